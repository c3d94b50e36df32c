#include "apps/lib/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <mutex>
#include <optional>
#include <regex>
#include <sstream>
#include <system_error>
#include <thread>

#include "apps/lib/data.h"
#include "core/io/h5.h"
#include "core/ops.h"

namespace tt::app {

namespace {
// 3: contiguous datasets, each with the CRC-32 of its bytes in an attribute (crc32). Earlier ones still load:
// 2, chunked with HDF5's Fletcher32 checksum per chunk (computed on one thread inside each read and write),
// and 1, no checksums.
constexpr int64_t kFormatVersion = 3;

}  // namespace

namespace {

// The step count, learning rate and options, as every optimizer holding AdamW state keeps them.
template <class Optimizer>
class AdamWStateOf : public OptimizerState {
 public:
  explicit AdamWStateOf(Optimizer& optimizer) : optimizer_(optimizer) {}
  int64_t step_count() const override { return optimizer_.step_count(); }
  void set_step_count(int64_t step) override { optimizer_.set_step_count(step); }
  double lr() const override { return optimizer_.lr(); }
  const optim::AdamWOptions& options() const override { return optimizer_.options(); }

 protected:
  Optimizer& optimizer_;
};

class WholeAdamW : public AdamWStateOf<optim::AdamW> {
 public:
  using AdamWStateOf::AdamWStateOf;
  Tensor gather(int which, int64_t offset, const Shape& shape) override {
    Tensor& flat = which == 0 ? optimizer_.exp_avg().at(0) : optimizer_.exp_avg_sq().at(0);
    return flat.narrow_view(0, offset, shape_numel(shape)).view(shape).to(Device::cpu());
  }
  void scatter(int which, int64_t offset, const Tensor& full) override {
    Tensor& flat = which == 0 ? optimizer_.exp_avg().at(0) : optimizer_.exp_avg_sq().at(0);
    Tensor dst = flat.narrow_view(0, offset, full.numel());
    dst.copy_(full.view({full.numel()}));
  }
};

class ShardedState : public AdamWStateOf<optim::ShardedOptimizer> {
 public:
  using AdamWStateOf::AdamWStateOf;
  // Each rank contributes the part of the parameter inside its slice (zeros elsewhere); a sum over ranks
  // assembles the whole parameter's state, one parameter at a time.
  Tensor gather(int which, int64_t offset, const Shape& shape) override {
    Tensor& shard = which == 0 ? optimizer_.shard_exp_avg() : optimizer_.shard_exp_avg_sq();
    const int64_t n = shape_numel(shape);
    Tensor full = Tensor::zeros({n}, shard.dtype(), shard.device());
    const int64_t begin = std::max(offset, optimizer_.shard_begin());
    const int64_t end = std::min(offset + n, optimizer_.shard_begin() + optimizer_.shard_size());
    if (begin < end) {
      Tensor dst = full.narrow_view(0, begin - offset, end - begin);
      dst.copy_(shard.narrow_view(0, begin - optimizer_.shard_begin(), end - begin));
    }
    optimizer_.collectives().all_reduce_sum(full);
    return full.view(shape).to(Device::cpu());
  }
  void scatter(int which, int64_t offset, const Tensor& full) override {
    Tensor& shard = which == 0 ? optimizer_.shard_exp_avg() : optimizer_.shard_exp_avg_sq();
    const int64_t n = full.numel();
    const int64_t begin = std::max(offset, optimizer_.shard_begin());
    const int64_t end = std::min(offset + n, optimizer_.shard_begin() + optimizer_.shard_size());
    if (begin >= end) return;
    Tensor dst = shard.narrow_view(0, begin - optimizer_.shard_begin(), end - begin);
    dst.copy_(full.view({n}).narrow_view(0, begin - offset, end - begin).to(shard.device()));
  }
};

// ZeRO-2/3: the master weights and the state are shards of the optimizer's own layout (zero_optimizer.h).
class ZeroState : public AdamWStateOf<optim::ZeroOptimizer> {
 public:
  using AdamWStateOf::AdamWStateOf;
  Tensor gather(int which, int64_t offset, const Shape& shape) override {
    return optimizer_.gather_moment(which, offset, shape);
  }
  void scatter(int which, int64_t offset, const Tensor& full) override {
    optimizer_.scatter_moment(which, offset, full);
  }
  bool holds_parameters() const override { return true; }
  Tensor gather_parameter(int64_t offset, const Shape& shape) override {
    return optimizer_.gather_parameter(offset, shape);
  }
  void scatter_parameter(int64_t offset, const Tensor& full) override {
    optimizer_.scatter_parameter(offset, full);
  }
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
  file.set_attr("/", "norm_eps", config.norm_eps);
  file.set_attr("/", "precision", std::string(nn::precision_name(config.precision)));
  file.set_attr("/", "attention", std::string(nn::attention_name(config.attention)));
}

// Writes host tensors into a file on a thread of its own, so that gathering the next one (collectives and
// copies from the device, on the calling thread) overlaps writing this one; at most two wait. Between its
// construction and finish() only this thread calls HDF5. A failed write is raised by finish(), after the
// caller has gone through all its gathers (every rank takes part in them).
class DatasetWriter {
 public:
  explicit DatasetWriter(io::H5File* file) : file_(file) {
    if (!file_) return;
    try {
      thread_ = std::thread([this] { run(); });
    } catch (const std::system_error&) {
      inline_ = true;  // no thread to be had (a process limit): write() writes on the calling thread
    }
  }
  ~DatasetWriter() {
    if (thread_.joinable()) stop();
  }
  DatasetWriter(const DatasetWriter&) = delete;
  DatasetWriter& operator=(const DatasetWriter&) = delete;

