// Parameter units: groups of a model's parameters (a Transformer block, the embedding, the head) that an
// optimizer handles one at a time: ZeRO-3 (optim/zero_optimizer.h) holds a unit whole only while it computes,
// ZeRO-2 and 3 collect its gradients unit by unit, and the update beside the next forward
// (optim/overlapped_update.h) lets each unit's forward wait for that unit's update only. A model that
// supports it runs each unit's forward through run_unit; with no ParameterUnits set that is just the call.
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
