// prepare_data: text (a file or a folder of files) -> DIR/train.bin, DIR/val.bin (uint16 tokens) and
// DIR/meta.json. Byte-level tokens by default (vocab 257, 256 = end of text); with --tokenizer sentencepiece
// a BPE model with byte fallback, trained on the text (or --tokenizer-model), kept as DIR/tokenizer.model.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <new>

#include "apps/lib/data.h"
#include "apps/lib/flags.h"
#include "apps/lib/prepare.h"
#include "apps/lib/run_setup.h"
#include "base/error.h"

int main(int argc, char** argv) {
  std::signal(SIGXFSZ, SIG_IGN);  // a full disk (or file-size limit) is reported as a write error
  try {
    tt::app::Flags flags(
        "prepare_data",
        "Tokenise text into train/validation token files (every 10th document to validation; with fewer\n"
        "than 10 documents, the last 10-20% of the tokens).");
    flags.add("input", "", "a text file or a folder of text files (required)");
    flags.add("out", "", "output folder for train.bin, val.bin, meta.json (required)");
    flags.add("separator", "", "a line that separates documents in a file (e.g. % for fortunes)");
    flags.add("tokenizer", "bytes",
              "bytes | sentencepiece (BPE with byte fallback; the default when --vocab or --tokenizer-model "
              "is given)");
    flags.add(
        "vocab", "0",
        "sentencepiece: vocabulary size to train, 260..65536 (a text of many distinct characters needs more: "
        "the error says how many)");
    flags.add("tokenizer-model", "", "sentencepiece: reuse this tokenizer.model instead of training one");
    flags.add("threads", "0", "threads encoding the text and training a SentencePiece model (0: every core)");
    flags.add_switch("overwrite", "replace a dataset already in --out (otherwise refused)");
    if (!flags.parse(argc, argv)) return 0;
    tt::app::require_one_process("prepare_data");
    if (flags.str("input").empty() || flags.str("out").empty())
      throw tt::Error("--input and --out are required");
    tt::app::PrepareOptions options;
    // --vocab or --tokenizer-model without --tokenizer means SentencePiece (bytes take neither).
    const bool sentencepiece_flags = flags.given("vocab") || flags.given("tokenizer-model");
    options.tokenizer =
        flags.given("tokenizer") || !sentencepiece_flags ? flags.str("tokenizer") : "sentencepiece";
    options.vocab_size = flags.integer("vocab");
    options.tokenizer_model = flags.str("tokenizer-model");
    TT_CHECK(options.vocab_size >= 0, "--vocab must not be negative, got " + flags.str("vocab"));
    const int64_t threads = flags.integer("threads");
    TT_CHECK(threads >= 0 && threads <= 4096, "--threads must be in 0..4096, got " + flags.str("threads"));
    options.threads = static_cast<int>(threads);
    const std::string out = flags.str("out");
    for (const char* name : {"/train.bin", "/val.bin", "/meta.json", "/tokenizer.model"}) {
      if (std::filesystem::exists(out + name) && !flags.boolean("overwrite"))
        throw tt::Error(out + " already holds a dataset (" + (out + name) +
                        "); pass another --out, or --overwrite to replace it");
    }
    const tt::app::PrepareStats s =
        tt::app::prepare_text(flags.str("input"), out, flags.str("separator"), options);
    // What was skipped, by kind: "skipped 3: 1 hidden (.git, ...), 2 earlier datasets".
    struct Skipped {
      int64_t count;
      const char *one, *many;
    };
    std::string skipped;
    int64_t skipped_count = 0;
    for (const Skipped& k :
         {Skipped{s.skipped_not_text, "not text", "not text"}, Skipped{s.skipped_hidden, "hidden", "hidden"},
          Skipped{s.skipped_datasets, "earlier dataset", "earlier datasets"},
          Skipped{s.skipped_other, "link to a folder or other entry that is not a file",
                  "links to folders or other entries that are not files"}}) {
      if (k.count == 0) continue;
      skipped +=
          (skipped.empty() ? "" : ", ") + std::to_string(k.count) + " " + (k.count == 1 ? k.one : k.many);
      skipped_count += k.count;
    }
    if (skipped_count > 0)
      std::printf("read %lld files; skipped %lld: %s\n", static_cast<long long>(s.files),
                  static_cast<long long>(skipped_count), skipped.c_str());
    if (s.tokenizer_seconds > 0)
      std::printf("trained a SentencePiece BPE model of %lld pieces in %.1f s on %.1f MB of text%s\n",
                  static_cast<long long>(s.vocab_size), s.tokenizer_seconds,
                  static_cast<double>(s.tokenizer_sample_bytes) / 1e6,
                  s.tokenizer_sampled ? " (lines sampled evenly from the training documents)" : "");
    std::printf("encoded %.1f MB in %.2f s on %d thread%s: %.1f MB/s\n",
                static_cast<double>(s.text_bytes) / 1e6, s.encode_seconds, s.threads,
                s.threads == 1 ? "" : "s",
                static_cast<double>(s.text_bytes) / 1e6 / std::max(s.encode_seconds, 1e-9));
    const std::string model_note =
        options.tokenizer == "sentencepiece" ? ", " + out + "/tokenizer.model" : "";
    std::printf("%lld document%s -> %s/train.bin (%lld tokens), %s/val.bin (%lld tokens), vocab %lld%s\n",
                static_cast<long long>(s.documents), s.documents == 1 ? "" : "s", out.c_str(),
                static_cast<long long>(s.train_tokens), out.c_str(), static_cast<long long>(s.val_tokens),
                static_cast<long long>(s.vocab_size), model_note.c_str());
    if (!flags.str("separator").empty() && s.separator_lines == 0)
      std::printf("note: no line is --separator '%s': each file is one document\n",
                  flags.str("separator").c_str());
    if (s.invalid_utf8_bytes > 0)
      std::printf(
          "note: %lld bytes of the text are not UTF-8 (%s); SentencePiece reads them as U+FFFD, so they do "
          "not come back from its tokens (convert the text to UTF-8, or use the byte tokenizer)\n",
          static_cast<long long>(s.invalid_utf8_bytes),
          (s.invalid_utf8_files == 1 ? "in " + s.first_invalid_utf8_file
                                     : "in " + std::to_string(s.invalid_utf8_files) + " files, the first " +
                                           s.first_invalid_utf8_file)
              .c_str());
    // What train checks of each split (check_context_fits) at its default --ctx.
    const int64_t needed = tt::app::tokens_for_context(tt::app::kDefaultContext);
    if (std::min(s.train_tokens, s.val_tokens) < needed)
      std::printf(
          "note: %s holds only %lld token%s; train's default context of %lld needs %lld in each split: pass "
          "a smaller --ctx to train, or give prepare_data more text\n",
          s.val_tokens < s.train_tokens ? "val.bin" : "train.bin",
          static_cast<long long>(std::min(s.train_tokens, s.val_tokens)),
          std::min(s.train_tokens, s.val_tokens) == 1 ? "" : "s",
          static_cast<long long>(tt::app::kDefaultContext), static_cast<long long>(needed));
    if (s.validation_from_tail)
      std::printf("fewer than 10 documents: val.bin is the last %s, not every 10th document\n",
                  s.tail_cut_at_line_break
                      ? "10 to 20% of the tokens (cut after a line break)"
                      : "10% of the tokens (no line break to cut after between 80 and 90%)");
    return 0;
  } catch (const std::bad_alloc&) {
    std::fprintf(
        stderr,
        "error: out of memory: prepare_data needs about 300 MB to encode, and several times its sample's "
        "size (at most 256 MB of text) to train a SentencePiece model\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", tt::error_line(e).c_str());
    return 1;
  }
}
