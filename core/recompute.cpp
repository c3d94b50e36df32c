#include "core/recompute.h"

#include <cstring>
#include <memory>
#include <string>

#include "core/profile.h"

namespace tt {

namespace {

// The results a selective recomputation keeps, in the order its ops ran.
struct KeptResults {
  struct Entry {
    const char* op;
    const void* weight;  // the op's weight parameter (its TensorImpl: the same object in both runs)
    std::vector<Tensor> results;
  };
  std::vector<Entry> entries;
  bool replaying = false;  // the second run: entries are taken, from `next` on
  size_t next = 0;
};

// The recomputation whose function is running on this thread, if it keeps results.
thread_local KeptResults* running_kept = nullptr;

class RunningKept {
 public:
  explicit RunningKept(KeptResults* kept) : previous_(running_kept) { running_kept = kept; }
  ~RunningKept() { running_kept = previous_; }
  RunningKept(const RunningKept&) = delete;
  RunningKept& operator=(const RunningKept&) = delete;

 private:
  KeptResults* previous_;
};

// Stands for the recomputed graph's input: collects the gradient that reaches it, as the saved input's own
// producer would have, so the nodes that add into a pending gradient in place see the same buffers.
class RecomputedInput : public Node {
 public:
  const char* name() const override { return "RecomputedInput"; }
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    grad = grad_output;
    return {};
  }
  std::vector<Tensor> apply_owned(Tensor& grad_output) override {
    grad = std::move(grad_output);
    return {};
  }
  Tensor grad;
};

class RecomputeBackward : public Node {
 public:
  RecomputeBackward(std::function<Tensor(const Tensor&)> fn, Tensor input, std::shared_ptr<KeptResults> kept)
      : fn_(std::move(fn)), input_(std::move(input)), kept_(std::move(kept)) {}
  const char* name() const override { return "RecomputeBackward"; }
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    Tensor grad = grad_output;
    return apply_owned(grad);
  }
  std::vector<Tensor> apply_owned(Tensor& grad_output) override {
    if (!grad_output.defined()) return {Tensor()};
    // A new handle on the saved input's memory, outside the forward graph, whose gradient lands in `entry`.
    const Tensor x = input_.as_strided_view(input_.shape(), input_.strides(), input_.offset());
    auto entry = std::make_shared<RecomputedInput>();
    if (input_.requires_grad()) attach_node(x, entry, {});
    Tensor y;
    {
      const NvtxRange range("recompute");
      const GradModeGuard grad_mode(true);
      if (kept_) kept_->replaying = true;
      const RunningKept running(kept_.get());
      y = fn_(x);
    }
    if (kept_) {
      TT_ASSERT(kept_->next == kept_->entries.size(),
                "recompute: the second run took fewer kept results than the first stored");
      // The recomputed graph's nodes hold what they need; the rest goes as backward frees them.
      kept_.reset();
    }
    TT_ASSERT(y.requires_grad(), "recompute: the recomputed function's output does not require grad");
    run_backward_owned(y, std::move(grad_output));
    return {std::move(entry->grad)};
  }
  void release_saved() override {
    input_ = Tensor();
    fn_ = nullptr;
    kept_.reset();
  }

 private:
  std::function<Tensor(const Tensor&)> fn_;
  Tensor input_;
  std::shared_ptr<KeptResults> kept_;
};

}  // namespace

Tensor recompute(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x,
                 const std::vector<const Tensor*>& parameters, RecomputeKeep keep) {
  bool needed = needs_grad({&x});
  for (const Tensor* p : parameters) needed = needed || needs_grad({p});
  if (!needed) {
    const RunningKept running(nullptr);
    return fn(x);
  }
  auto kept = keep == RecomputeKeep::matmuls ? std::make_shared<KeptResults>() : nullptr;
  Tensor y;
  {
    const NoGradGuard no_grad;
    const RunningKept running(kept.get());
    y = fn(x);
  }
  attach_node(y, std::make_shared<RecomputeBackward>(fn, x, std::move(kept)), {&x});
  return y;
}

bool replaying_kept_results() {
  return running_kept != nullptr && running_kept->replaying;
}

namespace detail {

bool keeping_results() {
  return running_kept != nullptr && !running_kept->replaying;
}

void store_results(const char* op, const Tensor& weight, std::vector<Tensor> results) {
  // Handles of their own: the function's output, one of them, gets the RecomputeBackward that holds these.
  for (Tensor& t : results) t = t.as_strided_view(t.shape(), t.strides(), t.offset());
  running_kept->entries.push_back({op, weight.impl(), std::move(results)});
}

bool kept_results(const char* op, const Tensor& weight, std::vector<Tensor>& results) {
  KeptResults* kept = running_kept;
  if (kept == nullptr || !kept->replaying) return false;
  TT_ASSERT(kept->next < kept->entries.size() && std::strcmp(kept->entries[kept->next].op, op) == 0 &&
                kept->entries[kept->next].weight == weight.impl(),
            std::string("recompute: the second run called ") + op +
                " where the first did not (the recomputed function must run the same ops in order)");
  KeptResults::Entry& entry = kept->entries[kept->next++];
  // The graph being recomputed attaches its own nodes to them.
  results = std::move(entry.results);
  return true;
}

}  // namespace detail

}  // namespace tt
