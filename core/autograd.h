// Define-by-run reverse-mode autograd. Each differentiable op creates a Node that saves what its backward
// needs and points to the nodes of its inputs. backward() runs the nodes in reverse creation order once all
// their consumers are done, accumulates into leaves' .grad, frees saved tensors as it goes, and fires a
// leaf's grad-ready hooks the moment its gradient for this pass is complete (DDP and ZeRO build on this).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace tt {

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
  // Whether a producer added its gradient straight into this node's buffer (claim_grad_buffer below): the
  // engine then runs the node even when no gradient tensor reached it.
  virtual bool has_direct_contribution() const { return false; }

  // Whether apply() may add its gradient for an input into that input's pending gradient in place (see
  // pending_grads): nodes whose kernels can accumulate for free (a GEMM with beta = 1, an epilogue) say so.
  virtual bool accumulates_in_place() const { return false; }

  std::vector<std::shared_ptr<Node>> next;  // nullptr for inputs that need no gradient
  uint64_t sequence = 0;                    // creation order; later nodes run first
  bool released = false;                    // saved tensors freed: the node cannot run again
  // Set by the engine for the duration of apply(), for nodes that accumulate in place: entry i is the
  // gradient already collected for next[i] by earlier nodes, when the engine alone holds it and it is one
  // whole dense buffer; undefined otherwise. A node may add its contribution into it (same shape and dtype)
  // and then return an undefined tensor for input i, which saves a separate sum over the buffer.
  std::vector<Tensor> pending_grads;
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

// When `edge` is the accumulator of a leaf whose .grad is a dense f32 or f64 buffer of `shape` and `dtype`
// (as FlatParameters sets up), or a bf16 one marked as holding zeros (to be overwritten, never added to),
// returns that buffer, else an undefined tensor. A producer that adds its
// gradient into it in place (a GEMM with beta = 1, say) then calls note_direct_contribution(edge) and returns
// no tensor for that input; the engine still runs the accumulator, so the leaf's grad-ready hooks fire.
// `known_zero`, when given, says whether that buffer is marked as holding zeros (mark_grad_zeroed below): the
// producer may then overwrite it instead of adding. With `or_bf16`, a leaf without such a buffer of `dtype`
// may instead offer a bf16 one marked as holding zeros (the bf16 gradients of wider parameters,
// FlatParameters::set_grad_dtype), for a producer that can round its result once as it writes it.
Tensor direct_grad_buffer(const std::shared_ptr<Node>& edge, const Shape& shape, DType dtype,
                          bool* known_zero = nullptr, bool or_bf16 = false);
void note_direct_contribution(const std::shared_ptr<Node>& edge, bool written = true);

// A leaf's consumer of its gradient in factored form. A linear layer's backward offers its weight's gradient
// dW = dy^T x as the pair (dy: rows x out, x: rows x in, both in the compute dtype) before computing it. A
// consumer that uses the gradient itself (an optimizer update fused into the weight-gradient matmul) returns
// true: the gradient is then neither computed nor stored, the leaf's .grad is left as it was, and its
// grad-ready hooks still fire; its zero mark (mark_grad_zeroed) stays, so a consumer can tell from it in the
// hook whether anything else wrote a gradient. Returning false lets backward compute the gradient as usual.
// One consumer per leaf; an empty function removes it.
void set_factored_grad_consumer(const Tensor& leaf, FactoredGradConsumer consumer);
// Offers (dy, x) to the consumer of the leaf behind `edge`, if it has one; true when it took the gradient.
bool consume_factored_grad(const std::shared_ptr<Node>& edge, const Tensor& dy, const Tensor& x);

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
