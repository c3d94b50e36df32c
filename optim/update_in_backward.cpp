#include "optim/update_in_backward.h"

#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "core/autograd.h"
#include "core/cuda_context.h"
#ifdef TT_WITH_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace tt::optim {

struct UpdateInBackward::State {
  State(nn::FlatParameters& p, AdamW& o) : params(p), optimizer(o) {}
  nn::FlatParameters& params;
  AdamW& optimizer;
  Device device;
  bool armed = false;
  bool in_matmul = false;
  size_t group = AdamW::kFactoredGroup;  // factored gradients applied per launch
  int64_t hook_updates = 0, matmul_updates = 0;
  std::vector<bool> done;                           // per parameter, this pass
  std::vector<bool> in_product;                     // per parameter: updated by its matmul this pass
  std::vector<std::unique_ptr<StreamEvent>> ready;  // per parameter: its gradient is complete
  std::unique_ptr<StreamEvent> updates_done;        // join of the side stream into the compute stream
  std::vector<uint64_t> hooks;                      // per parameter: its hook's handle
  std::vector<AdamW::FactoredGradient> pending;     // taken by consume(), not yet applied

  // Applies the pending factored gradients (one launch on CUDA).
  void flush() {
    std::vector<AdamW::FactoredGradient> ready_now;
    ready_now.swap(pending);
    optimizer.apply_factored_gradients(0, ready_now);
  }

  // Updates elements [begin, begin + count) of the flat buffer and zeroes their gradients.
  void update(int64_t begin, int64_t count) {
    if (count == 0) return;
    Tensor& grads = params.flat_grads();
    if (device.is_cuda()) {
      void* side = side_stream(device.index);
      optimizer.apply_range(0, begin, count, side);
#ifdef TT_WITH_CUDA
      // All-zero bits are 0.0 in f32 and bf16 alike.
      const size_t element = dtype_size(grads.dtype());
      TT_CUDA_CHECK(
          cudaMemsetAsync(static_cast<char*>(grads.raw_data()) + static_cast<size_t>(begin) * element, 0,
                          static_cast<size_t>(count) * element, static_cast<cudaStream_t>(side)));
#endif
    } else {
      optimizer.apply_range(0, begin, count);
      grads.narrow_view(0, begin, count).zero_();
    }
  }
  // Updates parameter `index` and zeroes its gradient, which the next pass may then overwrite.
  void update_parameter(size_t index) {
    const Tensor& p = *params.parameters()[index].tensor;
    update(params.offsets()[index], p.numel());
    mark_grad_zeroed(p);  // from a hook, for the next pass
  }

  // The compute stream waits for everything queued on the side stream.
  void join() {
    updates_done->record(side_stream(device.index));
    updates_done->block(compute_stream(device.index));
  }

  void check_first_gradient(size_t index) const {
    TT_ASSERT(!done[index] && !in_product[index],
              "UpdateInBackward: parameter " + params.parameters()[index].name +
                  " got its gradient twice in one pass (gradient accumulation is not supported)");
  }

  // The factored-gradient consumer of parameter `index`: the update inside its weight-gradient matmul.
  bool consume(size_t index, const Tensor& dy, const Tensor& x) {
    if (!armed) return false;
    check_first_gradient(index);
    const Tensor& p = *params.parameters()[index].tensor;
    if (p.dim() != 2 || dy.dim() != 2 || x.dim() != 2 || dy.size(1) != p.size(0) || x.size(1) != p.size(1))
      return false;
    // A gradient already in .grad (another contribution of this pass, or one left from before begin()) must
    // be part of the update: the hook path applies the whole buffer.
    if (!grad_known_zero(p)) return false;
    AdamW::FactoredGradient g{params.offsets()[index], dy, x};
    if (!optimizer.takes_factored_gradient(0, g)) return false;
    // Applied with the next ones, a group per launch: one weight alone leaves most SMs idle in its last
    // round of tiles. Holding dy and x keeps them from being reused until then.
    pending.push_back(std::move(g));
    in_product[index] = true;
    if (pending.size() == group) flush();
    return true;
  }

  void on_gradient_ready(size_t index) {
    if (!armed) return;
    if (in_product[index] && !done[index]) {
      // Updated by its matmul already; its gradient buffer was never written and still holds zeros, unless
      // another op of this pass added to it, which that update did not see.
      const Tensor& p = *params.parameters()[index].tensor;
      TT_CHECK(grad_known_zero(p), "UpdateInBackward: parameter " + params.parameters()[index].name +
                                       " was updated inside its matmul but got another gradient in the same "
                                       "pass (use in_matmul = false for weights used twice)");
      done[index] = true;
      ++hook_updates;
      ++matmul_updates;
      mark_grad_zeroed(p);
      return;
    }
    check_first_gradient(index);
    done[index] = true;
    ++hook_updates;
    if (device.is_cuda()) {
      // The side stream starts this update only once the compute stream has finished the gradient.
      ready[index]->record(compute_stream(device.index));
      ready[index]->block(side_stream(device.index));
    }
    update_parameter(index);
  }
};

