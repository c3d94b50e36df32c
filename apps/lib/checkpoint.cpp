#include "apps/lib/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <regex>

#include "core/io/h5.h"

namespace tt::app {

namespace {
// 2: every dataset is chunked with a Fletcher32 checksum per chunk. 1 (no checksums) still loads.
constexpr int64_t kFormatVersion = 2;

}  // namespace

namespace {

class WholeAdamW : public OptimizerState {
 public:
  explicit WholeAdamW(optim::AdamW& adamw) : adamw_(adamw) {}
  int64_t step_count() const override { return adamw_.step_count(); }
  void set_step_count(int64_t step) override { adamw_.set_step_count(step); }
  double lr() const override { return adamw_.lr(); }
  const optim::AdamWOptions& options() const override { return adamw_.options(); }
  Tensor gather(int which, int64_t offset, const Shape& shape) override {
    Tensor& flat = which == 0 ? adamw_.exp_avg().at(0) : adamw_.exp_avg_sq().at(0);
    return flat.narrow_view(0, offset, shape_numel(shape)).view(shape).to(Device::cpu());
  }
  void scatter(int which, int64_t offset, const Tensor& full) override {
    Tensor& flat = which == 0 ? adamw_.exp_avg().at(0) : adamw_.exp_avg_sq().at(0);
    Tensor dst = flat.narrow_view(0, offset, full.numel());
    dst.copy_(full.view({full.numel()}));
  }

 private:
  optim::AdamW& adamw_;
};

class ShardedState : public OptimizerState {
 public:
  explicit ShardedState(optim::ShardedOptimizer& sharded) : sharded_(sharded) {}
  int64_t step_count() const override { return sharded_.step_count(); }
  void set_step_count(int64_t step) override { sharded_.set_step_count(step); }
  double lr() const override { return sharded_.lr(); }
  const optim::AdamWOptions& options() const override { return sharded_.options(); }
  // Each rank contributes the part of the parameter inside its slice (zeros elsewhere); a sum over ranks
  // assembles the whole parameter's state, one parameter at a time.
  Tensor gather(int which, int64_t offset, const Shape& shape) override {
    Tensor& shard = which == 0 ? sharded_.shard_exp_avg() : sharded_.shard_exp_avg_sq();
    const int64_t n = shape_numel(shape);
    Tensor full = Tensor::zeros({n}, shard.dtype(), shard.device());
    const int64_t begin = std::max(offset, sharded_.shard_begin());
    const int64_t end = std::min(offset + n, sharded_.shard_begin() + sharded_.shard_size());
    if (begin < end) {
      Tensor dst = full.narrow_view(0, begin - offset, end - begin);
      dst.copy_(shard.narrow_view(0, begin - sharded_.shard_begin(), end - begin));
    }
    sharded_.collectives().all_reduce_sum(full);
    return full.view(shape).to(Device::cpu());
  }
  void scatter(int which, int64_t offset, const Tensor& full) override {
    Tensor& shard = which == 0 ? sharded_.shard_exp_avg() : sharded_.shard_exp_avg_sq();
    const int64_t n = full.numel();
    const int64_t begin = std::max(offset, sharded_.shard_begin());
    const int64_t end = std::min(offset + n, sharded_.shard_begin() + sharded_.shard_size());
    if (begin >= end) return;
    Tensor dst = shard.narrow_view(0, begin - sharded_.shard_begin(), end - begin);
    dst.copy_(full.view({n}).narrow_view(0, begin - offset, end - begin).to(shard.device()));
  }

