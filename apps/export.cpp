// export: a checkpoint -> a Hugging Face Llama folder (README.md "From your text to Hugging Face") that
// transformers.LlamaForCausalLM.from_pretrained loads with the same logits: model.safetensors (shards and
// model.safetensors.index.json above --shard-bytes), config.json, and for SentencePiece data its
// tokenizer.model with a tokenizer_config.json.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include "apps/lib/checkpoint.h"
#include "apps/lib/data.h"
#include "apps/lib/flags.h"
#include "apps/lib/hf_llama.h"
#include "apps/lib/run_folder.h"
#include "apps/lib/run_setup.h"
#include "apps/lib/safetensors.h"
#include "apps/lib/tokenizer.h"
#include "base/error.h"

namespace fs = std::filesystem;
using namespace tt;
using namespace tt::app;

namespace {

// Hugging Face's default largest shard (save_pretrained's max_shard_size "5GB").
constexpr int64_t kShardBytes = 5'000'000'000;

const char* kByteTokensNote =
    "# Tokens\n\n"
    "This model was trained on tinytrain's byte-level tokens: ids 0-255 are the bytes of UTF-8 text and 256\n"
    "ends a document. There is no Hugging Face tokenizer for them: pass `list(text.encode())` as the input\n"
    "ids, and decode generated ids below 256 as bytes.\n";

// The training data's folder: --data, else the one the checkpoint's run trained on (found as generate finds
// it).
std::string data_folder(const Flags& flags, const std::string& checkpoint) {
  if (!flags.given("data")) return training_data_folder(checkpoint);
  check_data_folder_path(flags.str("data"));
  return flags.str("data");
}

fs::path folder_path(const std::string& text) {
  fs::path path = fs::path(text).lexically_normal();
  if (!path.has_filename()) path = path.parent_path();  // "out/" names "out"
  return path;
}

// What export writes: a folder holding only these is an earlier export, which --overwrite may replace; any
// other file (a script, notes) means the folder is the user's.
bool written_by_export(const std::string& name) {
  static const char* const kNames[] = {
      "config.json",     "model.safetensors",     "model.safetensors.index.json",
      "tokenizer.model", "tokenizer_config.json", "README.md"};
  for (const char* known : kNames)
    if (name == known) return true;
  int part = 0, parts = 0, end = 0;
  return std::sscanf(name.c_str(), "model-%5d-of-%5d.safetensors%n", &part, &parts, &end) == 2 &&
         static_cast<size_t>(end) == name.size();
}

// The first entry of `dir` export would not have written, or "" when there is none.
std::string foreign_entry(const fs::path& dir) {
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || !written_by_export(name)) return name;
  }
  return "";
}

