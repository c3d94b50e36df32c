#include "core/autograd.h"

#include <atomic>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "core/allocator.h"
#include "core/ops.h"
#include "core/profile.h"

namespace tt {

namespace {
thread_local bool g_grad_mode = true;
std::atomic<uint64_t> g_sequence{0};
std::atomic<uint64_t> g_backward_passes{0};  // backward passes ended (normally or by an exception)
thread_local int g_backward_depth = 0;       // > 0 while run_backward runs on this thread

// Sum of two gradients for the same tensor; mixed precisions meet in the wider type.
Tensor accumulate(const Tensor& a, const Tensor& b) {
  if (a.dtype() == b.dtype()) return ops::add(a, b);
  const DType wide = (a.dtype() == DType::f64 || b.dtype() == DType::f64) ? DType::f64 : DType::f32;
  return ops::add(ops::cast(a, wide), ops::cast(b, wide));
}
// Whether `t` is one whole dense storage that at most `handles` references to its TensorImpl can reach
// (the caller's own included), so that writing to it or adopting it disturbs nobody.
bool held_only_by(const Tensor& t, long handles) {
  return t.defined() && t.impl_ptr().use_count() <= handles && t.storage().use_count() == 1 &&
         t.offset() == 0 && t.is_contiguous() && t.storage()->bytes() == t.nbytes();
}
}  // namespace

Node::Node() : sequence(g_sequence.fetch_add(1)) {}

bool grad_mode_enabled() {
  return g_grad_mode;
}
NoGradGuard::NoGradGuard() : previous_(g_grad_mode) {
  g_grad_mode = false;
}
NoGradGuard::~NoGradGuard() {
  g_grad_mode = previous_;
}
GradModeGuard::GradModeGuard(bool enabled) : previous_(g_grad_mode) {
  g_grad_mode = enabled;
}
GradModeGuard::~GradModeGuard() {
  g_grad_mode = previous_;
}

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!g_grad_mode) return false;
  for (const Tensor* t : inputs) {
    if (t && t->defined() && t->requires_grad()) return true;
  }
  return false;
}

std::shared_ptr<Node> gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return nullptr;
  if (t.grad_fn()) return t.grad_fn();
  TensorImpl* impl = t.impl();
  std::shared_ptr<Node> acc = impl->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t);
    impl->grad_accumulator = acc;
  }
  return acc;
}

void attach_node(const Tensor& output, const std::shared_ptr<Node>& node,
                 std::initializer_list<const Tensor*> inputs) {
  node->next.clear();
  for (const Tensor* t : inputs) node->next.push_back(t ? gradient_edge(*t) : nullptr);
  output.set_grad_fn(node);
  output.impl()->requires_grad = true;
}

Tensor AccumulateGrad::grad_buffer(const Shape& shape, DType dtype) const {
  const Tensor existing = leaf_.grad();
  const bool supported = dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16;
  if (!supported || !existing.defined() || !existing.is_contiguous() || existing.shape() != shape ||
      existing.dtype() != dtype || existing.device() != leaf_.device()) {
    return Tensor();
  }
  return existing;
}

void set_factored_grad_consumer(const Tensor& leaf, FactoredGradConsumer consumer) {
  TT_ASSERT(leaf.grad_fn() == nullptr, "set_factored_grad_consumer: " + leaf.describe() + " is not a leaf");
  TT_ASSERT(!consumer || !leaf.impl()->factored_grad_consumer,
            "set_factored_grad_consumer: " + leaf.describe() + " has a consumer already (remove it first)");
  leaf.impl()->factored_grad_consumer = std::move(consumer);
}

void mark_grad_zeroed(const Tensor& leaf) {
  leaf.impl()->grad_zero_pass = g_backward_passes.load() + (g_backward_depth > 0 ? 1 : 0);
}

void mark_grad_zeroed_in_current_pass(const Tensor& leaf) {
  leaf.impl()->grad_zero_pass = g_backward_passes.load();
}

bool grad_known_zero(const Tensor& leaf) {
  return leaf.impl()->grad_zero_pass == g_backward_passes.load();
}

void AccumulateGrad::note_direct_contribution(bool written) {
  direct_ = true;
  if (written) leaf_.impl()->grad_zero_pass = TensorImpl::kNoZeroPass;
}

