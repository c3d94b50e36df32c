// Parameter units: groups of a model's parameters (a Transformer block, the embedding, the head) that a
// strategy sharding parameters across ranks (ZeRO-3, optim/zero_optimizer.h) holds whole only while they
// compute, and whose gradients it collects unit by unit (ZeRO-2 and 3). A model that supports it runs each
// unit's forward through run_unit; with no ParameterUnits set that is just the call.
#pragma once

#include <functional>

#include "core/tensor.h"

namespace tt::nn {

class ParameterUnits {
 public:
  virtual ~ParameterUnits() = default;
  // Before unit `unit`'s forward: its parameters hold their values afterwards.
  virtual void before_forward(int unit) = 0;
  // After its forward; `backward_follows`: the output was recorded for backward, which will call
  // before_backward(unit) before the unit's backward uses the parameters (or writes their gradients).
  virtual void after_forward(int unit, bool backward_follows) = 0;
  virtual void before_backward(int unit) = 0;
};

// fn(x) with `units`' hooks around it, its output passed through a node whose backward calls
// before_backward(unit) before any of the unit's backward runs (every gradient into the unit flows through
// that output). The unit's parameters must be used inside fn only. units == nullptr: fn(x).
Tensor run_unit(ParameterUnits* units, int unit, const std::function<Tensor(const Tensor&)>& fn,
                const Tensor& x);

}  // namespace tt::nn
