// Training checkpoints in one HDF5 file (DESIGN.md):
//   /model/<parameter name>                      f32, PyTorch shape
//   /optimizer/<parameter name>/exp_avg|exp_avg_sq  f32, and attributes step, lr, beta1, beta2, eps,
//   weight_decay /train                                        attributes step, rng_seed, rng_counter,
//   tokens_seen, args /                                             attributes: the model configuration,
//   format_version
// Written atomically (temporary file, fsync, rename); loading checks every dataset and names the first one
// that is missing or mis-shaped.
#pragma once

#include <string>

#include <memory>

#include "nn/transformer.h"
#include "optim/optimizer.h"
#include "optim/sharded_optimizer.h"

namespace tt::app {

struct TrainState {
  int64_t step = 0;
  uint64_t rng_seed = 0, rng_counter = 0;
  int64_t tokens_seen = 0;
  std::string args;  // the flags of the run that wrote it
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
  // Takes this rank's part of a parameter's full state (a host tensor every rank read).
  virtual void scatter(int which, int64_t offset, const Tensor& full) = 0;
};
std::unique_ptr<OptimizerState> optimizer_state(optim::AdamW& adamw);
std::unique_ptr<OptimizerState> optimizer_state(optim::ShardedOptimizer& sharded);

// Every rank calls it (sharded state is gathered parameter by parameter, never whole on one rank); only the
// rank with `writer` set writes the file.
void save_checkpoint(const std::string& path, const nn::ModelConfig& config, nn::FlatParameters& params,
                     OptimizerState* optimizer, const TrainState& state, bool writer = true);

// The model configuration stored in a checkpoint (precision and attention are not part of the file's
// identity and keep their defaults).
nn::ModelConfig read_checkpoint_config(const std::string& path);

// Loads parameters (and optimizer and train state when given) into a model of the same shape.
void load_checkpoint(const std::string& path, nn::FlatParameters& params, OptimizerState* optimizer,
                     TrainState* state);

// Deletes all but the newest `keep` files named step_N.h5 with N <= up_to_step in `dir` (keep <= 0 keeps
// everything).
void prune_checkpoints(const std::string& dir, int64_t keep, int64_t up_to_step);

}  // namespace tt::app
