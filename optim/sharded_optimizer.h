// ZeRO stage 1: the optimizer state is sharded across data-parallel ranks. The flat parameter buffer (padded
// to a multiple of the world size) is cut into equal contiguous slices; rank r owns slice r's optimizer
// state (AdamW's moments; SGD has none, so only its update is sharded).
// A step reduce-scatters the gradients (averaged) so each rank receives only its slice, updates that slice
// of the parameters, and all-gathers the updated slices so every rank again holds the full model. Optimizer
// memory per rank falls by the world size; the result equals the unsharded optimizer's.
//
// The update and the gather are pipelined: the slice is updated in chunks, and each chunk's all-gather
// starts as soon as the chunk is written, so the gather of chunk k runs while chunk k+1 is updated (on
// CUDA the update runs on the compute stream, the gathers on the communication stream).
#pragma once

#include <memory>

#include "nn/module.h"
#include "optim/optimizer.h"

namespace tt::optim {

// The collectives ZeRO needs (ShardedOptimizer here, ZeroOptimizer in zero_optimizer.h), implemented by dist/
// over its communicators (optim does not depend on dist).
class ShardCollectives {
 public:
  // A collective in flight; wait() orders later work after it (CUDA) or blocks until it is done (CPU).
  class Pending {
   public:
    virtual ~Pending() = default;
    virtual void wait() = 0;
  };

  virtual ~ShardCollectives() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // output (n) = average over ranks of input[rank * n, rank * n + n); output may be that very block.
  virtual void reduce_scatter_avg(const Tensor& input, Tensor& output) = 0;
  // output (world * n) = concatenation of every rank's input (n); input may be output's own block.
  virtual void all_gather(const Tensor& input, Tensor& output) = 0;
  virtual void all_reduce_sum(Tensor& tensor) = 0;
  // Asynchronous forms (ZeRO-2/3 overlap them with backward and forward); the tensors stay alive until
  // wait(). Not in place: output and input are separate buffers.
  virtual std::unique_ptr<Pending> reduce_scatter_avg_async(const Tensor& input, Tensor& output) = 0;
  virtual std::unique_ptr<Pending> all_gather_async(const Tensor& input, Tensor& output) = 0;
  // In place in the contiguous `buffer`: rank r's block is the `count` elements from offset + r * stride;
  // afterwards every rank holds every rank's block.
  virtual std::unique_ptr<Pending> all_gather_blocks_async(Tensor& buffer, int64_t offset, int64_t count,
                                                           int64_t stride) = 0;
};

struct SgdOptions {
  double lr = 1e-2;
};

// ZeRO-1 around AdamW (the state that matters: two moments per parameter) or SGD (stateless: only the
// update is sharded).
class ShardedOptimizer {
 public:
  // `params` must have been built with padding to a multiple of the world size (FlatParameters'
  // pad_multiple), so that every slice has the same length.
  ShardedOptimizer(nn::FlatParameters& params, ShardCollectives& comm, const AdamWOptions& options = {});
  ShardedOptimizer(nn::FlatParameters& params, ShardCollectives& comm, const SgdOptions& options);

  // Averages gradients across ranks into this rank's slice (a reduce-scatter after backward, instead of a
  // DDP all-reduce), clips by the global norm when max_norm > 0 (returns the norm), updates the slice and
  // gathers the parameters. gradients_averaged: a data-parallel all-reduce (dist::DataParallel, which can
  // overlap it with backward) has already left the average in the whole gradient buffer, so the
  // reduce-scatter is skipped and the slice is read where it lies.
  // measure_norm = false with max_norm <= 0 skips the norm (and its read-back to the host); returns NaN.
  // A norm that is not finite is returned without any update (parameters and state unchanged).
  double step(double max_norm, bool gradients_averaged = false, bool measure_norm = true);
  // Elements per pipelined chunk of the update + all-gather (default 2^25 = 128 MiB of f32 per rank).
  void set_gather_chunk(int64_t elements);
  int64_t gather_chunk() const { return gather_chunk_; }
  void set_lr(double lr) { inner_->set_lr(lr); }
  double lr() const { return inner_->lr(); }
  int64_t step_count() const { return adamw_ ? adamw_->step_count() : steps_; }
  void set_step_count(int64_t step);

  int64_t shard_begin() const { return shard_begin_; }  // element range of this rank's slice
  int64_t shard_size() const { return shard_size_; }
  bool is_adamw() const { return adamw_ != nullptr; }
  // The AdamW state of this rank's slice (throws for SGD).
  Tensor& shard_exp_avg() { return adamw().exp_avg()[0]; }
  Tensor& shard_exp_avg_sq() { return adamw().exp_avg_sq()[0]; }
  const AdamWOptions& options() const;
  // Bytes of optimizer state held by this rank (measured from the tensors, not computed from a formula).
  int64_t state_bytes() const;
  ShardCollectives& collectives() { return comm_; }

 private:
  void slice();  // this rank's views of the flat parameter and gradient buffers
  AdamW& adamw() const;
  void update_and_gather();

  nn::FlatParameters& params_;
  ShardCollectives& comm_;
  int64_t shard_begin_ = 0, shard_size_ = 0;
  int64_t gather_chunk_ = int64_t{1} << 25;
  int64_t steps_ = 0;  // SGD's step count (AdamW keeps its own)
  Tensor shard_params_, shard_grads_;
  std::unique_ptr<Optimizer> inner_;
  AdamW* adamw_ = nullptr;  // inner_ when it is AdamW
};

}  // namespace tt::optim