UpdateInBackward::UpdateInBackward(nn::FlatParameters& params, AdamW& optimizer, bool in_matmul, size_t group)
    : state_(std::make_shared<State>(params, optimizer)) {
  TT_ASSERT(optimizer.parameter_count() == 1 && optimizer.params()[0].impl() == params.flat_params().impl(),
            "UpdateInBackward needs an AdamW over the flat parameter buffer");
  TT_CHECK(group >= 1 && group <= AdamW::kFactoredGroup,
           "UpdateInBackward: a group of " + std::to_string(group) + " weights per launch (1 to " +
               std::to_string(AdamW::kFactoredGroup) + ")");
  State& s = *state_;
  s.device = params.flat_params().device();
  // Events only for CUDA parameters (a CUDA build on a machine without a GPU must not touch the driver).
  const bool cuda = s.device.is_cuda();
  if (cuda) s.updates_done = std::make_unique<StreamEvent>(s.device.index);
  const size_t n = params.parameters().size();
  if (in_matmul) {
    // Checked before anything is registered, so a refusal leaves no hooks behind.
    for (const nn::NamedParameter& p : params.parameters()) {
      TT_CHECK(!p.tensor->impl()->factored_grad_consumer,
               "UpdateInBackward: " + p.name +
                   " has a consumer already (another UpdateInBackward with in_matmul)");
    }
  }
  s.done.assign(n, false);
  s.in_product.assign(n, false);
  s.in_matmul = in_matmul;
  s.group = group;
  for (size_t i = 0; i < n; ++i) {
    s.ready.push_back(cuda ? std::make_unique<StreamEvent>(s.device.index) : nullptr);
    std::weak_ptr<State> weak = state_;
    const Tensor& p = *params.parameters()[i].tensor;
    s.hooks.push_back(p.register_grad_ready_hook([weak, i](Tensor&) {
      if (auto state = weak.lock()) state->on_gradient_ready(i);
    }));
    if (in_matmul && p.dim() == 2) {
      set_factored_grad_consumer(p, [weak, i](const Tensor& dy, const Tensor& x) {
        auto state = weak.lock();
        return state && state->consume(i, dy, x);
      });
    }
  }
}

UpdateInBackward::~UpdateInBackward() {
  // A backward that threw left updates queued on the side stream: order later work after them anyway.
  State& s = *state_;
  if (s.armed && s.device.is_cuda()) {
    try {
      s.join();
    } catch (...) {
    }
  }
  s.armed = false;
  s.pending.clear();
  for (size_t i = 0; i < s.hooks.size(); ++i) {
    const Tensor& p = *s.params.parameters()[i].tensor;
    p.remove_grad_ready_hook(s.hooks[i]);
    if (s.in_matmul && p.dim() == 2) set_factored_grad_consumer(p, nullptr);
  }
}

int64_t UpdateInBackward::updated_in_backward() const {
  return state_->hook_updates;
}

int64_t UpdateInBackward::updated_in_matmul() const {
  return state_->matmul_updates;
}

void UpdateInBackward::begin() {
  State& s = *state_;
  TT_ASSERT(!s.armed, "UpdateInBackward::begin() twice without finish()");
  TT_ASSERT(s.optimizer.step_count() >= 1, "UpdateInBackward::begin() before the optimizer's prepare_step()");
  TT_ASSERT(
      !s.optimizer.has_grad_scale(),
      "UpdateInBackward: gradients are scaled (clipping); a fused update cannot wait for the global norm");
  s.done.assign(s.done.size(), false);
  s.in_product.assign(s.in_product.size(), false);
  s.hook_updates = 0;
  s.matmul_updates = 0;
  s.pending.clear();
  s.armed = true;
}

void UpdateInBackward::finish() {
  State& s = *state_;
  TT_ASSERT(s.armed, "UpdateInBackward::finish() without begin()");
  s.armed = false;
  s.flush();
  if (s.device.is_cuda()) {
    // What no hook reached goes after everything backward queued.
    s.updates_done->record(compute_stream(s.device.index));
    s.updates_done->block(side_stream(s.device.index));
  }
  for (size_t i = 0; i < s.done.size(); ++i) {
    if (!s.done[i] && !s.in_product[i]) s.update_parameter(i);
  }
  const int64_t total = s.params.flat_params().numel();
  s.update(s.params.numel(), total - s.params.numel());  // padding (ZeRO layouts): zeros stay zeros
  if (s.device.is_cuda()) {
    s.join();
  }
}

}  // namespace tt::optim
