// Module: a tree of layers with ordered, named parameters whose names follow the PyTorch reference model's
// state_dict ("layers.0.attn.q_proj.weight"). FlatParameters then moves every parameter of a model into
// one contiguous f32 buffer (and every gradient into another), leaving each parameter a view of it, so the
// optimizer, DDP buckets, ZeRO shards and checkpoints all work on ranges of two buffers.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace tt::nn {

// How a parameter is initialised (as the CS336 "basics" handout says): truncated normal with a std (cut at
// +-3 std), or ones.
struct Init {
  enum class Kind { truncated_normal, ones } kind = Kind::ones;
  double std = 1.0;
};

struct NamedParameter {
  std::string name;
  Tensor* tensor;
  Init init;
  // Read only by matmuls, which in bf16 training read its bf16 copy (Tensor::low_precision_copy) and never
  // its f32 values: ZeRO-2 then brings back only the copy after an update.
  bool matmul_weight = false;
};

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Depth-first, in registration order, with dotted names.
  std::vector<NamedParameter> named_parameters();
  int64_t parameter_count();

 protected:
  Tensor& register_parameter(const std::string& name, const Shape& shape, Init init,
                             bool matmul_weight = false);
  template <class M>
  M& register_module(const std::string& name, std::unique_ptr<M> module) {
    M& ref = *module;
    children_.emplace_back(name, std::move(module));
    return ref;
  }

 private:
  void collect(const std::string& prefix, std::vector<NamedParameter>& out);
  struct Param {
    std::string name;
    Tensor tensor;
    Init init;
    bool matmul_weight = false;
  };
  std::vector<std::unique_ptr<Param>> params_;
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> children_;
};

// The flat parameter and gradient buffers of a module (f32, or f64 on CPU for gradient checks).
class FlatParameters {
 public:
  // Allocates the buffers on `device`, initialises parameters from `seed` (element i of the flat buffer
  // from Philox counter i: identical on every device and rank), points every parameter at its slice and
  // sets each .grad to its slice of the zeroed gradient buffer.
  // pad_multiple > 1 pads both buffers with zeros to a multiple of it (ZeRO slices them evenly by rank);
  // padding belongs to no parameter.
  FlatParameters(Module& module, Device device, uint64_t seed, DType dtype = DType::f32,
                 int64_t pad_multiple = 1);

  const std::vector<NamedParameter>& parameters() const { return params_; }
  const std::vector<int64_t>& offsets() const { return offsets_; }  // element offset of each parameter
  Tensor& flat_params() { return flat_params_; }
  const Tensor& flat_params() const { return flat_params_; }
  Tensor& flat_grads() { return flat_grads_; }
  int64_t numel() const { return parameter_numel_; }  // without padding
  // Zeroes the gradient buffer and marks every parameter's .grad as zero (mark_grad_zeroed), so that the
  // next backward's matmuls write weight gradients without reading the buffer.
  void zero_grad();
  // The gradient buffer's dtype: the parameters' own (the default), or bf16 for f32 parameters trained in
  // bf16 (half the bytes for the weight-gradient matmuls to write, the optimizer to read and an all-reduce to
  // move). With bf16 gradients the matmuls write each weight's gradient rounded to bf16 once, as PyTorch's
  // autocast does (its bf16 matmul's gradient, widened to the f32 .grad); other parameters' gradients are
  // computed in f32 and rounded to bf16 as they are stored, and a second contribution is added in f32 and
  // rounded again. Reallocates the (zeroed) buffer and re-points every .grad: call it before handing the
  // gradients to anything that keeps them (DataParallel, ShardedOptimizer, UpdateInBackward).
  void set_grad_dtype(DType dtype);
  DType grad_dtype() const { return grad_dtype_; }

  // For ZeRO-2 and 3 (optim/zero_optimizer.h), which keep only shards and per-unit buffers: frees the
  // gradient buffer (every .grad becomes undefined; zero_grad() then does nothing) or the parameter buffer
  // (flat_params() becomes undefined and each parameter keeps its shape, dtype and autograd state but no
  // storage until someone points it at some). Afterwards whoever freed them provides the memory.
  void release_gradient_buffer();
  void release_parameter_buffer();
  // The same for the f32 buffer alone, keeping the bf16 mirror and each parameter's copy in it (ZeRO-2 in
  // bf16 training, whose matmuls read only the mirror).
  void release_parameter_values();

  // For bf16 training (f32 parameters): a bf16 copy of every parameter, laid out like the flat buffer and
  // attached to each parameter (Tensor::low_precision_copy), so the bf16 matmuls read it instead of casting
  // their weights in every forward. It must stay current: the AdamW that updates the flat buffer writes it
  // in the same pass (AdamW::write_bf16_mirror(this)); after changing parameters any other way (loading,
  // broadcasting, another optimizer) call refresh_bf16_mirror().
  void enable_bf16_mirror();  // allocates and fills it
  void refresh_bf16_mirror();
  void disable_bf16_mirror();  // detaches and frees it: matmuls cast again
  const Tensor& bf16_mirror() const { return mirror_; }
  // Whether the mirror holds exactly the parameters rounded to bf16 (for tests; reads both back).
  bool bf16_mirror_is_current() const;

 private:
  std::vector<NamedParameter> params_;
  std::vector<int64_t> offsets_;
  void attach_grads();  // points the flat tensor's and every parameter's .grad at flat_grads_, marked zero
  Tensor flat_params_, flat_grads_;
  DType grad_dtype_ = DType::f32;
  Tensor mirror_;
  int64_t parameter_numel_ = 0;
};

}  // namespace tt::nn
