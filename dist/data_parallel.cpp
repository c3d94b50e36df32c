#include "dist/data_parallel.h"

#include <cmath>

#include "core/ops.h"
#include "dist/runtime.h"

namespace tt::dist {

DdpStrategy parse_ddp_strategy(const std::string& text) {
  if (text == "naive") return DdpStrategy::naive;
  if (text == "flat") return DdpStrategy::flat;
  if (text == "overlap") return DdpStrategy::overlap;
  if (text == "bucketed") return DdpStrategy::bucketed;
  throw Error("unknown DDP strategy '" + text + "' (expected naive, flat, overlap or bucketed)");
}

const char* ddp_strategy_name(DdpStrategy strategy) {
  switch (strategy) {
    case DdpStrategy::naive:
      return "naive";
    case DdpStrategy::flat:
      return "flat";
    case DdpStrategy::overlap:
      return "overlap";
    case DdpStrategy::bucketed:
      return "bucketed";
  }
  return "?";
}

struct DataParallel::State {
  State(nn::FlatParameters& p, Communicator& c, DdpStrategy s) : params(p), comm(c), strategy(s) {}

  nn::FlatParameters& params;
  Communicator& comm;
  DdpStrategy strategy;
  int64_t capacity_bytes = 0;
  Tensor wire;        // bf16 communication: the staging buffer, laid out like the flat gradient buffer
  Tensor registered;  // the buffer whose views are all-reduced, registered with the communicator
  std::vector<bool> trainable;  // per parameter, fixed at construction
  std::vector<GradientBucket> buckets;
  std::vector<int64_t> bucket_of;                  // per parameter; -1 when frozen
  std::vector<std::pair<size_t, uint64_t>> hooks;  // (parameter, hook handle), removed with this object

  // Per backward pass.
  bool sync = true;
  bool armed = false;
  std::vector<bool> ready;                 // per parameter: its gradient is final for this pass
  std::vector<bool> launched;              // per parameter: its own all-reduce is in flight (overlap)
  std::vector<size_t> bucket_ready_count;  // per bucket
  size_t next_bucket = 0;                  // buckets launch in index order (see launch_ready_buckets)
  std::vector<std::unique_ptr<Work>> pending;
  size_t first_unfinished = 0;  // pending[0, first_unfinished) have completed
  int64_t collectives = 0;
  std::unique_ptr<StreamTimer> wait_timer;
  double wait_ms = 0;

  void build_buckets() {
    const auto& list = params.parameters();
    const int64_t element_bytes = static_cast<int64_t>(dtype_size(params.flat_grads().dtype()));
    bucket_of.assign(list.size(), -1);
    GradientBucket current;
    auto close = [&] {
      if (current.parameters.empty()) return;
      for (size_t p : current.parameters) bucket_of[p] = static_cast<int64_t>(buckets.size());
      buckets.push_back(std::move(current));
      current = GradientBucket();
    };
    // Reverse order: backward produces the last parameters' gradients first, so the first buckets fill
    // early and their communication overlaps the rest of backward.
    for (size_t i = list.size(); i-- > 0;) {
      // A frozen parameter ends the bucket: buckets are contiguous ranges and its gradient is never sent.
      if (!trainable[i]) {
        close();
        continue;
      }
      const int64_t begin = params.offsets()[i], end = begin + list[i].tensor->numel();
      if (!current.parameters.empty() && (current.end - begin) * element_bytes > capacity_bytes) close();
      if (current.parameters.empty()) current.end = end;
      current.begin = begin;
      current.parameters.push_back(i);
    }
    close();
  }