 private:
  optim::ShardedOptimizer& sharded_;
};

void write_model_attributes(io::H5File& file, const nn::ModelConfig& config) {
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
}

// The body of a save, run by every rank; `file` is null on the ranks that do not write.
void write_contents(io::H5File* file, const nn::ModelConfig& config, nn::FlatParameters& params,
                    OptimizerState* optimizer, const TrainState& state) {
  const auto& named = params.parameters();
  if (file) {
    write_model_attributes(*file, config);
    for (const nn::NamedParameter& p : named) file->write_tensor("/model/" + p.name, *p.tensor);
  }
  if (optimizer) {
    for (size_t i = 0; i < named.size(); ++i) {
      const std::string group = "/optimizer/" + named[i].name;
      const Tensor m = optimizer->gather(0, params.offsets()[i], named[i].tensor->shape());
      if (file) file->write_tensor(group + "/exp_avg", m);
      const Tensor v = optimizer->gather(1, params.offsets()[i], named[i].tensor->shape());
      if (file) file->write_tensor(group + "/exp_avg_sq", v);
    }
    if (file) {
      const optim::AdamWOptions& o = optimizer->options();
      file->set_attr("/optimizer", "step", optimizer->step_count());
      file->set_attr("/optimizer", "lr", optimizer->lr());
      file->set_attr("/optimizer", "beta1", o.beta1);
      file->set_attr("/optimizer", "beta2", o.beta2);
      file->set_attr("/optimizer", "eps", o.eps);
      file->set_attr("/optimizer", "weight_decay", o.weight_decay);
    }
  }
  if (file) {
    file->set_attr("/train", "step", state.step);
    file->set_attr("/train", "rng_seed", static_cast<int64_t>(state.rng_seed));
    file->set_attr("/train", "rng_counter", static_cast<int64_t>(state.rng_counter));
    file->set_attr("/train", "tokens_seen", state.tokens_seen);
    file->set_attr("/train", "args", state.args);
  }
}

}  // namespace

std::unique_ptr<OptimizerState> optimizer_state(optim::AdamW& adamw) {
  return std::make_unique<WholeAdamW>(adamw);
}
std::unique_ptr<OptimizerState> optimizer_state(optim::ShardedOptimizer& sharded) {
  TT_CHECK(sharded.is_adamw(), "checkpoints hold AdamW state; this sharded optimizer is SGD");
  return std::make_unique<ShardedState>(sharded);
}

void save_checkpoint(const std::string& path, const nn::ModelConfig& config, nn::FlatParameters& params,
                     OptimizerState* optimizer, const TrainState& state, bool writer) {
  if (!writer) {
    write_contents(nullptr, config, params, optimizer, state);
    return;
  }
  try {
    io::atomic_write(path,
                     [&](io::H5File& file) { write_contents(&file, config, params, optimizer, state); });
  } catch (const Error& e) {
    // A folder this process may not write to is the other common cause besides a full disk.
    const std::string folder = std::filesystem::path(path).parent_path().string();
    const bool writable = access(folder.empty() ? "." : folder.c_str(), W_OK) == 0;
    throw Error("cannot write checkpoint " + path +
                (writable ? " (disk full?): " : " (folder not writable): ") + e.what() +
                "; earlier checkpoints are intact");
  }
}

namespace {
// HDF5's messages name the call and the object, not the file: a damaged checkpoint is reported by its path.
template <class F>
auto naming_file(const std::string& path, F&& read) {
  try {
    return read();
  } catch (const Error& e) {
    const std::string message = e.what();
    if (message.rfind("HDF5 error", 0) == 0) throw Error("checkpoint " + path + " is damaged: " + message);
    throw;
  }
}

nn::ModelConfig read_checkpoint_config_unnamed(const std::string& path) {
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

void load_checkpoint_unnamed(const std::string& path, nn::FlatParameters& params, OptimizerState* optimizer,
                             TrainState* state) {
  const io::H5File file = io::H5File::open_read(path);
  const auto& named = params.parameters();
  // Check every dataset (and the optimizer's and trainer's attributes) first, so a file that does not fit
  // changes nothing.
  auto check_dataset = [&](const std::string& dataset, const Shape& expected) {
    if (!file.exists(dataset)) throw Error("checkpoint " + path + ": dataset " + dataset + " is missing");
    const Shape shape = file.dataset_shape(dataset);
    if (shape != expected) {
      throw Error("checkpoint " + path + ": dataset " + dataset + " has shape " + shape_str(shape) +
                  ", the model expects " + shape_str(expected));
    }
  };
  for (const nn::NamedParameter& p : named) check_dataset("/model/" + p.name, p.tensor->shape());
  if (optimizer) {
    if (!file.exists("/optimizer"))
      throw Error("checkpoint " + path + " has no optimizer state (/optimizer)");
    for (const nn::NamedParameter& p : named) {
      check_dataset("/optimizer/" + p.name + "/exp_avg", p.tensor->shape());
      check_dataset("/optimizer/" + p.name + "/exp_avg_sq", p.tensor->shape());
    }
    file.attr_int("/optimizer", "step");
  }
  if (state) {
    for (const char* name : {"step", "rng_seed", "rng_counter", "tokens_seen"}) file.attr_int("/train", name);
  }
  for (const nn::NamedParameter& p : named) file.read_into("/model/" + p.name, *p.tensor);
  if (optimizer) {
    if (!file.exists("/optimizer"))
      throw Error("checkpoint " + path + " has no optimizer state (/optimizer)");
    for (size_t i = 0; i < named.size(); ++i) {
      const std::string group = "/optimizer/" + named[i].name;
      for (int which = 0; which < 2; ++which) {
        const std::string dataset = group + (which == 0 ? "/exp_avg" : "/exp_avg_sq");
        Tensor host = Tensor::empty(named[i].tensor->shape(), named[i].tensor->dtype(), Device::cpu());
        file.read_into(dataset, host);
        optimizer->scatter(which, params.offsets()[i], host);
      }
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

}  // namespace

nn::ModelConfig read_checkpoint_config(const std::string& path) {
  return naming_file(path, [&] { return read_checkpoint_config_unnamed(path); });
}

void load_checkpoint(const std::string& path, nn::FlatParameters& params, OptimizerState* optimizer,
                     TrainState* state) {
  naming_file(path, [&] { load_checkpoint_unnamed(path, params, optimizer, state); });
}

void prune_checkpoints(const std::string& dir, int64_t keep, int64_t up_to_step) {
  if (keep <= 0 || !std::filesystem::exists(dir)) return;
  std::vector<std::pair<int64_t, std::filesystem::path>> found;
  const std::regex pattern("step_([0-9]+)\\.h5");
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::smatch match;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, match, pattern) && std::stoll(match[1]) <= up_to_step) {
      found.emplace_back(std::stoll(match[1]), entry.path());
    }
  }
  std::sort(found.begin(), found.end());
  for (size_t i = 0; i + static_cast<size_t>(keep) < found.size(); ++i)
    std::filesystem::remove(found[i].second);
}

}  // namespace tt::app
