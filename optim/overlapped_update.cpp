#include "optim/overlapped_update.h"

#include <string>

namespace tt::optim {

OverlappedUpdate::OverlappedUpdate(AdamW& adamw, const nn::FlatParameters& params,
                                   const std::vector<size_t>& unit_first_parameters)
    : adamw_(adamw), device_(params.flat_params().device()) {
  TT_ASSERT(device_.is_cuda(), "OverlappedUpdate runs the update on a CUDA side stream");
  TT_ASSERT(adamw.parameter_count() == 1 && adamw.params()[0].raw_data() == params.flat_params().raw_data() &&
                adamw.params()[0].numel() == params.flat_params().numel(),
            "OverlappedUpdate needs the AdamW of the flat parameter buffer");
  TT_ASSERT(!unit_first_parameters.empty() && unit_first_parameters[0] == 0,
            "the first parameter unit starts at parameter 0");
  for (const size_t first : unit_first_parameters) {
    TT_ASSERT(first < params.offsets().size(), "a parameter unit starts past the last parameter");
    const int64_t begin = params.offsets()[first];
    TT_ASSERT(unit_begin_.empty() || begin > unit_begin_.back(), "parameter units out of order");
    unit_begin_.push_back(begin);
  }
  unit_begin_.push_back(params.flat_params().numel());
  for (size_t u = 0; u + 1 < unit_begin_.size(); ++u)
    unit_done_.push_back(std::make_unique<StreamEvent>(device_.index));
  gradients_final_ = std::make_unique<StreamEvent>(device_.index);
  all_done_ = std::make_unique<StreamEvent>(device_.index);
}

OverlappedUpdate::~OverlappedUpdate() {
  // A launched update finishes first; a deferred one nobody settled is dropped (launching kernels from a
  // destructor could only throw). A CUDA error here has already been reported by whatever failed first.
  if (state_ != State::launched) return;
  try {
    all_done_->block(compute_stream(device_.index));
  } catch (const std::exception&) {
  }
}

void OverlappedUpdate::launch() {
  void* compute = compute_stream(device_.index);
  void* side = side_stream(device_.index);
  gradients_final_->record(compute);
  gradients_final_->block(side);
  for (size_t u = 0; u < unit_done_.size(); ++u) {
    adamw_.apply_range(0, unit_begin_[u], unit_begin_[u + 1] - unit_begin_[u], side);
    unit_done_[u]->record(side);
  }
  all_done_->record(side);
  state_ = State::launched;
}

void OverlappedUpdate::settle() {
  if (state_ == State::deferred) return run_deferred();
  if (state_ == State::launched) all_done_->block(compute_stream(device_.index));
}

void OverlappedUpdate::run_deferred() {
  launch();
  // The replay's copy of this update is cancelled behind it on the side stream, before anything can wait.
  void* side = side_stream(device_.index);
  adamw_.cancel_prepared_step(side);
  all_done_->record(side);
  all_done_->block(compute_stream(device_.index));
}

void OverlappedUpdate::before_forward(int unit) {
  TT_ASSERT(unit >= 0 && static_cast<size_t>(unit) + 1 < unit_begin_.size(),
            "no parameter unit " + std::to_string(unit));
  if (state_ == State::deferred) run_deferred();
  if (state_ != State::launched) return;
  unit_done_[static_cast<size_t>(unit)]->block(compute_stream(device_.index));
}

}  // namespace tt::optim
