// Data parallelism over a model's flat parameter and gradient buffers: every rank runs the same model on its
// own batch, and after backward every rank's flat gradient buffer holds the average of all ranks' gradients,
// so identical optimizer steps keep the replicas identical.
//
// Strategies (how the average is communicated):
//   naive     after backward, one all-reduce per parameter, in parameter order;
//   flat      after backward, one all-reduce of the whole flat gradient buffer;
//   overlap   one asynchronous all-reduce per parameter, launched from its grad-ready hook during backward;
//   bucketed  contiguous ranges of the gradient buffer ("buckets", filled in reverse parameter order up to
//             bucket_mb MiB) reduced asynchronously as soon as all their parameters' gradients are ready.
//
// Gradients travel in their own dtype (f32, or bf16 with bf16 gradient buffers), or, with bf16 communication,
// rounded to bf16 into a staging buffer, averaged in bf16 by the collective (NCCL rounds each partial sum to
// bf16, the copy-engine transport the f32 sum once) and widened back: half the bytes on the wire, gradients
// exact to about 3 significant digits (PyTorch's bf16 compression hook).
//
// Per step (set_sync(false) on all but the last micro-batch when accumulating gradients):
//   ddp.set_sync(last_micro_batch);  ddp.begin_backward();  loss.backward();  ddp.finish_backward();
//   optimizer.step();  params.zero_grad();
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "nn/module.h"

namespace tt::dist {

enum class DdpStrategy { naive, flat, overlap, bucketed };

DdpStrategy parse_ddp_strategy(const std::string& text);  // throws tt::Error on unknown names
const char* ddp_strategy_name(DdpStrategy strategy);

// A contiguous element range [begin, end) of the flat gradient buffer and the parameters it covers (indices
// into FlatParameters::parameters(), in the order the bucket was filled: descending).
struct GradientBucket {
  int64_t begin = 0, end = 0;
  std::vector<size_t> parameters;
  int64_t numel() const { return end - begin; }
};

class DataParallel {
 public:
  // Collective: broadcasts rank 0's whole flat parameter buffer (frozen parameters too) to every rank, and
  // hooks every parameter that requires grad now. Parameters frozen now are never communicated (except as
  // part of the whole buffer by `flat`). `params` and `comm` must outlive this object.
  DataParallel(nn::FlatParameters& params, Communicator& comm, DdpStrategy strategy, double bucket_mb = 25.0,
               bool bf16_communication = false);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // false: the following backward passes only accumulate locally (gradient accumulation). Call outside a
  // begin_backward/finish_backward pair; every rank must make the same choice.
  void set_sync(bool sync);
  bool sync() const;

  // Before each backward pass: resets the per-pass state so hooks launch this pass's communication.
  void begin_backward();
  // After each backward pass: issues what is left and waits for it. Afterwards the flat gradient buffer holds
  // the average over ranks (on CUDA: for work queued on the compute stream from now on; the host does not
  // wait). No communication when sync is false.
  void finish_backward();

  DdpStrategy strategy() const;
  bool bf16_communication() const;
  // Time the last finish_backward held up the host (CPU) or the compute stream (CUDA): the communication
  // not hidden behind backward. On CUDA, reading it waits for that step's communication; after a pass
  // captured in a CUDA graph, it is the last replay's.
  double communication_wait_ms();
  // Collectives issued by the last begin_backward/finish_backward pair.
  int64_t collectives_last_pass() const;

  // The bucket layout of `bucketed` (computed for every strategy; empty buckets are never made).
  const std::vector<GradientBucket>& buckets() const;
  size_t bucket_count() const { return buckets().size(); }
  int64_t bucket_capacity_bytes() const;

 private:
  struct State;
  std::shared_ptr<State> state_;  // hooks hold it weakly, so they outlive this object harmlessly
};

}  // namespace tt::dist