  void on_grad_ready(size_t index) {
    if (!armed || !sync) return;
    if (ready[index]) {
      throw Error("DataParallel: the gradient of " + params.parameters()[index].name +
                  " became ready twice in one pass; call begin_backward() before every backward()");
    }
    ready[index] = true;
    if (strategy == DdpStrategy::overlap) {
      launch_parameter(index);
      launched[index] = true;
    } else if (strategy == DdpStrategy::bucketed) {
      const size_t b = static_cast<size_t>(bucket_of[index]);
      ++bucket_ready_count[b];
      launch_ready_buckets();
    }
    // Backward is the only time the host runs between launches; let in-flight collectives advance (MPI
    // progresses them inside MPI calls). Collectives finish in issue order, so polling stops at the first
    // unfinished one and each is polled to completion once: O(1) amortised per hook.
    while (first_unfinished < pending.size() && pending[first_unfinished]->poll()) ++first_unfinished;
  }

  // Launches ready buckets strictly in index order: every rank then issues its collectives in the same
  // order even if gradients became ready in a different order somewhere, which NCCL and MPI require.
  void launch_ready_buckets() {
    while (next_bucket < buckets.size() &&
           bucket_ready_count[next_bucket] == buckets[next_bucket].parameters.size()) {
      launch_bucket(next_bucket++);
    }
  }

  void launch_bucket(size_t b) { launch(buckets[b].begin, buckets[b].numel()); }
  void launch_parameter(size_t index) {
    launch(params.offsets()[index], params.parameters()[index].tensor->numel());
  }

  // Starts the average of gradient elements [begin, begin + count). With bf16 communication the range is
  // rounded into the staging buffer (on the compute stream, after the gradients) and the collective widens
  // its result back into the gradients itself.
  void launch(int64_t begin, int64_t count) {
    Tensor grads = params.flat_grads().narrow_view(0, begin, count);
    if (wire.defined()) {
      Tensor staged = wire.narrow_view(0, begin, count);
      ops::cast_into(staged, grads);
      pending.push_back(comm.all_reduce_widen_async(staged, ReduceOp::avg, grads));
    } else {
      pending.push_back(comm.all_reduce_async(grads, ReduceOp::avg));
    }
    ++collectives;
  }

  void reset_pass() {
    wait_pending();
    ready.assign(trainable.size(), false);
    launched.assign(trainable.size(), false);
    bucket_ready_count.assign(buckets.size(), 0);
    next_bucket = 0;
    collectives = 0;
  }

  void wait_pending() {
    for (auto& work : pending) work->wait();
    pending.clear();
    first_unfinished = 0;
  }
};

DataParallel::DataParallel(nn::FlatParameters& params, Communicator& comm, DdpStrategy strategy,
                           double bucket_mb, bool bf16_communication)
    : state_(std::make_shared<State>(params, comm, strategy)) {
  State& s = *state_;
  TT_CHECK(bucket_mb > 0 && std::isfinite(bucket_mb), "DataParallel: bucket_mb must be positive");
  if (bf16_communication) {
    const Tensor& grads = params.flat_grads();
    TT_CHECK(grads.dtype() == DType::f32 || (grads.dtype() == DType::f64 && grads.device().is_cpu()),
             std::string("DataParallel: bf16 communication needs f32 gradients (or f64 on the CPU), got ") +
                 dtype_name(grads.dtype()));
    s.wire = Tensor::empty(grads.shape(), DType::bf16, grads.device());
  }
  TT_ASSERT(params.flat_params().device() == comm.device(),
            "DataParallel: parameters on " + params.flat_params().device().str() +
                " but the communicator is on " + comm.device().str());
  s.capacity_bytes = std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * 1024.0 * 1024.0));

  // A rank built from a different configuration would otherwise receive a broadcast of the wrong size and
  // hang or corrupt memory: compare the element count with rank 0's first.
  const int64_t numel = params.numel();
  Tensor count = Tensor::from_ints(
      {static_cast<int32_t>(numel >> 31), static_cast<int32_t>(numel & 0x7fffffff)}, {2}, comm.device());
  comm.broadcast(count, 0);
  const std::vector<int32_t> root = count.to_ints();
  const int64_t root_numel = (static_cast<int64_t>(root[0]) << 31) | root[1];
  TT_CHECK(root_numel == numel, "DataParallel: rank 0 has " + std::to_string(root_numel) +
                                    " parameter elements, rank " + std::to_string(comm.rank()) + " has " +
                                    std::to_string(numel) + " (different model configurations?)");
  comm.broadcast(params.flat_params(), 0);

  const auto& list = params.parameters();
  for (size_t i = 0; i < list.size(); ++i) {
    s.trainable.push_back(list[i].tensor->requires_grad());
  }
  s.build_buckets();
  s.reset_pass();
  // Every collective below is on a view of this buffer; a transport may map it once (copy engine).
  s.registered = s.wire.defined() ? s.wire : params.flat_grads();
  comm.register_buffer(s.registered);
  const std::weak_ptr<State> weak = state_;
  for (size_t i = 0; i < list.size(); ++i) {
    if (!s.trainable[i]) continue;
    s.hooks.emplace_back(i, list[i].tensor->register_grad_ready_hook([weak, i](Tensor&) {
      if (const std::shared_ptr<State> state = weak.lock()) state->on_grad_ready(i);
    }));
  }
}