  void write(std::string dataset, Tensor host) {
    if (!file_) return;
    if (inline_) {
      if (failure_) return;
      try {
        file_->write_tensor(dataset, host);
      } catch (...) {
        failure_ = std::current_exception();
      }
      return;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return queue_.size() < 2 || failure_; });
    if (failure_) return;
    queue_.emplace_back(std::move(dataset), std::move(host));
    changed_.notify_all();
  }
  void finish() {
    if (!file_) return;
    if (!inline_) stop();
    if (failure_) std::rethrow_exception(failure_);
  }

 private:
  void stop() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  void run() {
    io::quiet_hdf5_errors_on_this_thread();
    for (;;) {
      std::pair<std::string, Tensor> next;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return !queue_.empty() || done_; });
        if (queue_.empty()) return;
        next = std::move(queue_.front());
        queue_.pop_front();
        changed_.notify_all();
      }
      try {
        file_->write_tensor(next.first, next.second);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(mutex_);
        failure_ = std::current_exception();
        queue_.clear();
        changed_.notify_all();
        return;
      }
    }
  }

  io::H5File* file_;
  bool inline_ = false;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::pair<std::string, Tensor>> queue_;
  bool done_ = false;
  std::exception_ptr failure_;
};

// The body of a save, run by every rank; `file` is null on the ranks that do not write.
void write_contents(io::H5File* file, const nn::ModelConfig& config, nn::FlatParameters& params,
                    OptimizerState* optimizer, const TrainState& state) {
  const auto& named = params.parameters();
  if (file) write_model_attributes(*file, config);
  DatasetWriter writer(file);
  if (optimizer && optimizer->holds_parameters()) {
    for (size_t i = 0; i < named.size(); ++i)
      writer.write("/model/" + named[i].name,
                   optimizer->gather_parameter(params.offsets()[i], named[i].tensor->shape()));
  } else if (file) {
    for (const nn::NamedParameter& p : named) {
      const Tensor& t = *p.tensor;
      writer.write("/model/" + p.name, t.device().is_cpu() ? t : t.to(Device::cpu()));
    }
  }
  if (optimizer) {
    for (size_t i = 0; i < named.size(); ++i) {
      const std::string group = "/optimizer/" + named[i].name;
      writer.write(group + "/exp_avg", optimizer->gather(0, params.offsets()[i], named[i].tensor->shape()));
      writer.write(group + "/exp_avg_sq",
                   optimizer->gather(1, params.offsets()[i], named[i].tensor->shape()));
    }
  }
  writer.finish();
  if (optimizer) {
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
    file->set_attr("/train", "data_tokenizer", state.data_tokenizer);
  }
}

}  // namespace