namespace {
// The leaf's .grad as a destination for a gradient of `shape` and `dtype` (GradientRequest::into_leaf), and
// whether it holds zeros.
Tensor leaf_destination(const AccumulateGrad& accumulator, const Shape& shape, DType dtype, bool or_bf16,
                        bool* zero) {
  Tensor buffer = accumulator.grad_buffer(shape, dtype);
  *zero = buffer.defined() && grad_known_zero(accumulator.leaf());
  // A bf16 buffer only to overwrite: adding in place would round once per addition.
  if (dtype == DType::bf16 && !*zero) buffer = Tensor();
  if (!buffer.defined() && or_bf16 && dtype != DType::bf16)
    return leaf_destination(accumulator, shape, DType::bf16, false, zero);
  *zero = *zero && buffer.defined();
  return buffer;
}
}  // namespace

GradientRoute Node::route_gradient(size_t input, const GradientRequest& request) {
  TT_ASSERT(input < next.size(), std::string(name()) + ": no input " + std::to_string(input));
  GradientRoute route;
  Node* edge = next[input].get();
  if (edge == nullptr) return route;
  auto* accumulator = dynamic_cast<AccumulateGrad*>(edge);
  if (accumulator != nullptr && request.dy != nullptr && request.x != nullptr) {
    const FactoredGradConsumer& consumer = accumulator->leaf().impl()->factored_grad_consumer;
    if (consumer && consumer(*request.dy, *request.x)) {
      accumulator->note_direct_contribution(/*written=*/false);
      route.kind = GradientRoute::Kind::taken;
      return route;
    }
  }
  if (accumulator != nullptr && request.into_leaf) {
    bool zero = false;
    Tensor buffer = leaf_destination(*accumulator, request.shape, request.dtype, request.or_bf16, &zero);
    if (buffer.defined() && (zero || !request.leaf_only_if_zero)) {
      route.kind = GradientRoute::Kind::into_buffer;
      route.buffer = buffer;
      route.overwrite = zero;
      route.leaf_grad = true;
      return route;
    }
  }
  if (request.into_collected && collected_ != nullptr) {
    auto it = collected_->find(edge);
    // Only a buffer nobody else can see (add's backward hands one tensor to both of its inputs, so the
    // residual stream's gradient becomes writable once the other branch has consumed its handle).
    if (it != collected_->end() && held_only_by(it->second, 1) && it->second.dtype() == request.dtype &&
        it->second.shape() == request.shape) {
      // The op adds into it, which would leave a bf16 copy of its values stale (it may set a new one).
      it->second.set_low_precision_copy(Tensor());
      route.kind = GradientRoute::Kind::into_buffer;
      route.buffer = it->second;
      return route;
    }
  }
  return route;
}

void Node::routed(size_t input, const GradientRoute& route) {
  if (!route.leaf_grad) return;
  auto* accumulator = dynamic_cast<AccumulateGrad*>(next[input].get());
  TT_ASSERT(accumulator != nullptr, "Node::routed: input " + std::to_string(input) + " is not a leaf");
  accumulator->note_direct_contribution();
}

std::vector<Tensor> AccumulateGrad::apply(const Tensor& grad_output) {
  direct_ = false;
  if (grad_output.defined()) accumulate_tensor(grad_output);
  for (auto& entry : leaf_.impl()->grad_ready_hooks) entry.second(leaf_);
  return {};
}

void AccumulateGrad::accumulate_tensor(const Tensor& grad_output) {
  Tensor g = grad_output.dtype() == leaf_.dtype() ? grad_output : ops::cast(grad_output, leaf_.dtype());
  TT_ASSERT(g.shape() == leaf_.shape(),
            "gradient shape " + shape_str(g.shape()) + " does not match parameter " + leaf_.describe());
  Tensor existing = leaf_.grad();
  const bool was_zero = grad_known_zero(leaf_);
  leaf_.impl()->grad_zero_pass = TensorImpl::kNoZeroPass;
  if (!existing.defined()) {
    // Adopt the incoming buffer when nothing else can see it: the engine's reference and ours are the only
    // handles (add's backward hands one tensor to both inputs, which shows up as a third), and it is a whole,
    // dense storage. Otherwise copy. Models pre-assign .grad views of a flat buffer and take the add below.
    // A bf16 copy that came with it (RMSNorm's) is dropped: later passes add into .grad in place.
    const bool adopt = held_only_by(g, 2);
    if (adopt) g.set_low_precision_copy(Tensor());
    leaf_.set_grad(adopt ? g : g.clone());
  } else if (existing.dtype() != DType::bf16 || g.dtype() == DType::bf16) {
    ops::add_into(existing, g);  // a wider buffer takes the gradient widened
  } else if (was_zero) {
    // A narrower buffer than the parameter (bf16 gradients of f32 parameters) holding zeros: the gradient
    // rounded as it is stored.
    ops::cast_into(existing, g);
  } else {
    // The same, adding: the sum in the parameter's dtype, rounded once.
    Tensor sum = ops::cast(existing, g.dtype());
    ops::add_into(sum, g);
    ops::cast_into(existing, sum);
  }
}

