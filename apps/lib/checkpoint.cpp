#include "apps/lib/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <regex>

#include "core/io/h5.h"

namespace tt::app {

namespace {
constexpr int64_t kFormatVersion = 1;

Tensor slice(Tensor& flat, int64_t offset, const Tensor& like) {
  return flat.narrow_view(0, offset, like.numel()).view(like.shape());
}
}  // namespace

namespace {
void write_checkpoint_file(const std::string& path, const nn::ModelConfig& config, nn::FlatParameters& params,
                           optim::AdamW* optimizer, const TrainState& state);
}

void save_checkpoint(const std::string& path, const nn::ModelConfig& config, nn::FlatParameters& params,
                     optim::AdamW* optimizer, const TrainState& state) {
  try {
    write_checkpoint_file(path, config, params, optimizer, state);
  } catch (const Error& e) {
    throw Error("cannot write checkpoint " + path + " (disk full?): " + e.what() +
                "; earlier checkpoints are intact");
  }
}

namespace {
void write_checkpoint_file(const std::string& path, const nn::ModelConfig& config, nn::FlatParameters& params,
                           optim::AdamW* optimizer, const TrainState& state) {
  io::atomic_write(path, [&](io::H5File& file) {
    file.set_attr("/", "format_version", kFormatVersion);
    file.set_attr("/", "vocab_size", config.vocab_size);
    file.set_attr("/", "context_length", config.context_length);
    file.set_attr("/", "d_model", config.d_model);
    file.set_attr("/", "num_layers", config.num_layers);
    file.set_attr("/", "num_heads", config.num_heads);
    file.set_attr("/", "d_ff", config.d_ff);
    file.set_attr("/", "rope_theta", config.rope_theta);
    file.set_attr("/", "precision", std::string(nn::precision_name(config.precision)));
    file.set_attr("/", "attention", std::string(nn::attention_name(config.attention)));
    const auto& named = params.parameters();
    for (const nn::NamedParameter& p : named) file.write_tensor("/model/" + p.name, *p.tensor);
    if (optimizer) {
      Tensor& exp_avg = optimizer->exp_avg().at(0);
      Tensor& exp_avg_sq = optimizer->exp_avg_sq().at(0);
      for (size_t i = 0; i < named.size(); ++i) {
        const std::string group = "/optimizer/" + named[i].name;
        file.write_tensor(group + "/exp_avg", slice(exp_avg, params.offsets()[i], *named[i].tensor));
        file.write_tensor(group + "/exp_avg_sq", slice(exp_avg_sq, params.offsets()[i], *named[i].tensor));
      }
      const optim::AdamWOptions& o = optimizer->options();
      file.set_attr("/optimizer", "step", optimizer->step_count());
      file.set_attr("/optimizer", "lr", optimizer->lr());
      file.set_attr("/optimizer", "beta1", o.beta1);
      file.set_attr("/optimizer", "beta2", o.beta2);
      file.set_attr("/optimizer", "eps", o.eps);
      file.set_attr("/optimizer", "weight_decay", o.weight_decay);
    }
    file.set_attr("/train", "step", state.step);
    file.set_attr("/train", "rng_seed", static_cast<int64_t>(state.rng_seed));
    file.set_attr("/train", "rng_counter", static_cast<int64_t>(state.rng_counter));
    file.set_attr("/train", "tokens_seen", state.tokens_seen);
    file.set_attr("/train", "args", state.args);
  });
}
}  // namespace

nn::ModelConfig read_checkpoint_config(const std::string& path) {
  const io::H5File file = io::H5File::open_read(path);
  nn::ModelConfig c;
  c.vocab_size = file.attr_int("/", "vocab_size");
  c.context_length = file.attr_int("/", "context_length");
  c.d_model = file.attr_int("/", "d_model");
  c.num_layers = file.attr_int("/", "num_layers");
  c.num_heads = file.attr_int("/", "num_heads");
  c.d_ff = file.attr_int("/", "d_ff");
  c.rope_theta = file.attr_double("/", "rope_theta");
  return c;
}

void load_checkpoint(const std::string& path, nn::FlatParameters& params, optim::AdamW* optimizer,
                     TrainState* state) {
  const io::H5File file = io::H5File::open_read(path);
  const auto& named = params.parameters();
  // Check every dataset first, so a mismatched file changes nothing.
  for (const nn::NamedParameter& p : named) {
    const std::string dataset = "/model/" + p.name;
    if (!file.exists(dataset)) throw Error("checkpoint " + path + ": dataset " + dataset + " is missing");
    const Shape shape = file.dataset_shape(dataset);
    if (shape != p.tensor->shape()) {
      throw Error("checkpoint " + path + ": dataset " + dataset + " has shape " + shape_str(shape) +
                  ", the model expects " + shape_str(p.tensor->shape()));
    }
  }
  for (const nn::NamedParameter& p : named) file.read_into("/model/" + p.name, *p.tensor);
  if (optimizer) {
    if (!file.exists("/optimizer"))
      throw Error("checkpoint " + path + " has no optimizer state (/optimizer)");
    Tensor& exp_avg = optimizer->exp_avg().at(0);
    Tensor& exp_avg_sq = optimizer->exp_avg_sq().at(0);
    for (size_t i = 0; i < named.size(); ++i) {
      const std::string group = "/optimizer/" + named[i].name;
      Tensor m = slice(exp_avg, params.offsets()[i], *named[i].tensor);
      Tensor v = slice(exp_avg_sq, params.offsets()[i], *named[i].tensor);
      file.read_into(group + "/exp_avg", m);
      file.read_into(group + "/exp_avg_sq", v);
    }
    optimizer->set_step_count(file.attr_int("/optimizer", "step"));
  }
  if (state) {
    state->step = file.attr_int("/train", "step");
    state->rng_seed = static_cast<uint64_t>(file.attr_int("/train", "rng_seed"));
    state->rng_counter = static_cast<uint64_t>(file.attr_int("/train", "rng_counter"));
    state->tokens_seen = file.attr_int("/train", "tokens_seen");
    state->args = file.attr_string("/train", "args");
  }
}

void prune_checkpoints(const std::string& dir, int64_t keep) {
  if (keep <= 0 || !std::filesystem::exists(dir)) return;
  std::vector<std::pair<int64_t, std::filesystem::path>> found;
  const std::regex pattern("step_([0-9]+)\\.h5");
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::smatch match;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, match, pattern)) found.emplace_back(std::stoll(match[1]), entry.path());
  }
  std::sort(found.begin(), found.end());
  for (size_t i = 0; i + static_cast<size_t>(keep) < found.size(); ++i)
    std::filesystem::remove(found[i].second);
}

}  // namespace tt::app
