// Activation recomputation ("gradient checkpointing") of one function of one tensor, a Transformer block:
// forward runs it without recording its graph and keeps only its input; backward runs it again from that
// input with autograd on and backpropagates the incoming gradient through the recomputed graph.
#pragma once

#include <functional>
#include <vector>

#include "core/autograd.h"

namespace tt {

// fn(x), recomputed in backward. `parameters` are the leaves fn reads (a module's parameters): they get their
// gradients from the recomputed graph, through their own accumulators, so grad-ready hooks, direct .grad
// buffers, factored gradients and zero marks behave as without recomputation, and each leaf's hooks run
// once per pass. fn must compute the same values both times (no randomness, no state it changes) and must
// not change x. Without grad mode, or when neither x nor a parameter requires grad, this is just fn(x).
Tensor recompute(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x,
                 const std::vector<const Tensor*>& parameters);

}  // namespace tt