// An export is made in OUT.tmp-PID beside OUT and moved into place whole: a failure leaves OUT as it was.
// The names carry the process id, and a folder already there under one is refused, never removed: it may
// be the user's.
class StagedFolder {
 public:
  explicit StagedFolder(const fs::path& out)
      : out_(out),
        tmp_(out.string() + ".tmp-" + std::to_string(::getpid())),
        old_(out.string() + ".old-" + std::to_string(::getpid())) {
    remove_interrupted_exports();
    for (const fs::path& path : {tmp_, old_})
      TT_CHECK(!fs::exists(path), path.string() + " is in the way of the export; move it away");
    fs::create_directories(tmp_);
  }
  ~StagedFolder() {
    std::error_code ignored;
    if (!committed_) fs::remove_all(tmp_, ignored);
  }
  StagedFolder(const StagedFolder&) = delete;
  StagedFolder& operator=(const StagedFolder&) = delete;
  std::string file(const std::string& name) const { return (tmp_ / name).string(); }
  // OUT.tmp-PID folders of exports killed mid-way (their process is gone) that hold only export's files.
  void remove_interrupted_exports() const {
    const fs::path parent = out_.has_parent_path() ? out_.parent_path() : fs::path(".");
    const std::string prefix = out_.filename().string() + ".tmp-";
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(parent, ec)) {
      const std::string name = entry.path().filename().string();
      if (!entry.is_directory() || name.rfind(prefix, 0) != 0) continue;
      const std::string digits = name.substr(prefix.size());
      if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos)
        continue;
      const pid_t pid = static_cast<pid_t>(std::stoll(digits));
      if ((::kill(pid, 0) == 0 || errno != ESRCH) || !foreign_entry(entry.path()).empty()) continue;
      std::printf("removing %s, left by an interrupted export\n", entry.path().c_str());
      fs::remove_all(entry.path(), ec);
    }
  }
  void commit() {
    if (fs::exists(out_)) fs::rename(out_, old_);
    fs::rename(tmp_, out_);
    committed_ = true;
    fs::remove_all(old_);  // the earlier export, checked by foreign_entry to hold only export's files
  }

 private:
  fs::path out_, tmp_, old_;
  bool committed_ = false;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TT_CHECK(in, "cannot read " + path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Exports `checkpoint`; throws with nothing written to --out.
int run(const Flags& flags, const std::string& checkpoint) {
  const std::string dtype_flag = flags.str("dtype");
  TT_CHECK(dtype_flag == "f32" || dtype_flag == "bf16",
           "--dtype must be f32 or bf16, got '" + dtype_flag + "'");
  const bool bf16 = dtype_flag == "bf16";
  const int64_t shard_bytes = flags.integer("shard-bytes");
  TT_CHECK(shard_bytes > 0, "--shard-bytes must be positive, got " + flags.str("shard-bytes"));
  TT_CHECK(fs::exists(checkpoint), "checkpoint " + checkpoint + " does not exist");
  const nn::ModelConfig config = read_checkpoint_config(checkpoint);

  const fs::path out = folder_path(flags.str("out"));
  {
    // The finished folder is moved onto --out, which cannot be done to the folder a process works in.
    const fs::path here = fs::current_path();
    const fs::path target = fs::weakly_canonical(fs::absolute(out));
    const auto [end, unused] = std::mismatch(target.begin(), target.end(), here.begin(), here.end());
    TT_CHECK(end != target.end(), "--out " + flags.str("out") +
                                      " is the current folder or holds it; export writes a new folder and "
                                      "moves it there: pass a folder beside or below this one");
  }
  if (fs::exists(out)) {
    TT_CHECK(fs::is_directory(out), "--out " + out.string() + " exists and is not a folder");
    const bool empty = fs::is_empty(out);
    TT_CHECK(empty || flags.boolean("overwrite"),
             out.string() +
                 " already holds files; pass another --out, or --overwrite to replace the export there");
    const std::string foreign = empty ? "" : foreign_entry(out);
    TT_CHECK(foreign.empty(), out.string() + " holds " + foreign +
                                  ", which export does not write: it is not an earlier export, so it is not "
                                  "replaced; pass another --out");
  }

  // What the tokens are: the data's meta.json and tokenizer.model.
  const std::string data = data_folder(flags, checkpoint);
  TT_CHECK(!flags.given("data") || fs::is_directory(data), "data folder '" + data + "' does not exist");
  if (!data.empty())
    check_training_tokenizer(checkpoint, data, "pass --data with the data it was trained on");
  DataTokens tokens = read_data_tokens(data);
  const std::string trained_on = read_checkpoint_data_tokenizer(checkpoint);
  // Byte tokens need nothing from the data folder, which may have moved: the checkpoint says what they are.
  if (tokens.tokenizer.empty() && trained_on.rfind("bytes ", 0) == 0) {
    tokens.tokenizer = "bytes";
    tokens.ids.eos = byte_tokenizer()->end_of_text();
  }
  // A SentencePiece model exported without its tokenizer.model could not be used: refuse rather than write
  // weights no one can feed text to.
  const std::string where = data.empty()              ? std::string("it names no data folder")
                            : !fs::is_directory(data) ? "'" + data + "' does not exist (moved?)"
                                                      : "'" + data + "' holds no tokenizer.model";
  TT_CHECK(!tokens.sentencepiece_model.empty() || trained_on.rfind("sentencepiece", 0) != 0,
           checkpoint + " was trained on SentencePiece tokens (" + trained_on + "), but " + where +
               ": pass --data with the data it was trained on, whose tokenizer.model the export needs");
  SpecialTokens ids = tokens.ids;
  std::optional<SentencePieceModel> sentencepiece;
  if (!tokens.sentencepiece_model.empty()) {
    sentencepiece = read_sentencepiece_model(tokens.sentencepiece_model);
    const auto pieces = static_cast<int64_t>(sentencepiece->pieces.size());
    TT_CHECK(pieces <= config.vocab_size, tokens.sentencepiece_model + " has " + std::to_string(pieces) +
                                              " pieces, more than the model's vocab_size " +
                                              std::to_string(config.vocab_size));
    if (ids.bos < 0 && sentencepiece->bos_id >= 0) ids.bos = sentencepiece->bos_id;
    if (ids.eos < 0 && sentencepiece->eos_id >= 0) ids.eos = sentencepiece->eos_id;
  }
  for (const int64_t id : {ids.bos, ids.eos}) {
    TT_CHECK(id < config.vocab_size, data + ": special token id " + std::to_string(id) +
                                         " is not below the model's vocab_size " +
                                         std::to_string(config.vocab_size));
  }

  // The files: tensors in the model's order, a new shard whenever the next tensor would pass --shard-bytes.
  const std::string st_dtype = bf16 ? "BF16" : "F32";
  nn::TransformerLM model(config);  // shapes only
  std::vector<std::vector<SafetensorsTensor>> shards(1);
  uint64_t total_bytes = 0, shard_used = 0;
  for (const nn::NamedParameter& p : model.named_parameters()) {
    const uint64_t bytes = static_cast<uint64_t>(shape_numel(p.tensor->shape()) * (bf16 ? 2 : 4));
    if (!shards.back().empty() && shard_used + bytes > static_cast<uint64_t>(shard_bytes)) {
      shards.emplace_back();
      shard_used = 0;
    }
    shards.back().push_back({llama_name(p.name), st_dtype, p.tensor->shape(), 0, 0});
    shard_used += bytes;
    total_bytes += bytes;
  }
  auto shard_name = [&](size_t i) {
    if (shards.size() == 1) return std::string("model.safetensors");
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    return std::string(name);
  };
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};

  StagedFolder stage(out);
  size_t shard = 0, written_in_shard = 0;
  auto writer = std::make_unique<SafetensorsWriter>(stage.file(shard_name(0)), shards[0], metadata);
  read_checkpoint_parameters(checkpoint, [&](const std::string& name, const Shape& shape,
                                             const std::vector<float>& values) {
    if (written_in_shard == shards[shard].size()) {
      writer->close();
      ++shard;
      written_in_shard = 0;
      writer = std::make_unique<SafetensorsWriter>(stage.file(shard_name(shard)), shards[shard], metadata);
    }
    if (rope_rows(name))
      writer->write(llama_name(name), rows_to_halves(values, shape[0], shape[1], config.d_head()));
    else
      writer->write(llama_name(name), values);
    ++written_in_shard;
  });
  writer->close();
  if (shards.size() > 1) {
    std::map<std::string, std::string> weight_map;
    for (size_t i = 0; i < shards.size(); ++i) {
      for (const SafetensorsTensor& t : shards[i]) weight_map[t.name] = shard_name(i);
    }
    write_file_synced(stage.file("model.safetensors.index.json"),
                      safetensors_index_json(total_bytes, weight_map));
  }
  write_file_synced(stage.file("config.json"), llama_config_json(config, bf16 ? "bfloat16" : "float32", ids));

  std::string tokenizer_note;
  if (sentencepiece) {
    write_file_synced(stage.file("tokenizer.model"), read_file(tokens.sentencepiece_model));
    write_file_synced(
        stage.file("tokenizer_config.json"),
        llama_tokenizer_config_json(*sentencepiece, ids, tokens.has_bos, config.context_length));
    tokenizer_note = "tokenizer.model and tokenizer_config.json (LlamaTokenizer) from " + data;
  } else if (tokens.tokenizer == "bytes") {
    write_file_synced(stage.file("README.md"), kByteTokensNote);
    tokenizer_note =
        "no Hugging Face tokenizer: the data's tokens are bytes (ids 0-255, 256 ends a document); " +
        (out / "README.md").string() + " says how to feed the model";
  } else if (!tokens.tokenizer.empty()) {
    tokenizer_note = "no tokenizer files: " + data + " has tokenizer '" + tokens.tokenizer +
                     "' and no tokenizer.model beside it";
  } else {
    tokenizer_note = "no tokenizer files and no bos/eos ids: " +
                     (data.empty() ? std::string("the checkpoint does not name its data folder")
                                   : "no meta.json in '" + data + "'") +
                     " (pass --data DIR)";
  }
  stage.commit();
  std::printf("exported %s -> %s: %zu tensors, %llu bytes of %s in %zu file%s, config.json\n",
              checkpoint.c_str(), out.c_str(), model.named_parameters().size(),
              static_cast<unsigned long long>(total_bytes), st_dtype.c_str(), shards.size(),
              shards.size() == 1 ? "" : "s (model.safetensors.index.json)");
  std::printf("tokenizer: %s\n", tokenizer_note.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGXFSZ, SIG_IGN);  // a full disk (or file-size limit) is reported as a write error
  try {
    Flags flags("export",
                "Write a checkpoint as a Hugging Face Llama folder (LlamaForCausalLM): model.safetensors,\n"
                "config.json and, for SentencePiece data, the tokenizer. The folder is written beside --out\n"
                "and moved into place once complete.");
    flags.add("checkpoint", "", "the checkpoint to export, or a run folder (its newest) (required)");
    flags.add("out", "", "the folder to write (required)");
    flags.add("dtype", "f32", "f32 | bf16 (rounded to nearest even)");
    flags.add(
        "data", "",
        "the data folder (meta.json, tokenizer.model) for special token ids and the tokenizer; default: "
        "the one the checkpoint's run trained on");
    flags.add("shard-bytes", std::to_string(kShardBytes),
              "largest model-NNNNN-of-NNNNN.safetensors shard; above it the weights are sharded");
    flags.add_switch("overwrite", "replace an earlier export in --out");
    if (!flags.parse(argc, argv)) return 0;
    tt::app::require_one_process("export");
    TT_CHECK(!flags.str("checkpoint").empty() && !flags.str("out").empty(),
             "--checkpoint and --out are required");
    int status = 1;
    read_newest_checkpoint(flags.str("checkpoint"),
                           [&](const std::string& checkpoint) { status = run(flags, checkpoint); });
    return status;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of host memory (std::bad_alloc)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", tt::error_line(e).c_str());
    return 1;
  }
}
