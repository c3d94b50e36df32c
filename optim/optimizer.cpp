#include "optim/optimizer.h"

#include <cmath>

#include "core/cuda_context.h"
#include "core/ops.h"
#include "kernels/cpu/cpu_kernels.h"
#ifdef TT_WITH_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace tt::optim {

void Optimizer::zero_grad() {
  for (Tensor& p : params_) {
    Tensor g = p.grad();
    if (g.defined()) g.zero_();
  }
}

SGD::SGD(std::vector<Tensor> params, double lr) : Optimizer(std::move(params)) {
  lr_ = lr;
}

void SGD::step() {
  for (Tensor& p : params_) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    Tensor scaled = ops::scale(g, -lr_);
    ops::add_into(p, scaled);
  }
}

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : Optimizer(std::move(params)), options_(options) {
  lr_ = options.lr;
  for (const Tensor& p : params_) {
    exp_avg_.push_back(Tensor::zeros(p.shape(), p.dtype(), p.device()));
    exp_avg_sq_.push_back(Tensor::zeros(p.shape(), p.dtype(), p.device()));
  }
}

void AdamW::step() {
  ++step_;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    TT_CHECK(p.is_contiguous() && g.is_contiguous(), "AdamW needs contiguous parameters and gradients");
    const int64_t n = p.numel();
    if (p.device().is_cuda()) {
#ifdef TT_WITH_CUDA
      TT_CHECK(p.dtype() == DType::f32, "AdamW on CUDA needs f32 parameters");
      cuda::adamw(p.data<float>(), g.data<float>(), exp_avg_[i].data<float>(), exp_avg_sq_[i].data<float>(),
                  n, lr_, options_.beta1, options_.beta2, options_.eps, options_.weight_decay, step_,
                  static_cast<cudaStream_t>(compute_stream(p.device().index)));
#endif
    } else if (p.dtype() == DType::f64) {
      cpu::adamw(p.data<double>(), g.data<double>(), exp_avg_[i].data<double>(),
                 exp_avg_sq_[i].data<double>(), n, lr_, options_.beta1, options_.beta2, options_.eps,
                 options_.weight_decay, step_);
    } else {
      cpu::adamw(p.data<float>(), g.data<float>(), exp_avg_[i].data<float>(), exp_avg_sq_[i].data<float>(), n,
                 lr_, options_.beta1, options_.beta2, options_.eps, options_.weight_decay, step_);
    }
  }
}

double cosine_lr(int64_t it, double lr_max, double lr_min, int64_t warmup_steps, int64_t cosine_steps) {
  if (it < warmup_steps) return lr_max * static_cast<double>(it) / static_cast<double>(warmup_steps);
  if (it > cosine_steps) return lr_min;
  const double progress = static_cast<double>(it - warmup_steps) /
                          static_cast<double>(std::max<int64_t>(1, cosine_steps - warmup_steps));
  return lr_min + 0.5 * (1.0 + std::cos(M_PI * progress)) * (lr_max - lr_min);
}

double clip_grad_norm(const std::vector<Tensor>& grads, double max_norm) {
  double total = 0;
  for (const Tensor& g : grads) {
    if (g.defined()) total += ops::sum_squares(g);
  }
  const double norm = std::sqrt(total);
  if (max_norm > 0) {
    const double scale = std::min(1.0, max_norm / (norm + 1e-6));
    if (scale < 1.0) {
      for (const Tensor& g : grads) {
        if (!g.defined()) continue;
        Tensor mutable_g = g;
        ops::scale_(mutable_g, scale);
      }
    }
  }
  return norm;
}

}  // namespace tt::optim
