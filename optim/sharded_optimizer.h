// ZeRO stage 1: the optimizer state is sharded across data-parallel ranks. The flat parameter buffer (padded
// to a multiple of the world size) is cut into equal contiguous slices; rank r owns slice r's AdamW state.
// A step reduce-scatters the gradients (averaged) so each rank receives only its slice, updates that slice
// of the parameters, and all-gathers the updated slices so every rank again holds the full model. Optimizer
// memory per rank falls by the world size; the result equals unsharded AdamW.
#pragma once

#include <memory>

#include "nn/module.h"
#include "optim/optimizer.h"

namespace tt::optim {

// The collectives ZeRO needs, implemented by dist/ over its communicators (optim does not depend on dist).
class ShardCollectives {
 public:
  virtual ~ShardCollectives() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // output (n) = average over ranks of input[rank * n, rank * n + n); output may be that very block.
  virtual void reduce_scatter_avg(const Tensor& input, Tensor& output) = 0;
  // output (world * n) = concatenation of every rank's input (n); input may be output's own block.
  virtual void all_gather(const Tensor& input, Tensor& output) = 0;
  virtual void all_reduce_sum(Tensor& tensor) = 0;
};

class ShardedAdamW {
 public:
  // `params` must have been built with padding to a multiple of the world size (FlatParameters'
  // pad_multiple), so that every slice has the same length.
  ShardedAdamW(nn::FlatParameters& params, ShardCollectives& comm, const AdamWOptions& options = {});

  // Averages gradients across ranks into this rank's slice (a reduce-scatter after backward, instead of a
  // DDP all-reduce), clips by the global norm when max_norm > 0 (returns the norm), updates the slice and
  // gathers the parameters. gradients_averaged: a data-parallel all-reduce (dist::DataParallel, which can
  // overlap it with backward) has already left the average in the whole gradient buffer, so the
  // reduce-scatter is skipped and the slice is read where it lies.
  double step(double max_norm, bool gradients_averaged = false);
  void set_lr(double lr) { inner_->set_lr(lr); }
  double lr() const { return inner_->lr(); }
  int64_t step_count() const { return inner_->step_count(); }
  void set_step_count(int64_t step) { inner_->set_step_count(step); }

  int64_t shard_begin() const { return shard_begin_; }  // element range of this rank's slice
  int64_t shard_size() const { return shard_size_; }
  Tensor& shard_exp_avg() { return inner_->exp_avg()[0]; }
  Tensor& shard_exp_avg_sq() { return inner_->exp_avg_sq()[0]; }
  const AdamWOptions& options() const { return inner_->options(); }
  // Bytes of optimizer state held by this rank (measured from the tensors, not computed from a formula).
  int64_t state_bytes() const;
  ShardCollectives& collectives() { return comm_; }

 private:
  nn::FlatParameters& params_;
  ShardCollectives& comm_;
  int64_t shard_begin_ = 0, shard_size_ = 0;
  Tensor shard_params_, shard_grads_;
  std::unique_ptr<AdamW> inner_;
};

}  // namespace tt::optim
