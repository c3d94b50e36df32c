// Training checkpoints in one HDF5 file (README.md's "Checkpoint format"):
//   /model/<parameter name>: f32, PyTorch shape
//   /optimizer/<parameter name>/exp_avg, exp_avg_sq: f32; attributes step, lr, beta1, beta2, eps and
//      weight_decay
//   /train: attributes step, rng_seed, rng_counter, tokens_seen, args, data_tokenizer (since it is recorded)
//   /: attributes, the model configuration (norm_eps since it is recorded; files without it mean 1e-5) and
//      format_version
// Written atomically (temporary file, fsync, rename), every dataset with the CRC-32 of its bytes (format 3;
// files of format 2, Fletcher32 per chunk, and 1, without checksums, still load). Reading refuses, in one
// line naming the file and the object, what does not fit: a missing, mis-typed or mis-shaped dataset, an
// attribute of the wrong type or range, a newer format, damaged data (checksum mismatch) and values that are
// not finite.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nn/transformer.h"
#include "optim/optimizer.h"
#include "optim/sharded_optimizer.h"
#include "optim/zero_optimizer.h"

namespace tt::app {

struct TrainState {
  int64_t step = 0;
  uint64_t rng_seed = 0, rng_counter = 0;
  int64_t tokens_seen = 0;
  std::string args;  // the flags of the run that wrote it
  // The training data's tokenizer as its meta.json described it when the run started (data_tokenizer_id);
  // "" when unknown (no meta.json, or a file written before it was recorded).
  std::string data_tokenizer;
};

// What a checkpoint needs from the optimizer, whether its state is whole on every rank (AdamW over the flat
// buffer) or sliced across ranks (ZeRO-1). The file layout is the same either way, so a checkpoint loads at
// any world size, sharded or not.
class OptimizerState {
 public:
  virtual ~OptimizerState() = default;
  virtual int64_t step_count() const = 0;
  virtual void set_step_count(int64_t step) = 0;
  virtual double lr() const = 0;
  virtual const optim::AdamWOptions& options() const = 0;
  // The full exp_avg (which = 0) or exp_avg_sq (1) of the parameter at [offset, offset + numel(shape)),
  // as a host tensor. Collective when sharded: every rank calls it for every parameter in order.
  virtual Tensor gather(int which, int64_t offset, const Shape& shape) = 0;
  // Takes this rank's part of a parameter's full state (on the host, or on the device when the ranks load
  // together: SharedRead).
  virtual void scatter(int which, int64_t offset, const Tensor& full) = 0;
  // Whether the optimizer holds the parameters' master copy (ZeRO-2/3: shards); then checkpoints read and
  // write them through the two calls below (the same contract as gather and scatter), else through the
  // model's parameter tensors.
  virtual bool holds_parameters() const { return false; }
  virtual Tensor gather_parameter(int64_t offset, const Shape& shape);
  virtual void scatter_parameter(int64_t offset, const Tensor& full);
};
std::unique_ptr<OptimizerState> optimizer_state(optim::AdamW& adamw);
std::unique_ptr<OptimizerState> optimizer_state(optim::ShardedOptimizer& sharded);
std::unique_ptr<OptimizerState> optimizer_state(optim::ZeroOptimizer& zero);

// Every rank calls it (sharded parameters and state are gathered parameter by parameter, never whole on
// one rank); only the rank with `writer` set writes the file. `check` (optional, the writer's): run on the
// written temporary file before it takes `path`'s name (train verifies it there, so a step_N.h5 in a run
// folder is always a verified one); what it throws propagates as thrown.
void save_checkpoint(const std::string& path, const nn::ModelConfig& config, nn::FlatParameters& params,
                     OptimizerState* optimizer, const TrainState& state, bool writer = true,
                     const std::function<void(const std::string&)>& check = {});

// The model configuration stored in a checkpoint (precision and attention are not part of the file's
// identity and keep their defaults), once it is known to describe the file's /model datasets (f32, their
// shapes), so a model built from it fits them.
nn::ModelConfig read_checkpoint_config(const std::string& path);

// Ranks loading one checkpoint together (every rank calls the load): each dataset is read and verified by
// one rank alone, the one with the fewest bytes so far (the same choice on every rank: it depends on the
// shapes only), and broadcast to the others, so the file is read once in all instead of once per rank.
struct SharedRead {
  int rank = 0, world = 1;
  std::function<void(Tensor& tensor, int root)> broadcast;  // collective, on the tensor's device
};

// Loads parameters (and optimizer and train state when given) into a model of the same shape. A file that
// does not fit (layout, types, shapes, attributes) changes nothing; data found damaged or not finite while
// reading throws with the model partly loaded, so the caller must not use it then. With `shared`, a rank
// that finds damage throws and the others block in a broadcast that never completes: the caller must end
// the whole job (dist::abort_job).
void load_checkpoint(const std::string& path, nn::FlatParameters& params, OptimizerState* optimizer,
                     TrainState* state, const SharedRead* shared = nullptr);
// The parameters only (a run that starts from a checkpoint's weights), through `optimizer` when it holds
// them (ZeRO-2/3), else into the model's tensors.
void load_checkpoint_weights(const std::string& path, nn::FlatParameters& params, OptimizerState* optimizer,
                             const SharedRead* shared = nullptr);

// Whether `path` is a checkpoint `train` can resume from: the layout and every attribute checked as loading
// does, then every dataset of /model and /optimizer read (one at a time, so memory is bounded by the
// largest; its checksums verified) and its values checked finite. Throws tt::Error naming the first problem.
// With `weights_only`, the /model part alone (what evaluation and generation read). Returns /train's step
// (-1 when the file has no /train).
int64_t verify_checkpoint(const std::string& path, bool weights_only = false);

// Each /model parameter of the checkpoint in the model's order, one at a time (memory bounded by the
// largest), checked as loading checks it (layout, type, shape, checksums, finite values).
using ParameterVisitor =
    std::function<void(const std::string& name, const Shape& shape, const std::vector<float>& values)>;
void read_checkpoint_parameters(const std::string& path, const ParameterVisitor& visit);

// /train's args (the flags of the run that wrote it); "" when the file has no /train.
std::string read_checkpoint_args(const std::string& path);
// The value of `--name` in such recorded flags ("--a 1 --b x ..."), or "" when absent or empty.
std::string recorded_flag(const std::string& args, const std::string& name);
// Flags as recorded: "--name value " each, a value with a blank or a quote in double quotes (as std::quoted
// writes it; recorded_flag reads it back whole).
std::string recorded_args_line(const std::vector<std::pair<std::string, std::string>>& flags);
// /train's data_tokenizer; "" when the file has none.
std::string read_checkpoint_data_tokenizer(const std::string& path);

// The data folder the checkpoint's run trained on, as `train` resolved it ("" when the file records no run).
// A relative path was relative to train's working folder: tried from here, then from that folder as the
// checkpoint's place tells it (RUN/checkpoints/step_N.h5, RUN being the recorded --out).
std::string training_data_folder(const std::string& checkpoint);
// Throws one line when the tokenizer `data_dir`'s meta.json describes is not the one the checkpoint's run
// trained with (the folder was prepared again since, say), ending with `remedy`; passes when either is
// unknown.
void check_training_tokenizer(const std::string& checkpoint, const std::string& data_dir,
                              const std::string& remedy);

// Writes (atomically) a checkpoint of `config`'s model at step 0 with zero AdamW state, whose parameters come
// from `parameter` one at a time (a host f32 tensor of the shape asked for): what `import` writes, which
// `train --resume` continues and verify_checkpoint accepts. `state` fills /train.
using ParameterSource = std::function<Tensor(const std::string& name, const Shape& shape)>;
void write_initial_checkpoint(const std::string& path, const nn::ModelConfig& config,
                              const ParameterSource& parameter, const TrainState& state);

// For a run that starts from a checkpoint: `run` (the configuration of the run's flags) with the
// checkpoint's RoPE theta and RMSNorm epsilon, which no flag sets, once its sizes are the checkpoint's (else
// one line naming the flag to pass). Resuming (`resume`) needs the same context length too (every recorded
// window depends on it); a run from the weights alone (train --init-from) may change it (RoPE has no learned
// positions). Build the model from the result, then load_checkpoint.
nn::ModelConfig config_for_checkpoint(const std::string& path, const nn::ModelConfig& run, bool resume);

}  // namespace tt::app
