#include "nn/module.h"

#include <vector>

#include "core/rng.h"

namespace tt::nn {

Tensor& Module::register_parameter(const std::string& name, const Shape& shape, Init init) {
  auto param = std::make_unique<Param>();
  param->name = name;
  // Shape only, no storage, until FlatParameters gives it a slice of the flat buffer.
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  param->tensor = Tensor(impl);
  param->init = init;
  params_.push_back(std::move(param));
  return params_.back()->tensor;
}

void Module::collect(const std::string& prefix, std::vector<NamedParameter>& out) {
  for (auto& p : params_) out.push_back({prefix + p->name, &p->tensor, p->init});
  for (auto& [name, child] : children_) child->collect(prefix + name + ".", out);
}

std::vector<NamedParameter> Module::named_parameters() {
  std::vector<NamedParameter> out;
  collect("", out);
  return out;
}

int64_t Module::parameter_count() {
  int64_t total = 0;
  for (const NamedParameter& p : named_parameters()) total += p.tensor->numel();
  return total;
}

FlatParameters::FlatParameters(Module& module, Device device, uint64_t seed, DType dtype)
    : params_(module.named_parameters()) {
  TT_CHECK(dtype == DType::f32 || dtype == DType::f64, "parameters are f32 (or f64 for gradient checks)");
  int64_t total = 0;
  for (const NamedParameter& p : params_) {
    offsets_.push_back(total);
    total += p.tensor->numel();
  }
  // Initialise on the host in double, then store once in the parameter dtype on the target device.
  std::vector<double> host(static_cast<size_t>(total));
  for (size_t i = 0; i < params_.size(); ++i) {
    const NamedParameter& p = params_[i];
    const int64_t begin = offsets_[i], n = p.tensor->numel();
    for (int64_t j = 0; j < n; ++j) {
      host[begin + j] = p.init.kind == Init::Kind::ones
                            ? 1.0
                            : p.init.std * truncated_normal(seed, static_cast<uint64_t>(begin + j), 3.0);
    }
  }
  Tensor staged = Tensor::from_doubles(host, {total});
  if (dtype == DType::f32) {
    std::vector<float> as_float(host.begin(), host.end());
    staged = Tensor::from_floats(as_float, {total});
  }
  flat_params_ = staged.to(device);
  flat_grads_ = Tensor::zeros({total}, dtype, device);
  // The flat buffer is itself a parameter for optimizers: one tensor, one fused update.
  flat_params_.set_requires_grad(true).set_name("<flat parameters>");
  flat_params_.set_grad(flat_grads_);
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& t = *params_[i].tensor;
    const Shape shape = t.shape();
    const int64_t n = shape_numel(shape);
    Tensor view = flat_params_.narrow_view(0, offsets_[i], n).view(shape);
    view.set_requires_grad(true).set_name(params_[i].name);
    view.set_grad(flat_grads_.narrow_view(0, offsets_[i], n).view(shape));
    t = view;
  }
}

}  // namespace tt::nn
