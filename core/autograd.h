// Define-by-run reverse-mode autograd. Each differentiable op creates a Node that saves what its backward
// needs and points to the nodes of its inputs. backward() runs the nodes in reverse creation order once all
// their consumers are done, accumulates into leaves' .grad, frees saved tensors as it goes, and fires a
// leaf's grad-ready hooks the moment its gradient for this pass is complete (DDP and ZeRO build on this).
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"

namespace tt {

// Where a backward op puts the gradient it computes for one of its inputs (Node::route_gradient). By default
// apply() returns each input's gradient, and the engine sums what reaches a tensor and passes it on. An op
// whose kernels can write or add in place asks first, and the engine answers one of:
//  - taken: the input is a leaf whose consumer took its gradient in factored form, dW = dy^T x (an optimizer
//    update fused into the weight-gradient matmul, set_factored_grad_consumer): compute nothing. Only
//    `benchmark --mode step-fused` installs such consumers: `train` clips, which needs the whole
//    gradient's norm before any update.
//  - into `buffer`: write the gradient there when `overwrite` (nothing of this pass is in it yet; a GEMM with
//    beta = 0 reads no C), else add it (beta = 1); then call routed() and return no tensor for that input.
//    The buffer is either the leaf's own .grad (FlatParameters' views of one flat buffer; known to hold
//    zeros after mark_grad_zeroed), or the gradient collected so far in this pass for the input (the
//    residual stream's, from the branch that ran first), which only the engine holds.
//  - returned: neither; return the gradient.
struct GradientRequest {
  Shape shape;  // the gradient's: the input's shape, in `dtype`
  DType dtype = DType::f32;
  // The op can write the leaf's .grad: an f32 or f64 buffer of `dtype` (added to unless it holds zeros), or
  // a bf16 one of `dtype` that holds zeros (an op never adds into a bf16 buffer, which would round each of
  // its sums; a later micro-batch's gradient goes through the engine, which adds in f32 and rounds once).
  bool into_leaf = false;
  bool leaf_only_if_zero = false;  // ... but only overwrite it, never add
  // ... or, when the leaf has no buffer of `dtype`, a bf16 one holding zeros, the result rounded once as
  // it is written (bf16 gradients of f32 parameters, FlatParameters::set_grad_dtype).
  bool or_bf16 = false;
  bool into_collected = false;  // the op can add into the gradient collected so far (same shape and dtype)
  // Offered first to the leaf's factored consumer, when set: dW = dy^T x.
  const Tensor* dy = nullptr;
  const Tensor* x = nullptr;

  // The two kinds of op: one that can add into the gradient collected so far, one that writes a leaf's .grad.
  static GradientRequest collected(const Shape& shape, DType dtype) {
    GradientRequest r;
    r.shape = shape;
    r.dtype = dtype;
    r.into_collected = true;
    return r;
  }
  static GradientRequest leaf(const Shape& shape, DType dtype, bool or_bf16) {
    GradientRequest r;
    r.shape = shape;
    r.dtype = dtype;
    r.into_leaf = true;
    r.or_bf16 = or_bf16;
    return r;
  }
};

struct GradientRoute {
  enum class Kind { returned, into_buffer, taken };
  Kind kind = Kind::returned;
  Tensor buffer;
  bool overwrite = false;
  bool leaf_grad = false;  // the buffer is the leaf's .grad (not a collected gradient)
};

class Node {
 public:
  Node();
  virtual ~Node() = default;
  virtual const char* name() const = 0;
  // Gradients with respect to each input, in the order of `next`; undefined where none flows.
  virtual std::vector<Tensor> apply(const Tensor& grad_output) = 0;
  // What the engine calls: apply() on the gradient, which the engine holds no other handle to. A node that
  // hands the gradient on (a recomputed block's, core/recompute.h) may move it out, so that whoever gets it
  // next can write to it in place as it could have without the node in between.
  virtual std::vector<Tensor> apply_owned(Tensor& grad_output) { return apply(grad_output); }
  // Frees saved tensors once the node has run (a graph is used for one backward pass).
  virtual void release_saved() {}
  // Whether the node may run in later backward passes (leaf accumulators are shared by every graph).
  virtual bool reusable() const { return false; }
  // Whether a producer wrote its gradient straight into this leaf's .grad (GradientRoute): the engine then
  // runs the node even when no gradient tensor reached it.
  virtual bool has_direct_contribution() const { return false; }

  // Inside apply(): where the gradient for input `input` goes (GradientRoute above). Asked at most once per
  // input and pass, just before the op computes that gradient.
  GradientRoute route_gradient(size_t input, const GradientRequest& request);
  // After the write into `route`'s buffer is queued (so a failure before leaves no trace): a leaf's
  // accumulator still runs its grad-ready hooks, and its .grad no longer holds zeros.
  void routed(size_t input, const GradientRoute& route);

