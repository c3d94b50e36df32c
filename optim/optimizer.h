// Optimizers over lists of parameters (each with its .grad). Given a model's FlatParameters, pass the single
// flat buffer: AdamW then updates every parameter in one fused kernel (the multi-tensor path).
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "nn/module.h"

namespace tt::optim {

class Optimizer {
 public:
  explicit Optimizer(std::vector<Tensor> params) : params_(std::move(params)) {}
  virtual ~Optimizer() = default;
  virtual void step() = 0;
  // A step in pieces (ZeRO-1 updates its slice chunk by chunk): prepare_step() once, then apply_range() on
  // ranges that cover every parameter with a gradient exactly once, equals step(). apply_range updates
  // elements [begin, begin + count) of parameter `index` on `stream` (a cudaStream_t; nullptr: the compute
  // stream).
  virtual void prepare_step() {}
  virtual void apply_range(size_t index, int64_t begin, int64_t count, void* stream = nullptr) = 0;
  void zero_grad();
  void set_lr(double lr) { lr_ = lr; }
  double lr() const { return lr_; }
  const std::vector<Tensor>& params() const { return params_; }

 protected:
  std::vector<Tensor> params_;
  double lr_ = 1e-3;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, double lr);
  void step() override;
  void apply_range(size_t index, int64_t begin, int64_t count, void* stream = nullptr) override;
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

// torch.optim.AdamW semantics, state per parameter: exp_avg, exp_avg_sq, and one step count.
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, const AdamWOptions& options = {});
  void step() override;  // prepare_step() then apply()
  // The two halves of a step, for CUDA graphs: prepare_step() counts the step and uploads its scalars
  // (outside a capture); apply() launches the update (may be captured, then replayed every step).
  void prepare_step() override;
  void apply();
  // CUDA: makes apply() and apply_range() launched after this on `stream` (a cudaStream_t; nullptr: the
  // compute stream), or on streams ordered after it, change nothing until the next prepare_step(): for a
  // graph replay whose update ran eagerly already. The factored-gradient kernel ignores it.
  void cancel_prepared_step(void* stream = nullptr);
  // The update of elements [begin, begin + count) of parameter `index` only (after prepare_step()), on
  // `stream` (a cudaStream_t; nullptr: the compute stream). Updating every range once equals apply().
  void apply_range(size_t index, int64_t begin, int64_t count, void* stream = nullptr) override;
  // A weight's gradient in factored form: elements [begin, begin + out * in) of a parameter are an (out, in)
  // row-major matrix W whose gradient is dW = dy^T x, with dy (rows, out) and x (rows, in) (a linear layer's
  // backward: set_factored_grad_consumer).
  struct FactoredGradient {
    int64_t begin = 0;
    Tensor dy, x;
  };
  // Weights one launch of the CUDA kernel below updates together (at most).
  static constexpr size_t kFactoredGroup = 32;
  // Whether apply_factored_gradients takes `g` for parameter `index`: always on the CPU; on CUDA where the
  // kernel applies (a Hopper GPU, bf16 operands in contiguous rows, an f32 parameter, aligned rows).
  // Arguments that do not fit the parameter at all are an error. After prepare_step().
  bool takes_factored_gradient(size_t index, const FactoredGradient& g) const;
  // Updates the weights of parameter `index` from their factored gradients (each one that
  // takes_factored_gradient takes, the ranges disjoint): each dW is rounded to the dtype of the parameter's
  // gradient buffer, as if stored there, and applied; the buffer itself is neither read nor written. On
  // CUDA the products and the updates are one kernel (cuda::gemm_adamw) on `stream`, one launch for each
  // run of up to kFactoredGroup weights with the same number of rows; on the CPU the product, then
  // apply_range's update. After prepare_step().
  void apply_factored_gradients(size_t index, const std::vector<FactoredGradient>& grads,
                                void* stream = nullptr);
  size_t parameter_count() const { return params_.size(); }
  // Multiplies gradients by this device scalar (CUDA clipping without a host round trip); undefined = 1.
  void set_grad_scale(const Tensor& scale) { grad_scale_ = scale; }
  // Keeps `params`' bf16 mirror current: every update also writes the updated parameters rounded to bf16
  // into params.bf16_mirror() (read at each update, so enabling, disabling and re-enabling the mirror need no
  // new call), in the same pass over memory. This AdamW must update exactly params.flat_params(); `params`
  // must outlive it. nullptr: stop.
  void write_bf16_mirror(const nn::FlatParameters* params);
  bool has_grad_scale() const { return grad_scale_.defined(); }
  int64_t step_count() const { return step_; }
  void set_step_count(int64_t step) { step_ = step; }
  std::vector<Tensor>& exp_avg() { return exp_avg_; }
  std::vector<Tensor>& exp_avg_sq() { return exp_avg_sq_; }
  const AdamWOptions& options() const { return options_; }

 private:
  AdamWOptions options_;
  int64_t step_ = 0;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
  Tensor device_factors_;  // 4 floats on the parameters' GPU: step size, sqrt(bias2), decay, apply (1 or 0)
  Tensor grad_scale_;
  const nn::FlatParameters* mirror_owner_ = nullptr;
  const Tensor* current_mirror() const;  // the bf16 mirror to write, or null
  // The CPU update of parameter `index` from `begin` on, with `grads` (1-D, the range's gradients).
  void apply_on_cpu(size_t index, int64_t begin, const Tensor& grads);
  // Errors for a factored gradient that does not fit parameter `index` at all; whether its dtypes are the
  // CUDA kernel's (always true on the CPU). takes_factored_gradient adds the kernel's layout check.
  bool check_factored_gradient(size_t index, const FactoredGradient& g) const;
};

// Cosine schedule with linear warm-up (the CS336 handout's): it < warmup: max*it/warmup;
// it > cosine_steps: min.
double cosine_lr(int64_t it, double lr_max, double lr_min, int64_t warmup_steps, int64_t cosine_steps);

// Scales all gradients so their global L2 norm is at most max_norm (scale = min(1, max/(norm + 1e-6))).
// Returns the norm before clipping. max_norm <= 0 only measures. f32, f64 or bf16 gradients.
double clip_grad_norm(const std::vector<Tensor>& grads, double max_norm);
// grads *= scale in place; bf16 gradients are scaled in f32 and rounded once.
void scale_gradients(Tensor& grads, double scale);

// The same on the GPU for one flat f32 (or bf16) gradient buffer, without reading anything back: writes the
// norm and the clipping factor to device scalars ({1} f32 tensors allocated by the caller); the factor is
// meant for AdamW::set_grad_scale; the norm is read back before the update (a non-finite one stops the run).
void clip_factor_on_device(const Tensor& flat_grads, double max_norm, Tensor& norm, Tensor& factor);

}  // namespace tt::optim
