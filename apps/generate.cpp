// generate: text from a checkpoint. The prompt (--prompt, or one per line on stdin) and its continuation go
// to stdout, streamed as the tokens come for a single prompt; several prompts run as one batch and print in
// order when it ends. Speed goes to stderr. Tokens come from the checkpoint's data folder's tokenizer (its
// /train args record --data) or --tokenizer.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "apps/lib/checkpoint.h"
#include "apps/lib/data.h"
#include "apps/lib/flags.h"
#include "apps/lib/generation.h"
#include "apps/lib/run_folder.h"
#include "apps/lib/run_setup.h"
#include "apps/lib/tokenizer.h"
#include "apps/lib/train_step.h"  // parse_graph_use: --cuda-graph as train takes it
#include "base/error.h"

namespace fs = std::filesystem;
using namespace tt;
using namespace tt::app;

namespace {

std::string describe(const Tokenizer& t) {
  return t.name() + " (" + std::to_string(t.vocab_size()) + " ids)";
}

// --tokenizer, or the tokenizer of the data the checkpoint was trained on, checked against what the
// checkpoint recorded of it (or, for older files, that data's meta.json when it can be found) and the
// model's vocabulary.
std::unique_ptr<Tokenizer> resolve_tokenizer(const std::string& spec, const std::string& checkpoint,
                                             int64_t model_vocab) {
  const std::string data = training_data_folder(checkpoint);
  const bool data_known = !data.empty() && fs::exists(data + "/meta.json");
  const std::string trained = read_checkpoint_data_tokenizer(checkpoint);
  std::unique_ptr<Tokenizer> tokenizer;
  if (spec.empty()) {
    TT_CHECK(
        !data.empty(),
        "no tokenizer: " + checkpoint +
            " records no training run (imported? `import --data DIR` records one); pass --tokenizer bytes "
            "or --tokenizer FILE.model (an export's folder holds its tokenizer.model)");
    const std::string kind = trained.substr(0, trained.find(' '));
    // Byte tokens need nothing from the data folder, which may have moved: the checkpoint says what they
    // are (as export takes them).
    if (!data_known && kind == "bytes") return byte_tokenizer();
    if (!data_known) {
      // What the checkpoint recorded of its tokenizer says which --tokenizer would do.
      const std::string which = kind == "bytes" ? "--tokenizer bytes"
                                : kind == "sentencepiece"
                                    ? "--tokenizer FILE.model (the data's tokenizer.model)"
                                    : "--tokenizer bytes or --tokenizer FILE.model";
      throw Error("no tokenizer: the checkpoint's data folder '" + data +
                  (fs::exists(data) ? "' has no meta.json" : "' does not exist (moved?)") + "; pass " +
                  which);
    }
    check_training_tokenizer(
        checkpoint, data,
        "pass --tokenizer bytes or FILE.model (an export's folder holds its tokenizer.model)");
    tokenizer = load_data_tokenizer(data);
  } else {
    tokenizer = spec == "bytes" ? byte_tokenizer() : load_sentencepiece(spec);
    std::string expected = trained;
    if (expected.empty() && data_known) expected = data_tokenizer_id(*read_meta(data));
    if (!expected.empty()) {
      DataMeta given{tokenizer->name(), tokenizer->vocab_size(), tokenizer->end_of_text(), ""};
      const bool same_kind = same_data_tokenizer(data_tokenizer_id(given), expected);  // name and size
      given.tokenizer_checksum = tokenizer->checksum();
      TT_CHECK(same_data_tokenizer(data_tokenizer_id(given), expected),
               "--tokenizer " + spec + " is " + describe(*tokenizer) +
                   ", not the tokenizer the checkpoint was trained with (" + expected +
                   (same_kind && tokenizer->name() != "bytes" ? ", another model file" : "") + ")");
    } else {
      // Without the data to compare with, only an exact fit is taken (a padded vocabulary is known only
      // from the data's meta.json).
      TT_CHECK(tokenizer->vocab_size() == model_vocab,
               "--tokenizer " + spec + " is " + describe(*tokenizer) + "; the checkpoint's vocabulary has " +
                   std::to_string(model_vocab) + " ids: not the tokenizer it was trained with");
    }
  }
  TT_CHECK(tokenizer->vocab_size() <= model_vocab,
           "the tokenizer is " + describe(*tokenizer) + ", more than the checkpoint's vocabulary of " +
               std::to_string(model_vocab) + " ids: not the tokenizer it was trained with");
  return tokenizer;
}

// The prompts: --prompt, or stdin's lines (empty ones skipped), handed out a batch at a time, so that a
// batch is answered before the next is read: prompts fed through a pipe are answered as they come.
class PromptReader {
 public:
  explicit PromptReader(const Flags& flags) {
    if (flags.given("prompt")) {
      single_ = flags.str("prompt");
    } else if (::isatty(STDIN_FILENO)) {
      std::fprintf(stderr, "reading prompts from stdin, one per line (Ctrl-D ends)\n");
    }
  }
  bool from_stdin() const { return !single_; }
  // Up to `count` prompts; none at the end.
  std::vector<std::string> next(size_t count) {
    std::vector<std::string> prompts;
    if (single_) {
      if (!single_used_) prompts.push_back(*single_);
      single_used_ = true;
      return prompts;
    }
    std::string line;
    while (prompts.size() < count && std::getline(std::cin, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty())
        prompts.push_back(line);
      else
        ++empty_;
    }
    return prompts;
  }
  int64_t skipped_empty() const { return empty_; }