DataParallel::~DataParallel() {
  // Collectives still in flight write into the gradient buffer: finish them before it can go away.
  try {
    state_->wait_pending();
    state_->comm.unregister_buffer(state_->registered);
  } catch (const std::exception& e) {
    abort_job(std::string("DataParallel: ") + e.what());
  }
  for (const auto& [index, handle] : state_->hooks)
    state_->params.parameters()[index].tensor->remove_grad_ready_hook(handle);
}

void DataParallel::set_sync(bool sync) {
  TT_ASSERT(!state_->armed, "DataParallel::set_sync between begin_backward and finish_backward");
  state_->sync = sync;
}

bool DataParallel::sync() const {
  return state_->sync;
}

void DataParallel::begin_backward() {
  state_->reset_pass();
  state_->armed = true;
}

void DataParallel::finish_backward() {
  State& s = *state_;
  TT_ASSERT(s.armed, "DataParallel::finish_backward without begin_backward");
  s.armed = false;
  s.wait_timer.reset();
  s.wait_ms = 0;
  if (!s.sync) return;
  s.wait_timer = s.comm.start_timer();
  switch (s.strategy) {
    case DdpStrategy::naive:
      // One parameter at a time, each waited for before the next starts.
      for (size_t i = 0; i < s.trainable.size(); ++i) {
        if (!s.trainable[i]) continue;
        s.launch_parameter(i);
        s.pending.back()->wait();
      }
      break;
    case DdpStrategy::flat:
      s.launch(0, s.params.flat_grads().numel());
      break;
    case DdpStrategy::overlap:
      // Parameters that received no gradient in this pass (same on every rank): send them now, in order.
      for (size_t i = 0; i < s.trainable.size(); ++i) {
        if (s.trainable[i] && !s.launched[i]) s.launch_parameter(i);
      }
      break;
    case DdpStrategy::bucketed:
      while (s.next_bucket < s.buckets.size()) s.launch_bucket(s.next_bucket++);
      break;
  }
  s.wait_pending();
  s.wait_timer->stop();
}

DdpStrategy DataParallel::strategy() const {
  return state_->strategy;
}

bool DataParallel::bf16_communication() const {
  return state_->wire.defined();
}

double DataParallel::communication_wait_ms() {
  State& s = *state_;
  if (s.wait_timer) {
    s.wait_ms = s.wait_timer->elapsed_ms();
    // A timer of a captured backward times every replay of it.
    if (!s.wait_timer->captured()) s.wait_timer.reset();
  }
  return s.wait_ms;
}

int64_t DataParallel::collectives_last_pass() const {
  return state_->collectives;
}

const std::vector<GradientBucket>& DataParallel::buckets() const {
  return state_->buckets;
}

int64_t DataParallel::bucket_capacity_bytes() const {
  return state_->capacity_bytes;
}

}  // namespace tt::dist