  std::vector<std::shared_ptr<Node>> next;  // nullptr for inputs that need no gradient
  uint64_t sequence = 0;                    // creation order; later nodes run first
  bool released = false;                    // saved tensors freed: the node cannot run again

 private:
  friend void run_backward_owned(const Tensor& root, Tensor grad);
  // The engine's gradients collected so far in this pass, for the duration of apply().
  std::unordered_map<Node*, Tensor>* collected_ = nullptr;
};

// The node standing for a leaf tensor that requires grad: it accumulates into the leaf's .grad.
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(Tensor leaf) : leaf_(std::move(leaf)) {}
  const char* name() const override { return "AccumulateGrad"; }
  // grad_output may be undefined when only direct contributions arrived; the hooks run either way.
  std::vector<Tensor> apply(const Tensor& grad_output) override;
  bool reusable() const override { return true; }
  bool has_direct_contribution() const override { return direct_; }
  // The leaf's .grad when it is a dense buffer of `shape` and `dtype` (f32, f64 or bf16), else undefined.
  Tensor grad_buffer(const Shape& shape, DType dtype) const;
  // written: the producer wrote into .grad (so it no longer holds zeros); false for a gradient taken in
  // factored form, which leaves .grad as it was.
  void note_direct_contribution(bool written = true);
  const Tensor& leaf() const { return leaf_; }

 private:
  void accumulate_tensor(const Tensor& grad_output);
  Tensor leaf_;
  bool direct_ = false;
};

// A leaf's consumer of its gradient in factored form. A linear layer's backward offers its weight's gradient
// dW = dy^T x as the pair (dy: rows x out, x: rows x in, both in the compute dtype) before computing it
// (GradientRequest::dy). A consumer that uses the gradient itself (an optimizer update fused into the
// weight-gradient matmul) returns true: the gradient is then neither computed nor stored, the leaf's .grad
// is left as it was, and its grad-ready hooks still fire; its zero mark (mark_grad_zeroed) stays, so a
// consumer can tell from it in the hook whether anything else wrote a gradient. Returning false lets backward
// compute the gradient as usual. One consumer per leaf; an empty function removes it.
void set_factored_grad_consumer(const Tensor& leaf, FactoredGradConsumer consumer);

// Gradient buffers known to hold zeros. Whoever zeroes a leaf's .grad (FlatParameters::zero_grad,
// Optimizer::zero_grad, an update fused into backward) marks it; the first contribution of the next backward
// pass may then overwrite the buffer instead of adding to it (a GEMM with beta = 0 reads no C). The mark
// lasts until the engine writes that gradient or a backward pass ends, so writers the engine does not see
// (an all-reduce, clipping) can only run after it has lapsed. Between zeroing and backward, write .grad only
// through backward. A mark made inside a pass (from a hook) is for the next pass. Marks belong to one leaf
// tensor: a gradient that reaches the same memory through another leaf in the same pass (FlatParameters'
// flat tensor, whose .grad spans every parameter's) is not seen, so differentiate through the parameters.
void mark_grad_zeroed(const Tensor& leaf);
// The same for a buffer given to a leaf inside a pass before any of the pass's gradient reached it (ZeRO
// stages a unit's gradient buffers from inside backward, just before the unit's backward): for this pass.
void mark_grad_zeroed_in_current_pass(const Tensor& leaf);
bool grad_known_zero(const Tensor& leaf);

// Whether ops record the graph (thread-local; on by default).
bool grad_mode_enabled();

// Sets grad mode for its lifetime and restores the previous mode (a recomputed block records its graph
// inside backward, where the engine has turned recording off).
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled);
  ~GradModeGuard();
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool previous_;
};

class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// True when grad mode is on and some input requires grad: then the op must record a node.
bool needs_grad(std::initializer_list<const Tensor*> inputs);
// The edge to follow for `t`: its grad_fn, its (unique) accumulator if it is a leaf requiring grad, or null.
std::shared_ptr<Node> gradient_edge(const Tensor& t);
// Marks `output` as produced by `node` from `inputs` (sets node->next and output's grad_fn).
void attach_node(const Tensor& output, const std::shared_ptr<Node>& node,
                 std::initializer_list<const Tensor*> inputs);

void run_backward(const Tensor& root, const Tensor& grad);
// run_backward() taking the root's gradient over (no handle to it stays behind), for a backward pass run from
// inside a node's apply() (core/recompute.h): such a nested pass belongs to the pass that runs it, so zero
// marks (mark_grad_zeroed) last until the outermost pass ends.
void run_backward_owned(const Tensor& root, Tensor grad);

}  // namespace tt
