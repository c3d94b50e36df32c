// AdamW fused into backward. Each parameter is updated the moment backward has finished its gradient (its
// grad-ready hook), and that gradient slice is zeroed right after, so the optimizer's memory traffic runs
// while the rest of backward computes instead of after it. On CUDA the updates go to a side stream, each
// ordered after its gradient by an event, and finish() orders the compute stream after all of them (both
// work inside a CUDA graph capture). The result is exactly that of
//     loss.backward();  optimizer.step();  params.zero_grad();
// whenever nothing rescales the gradients between backward and the step: no clipping, no accumulation over
// micro-batches, no data-parallel averaging. Parameters that receive no gradient (frozen ones, or unused
// in this pass) and the flat buffer's padding are updated in finish(), as a whole-buffer step would.
// With `in_matmul`, a linear layer's weight goes one step further: its update runs inside the matmul that
// computes its gradient (AdamW::apply_factored_gradients, the factored-gradient consumer of autograd.h), so
// the gradient is never stored, read back or zeroed. Those updates run on the compute stream in groups of
// `group` weights (by default AdamW::kFactoredGroup), one launch each, as soon as a group is complete and at
// finish(); each weight's dy and x stay allocated until its group has run. The result then differs from the
// unfused step only by the matmul's summation order (another kernel computes the same product). Weights that
// kernel does not take fall back to the hook path above, and so does a weight whose .grad already holds a
// gradient when its matmul runs (left from before begin()); a weight that gets another gradient after its
// matmul's update in the same pass (used twice) is an error. begin() refuses an AdamW with a gradient scale
// (clipping needs the global norm first), and a parameter whose gradient arrives twice in one pass
// (accumulation) is an error when the second arrives; do not combine it with dist::DataParallel, whose hooks
// communicate the very gradients these updates consume and zero.
#pragma once

#include <memory>

#include "nn/module.h"
#include "optim/optimizer.h"

namespace tt::optim {

class UpdateInBackward {
 public:
  // `optimizer` must be an AdamW over exactly {params.flat_params()}. Registers a grad-ready hook on every
  // parameter; the hooks do nothing outside begin()/finish() and after this object is gone. `group`: with
  // in_matmul, the weights applied per launch (1 to AdamW::kFactoredGroup).
  UpdateInBackward(nn::FlatParameters& params, AdamW& optimizer, bool in_matmul = false,
                   size_t group = AdamW::kFactoredGroup);
  ~UpdateInBackward();
  UpdateInBackward(const UpdateInBackward&) = delete;
  UpdateInBackward& operator=(const UpdateInBackward&) = delete;

  // Before backward, after optimizer.prepare_step() (which counts the step and uploads its scalars).
  void begin();
  // After backward: updates the ranges no hook reached and, on CUDA, makes the compute stream wait for
  // every update. The gradients are zero afterwards.
  void finish();
  // Parameters the hooks updated during the last backward (the rest were updated by finish()).
  int64_t updated_in_backward() const;
  // Of those, the ones updated inside their weight-gradient matmul (in_matmul).
  int64_t updated_in_matmul() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace tt::optim
