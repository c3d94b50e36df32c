#include "core/recompute.h"

#include "core/profile.h"

namespace tt {

namespace {

// Stands for the recomputed graph's input: collects the gradient that reaches it, as the saved input's own
// producer would have, so the nodes that add into a pending gradient in place see the same buffers.
class RecomputedInput : public Node {
 public:
  const char* name() const override { return "RecomputedInput"; }
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    grad = grad_output;
    return {};
  }
  std::vector<Tensor> apply_owned(Tensor& grad_output) override {
    grad = std::move(grad_output);
    return {};
  }
  Tensor grad;
};

class RecomputeBackward : public Node {
 public:
  RecomputeBackward(std::function<Tensor(const Tensor&)> fn, Tensor input)
      : fn_(std::move(fn)), input_(std::move(input)) {}
  const char* name() const override { return "RecomputeBackward"; }
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    Tensor grad = grad_output;
    return apply_owned(grad);
  }
  std::vector<Tensor> apply_owned(Tensor& grad_output) override {
    if (!grad_output.defined()) return {Tensor()};
    // A new handle on the saved input's memory, outside the forward graph, whose gradient lands in `entry`.
    const Tensor x = input_.as_strided_view(input_.shape(), input_.strides(), input_.offset());
    auto entry = std::make_shared<RecomputedInput>();
    if (input_.requires_grad()) attach_node(x, entry, {});
    Tensor y;
    {
      const NvtxRange range("recompute");
      const GradModeGuard grad_mode(true);
      y = fn_(x);
    }
    TT_ASSERT(y.requires_grad(), "recompute: the recomputed function's output does not require grad");
    run_backward_owned(y, std::move(grad_output));
    return {std::move(entry->grad)};
  }
  void release_saved() override {
    input_ = Tensor();
    fn_ = nullptr;
  }

 private:
  std::function<Tensor(const Tensor&)> fn_;
  Tensor input_;
};

}  // namespace

Tensor recompute(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x,
                 const std::vector<const Tensor*>& parameters) {
  bool needed = needs_grad({&x});
  for (const Tensor* p : parameters) needed = needed || needs_grad({p});
  if (!needed) return fn(x);
  Tensor y;
  {
    const NoGradGuard no_grad;
    y = fn(x);
  }
  attach_node(y, std::make_shared<RecomputeBackward>(fn, x), {&x});
  return y;
}

}  // namespace tt
