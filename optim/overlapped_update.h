// The AdamW update of one step overlapped with the next step's forward. Global-norm clipping needs every
// gradient before the first update, so the update cannot run inside backward; it can run beside the next
// forward instead. After backward and clipping, launch() queues the update on the side stream unit by unit
// (the embedding, each Transformer block, the final norm with the head: nn/parameter_units.h), and the next
// forward waits, before each unit, for that unit's update only. Exact: every parameter (and its bf16
// mirror) is updated before anything reads it, from final, clipped gradients; only the timing changes.
//
// Per step:  forward (gated per unit);  settle();  zero_grad();  backward;  clip;  adamw.prepare_step();
//            launch();
// Anything else that reads the parameters or the optimizer state (a checkpoint, a sample) calls settle()
// first. CUDA only: on the CPU the step updates in place after backward.
//
// Under a CUDA graph of the whole step (apps/lib/train_step.h), the graph's body starts with launch(): the
// update of step k runs in replay k + 1.
//   Per step:  hand_to_replay();  replay (launch(), forward, settle(), zero_grad(), backward, clip);
//              adamw.prepare_step();  defer();
// Anything that needs the parameters before that replay (a forward outside the step, settle()) runs the
// deferred update eagerly and cancels it in the replay (AdamW::cancel_prepared_step).
#pragma once

#include <memory>
#include <vector>

#include "core/cuda_context.h"
#include "nn/parameter_units.h"
#include "optim/optimizer.h"

namespace tt::optim {

class OverlappedUpdate : public nn::ParameterUnits {
 public:
  // `adamw` updates exactly params.flat_params(); unit u owns the parameters from index
  // unit_first_parameters[u] to the next unit's first (the last unit also the padding).
  OverlappedUpdate(AdamW& adamw, const nn::FlatParameters& params,
                   const std::vector<size_t>& unit_first_parameters);
  ~OverlappedUpdate() override;

  // Queues this step's update, after prepare_step(), the gradients final and clipped on the compute stream.
  void launch();
  // Work queued on the compute stream from now on waits for the whole update (a deferred one runs first).
  void settle();
  // After prepare_step(): the update waits for the next graph replay (hand_to_replay()), or for the first
  // use of the parameters before it.
  void defer() { state_ = State::deferred; }
  // Before capturing a step whose body starts with launch(), and before each replay of it: the replay
  // applies the deferred update (or skips it, when it ran eagerly meanwhile) and waits for it to finish. The
  // events a capture records can only be waited on inside its graph, so nothing outside waits on them.
  void hand_to_replay() { state_ = State::idle; }
  bool deferred() const { return state_ == State::deferred; }

  void before_forward(int unit) override;  // the compute stream waits for the unit's update
  void after_forward(int, bool) override {}
  void before_backward(int) override {}

 private:
  AdamW& adamw_;
  Device device_;
  std::vector<int64_t> unit_begin_;  // element offsets into the flat buffer; one more than units, the end
  std::vector<std::unique_ptr<StreamEvent>> unit_done_;
  std::unique_ptr<StreamEvent> gradients_final_, all_done_;
  // idle: nothing to wait for; launched: the events mark an update on the side stream; deferred: prepared,
  // not launched.
  enum class State { idle, launched, deferred } state_ = State::idle;
  void run_deferred();  // the deferred update, now, eagerly; its replay then skips it
};

}  // namespace tt::optim
