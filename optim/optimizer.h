// Optimizers over lists of parameters (each with its .grad). Given a model's FlatParameters, pass the single
// flat buffer: AdamW then updates every parameter in one fused kernel (the multi-tensor path).
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"

namespace tt::optim {

class Optimizer {
 public:
  explicit Optimizer(std::vector<Tensor> params) : params_(std::move(params)) {}
  virtual ~Optimizer() = default;
  virtual void step() = 0;
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
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

// torch.optim.AdamW semantics (REFERENCE.md), state per parameter: exp_avg, exp_avg_sq, and one step count.
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, const AdamWOptions& options = {});
  void step() override;
  int64_t step_count() const { return step_; }
  void set_step_count(int64_t step) { step_ = step; }
  std::vector<Tensor>& exp_avg() { return exp_avg_; }
  std::vector<Tensor>& exp_avg_sq() { return exp_avg_sq_; }
  const AdamWOptions& options() const { return options_; }

 private:
  AdamWOptions options_;
  int64_t step_ = 0;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
};

// Cosine schedule with linear warm-up (REFERENCE.md): it < warmup: max*it/warmup; it > cosine_steps: min.
double cosine_lr(int64_t it, double lr_max, double lr_min, int64_t warmup_steps, int64_t cosine_steps);

// Scales all gradients so their global L2 norm is at most max_norm (scale = min(1, max/(norm + 1e-6))).
// Returns the norm before clipping. max_norm <= 0 only measures.
double clip_grad_norm(const std::vector<Tensor>& grads, double max_norm);

}  // namespace tt::optim
