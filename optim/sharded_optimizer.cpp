#include "optim/sharded_optimizer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/ops.h"

namespace tt::optim {

ShardedOptimizer::ShardedOptimizer(nn::FlatParameters& params, ShardCollectives& comm,
                                   const AdamWOptions& options)
    : params_(params), comm_(comm) {
  slice();
  auto adamw = std::make_unique<AdamW>(std::vector<Tensor>{shard_params_}, options);
  adamw_ = adamw.get();
  inner_ = std::move(adamw);
}

ShardedOptimizer::ShardedOptimizer(nn::FlatParameters& params, ShardCollectives& comm,
                                   const SgdOptions& options)
    : params_(params), comm_(comm) {
  slice();
  inner_ = std::make_unique<SGD>(std::vector<Tensor>{shard_params_}, options.lr);
}

void ShardedOptimizer::slice() {
  const int64_t total = params_.flat_params().numel();
  const int world = comm_.world_size();
  TT_ASSERT(total % world == 0, "ShardedOptimizer: the flat buffer (" + std::to_string(total) +
                                    " elements) must be padded to a multiple of the world size " +
                                    std::to_string(world) + " (FlatParameters pad_multiple)");
  shard_size_ = total / world;
  shard_begin_ = shard_size_ * comm_.rank();
  // The slice of the parameters this rank updates and its gradient are views of the flat buffers: the
  // reduce-scatter and the all-gather work in place, so ZeRO adds no buffer of the model's size. The inner
  // optimizer holds state for the slice only.
  shard_params_ = params_.flat_params().narrow_view(0, shard_begin_, shard_size_);
  shard_params_.set_requires_grad(true);
  shard_grads_ = params_.flat_grads().narrow_view(0, shard_begin_, shard_size_);
  shard_params_.set_grad(shard_grads_);
}

AdamW& ShardedOptimizer::adamw() const {
  TT_CHECK(adamw_ != nullptr, "ShardedOptimizer: this shards SGD, which has no AdamW state");
  return *adamw_;
}

const AdamWOptions& ShardedOptimizer::options() const {
  return adamw().options();
}

void ShardedOptimizer::set_step_count(int64_t step) {
  if (adamw_) {
    adamw_->set_step_count(step);
  } else {
    steps_ = step;
  }
}

void ShardedOptimizer::set_gather_chunk(int64_t elements) {
  TT_CHECK(elements > 0,
           "ShardedOptimizer: the gather chunk must be positive, got " + std::to_string(elements));
  gather_chunk_ = elements;
}

double ShardedOptimizer::step(double max_norm, bool gradients_averaged, bool measure_norm) {
  if (!gradients_averaged) comm_.reduce_scatter_avg(params_.flat_grads(), shard_grads_);
  if (max_norm <= 0 && !measure_norm) {
    update_and_gather();
    return std::nan("");
  }
  // The global norm is the root of the sum over ranks of each slice's squared norm.
  const double local = ops::sum_squares(shard_grads_);
  Tensor total = shard_grads_.device().is_cpu()
                     ? Tensor::from_doubles({local}, {1})
                     : Tensor::from_floats({static_cast<float>(local)}, {1}, shard_grads_.device());
  comm_.all_reduce_sum(total);
  const double norm = std::sqrt(total.item());
  if (!std::isfinite(norm)) return norm;  // diverged: the caller stops; nothing is updated
  if (max_norm > 0) {
    const double scale = std::min(1.0, max_norm / (norm + 1e-6));
    if (scale < 1.0) scale_gradients(shard_grads_, scale);
  }
  update_and_gather();
  return norm;
}

void ShardedOptimizer::update_and_gather() {
  inner_->prepare_step();
  if (!adamw_) ++steps_;
  std::vector<std::unique_ptr<ShardCollectives::Pending>> gathers;
  for (int64_t begin = 0; begin < shard_size_; begin += gather_chunk_) {
    const int64_t count = std::min(gather_chunk_, shard_size_ - begin);
    inner_->apply_range(0, begin, count);
    // Every rank's chunk at the same position of its slice: rank r's lies at r * shard_size + begin.
    gathers.push_back(comm_.all_gather_blocks_async(params_.flat_params(), begin, count, shard_size_));
  }
  for (auto& gather : gathers) gather->wait();
}

int64_t ShardedOptimizer::state_bytes() const {
  if (!adamw_) return 0;
  return static_cast<int64_t>(adamw_->exp_avg()[0].nbytes() + adamw_->exp_avg_sq()[0].nbytes());
}

}  // namespace tt::optim