 private:
  std::optional<std::string> single_;
  bool single_used_ = false;
  int64_t empty_ = 0;
};

// A text nobody received is not a success: a full disk ends the run with an error. A reader that stopped
// reading (`generate ... | head`) ends it quietly, with the status of a process its SIGPIPE ended, as any
// other program writing to that pipe would.
void write_out(const std::string& text) {
  if (std::fwrite(text.data(), 1, text.size(), stdout) == text.size() && std::fflush(stdout) == 0) return;
  if (errno == EPIPE) std::_Exit(128 + SIGPIPE);
  throw Error(std::string("cannot write the text to standard output: ") + std::strerror(errno));
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);  // a closed pipe is a write error (EPIPE), handled in write_out
  try {
    Flags flags("generate",
                "Continue prompts with a trained checkpoint (KV cache). Text to stdout, speed to stderr.\n"
                "Prompts: --prompt TEXT, or one per line on stdin (empty lines skipped), read and answered\n"
                "--batch at a time; each prompt's text and continuation follow in order, each ending with a\n"
                "newline.");
    flags.add("checkpoint", "",
              "checkpoint (.h5), or a run folder (its newest), to generate with (required)");
    flags.add("prompt", "", "text to continue (else prompts on stdin; empty: from a document's start)");
    flags.add("max-tokens", "256", "new tokens per prompt, at most");
    flags.add("temperature", "0.8", "softmax temperature; 0: greedy");
    flags.add("top-k", "40", "sample among the k likeliest tokens (0: all)");
    flags.add("top-p", "0.95", "... and the fewest reaching this mass (1: all)");
    flags.add("seed", "0", "random seed of the sampling");
    flags.add("tokenizer", "", "bytes | a tokenizer.model (default: the data's)");
    flags.add("batch", "16", "prompts generated together, at most");
    declare_device_flag(flags);
    flags.add("precision", "f32", "dtype of the matmuls", {"f32", "bf16"});
    flags.add(
        "cuda-graph", "auto",
        "as train's: auto and on replay each decoding step as one CUDA graph on a CUDA device (the same "
        "tokens); off runs it kernel by kernel",
        {"auto", "on", "off"});
    flags.add_switch("no-stop", "go on past the end-of-text token");
    flags.add_switch(
        "jsonl",
        "one JSON object per prompt, in order: {\"prompt\": ..., \"completion\": ...} (bytes that are "
        "not UTF-8 become U+FFFD), for programs that read the outputs of several prompts");
    if (!flags.parse(argc, argv)) return 0;
    tt::app::require_one_process("generate");
    TT_CHECK(!flags.str("checkpoint").empty(), "--checkpoint is required");
    SamplingOptions sampling;
    sampling.max_tokens = flags.integer("max-tokens");
    sampling.temperature = flags.number("temperature");
    sampling.top_k = flags.integer("top-k");
    sampling.top_p = flags.number("top-p");
    TT_CHECK(flags.integer("seed") >= 0, "--seed must be >= 0, got " + flags.str("seed"));
    sampling.seed = static_cast<uint64_t>(flags.integer("seed"));
    sampling.stop_at_end_of_text = !flags.boolean("no-stop");
    sampling.cuda_graph = parse_graph_use(flags.str("cuda-graph")) != GraphUse::off;
    check_sampling_options(sampling);
    const int64_t batch = flags.integer("batch");
    TT_CHECK(batch >= 1, "--batch must be at least 1, got " + flags.str("batch"));
    // A run folder, as --resume takes one: its newest checkpoint whose weights load.
    const Device device = pick_device(flags.str("device"));
    nn::ModelConfig config;
    std::unique_ptr<Tokenizer> tokenizer;
    std::unique_ptr<nn::TransformerLM> model;
    std::unique_ptr<nn::FlatParameters> params;
    read_newest_checkpoint(flags.str("checkpoint"), [&](const std::string& checkpoint) {
      config = read_checkpoint_config(checkpoint);
      config.precision = nn::parse_precision(flags.str("precision"));
      tokenizer = resolve_tokenizer(flags.str("tokenizer"), checkpoint, config.vocab_size);
      params.reset();
      model = std::make_unique<nn::TransformerLM>(config);
      params = std::make_unique<nn::FlatParameters>(*model, device, 0);
      load_checkpoint(checkpoint, *params, nullptr, nullptr);
    });
    sampling.end_of_text = tokenizer->end_of_text();
    sampling.vocab_limit = tokenizer->vocab_size();
    if (config.precision == nn::Precision::bf16) params->enable_bf16_mirror();  // no weight casts per token

    const bool jsonl = flags.boolean("jsonl");
    GenerationResult total;
    PromptReader reader(flags);
    int64_t first = 0;  // prompts answered so far
    for (std::vector<std::string> prompts = reader.next(static_cast<size_t>(batch)); !prompts.empty();
         first += static_cast<int64_t>(prompts.size()), prompts = reader.next(static_cast<size_t>(batch))) {
      std::vector<std::vector<int32_t>> group;
      for (size_t i = 0; i < prompts.size(); ++i) {
        group.push_back(prompt_ids(*tokenizer, prompts[i]));
        TT_CHECK(static_cast<int64_t>(group.back().size()) <= config.context_length,
                 (reader.from_stdin() ? "prompt " + std::to_string(first + static_cast<int64_t>(i) + 1)
                                      : std::string("the prompt")) +
                     " is " + std::to_string(group.back().size()) +
                     " tokens, longer than the model's context of " + std::to_string(config.context_length));
      }
      std::vector<TextStream> streams;
      std::vector<std::string> texts;
      for (size_t i = 0; i < group.size(); ++i) {
        streams.emplace_back(*tokenizer, group[i]);
        texts.push_back(prompts[i]);
      }
      const bool stream_now = group.size() == 1 && !jsonl;
      if (stream_now) write_out(texts[0]);
      auto on_token = [&](int64_t row, int32_t token) {
        if (token == sampling.end_of_text && sampling.stop_at_end_of_text) return;
        const std::string piece = streams[static_cast<size_t>(row)].push(token);
        if (stream_now)
          write_out(piece);
        else
          texts[static_cast<size_t>(row)] += piece;
      };
      sampling.first_prompt = first;
      const GenerationResult result = generate_tokens(*model, group, sampling, device, on_token);
      for (size_t r = 0; r < group.size(); ++r) {
        const std::string rest = streams[r].finish();
        if (jsonl) {
          const std::string& prompt = prompts[r];
          const std::string completion = texts[r].substr(prompt.size()) + rest;
          const nlohmann::ordered_json line = {{"prompt", prompt}, {"completion", completion}};
          write_out(line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n");
        } else if (stream_now) {
          write_out(rest + "\n");
        } else {
          write_out(texts[r] + rest + "\n");
        }
      }
      total.prompt_tokens += result.prompt_tokens;
      total.new_tokens += result.new_tokens;
      total.prefill_seconds += result.prefill_seconds;
      total.decode_seconds += result.decode_seconds;
      total.context_refills += result.context_refills;
      total.graph_steps += result.graph_steps;
      if (total.graph_declined.empty()) total.graph_declined = result.graph_declined;
    }
    TT_CHECK(first > 0, "no prompts: pass --prompt TEXT or give prompts on stdin, one per line");
    if (reader.skipped_empty() > 0)
      std::fprintf(stderr, "skipped %lld empty line%s\n", static_cast<long long>(reader.skipped_empty()),
                   reader.skipped_empty() == 1 ? "" : "s");
    const double seconds = total.prefill_seconds + total.decode_seconds;
    const int64_t rows = first;
    // Each row's first new token comes out of its prefill; the rest out of the batched steps.
    const int64_t stepped = std::max<int64_t>(0, total.new_tokens - rows);
    // With one new token per prompt there is no decoding step (each first token comes from the prompt).
    char rate[64];
    std::snprintf(rate, sizeof(rate), "decoding %.1f tokens/s",
                  static_cast<double>(stepped) / std::max(total.decode_seconds, 1e-9));
    const std::string decoding = stepped > 0 ? rate : "no decoding step";
    std::fprintf(
        stderr,
        "%lld new token%s for %lld prompt%s in %.3f s: %.1f tokens/s (prompts %lld tokens in %.3f s; "
        "%s%s) on %s, %s\n",
        static_cast<long long>(total.new_tokens), total.new_tokens == 1 ? "" : "s",
        static_cast<long long>(rows), rows == 1 ? "" : "s", seconds,
        static_cast<double>(total.new_tokens) / std::max(seconds, 1e-9),
        static_cast<long long>(total.prompt_tokens), total.prefill_seconds, decoding.c_str(),
        total.graph_steps > 0 ? ", CUDA graph" : "", device_name(device).c_str(),
        nn::precision_name(config.precision));
    if (!total.graph_declined.empty())
      std::fprintf(stderr, "decoding ran kernel by kernel: %s\n", total.graph_declined.c_str());
    if (total.context_refills > 0)
      std::fprintf(stderr, "the context filled up %lld time%s: generation went on from its last half\n",
                   static_cast<long long>(total.context_refills), total.context_refills == 1 ? "" : "s");
    return 0;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s\n", tt::error_line(e).c_str());
    return 1;
  }
}
