// One training step, as `train` runs it: forward and backward over the micro-batches, gradient averaging
// across ranks (a DDP strategy, or ZeRO's reduce-scatter), global-norm clipping, the AdamW update, and the
// read-back of loss and gradient norm. A non-finite loss or gradient norm stops the step before the update,
// so the parameters and optimizer state stay those of the last finite step.
#pragma once

#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "apps/lib/checkpoint.h"
#include "apps/lib/data.h"
#include "core/cuda_context.h"
#include "core/cuda_graph.h"
#include "core/pinned_upload.h"
#include "dist/communicator.h"
#include "dist/data_parallel.h"
#include "dist/runtime.h"
#include "nn/transformer.h"
#include "optim/optimizer.h"
#include "optim/overlapped_update.h"
#include "optim/sharded_optimizer.h"
#include "optim/zero_optimizer.h"

namespace tt::app {

// Whether steps after the first are replays of one CUDA graph (the same kernels and collectives on the same
// values, without the host launching each of them). Where it can be captured, on CUDA: without ZeRO (one
// process or DDP) the whole step, with bf16 gradients (clipped on the device) and DDP's all-reduce by NCCL;
// with ZeRO forward and backward, the update then running after the host has read the norm.
enum class GraphUse {
  off,
  on,         // wherever the step can be captured
  automatic,  // on, except under ZeRO: there the graph's memory pool costs about 2 GiB a rank at 7b and
              // saves under 0.5% of the step
};
// "auto", "on" or "off" (the --cuda-graph flag); throws tt::Error otherwise.
GraphUse parse_graph_use(const std::string& text);

struct TrainStepOptions {
  int64_t batch = 1, ctx = 1, grad_accum = 1;
  double clip = 1.0;               // global gradient-norm clip (0: off)
  int zero = 0;                    // ZeRO stage: 1 AdamW state, 2 and gradients, 3 and parameters sharded
  bool zero_grads_by_ddp = false;  // with zero 1: gradients averaged by the DDP all-reduce instead
  dist::DdpStrategy ddp = dist::DdpStrategy::bucketed;
  double bucket_mb = 25;
  bool grad_comm_bf16 = false;      // all-reduce f32 gradients in bf16
  std::string all_reduce = "auto";  // library | copy-engine | auto
  optim::AdamWOptions adamw;
  double zero1_gather_chunk_mb = 0;  // ZeRO-1's pipelined update + all-gather chunk (0: its default)
  GraphUse cuda_graph = GraphUse::automatic;
};
// Whether a DDP strategy all-reduces the gradients: always without ZeRO, and under ZeRO-1 when asked to;
// otherwise ZeRO reduce-scatters them itself.
inline bool ddp_averages_gradients(const TrainStepOptions& options) {
  return options.zero == 0 || (options.zero == 1 && options.zero_grads_by_ddp);
}

// A run ends on every rank at once, with an exit code (divergence, a stop signal): not an error to abort on.
class RunEnded : public std::runtime_error {
 public:
  RunEnded(int exit_code, const std::string& message) : std::runtime_error(message), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

// Bytes this rank holds for the model's state, measured from the tensors (for memory tables).
struct StateBytes {
  int64_t parameters = 0;  // f32 parameters (or their shard) and any bf16 copy the matmuls read
  int64_t gradients = 0;
  int64_t optimizer = 0;  // AdamW's moments (or their shard)
  // ZeRO-2/3: the most gradient staging (and receive) bytes held at once during the backward passes so far.
  int64_t peak_gradient_staging = 0;
};

struct StepResult {
  double loss = 0, grad_norm = 0;
  bool stop_requested = false;  // some rank got a stop signal (the same answer on every rank)
  // CUDA: the compute stream's time for the step's forward and backward: with the CUDA graph step, the
  // replay (without ZeRO the last update included), from its launch; otherwise from the step's start, so
  // launch gaps count. With the graph, a step's wall time minus this is the time the GPU waited for the host
  // (batch uploads, launch, read-back, logging). NaN on the CPU.
  double gpu_ms = NAN;
};

class TrainStep {
 public:
  // Builds the optimizer and, under mpirun, the communicator and data-parallel strategy (collective: every
  // rank constructs it at the same point). `params` must have been padded for ZeRO-1 (FlatParameters'
  // pad_multiple = world size). ZeRO-2/3, and on CUDA the update beside the next forward, run the model's
  // units through the optimizer (until destroyed).
  TrainStep(nn::TransformerLM& model, nn::FlatParameters& params, Device device, dist::DistRuntime* runtime,
            const TrainStepOptions& options);
  ~TrainStep();

