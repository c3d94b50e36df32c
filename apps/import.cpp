// import: a Hugging Face Llama folder (config.json, model.safetensors or shards with
// model.safetensors.index.json; F32, BF16 or F16) -> a checkpoint at step 0 with zero AdamW state, which
// `train --resume` continues and `train --init-from` starts from. What our model cannot represent is refused.
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>

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

struct Located {
  const SafetensorsReader* file = nullptr;
  const SafetensorsTensor* tensor = nullptr;
};

// Every tensor of the folder's weights, single file or shards, each header checked.
class Weights {
 public:
  explicit Weights(const std::string& dir) {
    const std::string single = dir + "/model.safetensors", index = dir + "/model.safetensors.index.json";
    // The order from_pretrained looks in.
    if (fs::exists(single)) {
      const SafetensorsReader& file = open(single);
      for (const SafetensorsTensor& t : file.tensors()) tensors_[t.name] = {&file, &t};
      return;
    }
    TT_CHECK(fs::exists(index), dir + " holds neither model.safetensors nor model.safetensors.index.json");
    index_ = index;
    std::map<std::string, const SafetensorsReader*> by_name;
    for (const auto& [name, file_name] : read_safetensors_index(index)) {
      const std::string path = dir + "/" + file_name;
      if (!by_name.count(file_name)) {
        TT_CHECK(fs::exists(path), index + " puts " + name + " in " + file_name + ", which does not exist");
        by_name[file_name] = &open(path);
      }
      const SafetensorsReader& file = *by_name[file_name];
      const SafetensorsTensor* tensor = file.find(name);
      TT_CHECK(tensor, index + " puts " + name + " in " + file_name + ", which does not hold it");
      tensors_[name] = {&file, tensor};
    }
  }
  const std::map<std::string, Located>& tensors() const { return tensors_; }
  // model.safetensors, or "N shards of INDEX" (from_pretrained's order: the single file first).
  std::string where() const {
    return files_.size() == 1 && index_.empty()
               ? files_[0]->path()
               : std::to_string(files_.size()) + " shard" + (files_.size() == 1 ? "" : "s") + " of " + index_;
  }

 private:
  const SafetensorsReader& open(const std::string& path) {
    files_.push_back(std::make_unique<SafetensorsReader>(path));
    return *files_.back();
  }
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::string index_;  // model.safetensors.index.json when the weights are sharded
  std::map<std::string, Located> tensors_;
};

