#include "nn/module.h"

#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <thread>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/rng.h"

namespace tt::nn {

namespace {

// Cores this process may run on. mpirun binds each rank to one core by default (below two ranks per
// socket), where hardware_concurrency() would still report every core of the machine.
unsigned usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) {
    return static_cast<unsigned>(CPU_COUNT(&set));
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace

Tensor& Module::register_parameter(const std::string& name, const Shape& shape, Init init,
                                   bool matmul_weight) {
  auto param = std::make_unique<Param>();
  param->name = name;
  // Shape only, no storage, until FlatParameters gives it a slice of the flat buffer.
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  param->tensor = Tensor(impl);
  param->init = init;
  param->matmul_weight = matmul_weight;
  params_.push_back(std::move(param));
  return params_.back()->tensor;
}

void Module::collect(const std::string& prefix, std::vector<NamedParameter>& out) {
  for (auto& p : params_) out.push_back({prefix + p->name, &p->tensor, p->init, p->matmul_weight});
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

FlatParameters::FlatParameters(Module& module, Device device, uint64_t seed, DType dtype,
                               int64_t pad_multiple)
    : params_(module.named_parameters()) {
  TT_CHECK(dtype == DType::f32 || dtype == DType::f64, "parameters are f32 (or f64 for gradient checks)");
  int64_t total = 0;
  for (const NamedParameter& p : params_) {
    offsets_.push_back(total);
    total += p.tensor->numel();
  }
  // Initialise on the host (the same numbers for every device and rank), in chunks spread over threads so
  // billion-parameter models start in seconds, each chunk copied to its slice of the device buffer.
  TT_CHECK(pad_multiple >= 1, "pad_multiple must be at least 1");
  parameter_numel_ = total;
  const int64_t padded = (total + pad_multiple - 1) / pad_multiple * pad_multiple;
  flat_params_ = Tensor::empty({padded}, dtype, device);
  if (padded > total) flat_params_.narrow_view(0, total, padded - total).fill_(0.0);
  constexpr int64_t kChunk = int64_t{1} << 24;
  const unsigned threads = std::min(32u, usable_cores());
  if (threads == 1 && total > (int64_t{1} << 27) && std::thread::hardware_concurrency() > 1) {
    std::fprintf(stderr,
                 "note: initialising %lld parameters on 1 core: this process is bound to a single core "
                 "(mpirun binds ranks to cores by default; --bind-to none lets it use the others)\n",
                 static_cast<long long>(total));
  }
  // One host chunk, reused: a fresh allocation per chunk costs more in page clearing than drawing the
  // numbers. On the CPU the values are written in place.
  const bool in_place = device.is_cpu();
  Tensor staged = in_place ? Tensor() : Tensor::empty({std::min(kChunk, std::max<int64_t>(total, 1))}, dtype);
  size_t param_index = 0;
  for (int64_t chunk_begin = 0; chunk_begin < total; chunk_begin += kChunk) {
    const int64_t chunk_end = std::min(total, chunk_begin + kChunk);
    Tensor target = in_place ? flat_params_.narrow_view(0, chunk_begin, chunk_end - chunk_begin)
                             : staged.narrow_view(0, 0, chunk_end - chunk_begin);
    void* const host = target.raw_data();
    // Parameters overlapping this chunk, initialised in parallel element ranges.
    while (param_index + 1 < params_.size() && offsets_[param_index + 1] <= chunk_begin) ++param_index;
    std::vector<std::thread> workers;
    const int64_t per_thread = (chunk_end - chunk_begin + threads - 1) / threads;
    for (unsigned t = 0; t < threads; ++t) {
      const int64_t begin = chunk_begin + t * per_thread, end = std::min(chunk_end, begin + per_thread);
      if (begin >= end) break;
      workers.emplace_back([&, begin, end, start_param = param_index] {
        size_t p = start_param;
        for (int64_t i = begin; i < end; ++i) {
          while (p + 1 < params_.size() && offsets_[p + 1] <= i) ++p;
          const Init& init = params_[p].init;
          const double value = init.kind == Init::Kind::ones
                                   ? 1.0
                                   : init.std * truncated_normal(seed, static_cast<uint64_t>(i), 3.0);
          if (dtype == DType::f32)
            static_cast<float*>(host)[i - chunk_begin] = static_cast<float>(value);
          else
            static_cast<double*>(host)[i - chunk_begin] = value;
        }
      });
    }
    for (std::thread& w : workers) w.join();
    if (!in_place) flat_params_.narrow_view(0, chunk_begin, chunk_end - chunk_begin).copy_(target);
  }
  // The flat buffer is itself a parameter for optimizers: one tensor, one fused update.
  flat_params_.set_requires_grad(true).set_name("<flat parameters>");
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& t = *params_[i].tensor;
    const Shape shape = t.shape();
    Tensor view = flat_params_.narrow_view(0, offsets_[i], shape_numel(shape)).view(shape);
    view.set_requires_grad(true).set_name(params_[i].name);
    t = view;
  }
  flat_grads_ = Tensor::zeros({padded}, dtype, device);
  attach_grads();
}

void FlatParameters::attach_grads() {
  grad_dtype_ = flat_grads_.dtype();
  flat_params_.set_grad(flat_grads_);
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& t = *params_[i].tensor;
    t.set_grad(flat_grads_.narrow_view(0, offsets_[i], t.numel()).view(t.shape()));
    mark_grad_zeroed(t);
  }
}

void FlatParameters::set_grad_dtype(DType dtype) {
  const DType own = flat_params_.dtype();
  TT_CHECK(dtype == own || (dtype == DType::bf16 && own == DType::f32),
           std::string("gradients are ") + dtype_name(own) +
               " like the parameters, or bf16 for f32 parameters; got " + dtype_name(dtype));
  if (dtype == flat_grads_.dtype()) return;
  // Whoever already holds the gradients (DataParallel's registered buffer, ZeRO's slice, hooks of DDP or of
  // an update fused into backward) would keep working on the old buffer: refuse instead. Expected holders:
  // our handle and the flat tensor's .grad (one TensorImpl), and one view per parameter (the storage).
  bool hooked = false;
  for (const NamedParameter& p : params_) {
    hooked =
        hooked || !p.tensor->impl()->grad_ready_hooks.empty() || p.tensor->impl()->factored_grad_consumer;
  }
  TT_CHECK(!hooked && flat_grads_.impl_ptr().use_count() <= 2 &&
               flat_grads_.storage().use_count() <= static_cast<long>(params_.size()) + 1,
           "set_grad_dtype: the gradient buffer is already in use (data parallelism, ZeRO or an update fused "
           "into backward); choose the gradient dtype before creating them");
  // The old buffer goes before the new one comes (a 2.7b model's is 13.6 GB): every handle is dropped first.
  flat_params_.set_grad(Tensor());
  for (const NamedParameter& p : params_) p.tensor->set_grad(Tensor());
  flat_grads_ = Tensor();
  flat_grads_ = Tensor::zeros(flat_params_.shape(), dtype, flat_params_.device());
  attach_grads();
}

void FlatParameters::release_gradient_buffer() {
  if (flat_params_.defined()) flat_params_.set_grad(Tensor());
  for (const NamedParameter& p : params_) p.tensor->set_grad(Tensor());
  flat_grads_ = Tensor();
}

void FlatParameters::release_parameter_buffer() {
  disable_bf16_mirror();
  release_parameter_values();
}

void FlatParameters::release_parameter_values() {
  for (const NamedParameter& p : params_) {
    p.tensor->impl()->storage.reset();
    p.tensor->impl()->offset = 0;
  }
  flat_params_ = Tensor();
}

void FlatParameters::zero_grad() {
  if (!flat_grads_.defined()) return;
  flat_grads_.zero_();
  for (const NamedParameter& p : params_) mark_grad_zeroed(*p.tensor);
}

void FlatParameters::enable_bf16_mirror() {
  TT_CHECK(flat_params_.dtype() == DType::f32, "the bf16 mirror needs f32 parameters");
  if (!mirror_.defined()) mirror_ = Tensor::empty(flat_params_.shape(), DType::bf16, flat_params_.device());
  refresh_bf16_mirror();
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& t = *params_[i].tensor;
    t.set_low_precision_copy(mirror_.narrow_view(0, offsets_[i], t.numel()).view(t.shape()));
  }
}

void FlatParameters::refresh_bf16_mirror() {
  if (!mirror_.defined()) return;
  ops::cast_into(mirror_, flat_params_);  // no temporary: a 2.7b model's would be 6.8 GB
}

void FlatParameters::disable_bf16_mirror() {
  for (const NamedParameter& p : params_) p.tensor->set_low_precision_copy(Tensor());
  mirror_ = Tensor();
}

bool FlatParameters::bf16_mirror_is_current() const {
  if (!mirror_.defined()) return false;
  NoGradGuard no_grad;
  const std::vector<float> expect = ops::cast(flat_params_, DType::bf16).to_floats();
  return mirror_.to_floats() == expect;
}

}  // namespace tt::nn