  // What checkpoints save and load; load before the first run().
  OptimizerState& optimizer_state() { return *optimizer_state_; }
  // Under mpirun, the ranks' way to load a checkpoint together (each reads a share of it); nullptr in one
  // process.
  const SharedRead* shared_read() const { return shared_read_ ? &*shared_read_ : nullptr; }
  // One line for the start-up banner: the strategy and transport, when data-parallel.
  std::string describe() const;
  StateBytes state_bytes() const;
  // The communication of the last step that backward did not hide (DDP strategies; 0 otherwise); on CUDA
  // reading it waits for that step's communication.
  double communication_wait_ms();
  // Whether communication_wait_ms measures anything: a DDP strategy averages the gradients.
  bool measures_communication_wait() const { return ddp_ != nullptr; }
  // One line for the banner: how and when the optimizer update runs, and whether the step is a CUDA graph.
  std::string update_path() const;
  // Whether steps after the first are replays of one CUDA graph (TrainStepOptions::cuda_graph, where it
  // applies).
  bool cuda_graph() const { return graph_step_; }
  // With --cuda-graph on, why the step is not a graph anyway (empty when it is, or when not asked for).
  const std::string& graph_declined() const { return graph_declined_; }

  // One optimizer step at learning rate `lr`; `next_batch(micro)` gives micro-batch 0..grad_accum-1.
  // `stop_here` says this rank got a stop signal. Throws RunEnded (kExitDiverged, on every rank) when the
  // loss or gradient norm is not finite, before anything is updated.
  StepResult run(const std::function<Batch(int64_t micro)>& next_batch, double lr, bool stop_here,
                 int64_t step);
  // On CUDA without ZeRO the update of a step runs beside the next step's forward
  // (optim/overlapped_update.h), and under ZeRO-2 (any device) the updated shards are gathered back as the
  // next forward reaches each unit, so run() returns before the model is current: call settle() (on every
  // rank: it may be collective) before reading the parameters or the optimizer state other than through
  // the model's forward (saving, sampling). Work queued on the compute stream afterwards sees the updated
  // values.
  void settle();

 private:
  void begin();  // the first run(): after loading, before any update
  // Forward and backward over the micro-batches (`micro_batch(m)`: inputs and targets on the device), the
  // gradients averaged or reduce-scattered, the clipping factor computed on the device where AdamW clips:
  // everything of a step before the first read-back. Returns the micro-batches' losses.
  std::vector<Tensor> forward_backward(const std::function<std::pair<Tensor, Tensor>(int64_t)>& micro_batch);
  // The graph step: the batches copied into the graph's inputs, then one replay (captured at the first).
  std::vector<Tensor> replay_step(const std::function<Batch(int64_t micro)>& next_batch);

  nn::TransformerLM& model_;
  nn::FlatParameters& params_;
  Device device_;
  TrainStepOptions options_;
  int world_ = 1;
  bool started_ = false;
  std::unique_ptr<dist::Communicator> comm_;
  std::optional<SharedRead> shared_read_;
  std::unique_ptr<optim::ShardCollectives> collectives_;
  std::unique_ptr<optim::AdamW> adamw_;
  std::unique_ptr<optim::ShardedOptimizer> sharded_;
  std::unique_ptr<optim::ZeroOptimizer> zero_;  // stages 2 and 3
  std::unique_ptr<dist::DataParallel> ddp_;
  std::unique_ptr<OptimizerState> optimizer_state_;
  std::unique_ptr<optim::OverlappedUpdate> overlap_;
  std::unique_ptr<PinnedUpload> upload_;
  std::unique_ptr<DeviceClock> clock_;  // CUDA: StepResult::gpu_ms
  Tensor clip_norm_, clip_factor_;      // device scalars when AdamW clips on the GPU
  // The CUDA graph step (TrainStepOptions::cuda_graph): whether it applies, the graph, its static inputs
  // and losses (one per micro-batch), and the number of steps run so far.
  bool graph_step_ = false;
  std::string graph_declined_;
  std::unique_ptr<CudaGraph> graph_;
  std::vector<Tensor> graph_inputs_, graph_targets_, graph_losses_;
  int64_t runs_ = 0;
};

}  // namespace tt::app