Tensor OptimizerState::gather_parameter(int64_t, const Shape&) {
  throw_internal_error("this optimizer does not hold the parameters", __FILE__, __LINE__);
}
void OptimizerState::scatter_parameter(int64_t, const Tensor&) {
  throw_internal_error("this optimizer does not hold the parameters", __FILE__, __LINE__);
}

std::unique_ptr<OptimizerState> optimizer_state(optim::ZeroOptimizer& zero) {
  return std::make_unique<ZeroState>(zero);
}

std::unique_ptr<OptimizerState> optimizer_state(optim::AdamW& adamw) {
  return std::make_unique<WholeAdamW>(adamw);
}
std::unique_ptr<OptimizerState> optimizer_state(optim::ShardedOptimizer& sharded) {
  TT_CHECK(sharded.is_adamw(), "checkpoints hold AdamW state; this sharded optimizer is SGD");
  return std::make_unique<ShardedState>(sharded);
}

void save_checkpoint(const std::string& path, const nn::ModelConfig& config, nn::FlatParameters& params,
                     OptimizerState* optimizer, const TrainState& state, bool writer,
                     const std::function<void(const std::string&)>& check) {
  if (!writer) {
    write_contents(nullptr, config, params, optimizer, state);
    return;
  }
  // The check's own error is not a write error: it is passed on as it was thrown.
  std::exception_ptr check_error;
  const auto checked = [&](const std::string& tmp) {
    try {
      check(tmp);
    } catch (...) {
      check_error = std::current_exception();
      throw;
    }
  };
  try {
    io::atomic_write(
        path, [&](io::H5File& file) { write_contents(&file, config, params, optimizer, state); },
        check ? std::function<void(const std::string&)>(checked) : std::function<void(const std::string&)>());
  } catch (const OutOfMemory& e) {
    if (check_error) std::rethrow_exception(check_error);
    throw OutOfMemory("cannot write checkpoint " + path + ": " + e.what() +
                      (state.step > 0 ? "; earlier checkpoints are intact" : ""));
  } catch (const Error& e) {
    if (check_error) std::rethrow_exception(check_error);
    // A folder this process may not write to is the other common cause besides a full disk.
    const std::string folder = std::filesystem::path(path).parent_path().string();
    const bool writable = access(folder.empty() ? "." : folder.c_str(), W_OK) == 0;
    throw Error("cannot write checkpoint " + path +
                (writable ? " (disk full?): " : " (folder not writable): ") + e.what() +
                (state.step > 0 ? "; earlier checkpoints are intact" : ""));
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

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.9g", value);
  return text;
}

// A checkpoint opened for reading, with the checks that loading and verifying share. Every refusal is one
// line naming the file and the object.
class CheckedReader {
 public:
  explicit CheckedReader(const std::string& path)
      : path_(path),
        file_(io::H5File::open_read(path)),
        format_version_(file_.has_attr("/", "format_version") ? file_.attr_int("/", "format_version") : 1) {}
  const io::H5File& file() const { return file_; }

  Error error(const std::string& what) const { return Error("checkpoint " + path_ + ": " + what); }

  int64_t integer(const std::string& object, const std::string& name, int64_t min) const {
    const int64_t value = file_.attr_int(object, name);
    if (value < min) {
      throw error("attribute " + object + "@" + name + " is " + std::to_string(value) +
                  ", expected >= " + std::to_string(min));
    }
    return value;
  }

  double finite(const std::string& object, const std::string& name) const {
    const double value = file_.attr_double(object, name);
    if (!std::isfinite(value))
      throw error("attribute " + object + "@" + name + " is " + number(value) + ", expected a finite number");
    return value;
  }

  void require_group(const std::string& group) const {
    if (!file_.exists(group)) throw error(group + " is missing");
    if (file_.is_dataset(group)) throw error(group + " is a dataset, expected a group");
  }

  // f32 (any other type would be converted silently) and the parameter's shape.
  void check_dataset(const std::string& dataset, const Shape& expected) const {
    if (!file_.exists(dataset)) throw error("dataset " + dataset + " is missing");
    if (!file_.is_dataset(dataset)) throw error(dataset + " is not a dataset");
    const std::string dtype = file_.dataset_dtype(dataset);
    if (dtype != "float32") throw error("dataset " + dataset + " is " + dtype + ", expected float32");
    const Shape shape = file_.dataset_shape(dataset);
    if (shape != expected) {
      throw error("dataset " + dataset + " has shape " + shape_str(shape) + ", the model expects " +
                  shape_str(expected));
    }
    // Format 3 writes a checksum with every dataset: one without it would load unverified.
    if (format_version_ >= 3 && !file_.has_checksum(dataset))
      throw error("dataset " + dataset + " has no checksum (attribute crc32), which format 3 writes");
  }

  // Reads a checked dataset (its checksums verified) and refuses values that are not finite, or negative
  // where they must not be (a second moment).
  std::vector<float> read_values(const std::string& dataset, bool non_negative) const {
    std::vector<float> values = file_.read_floats(dataset);
    // One branch-free pass over the bits, which vectorises: exponent all ones is inf or NaN, and above the
    // sign bit alone is negative (-0 is fine). The element is looked for only when there is one.
    const uint32_t limit = non_negative ? 0x80000000u : 0xFFFFFFFFu;
    uint32_t bad = 0;
    for (const float v : values) {
      const uint32_t bits = std::bit_cast<uint32_t>(v);
      bad |= static_cast<uint32_t>((bits & 0x7F800000u) == 0x7F800000u) | static_cast<uint32_t>(bits > limit);
    }
    if (!bad) return values;
    const float lowest = non_negative ? 0.0f : -std::numeric_limits<float>::max();
    const float highest = std::numeric_limits<float>::max();
    for (size_t i = 0; i < values.size(); ++i) {
      if (values[i] >= lowest && values[i] <= highest) continue;
      throw error("dataset " + dataset + " holds " +
                  (std::isfinite(values[i]) ? "a negative value " : "a non-finite value ") +
                  number(values[i]) + " (element " + std::to_string(i) + ")");
    }
    return values;
  }

 private:
  std::string path_;
  io::H5File file_;
  int64_t format_version_;  // files from before the attribute are format 1
};

// The root attributes: a format this build reads and a consistent model configuration.
nn::ModelConfig read_config(const CheckedReader& reader) {
  const io::H5File& file = reader.file();
  const int64_t version = reader.integer("/", "format_version", 1);
  if (version > kFormatVersion) {
    throw Error("checkpoint " + file.path() +
                " was written by a newer version of tinytrain (format_version " + std::to_string(version) +
                "; this build reads versions 1 to " + std::to_string(kFormatVersion) + ")");
  }
  nn::ModelConfig c;
  c.vocab_size = reader.integer("/", "vocab_size", 1);
  c.context_length = reader.integer("/", "context_length", 1);
  c.d_model = reader.integer("/", "d_model", 1);
  c.num_layers = reader.integer("/", "num_layers", 1);
  c.num_heads = reader.integer("/", "num_heads", 1);
  c.d_ff = reader.integer("/", "d_ff", 1);
  c.rope_theta = reader.finite("/", "rope_theta");
  if (c.rope_theta <= 0)
    throw reader.error("attribute /@rope_theta is " + number(c.rope_theta) + ", expected > 0");
  // Recorded since checkpoints can be imported from models trained with another epsilon; older files were
  // all written by models using the default.
  if (file.has_attr("/", "norm_eps")) {
    c.norm_eps = reader.finite("/", "norm_eps");
    if (c.norm_eps <= 0)
      throw reader.error("attribute /@norm_eps is " + number(c.norm_eps) + ", expected > 0");
  }
  // Not part of the file's identity (the run's flags choose them), but a value this build does not know
  // means a file it does not understand.
  auto known = [&](const char* name, auto parse) {
    const std::string value = file.attr_string("/", name);
    try {
      parse(value);
    } catch (const Error& e) {
      throw reader.error(std::string("attribute /@") + name + ": " + e.what());
    }
  };
  known("precision", nn::parse_precision);
  known("attention", nn::parse_attention);
  try {
    c.validate();
  } catch (const Error& e) {
    throw reader.error(e.what());
  }
  return c;
}

// The configuration's parameters, as the file must hold them in /model. The model object holds shapes only.
std::vector<std::pair<std::string, Shape>> expected_parameters(const CheckedReader& reader,
                                                               const nn::ModelConfig& config) {
  reader.require_group("/model");
  // Every layer has datasets of its own; a damaged layer count must not build millions of layers.
  const size_t stored = reader.file().children("/model").size();
  if (static_cast<uint64_t>(config.num_layers) > stored) {
    throw reader.error("attribute /@num_layers is " + std::to_string(config.num_layers) +
                       " but /model holds " + std::to_string(stored) + " datasets");
  }
  nn::TransformerLM model(config);
  std::vector<std::pair<std::string, Shape>> expected;
  for (const nn::NamedParameter& p : model.named_parameters())
    expected.emplace_back(p.name, p.tensor->shape());
  return expected;
}

void check_optimizer_attributes(const CheckedReader& reader) {
  reader.require_group("/optimizer");
  reader.integer("/optimizer", "step", 0);
  for (const char* name : {"lr", "beta1", "beta2", "eps", "weight_decay"}) reader.finite("/optimizer", name);
}

void check_train_attributes(const CheckedReader& reader) {
  reader.require_group("/train");
  reader.integer("/train", "step", 0);
  // A uint64 stored as int64: any value.
  reader.integer("/train", "rng_seed", std::numeric_limits<int64_t>::min());
  reader.integer("/train", "rng_counter", 0);
  reader.integer("/train", "tokens_seen", 0);
  reader.file().attr_string("/train", "args");
}

std::string moment_dataset(const std::string& name, int which) {
  return "/optimizer/" + name + (which == 0 ? "/exp_avg" : "/exp_avg_sq");
}

nn::ModelConfig read_checkpoint_config_unnamed(const std::string& path) {
  const CheckedReader reader(path);
  const nn::ModelConfig config = read_config(reader);
  // The sizes must describe the datasets, so that nobody allocates a model from a damaged attribute.
  for (const auto& [name, shape] : expected_parameters(reader, config))
    reader.check_dataset("/model/" + name, shape);
  return config;
}

// weights_only: `optimizer` only receives the parameters it holds, not its state.
void load_checkpoint_unnamed(const std::string& path, nn::FlatParameters& params, OptimizerState* optimizer,
                             TrainState* state, const SharedRead* shared, bool weights_only = false) {
  OptimizerState* holder = optimizer && optimizer->holds_parameters() ? optimizer : nullptr;
  if (weights_only) optimizer = nullptr;
  const CheckedReader reader(path);
  const io::H5File& file = reader.file();
  read_config(reader);
  const auto& named = params.parameters();
  // Check every dataset (and the optimizer's and trainer's attributes) first, so a file that does not fit
  // changes nothing. What is there is checked even when not loaded: a file with a damaged part is damaged.
  for (const nn::NamedParameter& p : named) reader.check_dataset("/model/" + p.name, p.tensor->shape());
  if (optimizer && !file.exists("/optimizer"))
    throw Error("checkpoint " + path + " has no optimizer state (/optimizer)");
  if (file.exists("/optimizer")) {
    check_optimizer_attributes(reader);
    for (const nn::NamedParameter& p : named) {
      for (int which = 0; which < 2; ++which)
        reader.check_dataset(moment_dataset(p.name, which), p.tensor->shape());
    }
  }
  if (state || file.exists("/train")) check_train_attributes(reader);
  // A dataset's values as a tensor of `like`'s dtype: read here (on the host), or, shared, read by the rank
  // with the fewest bytes read so far and broadcast on `like`'s device.
  std::vector<int64_t> bytes_read(shared ? static_cast<size_t>(shared->world) : 1, 0);
  auto values = [&](const std::string& dataset, const Tensor& like, bool non_negative) {
    const auto least = std::min_element(bytes_read.begin(), bytes_read.end());
    const int root = static_cast<int>(least - bytes_read.begin());
    *least += like.numel();
    const bool reads = !shared || root == shared->rank;
    Tensor t;
    if (reads) {
      t = Tensor::from_floats(reader.read_values(dataset, non_negative), like.shape());
      if (like.dtype() != DType::f32) t = ops::cast(t, like.dtype());
    }
    if (!shared) return t;
    t = reads ? t.to(like.device()) : Tensor::empty(like.shape(), like.dtype(), like.device());
    shared->broadcast(t, root);
    return t;
  };
  for (size_t i = 0; i < named.size(); ++i) {
    const nn::NamedParameter& p = named[i];
    const Tensor value = values("/model/" + p.name, *p.tensor, false);
    if (holder) {
      holder->scatter_parameter(params.offsets()[i], value);
    } else {
      p.tensor->copy_(value.to(p.tensor->device()));
    }
  }
  if (optimizer) {
    for (size_t i = 0; i < named.size(); ++i) {
      for (int which = 0; which < 2; ++which) {
        const Tensor value = values(moment_dataset(named[i].name, which), *named[i].tensor, which == 1);
        optimizer->scatter(which, params.offsets()[i], value);
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
    state->data_tokenizer =
        file.has_attr("/train", "data_tokenizer") ? file.attr_string("/train", "data_tokenizer") : "";
  }
}

int64_t verify_checkpoint_unnamed(const std::string& path, bool weights_only) {
  const CheckedReader reader(path);
  const nn::ModelConfig config = read_config(reader);
  const auto expected = expected_parameters(reader, config);
  // Everything that is cheap first: the layout and the attributes, then every value.
  for (const auto& [name, shape] : expected) reader.check_dataset("/model/" + name, shape);
  if (!weights_only) {
    check_optimizer_attributes(reader);
    for (const auto& [name, shape] : expected) {
      for (int which = 0; which < 2; ++which) reader.check_dataset(moment_dataset(name, which), shape);
    }
    check_train_attributes(reader);
  }
  for (const auto& [name, shape] : expected) reader.read_values("/model/" + name, false);
  if (!weights_only) {
    for (const auto& [name, shape] : expected) {
      for (int which = 0; which < 2; ++which) reader.read_values(moment_dataset(name, which), which == 1);
    }
  }
  return reader.file().exists("/train") ? reader.integer("/train", "step", 0) : -1;
}

void read_parameters_unnamed(const std::string& path, const ParameterVisitor& visit) {
  const CheckedReader reader(path);
  const nn::ModelConfig config = read_config(reader);
  const auto expected = expected_parameters(reader, config);
  for (const auto& [name, shape] : expected) reader.check_dataset("/model/" + name, shape);
  for (const auto& [name, shape] : expected) visit(name, shape, reader.read_values("/model/" + name, false));
}

std::string read_args_unnamed(const std::string& path) {
  const CheckedReader reader(path);
  read_config(reader);
  if (!reader.file().exists("/train")) return "";
  check_train_attributes(reader);
  return reader.file().attr_string("/train", "args");
}

}  // namespace

nn::ModelConfig read_checkpoint_config(const std::string& path) {
  return naming_file(path, [&] { return read_checkpoint_config_unnamed(path); });
}

void load_checkpoint(const std::string& path, nn::FlatParameters& params, OptimizerState* optimizer,
                     TrainState* state, const SharedRead* shared) {
  naming_file(path, [&] { load_checkpoint_unnamed(path, params, optimizer, state, shared); });
}

void load_checkpoint_weights(const std::string& path, nn::FlatParameters& params, OptimizerState* optimizer,
                             const SharedRead* shared) {
  naming_file(path, [&] { load_checkpoint_unnamed(path, params, optimizer, nullptr, shared, true); });
}

int64_t verify_checkpoint(const std::string& path, bool weights_only) {
  return naming_file(path, [&] { return verify_checkpoint_unnamed(path, weights_only); });
}

void read_checkpoint_parameters(const std::string& path, const ParameterVisitor& visit) {
  naming_file(path, [&] { read_parameters_unnamed(path, visit); });
}

std::string read_checkpoint_args(const std::string& path) {
  return naming_file(path, [&] { return read_args_unnamed(path); });
}

std::string read_checkpoint_data_tokenizer(const std::string& path) {
  return naming_file(path, [&] {
    const CheckedReader reader(path);
    const io::H5File& file = reader.file();
    if (!file.exists("/train") || !file.has_attr("/train", "data_tokenizer")) return std::string();
    return file.attr_string("/train", "data_tokenizer");
  });
}

std::string recorded_flag(const std::string& args, const std::string& name) {
  std::istringstream in(args);
  std::string token;
  while (in >> std::quoted(token)) {
    if (token != "--" + name) continue;
    // An empty value was recorded as nothing: the next token is the next flag.
    std::string value;
    const bool quoted = (in >> std::ws).peek() == '"';
    return (in >> std::quoted(value)) && (quoted || value.rfind("--", 0) != 0) ? value : "";
  }
  return "";
}

std::string recorded_args_line(const std::vector<std::pair<std::string, std::string>>& flags) {
  std::ostringstream out;
  for (const auto& [name, value] : flags) {
    out << name << ' ';
    if (value.find_first_of(" \t\n\"\\") == std::string::npos)
      out << value;
    else
      out << std::quoted(value);
    out << ' ';
  }
  return out.str();
}

std::string training_data_folder(const std::string& checkpoint) {
  const std::string args = read_checkpoint_args(checkpoint);
  if (args.empty()) return "";
  std::string data = recorded_flag(args, "data");
  if (data.empty()) data = kBuiltinDataDir;
  namespace fs = std::filesystem;
  const fs::path recorded(data), out(recorded_flag(args, "out"));
  // A relative path was relative to where that run started: found from the checkpoint's place in its run
  // folder (RUN/checkpoints/step_N.h5, RUN as --out gave it) first, then from here.
  if (recorded.is_absolute() || out.empty() || out.is_absolute()) return data;
  fs::path base = fs::absolute(checkpoint).lexically_normal().parent_path().parent_path();
  fs::path part = out.lexically_normal();
  if (!part.has_filename()) part = part.parent_path();  // "runs/x/"
  for (; !part.empty() && part != "."; part = part.parent_path()) {
    if (base.filename() != part.filename()) return data;
    base = base.parent_path();
  }
  const fs::path there = (base / recorded).lexically_normal();
  return fs::exists(there / "meta.json") ? there.string() : data;
}

void check_training_tokenizer(const std::string& checkpoint, const std::string& data_dir,
                              const std::string& remedy) {
  const std::string trained = read_checkpoint_data_tokenizer(checkpoint);
  const std::optional<DataMeta> meta = read_meta(data_dir);
  if (trained.empty() || !meta) return;
  const std::string now = data_tokenizer_id(*meta);
  TT_CHECK(same_data_tokenizer(now, trained), data_dir + " holds tokens of " + now + ", but " + checkpoint +
                                                  " was trained on tokens of " + trained +
                                                  " (was the folder prepared again since?); " + remedy);
}

void write_initial_checkpoint(const std::string& path, const nn::ModelConfig& config,
                              const ParameterSource& parameter, const TrainState& state) {
  config.validate();
  nn::TransformerLM model(config);  // shapes only
  const optim::AdamWOptions options;
  try {
    io::atomic_write(path, [&](io::H5File& file) {
      write_model_attributes(file, config);
      for (const nn::NamedParameter& p : model.named_parameters()) {
        const Shape& shape = p.tensor->shape();
        const Tensor value = parameter(p.name, shape);
        TT_ASSERT(value.shape() == shape, "parameter " + p.name + " came as " + shape_str(value.shape()) +
                                              ", expected " + shape_str(shape));
        file.write_tensor("/model/" + p.name, value);
        // A fresh AdamW: both moments zero, as the first step expects them.
        const Tensor zeros = Tensor::zeros(shape, DType::f32);
        file.write_tensor(moment_dataset(p.name, 0), zeros);
        file.write_tensor(moment_dataset(p.name, 1), zeros);
      }
      file.set_attr("/optimizer", "step", int64_t{0});
      file.set_attr("/optimizer", "lr", options.lr);
      file.set_attr("/optimizer", "beta1", options.beta1);
      file.set_attr("/optimizer", "beta2", options.beta2);
      file.set_attr("/optimizer", "eps", options.eps);
      file.set_attr("/optimizer", "weight_decay", options.weight_decay);
      file.set_attr("/train", "step", state.step);
      file.set_attr("/train", "rng_seed", static_cast<int64_t>(state.rng_seed));
      file.set_attr("/train", "rng_counter", static_cast<int64_t>(state.rng_counter));
      file.set_attr("/train", "tokens_seen", state.tokens_seen);
      file.set_attr("/train", "args", state.args);
      file.set_attr("/train", "data_tokenizer", state.data_tokenizer);
    });
  } catch (const Error& e) {
    // The source's own refusals (a missing tensor, say) pass unchanged; a failed write names the file.
    const std::string message = e.what();
    if (message.rfind("HDF5 error", 0) != 0) throw;
    throw Error("cannot write checkpoint " + path + " (disk full?): " + message);
  }
}

nn::ModelConfig config_for_checkpoint(const std::string& path, const nn::ModelConfig& run, bool resume) {
  const nn::ModelConfig saved = read_checkpoint_config(path);
  const std::pair<const char*, std::pair<int64_t, int64_t>> fields[] = {
      {"--vocab", {saved.vocab_size, run.vocab_size}},
      {"--ctx", {resume ? saved.context_length : run.context_length, run.context_length}},
      {"--d-model", {saved.d_model, run.d_model}},
      {"--layers", {saved.num_layers, run.num_layers}},
      {"--heads", {saved.num_heads, run.num_heads}},
      {"--d-ff", {saved.d_ff, run.d_ff}}};
  for (const auto& [flag, values] : fields) {
    // The model's sizes may come from --preset rather than their own flags.
    const bool shape = std::string(flag) != "--vocab" && std::string(flag) != "--ctx";
    TT_CHECK(values.first == values.second,
             std::string(flag) + " " + std::to_string(values.second) +
                 (shape ? " (the preset's or given)" : "") + " differs from the checkpoint " + path + " (" +
                 std::to_string(values.first) + "); pass " + flag + " " + std::to_string(values.first) +
                 (shape ? " or the --preset it was trained with" : "") +
                 (resume ? " to resume it" : " to start from it"));
  }
  nn::ModelConfig config = run;
  config.rope_theta = saved.rope_theta;
  config.norm_eps = saved.norm_eps;
  return config;
}

}  // namespace tt::app
