#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/autograd.h"
#include "core/cuda_context.h"
#include "core/ops.h"
#include "kernels/cpu/cpu_kernels.h"
#ifdef TT_WITH_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace tt::optim {

#ifdef TT_WITH_CUDA
namespace {

// The kernel's description of one weight of `p` (moments m and v, bf16 mirror or null) and its gradient.
cuda::GemmAdamwProblem cuda_problem(const Tensor& p, const Tensor& m, const Tensor& v, const Tensor* mirror,
                                    const AdamW::FactoredGradient& fg) {
  const int64_t out = fg.dy.size(1), in = fg.x.size(1);
  return {fg.dy.raw_data(),
          fg.x.raw_data(),
          fg.dy.strides()[0],  // ld_dy: dy may be some columns of a wider product (ops::attention_qkv)
          in,
          out,
          in,
          p.data<float>() + fg.begin,
          m.data<float>() + fg.begin,
          v.data<float>() + fg.begin,
          mirror ? mirror->data<bf16>() + fg.begin : nullptr};
}

}  // namespace
#endif

void Optimizer::zero_grad() {
  for (Tensor& p : params_) {
    Tensor g = p.grad();
    if (g.defined()) {
      g.zero_();
      mark_grad_zeroed(p);
    }
  }
}

SGD::SGD(std::vector<Tensor> params, double lr) : Optimizer(std::move(params)) {
  lr_ = lr;
}

void SGD::step() {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].grad().defined()) apply_range(i, 0, params_[i].numel());
  }
}

void SGD::apply_range(size_t index, int64_t begin, int64_t count, void* stream) {
  TT_ASSERT(index < params_.size(), "SGD::apply_range: no parameter " + std::to_string(index));
  TT_ASSERT(stream == nullptr, "SGD::apply_range runs on the compute stream only");
  Tensor& p = params_[index];
  const Tensor g = p.grad();
  TT_CHECK(g.defined(), "SGD::apply_range: parameter " + std::to_string(index) + " has no gradient");
  TT_CHECK(g.dtype() == p.dtype(), std::string("SGD needs gradients of the parameters' dtype (") +
                                       dtype_name(p.dtype()) + "), got " + dtype_name(g.dtype()));
  TT_ASSERT(begin >= 0 && count >= 0 && begin + count <= p.numel(), "SGD::apply_range: range out of bounds");
  if (count == 0) return;
  if (begin == 0 && count == p.numel()) {
    ops::add_into(p, ops::scale(g, -lr_));
    return;
  }
  TT_ASSERT(p.is_contiguous() && g.is_contiguous(),
            "SGD::apply_range needs contiguous parameters and gradients");
  Tensor p_range = p.view({-1}).narrow_view(0, begin, count);
  const Tensor g_range = g.view({-1}).narrow_view(0, begin, count);
  ops::add_into(p_range, ops::scale(g_range, -lr_));
}

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : Optimizer(std::move(params)), options_(options) {
  lr_ = options.lr;
  for (const Tensor& p : params_) {
    exp_avg_.push_back(Tensor::zeros(p.shape(), p.dtype(), p.device()));
    exp_avg_sq_.push_back(Tensor::zeros(p.shape(), p.dtype(), p.device()));
  }
}

void AdamW::write_bf16_mirror(const nn::FlatParameters* params) {
  if (params != nullptr) {
    TT_CHECK(params_.size() == 1 && params_[0].dtype() == DType::f32 &&
                 params_[0].storage() == params->flat_params().storage(),
             "AdamW::write_bf16_mirror: this AdamW must update exactly the flat f32 parameter buffer of the "
             "FlatParameters whose mirror it writes");
  }
  mirror_owner_ = params;
}

const Tensor* AdamW::current_mirror() const {
  if (mirror_owner_ == nullptr || !mirror_owner_->bf16_mirror().defined()) return nullptr;
  return &mirror_owner_->bf16_mirror();
}

void AdamW::step() {
  prepare_step();
  apply();
}

void AdamW::prepare_step() {
  ++step_;
  if (params_.empty() || !params_[0].device().is_cuda()) return;
#ifdef TT_WITH_CUDA
  if (!device_factors_.defined()) device_factors_ = Tensor::zeros({4}, DType::f32, params_[0].device());
  cuda::adamw_upload_factors(device_factors_.data<float>(), lr_, options_.beta1, options_.beta2,
                             options_.weight_decay, step_,
                             static_cast<cudaStream_t>(compute_stream(params_[0].device().index)));
#endif
}

void AdamW::cancel_prepared_step(void* stream) {
  TT_ASSERT(device_factors_.defined(), "AdamW::cancel_prepared_step() before prepare_step()");
#ifdef TT_WITH_CUDA
  cuda::adamw_cancel_factors(
      device_factors_.data<float>(),
      static_cast<cudaStream_t>(stream ? stream : compute_stream(params_[0].device().index)));
#else
  (void)stream;
#endif
}

