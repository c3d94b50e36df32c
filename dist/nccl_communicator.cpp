// The NCCL backend: one communicator per process on its GPU, collectives on a dedicated non-blocking,
// high-priority communication stream. Ordering with the compute stream uses events only (compute -> comm
// before each collective, comm -> compute in Work::wait()), so the host never waits in the training loop.
//
// Failures that NCCL reports asynchronously, and collectives that never finish (a peer died or diverged),
// are caught by a watchdog thread that ends the job (MPI_Abort), instead of every rank hanging until the
// scheduler's limit.
//
// NVLink multicast (NVLS) stays off: NCCL_NVLS_ENABLE is set to 0 unless the user set it. On shared
// machines it must stay 0, because a process using multicast can take the host's GPUs out of service for
// everyone; nothing here calls cuMulticastCreate.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "core/cuda_context.h"
#include "dist/backends.h"
#include "dist/collective_timeout.h"
#include "dist/mpi_check.h"
#include "dist/peer_all_reduce.h"
#include "dist/runtime.h"
#include "kernels/cuda/cuda_kernels.h"

#define TT_NCCL_CHECK(call)                                                                               \
  do {                                                                                                    \
    const ncclResult_t tt_nccl_rc_ = (call);                                                              \
    if (tt_nccl_rc_ != ncclSuccess) ::tt::dist::throw_nccl_error(tt_nccl_rc_, #call, __FILE__, __LINE__); \
  } while (0)

namespace tt::dist {

[[noreturn]] void throw_nccl_error(ncclResult_t rc, const char* call, const char* file, int line) {
  std::string detail = ncclGetErrorString(rc);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') detail += std::string(" (") + last + ")";
  throw_call_error("NCCL", call, detail, file, line);
}

namespace {

constexpr auto kWatchdogPeriod = std::chrono::milliseconds(100);

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i32:
      return ncclInt32;
  }
  throw Error("no NCCL type for this dtype");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  return op == ReduceOp::sum ? ncclSum : ncclAvg;
}

class Event {
 public:
  explicit Event(bool timing) {
    TT_CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

class CommStream {
 public:
  CommStream() {
    // Highest priority, so communication kernels are scheduled ahead of queued compute and overlap it.
    int least = 0, greatest = 0;
    TT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    TT_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
  }
  ~CommStream() {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  CommStream(const CommStream&) = delete;
  CommStream& operator=(const CommStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class NcclComm {
 public:
  NcclComm(int world_size, int rank) {
    ncclUniqueId id{};
    if (rank == 0) TT_NCCL_CHECK(ncclGetUniqueId(&id));
    const CollectiveWait wait("broadcast of the NCCL id");
    TT_MPI_CHECK(MPI_Bcast(&id, static_cast<int>(sizeof(id)), MPI_BYTE, 0, MPI_COMM_WORLD));
    TT_NCCL_CHECK(ncclCommInitRank(&comm_, world_size, id, rank));
  }
  ~NcclComm() {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ncclComm_t get() const { return comm_; }

 private:
  ncclComm_t comm_ = nullptr;
};

// Polls the communicator's asynchronous error state and the completion of every issued collective. Such
// queries (ncclCommGetAsyncError, cudaEventQuery) are known to block at times while a collective hangs, and
// a blocked watchdog ends nothing: a StuckQueryMonitor ends the job when one has not returned within the
// timeout.
class Watchdog {
 public:
  Watchdog(ncclComm_t comm, int device, CollectiveTimeout timeout, std::string who)
      : comm_(comm),
        device_(device),
        timeout_(timeout.seconds),
        bound_(describe(timeout)),
        who_(std::move(who)),
        monitor_(timeout.seconds,
                 [this](const std::string& what) {
                   fail("the NCCL watchdog's query of " + what + " did not return within " + bound_ + kBlame);
                 }),
        thread_([this] { run(); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void track(std::shared_ptr<Event> done, std::string what) {
    std::lock_guard<std::mutex> lock(mutex_);
    in_flight_.push_back({std::move(done), std::move(what), std::chrono::steady_clock::now()});
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct InFlight {
    std::shared_ptr<Event> done;
    std::string what;
    Clock::time_point issued;
  };

  void run() {
    if (cudaSetDevice(device_) != cudaSuccess) fail("the watchdog cannot select its GPU");
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, kWatchdogPeriod, [this] { return stop_; })) {
      monitor_.begin("NCCL's error state");
      ncclResult_t async_state = ncclSuccess;
      const ncclResult_t rc = ncclCommGetAsyncError(comm_, &async_state);
      if (rc != ncclSuccess) fail(std::string("ncclCommGetAsyncError failed: ") + ncclGetErrorString(rc));
      if (async_state != ncclSuccess && async_state != ncclInProgress)
        fail(std::string("NCCL asynchronous error: ") + ncclGetErrorString(async_state));
      // Collectives complete in issue order on the one communication stream: only the oldest can be late.
      while (!in_flight_.empty()) {
        const InFlight& oldest = in_flight_.front();
        monitor_.begin(oldest.what);
        const cudaError_t state = cudaEventQuery(oldest.done->get());
        if (state == cudaSuccess) {
          in_flight_.pop_front();
          continue;
        }
        if (state != cudaErrorNotReady)
          fail("CUDA error while waiting for " + oldest.what + ": " + cudaGetErrorString(state));
        if (Clock::now() - oldest.issued > timeout_)
          fail("NCCL " + oldest.what + " did not complete within " + bound_ + kBlame);
        break;
      }
      monitor_.end();
    }
  }

  static constexpr const char* kBlame = "; a peer rank has probably failed or is in a different collective";

  // MPI_Abort ends every rank; ncclCommAbort first is not needed, and with a peer stopped in a collective
  // it could block before the line is printed.
  [[noreturn]] void fail(const std::string& why) { abort_job(why + " [" + who_ + "]"); }

  ncclComm_t comm_;
  int device_;
  std::chrono::duration<double> timeout_;
  std::string bound_;  // the timeout and its source, for messages
  std::string who_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::deque<InFlight> in_flight_;
  StuckQueryMonitor monitor_;
  std::thread thread_;  // last: starts once everything it reads is initialised
};

// A mark on `stream`; inside a capture, one that every replay of the graph makes again.
void record(const Event& event, cudaStream_t stream, bool captured) {
  TT_CUDA_CHECK(cudaEventRecordWithFlags(event.get(), stream, captured ? cudaEventRecordExternal : 0));
}

class NcclWork : public Work {
 public:
  // `captured`: issued inside a CUDA-graph capture, where `done` can only be waited on by the graph.
  NcclWork(std::shared_ptr<Event> done, cudaStream_t compute, std::vector<Tensor> keep_alive, bool captured)
      : done_(std::move(done)), compute_(compute), keep_alive_(std::move(keep_alive)), captured_(captured) {}
  ~NcclWork() override {
    if (waited_) return;
    try {
      wait();
    } catch (const std::exception& e) {
      abort_job(e.what());
    }
  }
  void wait() override {
    if (waited_) return;
    waited_ = true;
    // Issued in a capture that was abandoned (its error is on its way up): it never ran, and its event
    // cannot be waited on outside the capture.
    if (captured_ && !cuda::capturing(compute_)) {
      keep_alive_.clear();
      return;
    }
    TT_CUDA_CHECK(cudaStreamWaitEvent(compute_, done_->get(), 0));
    // The caching allocator orders reuse on the compute stream, which now runs after the collective.
    keep_alive_.clear();
  }
  bool poll() override {
    if (captured_) return false;  // runs only in replays; the graph orders it
    const cudaError_t state = cudaEventQuery(done_->get());
    if (state == cudaErrorNotReady) return false;
    TT_CUDA_CHECK(state);
    return true;
  }

 private:
  std::shared_ptr<Event> done_;
  cudaStream_t compute_;
  std::vector<Tensor> keep_alive_;
  bool captured_;
  bool waited_ = false;
};

class CudaTimer : public StreamTimer {
 public:
  explicit CudaTimer(cudaStream_t stream)
      : start_(true), stop_(true), stream_(stream), captured_(cuda::capturing(stream)) {
    record(start_, stream_, captured_);
  }
  void stop() override {
    record(stop_, stream_, captured_);
    stopped_ = true;
  }
  bool captured() const override { return captured_; }
  double elapsed_ms() override {
    TT_ASSERT(stopped_, "StreamTimer::elapsed_ms before stop()");
    TT_CUDA_CHECK(cudaEventSynchronize(stop_.get()));
    float ms = 0;
    TT_CUDA_CHECK(cudaEventElapsedTime(&ms, start_.get(), stop_.get()));
    return ms;
  }

 private:
  Event start_, stop_;
  cudaStream_t stream_;
  bool captured_;
  bool stopped_ = false;
};

std::string describe_rank(const DistRuntime& runtime, Device device) {
  return "rank " + std::to_string(runtime.rank()) + " on " + runtime.host_name() + " " + device.str();
}

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(Device device, DistRuntime& runtime)
      : Communicator(device, runtime.rank(), runtime.world_size()),
        compute_(enter_device(device)),
        local_size_(runtime.local_size()),
        comm_(runtime.world_size(), runtime.rank()),
        ready_(false),
        watchdog_(comm_.get(), device.index, nccl_timeout(), describe_rank(runtime, device)) {}
  ~NcclCommunicator() override = default;  // members: watchdog stops, peer maps close, stream drains, ...

  const char* backend() const override { return "nccl"; }

  std::unique_ptr<Work> all_reduce_async(Tensor& t, ReduceOp op) override {
    check_tensor(t, "all_reduce", true);
    const bool peer = by_copy_engine(t);
    return launch(all_reduce_name(peer), {t}, [&](cudaStream_t s) { issue_all_reduce(t, op, s, peer); });
  }

  void set_all_reduce_transport(AllReduceTransport transport) override {
    if (transport == all_reduce_transport()) return;
    TT_ASSERT(registered_ == 0, "set_all_reduce_transport: " + std::to_string(registered_) +
                                    " buffers are still registered with the current transport");
    if (transport == AllReduceTransport::copy_engine) {
      TT_CHECK(copy_engine_layout(world_size(), local_size_),
               "the copy-engine all-reduce needs 2 to " + std::to_string(PeerAllReduce::kMaxRanks) +
                   " ranks, all on one host; this job has " + std::to_string(world_size()) + " ranks, " +
                   std::to_string(local_size_) + " on this host");
      synchronize();
      peer_ = std::make_unique<PeerAllReduce>(rank(), world_size(), device().index, comm_stream_.get());
    } else {
      synchronize();
      peer_.reset();
    }
    set_transport_field(transport);
  }

  // Counted under every transport, so the transport cannot change under a live registration.
  void register_buffer(const Tensor& buffer) override {
    check_tensor(buffer, "register_buffer", false);
    if (peer_) peer_->register_buffer(buffer);
    ++registered_;
  }
  void unregister_buffer(const Tensor& buffer) override {
    if (peer_) peer_->unregister_buffer(buffer);
    --registered_;
  }

  std::unique_ptr<Work> all_reduce_widen_async(Tensor& t, ReduceOp op, Tensor& widened) override {
    check_tensor(t, "all_reduce", true);
    check_widened(t, widened);
    // Checked before anything is queued: the cast runs after the collective, on the communication stream.
    TT_ASSERT(t.dtype() == widened.dtype() || (t.dtype() == DType::bf16 && widened.dtype() == DType::f32),
              std::string("nccl all_reduce_widen: cannot widen ") + dtype_name(t.dtype()) + " into " +
                  dtype_name(widened.dtype()) + " (supported: bf16 -> f32)");
    const bool peer = by_copy_engine(t);
    return launch(all_reduce_name(peer), {t, widened}, [&](cudaStream_t s) {
      issue_all_reduce(t, op, s, peer);
      cuda::cast(t.raw_data(), t.dtype(), widened.raw_data(), widened.dtype(), t.numel(), s);
    });
  }

  std::unique_ptr<Work> broadcast_async(Tensor& t, int root) override {
    check_tensor(t, "broadcast", false);
    check_root(root);
    return launch("broadcast", {t}, [&](cudaStream_t s) {
      TT_NCCL_CHECK(ncclBroadcast(t.raw_data(), t.raw_data(), static_cast<size_t>(t.numel()),
                                  nccl_type(t.dtype()), root, comm_.get(), s));
    });
  }

  std::unique_ptr<Work> reduce_scatter_async(const Tensor& input, Tensor& output, ReduceOp op) override {
    check_tensor(input, "reduce_scatter", true);
    check_tensor(output, "reduce_scatter", true);
    check_blocks(input, output, "reduce_scatter");
    return launch("reduce_scatter", {input, output}, [&](cudaStream_t s) {
      TT_NCCL_CHECK(ncclReduceScatter(input.raw_data(), output.raw_data(),
                                      static_cast<size_t>(output.numel()), nccl_type(output.dtype()),
                                      nccl_op(op), comm_.get(), s));
    });
  }

  std::unique_ptr<Work> all_gather_async(const Tensor& input, Tensor& output) override {
    check_tensor(input, "all_gather", false);
    check_tensor(output, "all_gather", false);
    check_blocks(output, input, "all_gather");
    return launch("all_gather", {input, output}, [&](cudaStream_t s) {
      TT_NCCL_CHECK(ncclAllGather(input.raw_data(), output.raw_data(), static_cast<size_t>(input.numel()),
                                  nccl_type(input.dtype()), comm_.get(), s));
    });
  }

  std::unique_ptr<Work> all_gather_blocks_async(Tensor& buffer, int64_t offset, int64_t count,
                                                int64_t stride) override {
    check_gather_blocks(buffer, offset, count, stride);
    // One broadcast per rank, rooted at that rank's block, fused by the group into one launch that moves
    // the blocks in both directions at once (what ncclAllGather does for adjacent blocks).
    return launch("all_gather_blocks", {buffer}, [&](cudaStream_t s) {
      const size_t bytes = dtype_size(buffer.dtype());
      char* base = static_cast<char*>(buffer.raw_data());
      TT_NCCL_CHECK(ncclGroupStart());
      for (int r = 0; r < world_size(); ++r) {
        char* block = base + static_cast<size_t>(offset + static_cast<int64_t>(r) * stride) * bytes;
        TT_NCCL_CHECK(ncclBroadcast(block, block, static_cast<size_t>(count), nccl_type(buffer.dtype()), r,
                                    comm_.get(), s));
      }
      TT_NCCL_CHECK(ncclGroupEnd());
    });
  }

  void barrier() override {
    synchronize();
    TT_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  }
  void synchronize() override { TT_CUDA_CHECK(cudaStreamSynchronize(comm_stream_.get())); }
  std::unique_ptr<StreamTimer> start_timer() override {
    set_current_device(device().index);
    return std::make_unique<CudaTimer>(compute_);
  }
  void watch_replay(const char* what) override {
    set_current_device(device().index);
    auto done = std::make_shared<Event>(false);
    TT_CUDA_CHECK(cudaEventRecord(done->get(), compute_));
    watchdog_.track(done, what);
  }

 protected:
  bool supports(DType dtype, bool reduces) const override { return true; }

 private:
  static cudaStream_t enter_device(Device device) {
    TT_CHECK(device.is_cuda(), "the NCCL communicator needs a CUDA device, got " + device.str());
    // Unless the user decided otherwise, before NCCL reads its environment (see the file comment).
    setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
    set_current_device(device.index);
    return static_cast<cudaStream_t>(compute_stream(device.index));
  }

  // NCCL's in-place forms are exactly "this rank's block"; any other overlap would corrupt the data.
  void check_blocks(const Tensor& whole, const Tensor& part, const char* collective) const {
    const std::string where = std::string("nccl ") + collective + ": ";
    TT_ASSERT(whole.dtype() == part.dtype(), where + "input and output dtypes differ");
    TT_ASSERT(whole.numel() == part.numel() * world_size(), where + whole.describe() + " is not " +
                                                                std::to_string(world_size()) + " blocks of " +
                                                                part.describe());
    if (whole.storage() != part.storage()) return;
    const int64_t whole_end = whole.offset() + whole.numel(), part_end = part.offset() + part.numel();
    const bool disjoint = part_end <= whole.offset() || whole_end <= part.offset();
    TT_ASSERT(disjoint || is_rank_block(whole, part), where + "buffers overlap but not as this rank's block");
  }

  // The copy-engine transport takes tensors inside its registered buffers, outside CUDA graph capture (its
  // signals carry sequence numbers fixed when issued, which a replay would repeat): NCCL carries a captured
  // all-reduce (every rank captures the same collectives).
  bool by_copy_engine(const Tensor& t) const {
    return peer_ && peer_->covers(t) && !cuda::capturing(compute_);
  }
  static const char* all_reduce_name(bool peer) { return peer ? "all_reduce (copy engine)" : "all_reduce"; }

  // On the communication stream `s`: by the copy-engine transport (peer; averaging N ranks is * (1/N)), or
  // by NCCL.
  void issue_all_reduce(Tensor& t, ReduceOp op, cudaStream_t s, bool peer) {
    if (peer) {
      peer_->issue(t, op == ReduceOp::avg ? 1.0f / static_cast<float>(world_size()) : 1.0f);
      return;
    }
    TT_NCCL_CHECK(ncclAllReduce(t.raw_data(), t.raw_data(), static_cast<size_t>(t.numel()),
                                nccl_type(t.dtype()), nccl_op(op), comm_.get(), s));
  }

  template <class Issue>
  std::unique_ptr<Work> launch(const char* what, std::vector<Tensor> keep_alive, Issue&& issue) {
    set_current_device(device().index);
    TT_CUDA_CHECK(cudaEventRecord(ready_.get(), compute_));
    TT_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_.get(), ready_.get(), 0));
    issue(comm_stream_.get());
    auto done = std::make_shared<Event>(false);
    TT_CUDA_CHECK(cudaEventRecord(done->get(), comm_stream_.get()));
    // A captured collective runs only in replays, which watch_replay() watches as a whole.
    const bool captured = cuda::capturing(compute_);
    if (!captured) watchdog_.track(done, what);
    return std::make_unique<NcclWork>(std::move(done), compute_, std::move(keep_alive), captured);
  }

  cudaStream_t compute_;
  int local_size_;
  NcclComm comm_;
  CommStream comm_stream_;
  Event ready_;  // re-recorded per collective: a stream wait captures the event's state when issued
  Watchdog watchdog_;
  std::unique_ptr<PeerAllReduce> peer_;  // the copy-engine transport, when chosen
  int registered_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Device device, DistRuntime& runtime) {
  return std::make_unique<NcclCommunicator>(device, runtime);
}

}  // namespace tt::dist
