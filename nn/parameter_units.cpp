#include "nn/parameter_units.h"

#include "core/autograd.h"

namespace tt::nn {

namespace {

// Identity whose backward first lets the unit's parameters be gathered and their gradient buffers be
// staged. It holds no tensor and hands the gradient on unchanged (moved, so in-place accumulation below it
// still sees a buffer nobody else holds).
class UnitBoundary : public Node {
 public:
  UnitBoundary(ParameterUnits* units, int unit) : units_(units), unit_(unit) {}
  const char* name() const override { return "UnitBoundary"; }
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    Tensor grad = grad_output;
    return apply_owned(grad);
  }
  std::vector<Tensor> apply_owned(Tensor& grad_output) override {
    units_->before_backward(unit_);
    return {std::move(grad_output)};
  }

 private:
  ParameterUnits* units_;
  int unit_;
};

}  // namespace

Tensor run_unit(ParameterUnits* units, int unit, const std::function<Tensor(const Tensor&)>& fn,
                const Tensor& x) {
  if (units == nullptr) return fn(x);
  units->before_forward(unit);
  Tensor y = fn(x);
  const bool backward_follows = grad_mode_enabled() && y.requires_grad();
  units->after_forward(unit, backward_follows);
  if (!backward_follows) return y;
  Tensor out = y.as_strided_view(y.shape(), y.strides(), y.offset());
  if (y.low_precision_copy().defined()) out.set_low_precision_copy(y.low_precision_copy());
  attach_node(out, std::make_shared<UnitBoundary>(units, unit), {&y});
  return out;
}

}  // namespace tt::nn