void AdamW::apply() {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].grad().defined()) apply_range(i, 0, params_[i].numel());
  }
}

void AdamW::apply_range(size_t index, int64_t begin, int64_t count, void* stream) {
  TT_ASSERT(index < params_.size(), "AdamW::apply_range: no parameter " + std::to_string(index));
  Tensor& p = params_[index];
  const Tensor g = p.grad();
  TT_CHECK(g.defined(), "AdamW::apply_range: parameter " + std::to_string(index) + " has no gradient");
  TT_ASSERT(p.is_contiguous() && g.is_contiguous(), "AdamW needs contiguous parameters and gradients");
  TT_ASSERT(begin >= 0 && count >= 0 && begin + count <= p.numel(),
            "AdamW::apply_range: range out of bounds");
  if (count == 0) return;
  if (p.device().is_cuda()) {
#ifdef TT_WITH_CUDA
    TT_CHECK(p.dtype() == DType::f32, "AdamW on CUDA needs f32 parameters");
    TT_ASSERT(device_factors_.defined(), "AdamW::apply() before prepare_step()");
    cudaStream_t s = static_cast<cudaStream_t>(stream ? stream : compute_stream(p.device().index));
    const Tensor* mirror = current_mirror();
    const bool grad_bf16 = g.dtype() == DType::bf16;
    TT_CHECK(grad_bf16 || g.dtype() == DType::f32, "AdamW on CUDA needs f32 or bf16 gradients");
    const void* grad = grad_bf16 ? static_cast<const void*>(g.data<bf16>() + begin) : g.data<float>() + begin;
    cuda::adamw_apply(p.data<float>() + begin, grad, grad_bf16, exp_avg_[index].data<float>() + begin,
                      exp_avg_sq_[index].data<float>() + begin, count, device_factors_.data<float>(),
                      grad_scale_.defined() ? grad_scale_.data<float>() : nullptr, options_.beta1,
                      options_.beta2, options_.eps, s, mirror ? mirror->data<bf16>() + begin : nullptr);
#endif
  } else {
    TT_ASSERT(!grad_scale_.defined(), "AdamW: device gradient scaling is for CUDA parameters");
    TT_ASSERT(step_ >= 1, "AdamW::apply() before prepare_step()");
    apply_on_cpu(index, begin, g.view({-1}).narrow_view(0, begin, count));
  }
}

void AdamW::apply_on_cpu(size_t index, int64_t begin, const Tensor& grads) {
  Tensor& p = params_[index];
  const int64_t count = grads.numel();
  // bf16 gradients of f32 parameters are widened exactly first.
  const Tensor wide = grads.dtype() == p.dtype() ? ops::contiguous(grads) : ops::cast(grads, p.dtype());
  auto update = [&](auto tag) {
    using T = decltype(tag);
    cpu::adamw(p.data<T>() + begin, wide.data<T>(), exp_avg_[index].data<T>() + begin,
               exp_avg_sq_[index].data<T>() + begin, count, lr_, options_.beta1, options_.beta2, options_.eps,
               options_.weight_decay, step_);
  };
  if (p.dtype() == DType::f64)
    update(double{});
  else
    update(float{});
  if (const Tensor* mirror = current_mirror()) {
    cpu::cast(p.data<float>() + begin, DType::f32, mirror->data<bf16>() + begin, DType::bf16, count);
  }
}

bool AdamW::check_factored_gradient(size_t index, const FactoredGradient& fg) const {
  TT_ASSERT(index < params_.size(), "AdamW: factored gradient for no parameter " + std::to_string(index));
  const Tensor& p = params_[index];
  const Tensor g = p.grad();
  TT_ASSERT(g.defined(), "AdamW: factored gradient for parameter " + std::to_string(index) +
                             ", which has no gradient buffer (its dtype says how the gradient is rounded)");
  TT_ASSERT(!grad_scale_.defined(), "AdamW: factored gradient while gradients are scaled (clipping)");
  const Tensor &dy = fg.dy, &x = fg.x;
  TT_ASSERT(dy.dim() == 2 && x.dim() == 2 && dy.size(0) == x.size(0) && dy.dtype() == x.dtype(),
            "AdamW: a factored gradient's dy and x must be (rows, out) and (rows, in) of one dtype, got " +
                dy.describe() + " and " + x.describe());
  TT_ASSERT(p.is_contiguous() && fg.begin >= 0 && fg.begin + dy.size(1) * x.size(1) <= p.numel(),
            "AdamW: factored gradient's range out of bounds");
  TT_ASSERT(dy.device() == p.device() && x.device() == p.device(),
            "AdamW: a factored gradient's dy and x must be on the parameter's device, got " + dy.describe() +
                " and " + x.describe() + " for " + p.describe());
  TT_ASSERT(step_ >= 1, "AdamW: factored gradient before prepare_step()");
  if (!p.device().is_cuda()) return true;
  // dy's rows may be further apart than its width (columns of a wider product); x is dense.
  const bool dy_rows = dy.strides()[1] == 1 && dy.strides()[0] >= dy.size(1);
  return p.dtype() == DType::f32 && dy.dtype() == DType::bf16 && dy_rows && x.is_contiguous() &&
         (g.dtype() == DType::f32 || g.dtype() == DType::bf16);
}

