// Activation recomputation ("gradient checkpointing") of one function of one tensor, a Transformer block:
// forward runs it without recording its graph and keeps only its input (and, selectively, the results of its
// matmuls); backward runs it again from that input with autograd on and backpropagates the incoming gradient
// through the recomputed graph.
#pragma once

#include <functional>
#include <vector>

#include "core/autograd.h"

namespace tt {

// What the first run keeps besides the input. nothing: the whole function runs again in backward.
// matmuls: the results of its linear layers and of flash attention too (ops::linear, ops::linear_residual,
// ops::attention_qkv, and ops::swiglu_projection's two projections); the second run takes them instead of
// computing them again, so only the ops between them run twice and only their outputs are not kept: in a
// Transformer block with flash attention, the norms, the SwiGLU gate and casts (with naive attention, its
// score and value products and softmax too).
enum class RecomputeKeep { nothing, matmuls };

// fn(x), recomputed in backward. `parameters` are the leaves fn reads (a module's parameters): they get their
// gradients from the recomputed graph, through their own accumulators, so grad-ready hooks, direct .grad
// buffers, factored gradients and zero marks behave as without recomputation, and each leaf's hooks run
// once per pass. fn must compute the same values both times (no randomness, no state it changes), call the
// same ops in the same order, and not change x. Without grad mode, or when neither x nor a parameter
// requires grad, this is just fn(x).
Tensor recompute(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x,
                 const std::vector<const Tensor*>& parameters, RecomputeKeep keep = RecomputeKeep::nothing);

// Whether the function running now is the second run of a RecomputeKeep::matmuls recomputation, whose
// matmuls take their kept results: work done only to feed those matmuls can be skipped.
bool replaying_kept_results();

namespace detail {
// For the ops whose results RecomputeKeep::matmuls keeps. In the first run of such a recomputation,
// keep_results stores `results` (the op's own, after any in-place change it makes); in the second run,
// kept_results returns true with what the same op stored then, as new handles outside any graph, and the op
// skips computing them. Anywhere else: keep_results does nothing, kept_results returns false. `weight`, the
// op's weight parameter, ties results to their op: a second run that takes them in another order fails.
bool keeping_results();  // the first run of such a recomputation is running on this thread
void store_results(const char* op, const Tensor& weight, std::vector<Tensor> results);
// Every linear op calls it: outside a selective recomputation it costs one thread-local read.
template <class... T>
void keep_results(const char* op, const Tensor& weight, const T&... results) {
  if (keeping_results()) store_results(op, weight, {results...});
}
bool kept_results(const char* op, const Tensor& weight, std::vector<Tensor>& results);
}  // namespace detail

}  // namespace tt
