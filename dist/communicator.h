// Collectives over the ranks of a job on tensors of one device: MPI for CPU tensors, NCCL for CUDA tensors.
// Tensors are contiguous (any shape; typically narrow views of a model's flat gradient buffer) and are
// reduced in place. Dtypes: f32, f64 (CPU), bf16 (CUDA reductions; CPU only for broadcast/all_gather), i32.
//
// On CUDA every collective is ordered after the work already queued on the device's compute stream and runs
// on a separate communication stream; Work::wait() makes the compute stream wait for it, so neither side
// blocks the host. A tensor handed to an asynchronous collective is kept alive by its Work until wait().
#pragma once

#include <memory>
#include <string>

#include "core/tensor.h"

namespace tt::dist {

class DistRuntime;
class Communicator;

enum class ReduceOp { sum, avg };  // avg = sum / world_size

const char* reduce_op_name(ReduceOp op);

// How all_reduce moves data.
//   library      the backend's collective library: NCCL for CUDA tensors, MPI for CPU tensors.
//   copy_engine  NCCL backend, 2 to 8 ranks, all on one host, whose GPUs can map each other's memory: an
//                all-reduce of a tensor inside a registered buffer pulls the other ranks' copies of this
//                rank's slice with the copy engines and adds them with one short kernel (see
//                dist/peer_all_reduce.h), leaving the SMs to the backward pass it overlaps; other tensors and
//                collectives still use NCCL.
enum class AllReduceTransport { library, copy_engine };
const char* all_reduce_transport_name(AllReduceTransport transport);     // "library", "copy-engine"
AllReduceTransport parse_all_reduce_transport(const std::string& text);  // throws tt::Error on unknown names
// Throws tt::Error unless `text` is a value of the --all-reduce flag: auto, library or copy-engine.
void check_all_reduce_flag(const std::string& text);

// Sets comm's transport from a flag value: "library", "copy-engine" (errors propagate), or "auto": the copy
// engine where it can work - a DDP all-reduce will run (will_all_reduce), a CUDA communicator, 2 to
// kAutoCopyEngineMaxRanks ranks, all on one host, each GPU able to map every other's memory,
// NCCL_P2P_DISABLE not 1 - else the library;
// when the copy engine was a candidate but could not be set up, the library, and the returned note says
// why (empty otherwise). Collective.
// The copy-engine transport serves up to kCopyEngineMaxRanks ranks of one host. Measured on 4 x H200
// (docs/distributed.md): with more than two ranks it beats NCCL only for some bucket sizes and models, so
// auto picks it for two ranks only.
constexpr int kCopyEngineMaxRanks = 8;
constexpr int kAutoCopyEngineMaxRanks = 2;
// Whether a job of `world_size` ranks, `local_size` of them on this host, is one the copy-engine transport
// can serve: 2 to kCopyEngineMaxRanks ranks, all on one host.
inline bool copy_engine_layout(int world_size, int local_size) {
  return world_size >= 2 && world_size <= kCopyEngineMaxRanks && local_size == world_size;
}
std::string select_all_reduce_transport(Communicator& comm, const std::string& text,
                                        const DistRuntime& runtime, bool will_all_reduce);

// A collective in flight. wait() is idempotent; destroying an unwaited Work waits.
class Work {
 public:
  virtual ~Work() = default;
  // CPU: blocks until the result is in place. CUDA: orders the compute stream after the collective.
  virtual void wait() = 0;
  // Never blocks: lets the backend make progress (MPI moves non-blocking collectives only inside MPI calls)
  // and says whether the collective has finished. wait() is still required before using the result.
  virtual bool poll() = 0;
};

// Time between start_timer() and stop() as seen by the compute stream (CUDA) or the host (CPU).
class StreamTimer {
 public:
  virtual ~StreamTimer() = default;
  virtual void stop() = 0;
  virtual double elapsed_ms() = 0;  // on CUDA waits until the stop mark has been reached
  // Started and stopped inside a CUDA-graph capture: every replay marks both again, and elapsed_ms() gives
  // the last replay's time.
  virtual bool captured() const { return false; }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  Device device() const { return device_; }
  virtual const char* backend() const = 0;  // "mpi" or "nccl"

