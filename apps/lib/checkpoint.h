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

#include "nn/transformer.h"
#include "optim/optimizer.h"

namespace tt::app {

struct TrainState {
  int64_t step = 0;
  uint64_t rng_seed = 0, rng_counter = 0;
  int64_t tokens_seen = 0;
  std::string args;  // the flags of the run that wrote it
};

void save_checkpoint(const std::string& path, const nn::ModelConfig& config, nn::FlatParameters& params,
                     optim::AdamW* optimizer, const TrainState& state);

// The model configuration stored in a checkpoint (precision and attention are not part of the file's
// identity and keep their defaults).
nn::ModelConfig read_checkpoint_config(const std::string& path);

// Loads parameters (and optimizer and train state when given) into a model of the same shape.
void load_checkpoint(const std::string& path, nn::FlatParameters& params, optim::AdamW* optimizer,
                     TrainState* state);

// Deletes all but the newest `keep` files named step_N.h5 in `dir` (keep <= 0 keeps everything).
void prune_checkpoints(const std::string& dir, int64_t keep);

}  // namespace tt::app