int run(const Flags& flags) {
  const std::string from = flags.str("from"), out = flags.str("out");
  TT_CHECK(!from.empty() && !out.empty(), "--from and --out are required");
  TT_CHECK(fs::is_directory(from), "--from " + from + " is not a folder");
  TT_CHECK(!fs::is_directory(out), "--out " + out + " is a folder; name the checkpoint file to write");
  // A step_N.h5 stands for step N wherever it is: train --resume, generate and export read a folder of them
  // (a run's checkpoints/, or any other) by those names, and an import holds weights alone, at step 0.
  TT_CHECK(!checkpoint_step_of(fs::path(out).filename().string()),
           "--out " + out +
               ": step_N.h5 is the name of a run's checkpoint of step N, which an import is not; name it "
               "otherwise, and start a run from it with train --init-from FILE");
  TT_CHECK(!fs::exists(out) || flags.boolean("overwrite"),
           out + " already exists; pass another --out, or --overwrite to replace it");
  const std::string data = flags.str("data");
  TT_CHECK(data.empty() || fs::is_directory(data), "data folder '" + data + "' does not exist");
  const nn::ModelConfig config = read_llama_config(from + "/config.json");
  const Weights weights(from);

  // Every tensor of the model, of the shape config.json implies, in a dtype we read; nothing else.
  nn::TransformerLM model(config);  // shapes only
  std::set<std::string> expected;
  std::map<std::string, int64_t> dtypes;
  for (const nn::NamedParameter& p : model.named_parameters()) {
    const std::string name = llama_name(p.name);
    expected.insert(name);
    const auto found = weights.tensors().find(name);
    TT_CHECK(found != weights.tensors().end(), weights.where() + ": tensor " + name + " is missing");
    const SafetensorsTensor& t = *found->second.tensor;
    const std::string& path = found->second.file->path();
    TT_CHECK(t.shape == p.tensor->shape(), path + ": tensor " + name + " has shape " + shape_str(t.shape) +
                                               ", config.json implies " + shape_str(p.tensor->shape()));
    TT_CHECK(t.dtype == "F32" || t.dtype == "BF16" || t.dtype == "F16",
             path + ": tensor " + name + " is " + t.dtype + ", expected F32, BF16 or F16");
    ++dtypes[t.dtype];
  }
  for (const auto& [name, located] : weights.tensors()) {
    // Precomputed RoPE frequencies some older exports carry: derived from config.json, not weights.
    const std::string inv_freq = ".rotary_emb.inv_freq";
    const bool derived = name.size() > inv_freq.size() &&
                         name.compare(name.size() - inv_freq.size(), inv_freq.size(), inv_freq) == 0;
    TT_CHECK(expected.count(name) || derived,
             located.file->path() + ": tensor " + name +
                 " is not part of the Llama model config.json describes, and cannot be represented");
  }

  TrainState state;
  // The folder's own SentencePiece tokenizer, when it has one we can read: the ids the weights mean. A
  // model handed ids of another tokenizer trains and generates without an error, and wrongly.
  const std::string own_tokenizer_path = from + "/tokenizer.model";
  std::string own_tokenizer;  // data_tokenizer_id form
  if (fs::is_regular_file(own_tokenizer_path)) {
    try {
      const std::unique_ptr<Tokenizer> own = load_sentencepiece(own_tokenizer_path);
      own_tokenizer =
          data_tokenizer_id({own->name(), own->vocab_size(), own->end_of_text(), own->checksum()});
    } catch (const Error&) {
      // Not a SentencePiece model this build reads (a tiktoken file, say): nothing to compare with.
    }
  }
  if (!own_tokenizer.empty()) state.data_tokenizer = own_tokenizer;  // train --init-from checks it
  // export finds the tokenizer and special ids of the data again through the recorded flag.
  if (!data.empty()) {
    const std::optional<DataMeta> meta = read_meta(data);
    TT_CHECK(!meta || own_tokenizer.empty() || same_data_tokenizer(data_tokenizer_id(*meta), own_tokenizer),
             data + " holds tokens of " + (meta ? data_tokenizer_id(*meta) : "") + ", not of " +
                 own_tokenizer_path + " (" + own_tokenizer +
                 "): pass data prepared with it (prepare_data --tokenizer sentencepiece --tokenizer-model " +
                 own_tokenizer_path + ")");
    // A model may have more ids than its data uses (train --vocab, padded vocabularies), never fewer.
    TT_CHECK(!meta || meta->vocab_size <= config.vocab_size,
             from + " holds a model of " + std::to_string(config.vocab_size) + " ids, but " + data +
                 "/meta.json gives " + std::to_string(meta ? meta->vocab_size : 0) + " ids (" +
                 (meta ? meta->tokenizer : "") +
                 "): pass the data folder prepared with this model's tokenizer");
    // Absolute, so that export and generate find it from any working folder; as given when the absolute
    // path has a space (recorded flags are split at spaces).
    const std::string absolute = fs::absolute(data).lexically_normal().string();
    state.args = "--data " + (absolute.find_first_of(" \t") == std::string::npos ? absolute : data) + " ";
    if (meta) state.data_tokenizer = data_tokenizer_id(*meta);
  }
  // The folders --out needs, the first of them remembered: a failed import takes back what it made.
  fs::path made;
  for (fs::path p = fs::path(out).parent_path(); !p.empty() && !fs::exists(p); p = p.parent_path()) made = p;
  if (!fs::path(out).parent_path().empty()) fs::create_directories(fs::path(out).parent_path());
  bool written = false;
  try {
    write_initial_checkpoint(
        out, config,
        [&](const std::string& ours, const Shape& shape) {
          const Located& at = weights.tensors().at(llama_name(ours));
          std::vector<float> values = at.file->read_floats(*at.tensor);
          for (size_t i = 0; i < values.size(); ++i) {
            TT_CHECK(std::isfinite(values[i]), at.file->path() + ": tensor " + at.tensor->name +
                                                   " holds a non-finite value (element " + std::to_string(i) +
                                                   ")");
          }
          if (rope_rows(ours)) values = rows_to_pairs(values, shape[0], shape[1], config.d_head());
          return Tensor::from_floats(values, shape);
        },
        state);
    written = true;  // a failed write left --out as it was (an earlier file under --overwrite)
    verify_checkpoint(out);
  } catch (...) {
    // Nothing of a failed import stays: the file it wrote, and the folders only this run created.
    std::error_code ignored;
    if (written) fs::remove(out, ignored);
    if (!made.empty()) fs::remove_all(made, ignored);
    throw;
  }
  std::string stored;
  for (const auto& [dtype, count] : dtypes)
    stored += (stored.empty() ? "" : ", ") + std::to_string(count) + " " + dtype;
  std::printf(
      "imported %s (%s tensors from %s) -> %s: d_model %lld, %lld layers, %lld heads, d_ff %lld, vocab %lld, "
      "context %lld, rope_theta %g, norm_eps %g; step 0, zero AdamW state\n",
      from.c_str(), stored.c_str(), weights.where().c_str(), out.c_str(),
      static_cast<long long>(config.d_model), static_cast<long long>(config.num_layers),
      static_cast<long long>(config.num_heads), static_cast<long long>(config.d_ff),
      static_cast<long long>(config.vocab_size), static_cast<long long>(config.context_length),
      config.rope_theta, config.norm_eps);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGXFSZ, SIG_IGN);  // a full disk (or file-size limit) is reported as a write error
  try {
    Flags flags("import",
                "Read a Hugging Face Llama folder into a checkpoint at step 0 (zero AdamW state) that\n"
                "`train --resume` continues and `train --init-from` starts from. Grouped-query attention,\n"
                "tied embeddings, biases and scaled RoPE are refused.");
    flags.add("from", "", "the Hugging Face folder: config.json, model.safetensors or its shards (required)");
    flags.add("out", "", "the checkpoint file to write (required)");
    flags.add("data", "", "the data folder the model goes with, recorded for export to find its tokenizer");
    flags.add_switch("overwrite", "replace an existing --out");
    if (!flags.parse(argc, argv)) return 0;
    tt::app::require_one_process("import");
    return run(flags);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of host memory (std::bad_alloc)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", tt::error_line(e).c_str());
    return 1;
  }
}