  // Every rank ends with the reduction of all ranks' `tensor`.
  virtual void all_reduce(Tensor& tensor, ReduceOp op = ReduceOp::sum);
  virtual std::unique_ptr<Work> all_reduce_async(Tensor& tensor, ReduceOp op = ReduceOp::sum) = 0;
  // The same, then the result converted to `widened`'s dtype (same shape, contiguous) is written there, on
  // the communication side (CUDA: the communication stream), so the caller needs no pass of its own.
  // For gradients sent in bf16 and kept in f32.
  virtual std::unique_ptr<Work> all_reduce_widen_async(Tensor& tensor, ReduceOp op, Tensor& widened) = 0;
  // Every rank ends with root's `tensor`.
  virtual void broadcast(Tensor& tensor, int root);
  virtual std::unique_ptr<Work> broadcast_async(Tensor& tensor, int root) = 0;
  // input holds world_size blocks of output.numel() elements; rank r gets the reduction of block r. output
  // may be block r of input itself (in place).
  virtual void reduce_scatter(const Tensor& input, Tensor& output, ReduceOp op = ReduceOp::sum);
  virtual std::unique_ptr<Work> reduce_scatter_async(const Tensor& input, Tensor& output,
                                                     ReduceOp op = ReduceOp::sum) = 0;
  // output holds world_size blocks of input.numel() elements; block r is rank r's input. input may be
  // block r of output itself (in place).
  virtual void all_gather(const Tensor& input, Tensor& output);
  virtual std::unique_ptr<Work> all_gather_async(const Tensor& input, Tensor& output) = 0;
  // An in-place all-gather of blocks that need not be adjacent: in the contiguous `buffer`, rank r's block
  // is the `count` elements from offset + r * stride (stride >= count). Every rank contributes its own block
  // and ends with every rank's. ZeRO gathers its slices chunk by chunk this way, each chunk as soon as it has
  // been updated.
  virtual std::unique_ptr<Work> all_gather_blocks_async(Tensor& buffer, int64_t offset, int64_t count,
                                                        int64_t stride) = 0;

  // Collective. Throws tt::Error naming the reason when this backend or job cannot use `transport`. Switch
  // only while no buffer is registered.
  virtual void set_all_reduce_transport(AllReduceTransport transport);
  AllReduceTransport all_reduce_transport() const { return transport_; }
  // Collective: the caller will all-reduce views of `buffer` (the same size on every rank, e.g. the flat
  // gradient buffer) until it unregisters it; a transport may map it once instead of per collective. No
  // effect for the library transport.
  virtual void register_buffer(const Tensor& buffer) {}
  virtual void unregister_buffer(const Tensor& buffer) {}

  // Host-level rendezvous of all ranks, after every collective issued so far has completed.
  virtual void barrier() = 0;
  // Blocks the host until every collective issued so far has completed.
  virtual void synchronize() = 0;
  virtual std::unique_ptr<StreamTimer> start_timer() = 0;
  // Collectives issued while the compute stream is being captured into a CUDA graph run only in its
  // replays, where the backend's watchdog (NCCL) cannot see them one by one. Called after each replay is
  // launched: the watchdog waits for the work queued on the compute stream so far as for one collective
  // named `what`, within the collective timeout.
  virtual void watch_replay(const char* what) {}

 protected:
  Communicator(Device device, int rank, int world_size)
      : device_(device), rank_(rank), world_size_(world_size) {}
  // Throws unless `t` is a contiguous tensor of this communicator's device whose dtype the backend supports
  // for the collective (`reduces`: the collective adds values).
  void check_tensor(const Tensor& t, const char* collective, bool reduces) const;
  void check_root(int root) const;
  // Block `rank` of `whole` (world_size equal blocks) is exactly `part`: the in-place layout.
  bool is_rank_block(const Tensor& whole, const Tensor& part) const;
  void check_widened(const Tensor& tensor, const Tensor& widened) const;
  // Throws unless the blocks of all_gather_blocks_async lie inside `buffer` without overlapping.
  void check_gather_blocks(const Tensor& buffer, int64_t offset, int64_t count, int64_t stride) const;
  virtual bool supports(DType dtype, bool reduces) const = 0;
  void set_transport_field(AllReduceTransport transport) { transport_ = transport; }

 private:
  AllReduceTransport transport_ = AllReduceTransport::library;
  Device device_;
  int rank_ = 0, world_size_ = 1;
};

// The MPI backend for a CPU device, the NCCL backend (on device.index) for a CUDA device. Collective: every
// rank must call it. The runtime must outlive the communicator.
std::unique_ptr<Communicator> make_communicator(Device device, DistRuntime& runtime);

}  // namespace tt::dist