bool AdamW::takes_factored_gradient(size_t index, const FactoredGradient& fg) const {
  if (!check_factored_gradient(index, fg)) return false;
  if (!params_[index].device().is_cuda()) return true;
#ifdef TT_WITH_CUDA
  return cuda::gemm_adamw_takes(
      cuda_problem(params_[index], exp_avg_[index], exp_avg_sq_[index], current_mirror(), fg), fg.dy.size(0));
#else
  return false;
#endif
}

void AdamW::apply_factored_gradients(size_t index, const std::vector<FactoredGradient>& grads, void* stream) {
  // The arguments and dtypes only: the CUDA kernel checks each weight's layout itself as it encodes its
  // tensor maps, which takes_factored_gradient has already done once.
  for (const FactoredGradient& fg : grads) {
    TT_ASSERT(
        check_factored_gradient(index, fg),
        "AdamW::apply_factored_gradients: a gradient its kernel does not take (ask takes_factored_gradient)");
  }
  if (grads.empty()) return;
  Tensor& p = params_[index];
  const DType grad_dtype = p.grad().dtype();
  if (p.device().is_cuda()) {
#ifdef TT_WITH_CUDA
    static_assert(kFactoredGroup == static_cast<size_t>(cuda::kGemmAdamwMaxProblems));
    TT_ASSERT(device_factors_.defined(), "AdamW::apply_factored_gradients before prepare_step()");
    cudaStream_t s = static_cast<cudaStream_t>(stream ? stream : compute_stream(p.device().index));
    // One launch per run of up to kFactoredGroup weights with the same number of rows.
    std::vector<cuda::GemmAdamwProblem> group;
    for (size_t i = 0; i < grads.size(); ++i) {
      group.push_back(
          cuda_problem(params_[index], exp_avg_[index], exp_avg_sq_[index], current_mirror(), grads[i]));
      const int64_t rows = grads[i].dy.size(0);
      if (i + 1 == grads.size() || group.size() == kFactoredGroup || grads[i + 1].dy.size(0) != rows) {
        cuda::gemm_adamw(group.data(), static_cast<int>(group.size()), rows, grad_dtype == DType::bf16,
                         device_factors_.data<float>(), options_.beta1, options_.beta2, options_.eps, s);
        group.clear();
      }
    }
#endif
    return;
  }
  // The CPU twin: each gradient computed, rounded as the gradient buffer would hold it, then applied.
  for (const FactoredGradient& fg : grads) {
    Tensor dw;
    {
      NoGradGuard no_grad;
      dw = ops::matmul(fg.dy, fg.x, true, false);
      if (dw.dtype() != grad_dtype) dw = ops::cast(dw, grad_dtype);
    }
    apply_on_cpu(index, fg.begin, dw.view({-1}));
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
        scale_gradients(mutable_g, scale);
      }
    }
  }
  return norm;
}

void scale_gradients(Tensor& grads, double scale) {
  if (grads.dtype() != DType::bf16) {
    ops::scale_(grads, scale);
    return;
  }
  // bf16 gradients (FlatParameters::set_grad_dtype) are scaled in f32 and rounded back, a bounded piece at a
  // time (a 2.7b model's in one piece would need a 13.6 GB temporary).
  TT_ASSERT(grads.is_contiguous(), "scale_gradients: bf16 gradients must be contiguous");
  Tensor flat = grads.view({-1});
  constexpr int64_t kPiece = int64_t{1} << 24;
  for (int64_t begin = 0; begin < flat.numel(); begin += kPiece) {
    Tensor piece = flat.narrow_view(0, begin, std::min(kPiece, flat.numel() - begin));
    Tensor wide = ops::cast(piece, DType::f32);
    ops::scale_(wide, scale);
    ops::cast_into(piece, wide);
  }
}

}  // namespace tt::optim

namespace tt::optim {

void clip_factor_on_device(const Tensor& flat_grads, double max_norm, Tensor& norm, Tensor& factor) {
  TT_ASSERT(flat_grads.device().is_cuda() &&
                (flat_grads.dtype() == DType::f32 || flat_grads.dtype() == DType::bf16) &&
                flat_grads.is_contiguous(),
            "clip_factor_on_device needs a contiguous f32 or bf16 CUDA gradient buffer");
#ifdef TT_WITH_CUDA
  const cudaStream_t stream = static_cast<cudaStream_t>(compute_stream(flat_grads.device().index));
  ops::sum_squares_into(flat_grads, norm);
  cuda::clip_scale(norm.data<float>(), max_norm, factor.data<float>(), norm.data<float>(), stream);
#endif
}

}  // namespace tt::optim