void run_backward(const Tensor& root, const Tensor& grad) {
  run_backward_owned(root, grad);
}

void run_backward_owned(const Tensor& root, Tensor root_grad) {
  TT_CHECK(root.requires_grad(), "backward() on a tensor that does not require grad");
  NoGradGuard no_grad;
  // Ends this pass's zero marks however the pass ends (mark_grad_zeroed); a pass nested in another (a
  // recomputed block's) ends none: it is part of the outer one.
  struct PassScope {
    PassScope() { ++g_backward_depth; }
    ~PassScope() {
      if (--g_backward_depth == 0) g_backward_passes.fetch_add(1);
    }
  } pass_scope;
  if (!root_grad.defined()) {
    TT_CHECK(root.numel() == 1, "backward() without a gradient needs a scalar, got " + root.describe());
    root_grad = Tensor::full(root.shape(), 1.0, root.dtype(), root.device());
  }
  std::shared_ptr<Node> root_node = gradient_edge(root);

  // Count, for every reachable node, how many edges point to it.
  std::unordered_map<Node*, int> dependencies;
  std::vector<Node*> stack{root_node.get()};
  std::unordered_set<Node*> seen{root_node.get()};
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const auto& child : node->next) {
      if (!child) continue;
      dependencies[child.get()] += 1;
      if (seen.insert(child.get()).second) stack.push_back(child.get());
    }
  }

  // Ready nodes run latest-created first, so gradients appear in reverse order of the forward pass.
  auto later_first = [](const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) {
    return a->sequence < b->sequence;
  };
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, decltype(later_first)> ready(
      later_first);
  std::unordered_map<Node*, Tensor> pending;
  pending[root_node.get()] = std::move(root_grad);
  // A node runs when a gradient reached it or a producer added into its buffer directly.
  auto has_work = [&pending](Node* n) { return pending.count(n) > 0 || n->has_direct_contribution(); };
  ready.push(root_node);
  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    if (node->released) {
      throw Error(std::string("backward() through a graph that was already used (") + node->name() +
                  "); run the forward pass again");
    }
    Tensor node_grad;
    if (auto it = pending.find(node.get()); it != pending.end()) {
      node_grad = std::move(it->second);
      pending.erase(it);
    }
    std::vector<Tensor> input_grads;
    {
      // The node may route its gradients into what is collected so far (Node::route_gradient), during
      // apply() only.
      node->collected_ = &pending;
      struct EndRouting {
        Node& node;
        ~EndRouting() { node.collected_ = nullptr; }
      } end_routing{*node};
      // Allocations of a backward node are attributed to it in memory timelines.
      MemoryTagGuard tag(node->name());
      const NvtxRange range(node->name());
      input_grads = node->apply_owned(node_grad);
    }
    node_grad = Tensor();
    node->release_saved();
    node->released = !node->reusable();
    // A used node lets go of its edges once its children are counted down (below): a graph whose output is
    // still held (a loss kept for its value) then keeps no leaf accumulator alive, so the next pass makes
    // fresh ones, ordered after their consumers; an old one would run (and fire its leaf's gradient hooks)
    // only at the end of that pass.
    const std::vector<std::shared_ptr<Node>> edges = node->released ? std::move(node->next) : node->next;
    if (node->released) node->next.clear();
    for (size_t i = 0; i < edges.size(); ++i) {
      const std::shared_ptr<Node>& child = edges[i];
      if (!child) continue;
      if (i < input_grads.size() && input_grads[i].defined()) {
        Tensor& slot = pending[child.get()];
        slot = slot.defined() ? accumulate(slot, input_grads[i]) : input_grads[i];
      }
      if (--dependencies[child.get()] == 0) {
        if (has_work(child.get())) {
          ready.push(child);
        } else {
          // No gradient reached this node (all inputs were undefined): still visit it so its own
          // children's dependency counts fall, without running it.
          std::vector<std::shared_ptr<Node>> skip{child};
          while (!skip.empty()) {
            const std::shared_ptr<Node> s = std::move(skip.back());
            skip.pop_back();
            s->release_saved();
            s->released = !s->reusable();
            const std::vector<std::shared_ptr<Node>> s_edges = s->released ? std::move(s->next) : s->next;
            if (s->released) s->next.clear();
            for (const auto& grandchild : s_edges) {
              if (grandchild && --dependencies[grandchild.get()] == 0) {
                if (has_work(grandchild.get()))
                  ready.push(grandchild);
                else
                  skip.push_back(grandchild);
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace tt
