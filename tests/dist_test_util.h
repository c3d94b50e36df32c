// Shared by the multi-rank suites (CPU with MPI, GPU with NCCL): the runtime and communicators of the run,
// two small models with a loss over any union of per-rank batches, and the check that every DDP strategy
// trains exactly like one process on the union of the ranks' batches.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "dist/data_parallel.h"
#include "dist/runtime.h"
#include "nn/module.h"
#include "nn/parameter_units.h"

namespace tt::testing {

dist::DistRuntime& runtime();
void set_runtime(dist::DistRuntime* runtime);  // by the main, around the test run
// One communicator per device for the whole run (NCCL start-up is slow); the main releases them before MPI
// is finalised.
dist::Communicator& communicator(Device device);
void release_communicators();

class TestModel {
 public:
  virtual ~TestModel() = default;
  virtual nn::Module& module() = 0;
  // Called once FlatParameters has made the parameter views.
  virtual void freeze() {}
  // Mean loss over the concatenation of the batches `batch_ids` (equal sizes, content drawn from the id).
  virtual Tensor loss(const std::vector<uint64_t>& batch_ids, Device device) = 0;
  // Parameter units for ZeRO-2/3 (nn/parameter_units.h): each unit's first parameter, and the hooks the
  // loss runs its units through (nullptr: none).
  virtual std::vector<size_t> unit_first_parameters() = 0;
  virtual void set_parameter_units(nn::ParameterUnits* units) = 0;
};

// transformer_recompute: the tiny LM with activation recomputation, its first block whole and its second
// selectively (--recompute block --recompute-blocks 1).
// mlp_detached: the MLP whose first unit gets no gradient in any pass of every fourth step.
enum class ModelKind { mlp, transformer, transformer_bf16, transformer_recompute, mlp_detached };
enum class OptimizerKind { sgd, adamw };
const char* model_kind_name(ModelKind kind);
const char* optimizer_kind_name(OptimizerKind kind);
// mlp: Linear layers with SwiGLU and a frozen Linear ("mix") between trainable ones. transformer: the tiny
// preset with vocabulary 32 and context 8; transformer_bf16: the same in bf16 precision (bf16 matmuls).
std::unique_ptr<TestModel> make_test_model(ModelKind kind);

struct DdpConfig {
  dist::DdpStrategy strategy;
  double bucket_mb = 25.0;
  std::string label;
  bool bf16_communication = false;
};
// naive, flat, overlap, and bucketed with one parameter per bucket, a few buckets, and one bucket.
std::vector<DdpConfig> ddp_configs(ModelKind kind);

struct TrainSpec {
  ModelKind model = ModelKind::mlp;
  OptimizerKind optimizer = OptimizerKind::sgd;
  Device device = Device::cpu();
  int steps = 3;
  int micro_batches = 1;     // > 1: gradient accumulation, communicating on the last micro-batch only
  DType dtype = DType::f32;  // f64 on the CPU only
  bool grads_bf16 = false;   // bf16 gradient buffer (FlatParameters::set_grad_dtype), f32 dtype only
};

// Parameters after training: with `ddp`, each rank on its own batches through DataParallel (checking the
// broadcast, the collectives issued per pass and that unsynchronised passes stay local); without, this
// process alone on the union of every rank's batches.
std::vector<double> train(const TrainSpec& spec, const DdpConfig* ddp);

// |a - b| <= atol + rtol |b| everywhere; `why` names the worst element otherwise.
bool allclose(const std::vector<double>& a, const std::vector<double>& b, double rtol, double atol,
              std::string* why);
// Collective (over MPI): whether every rank holds exactly rank 0's values; the same answer on every rank.
bool same_on_all_ranks(const std::vector<double>& values);

// For every strategy: DDP training equals single-process training on the union (rtol 1e-5, atol 1e-8) and
// all ranks end identical.
void check_strategies_match_single_process(ModelKind model, OptimizerKind optimizer, Device device,
                                           DType dtype = DType::f32);

// For every strategy with gradients communicated in bf16: close to single-process training (the gradients are
// rounded to bf16 once before and once after the average), not equal to the f32-communicated result (the
// rounding did happen), and all ranks end identical.
void check_bf16_communication(ModelKind model, Device device);

// For every strategy with bf16 gradient buffers and AdamW: close to single-process training with bf16
// gradients (each rank's gradient is rounded before the average, the average rounded again), not equal to
// training with f32 gradients, and all ranks end identical.
void check_bf16_gradients(ModelKind model, Device device);

// 10 AdamW steps, each rank on its own batch, either through ZeRO-1 (sharded) or through a flat DDP
// all-reduce followed by ordinary AdamW; returns the parameters (without padding) and the optimizer state
// bytes of this rank. zero_over_ddp_mb > 0: ZeRO-1's gradients averaged by bucketed DDP (buckets of that many
// MiB) instead of a reduce-scatter; gather_chunk > 0: elements per pipelined update + all-gather chunk;
// grads_bf16: bf16 gradient buffers (f32 parameters only).
std::vector<double> train_zero(ModelKind kind, Device device, DType dtype, bool sharded, int64_t* state_bytes,
                               double zero_over_ddp_mb = 0, int64_t gather_chunk = 0,
                               bool grads_bf16 = false);

// ZeRO-1 with bf16 gradient buffers, fed by the reduce-scatter and by bucketed DDP, on the MLP and the tiny
// LM (f32 and bf16 precision): close to unsharded AdamW with bf16 gradients, ranks identical.
void check_zero_bf16_gradients(Device device);

// ZeRO-1 pipelined in each of `chunks` elements per update + all-gather chunk, with the reduce-scatter and
// with bucketed DDP as the gradient source, on the MLP and the tiny LM: equals unsharded AdamW (allclose
// rtol, atol), ranks identical; with check_state_smaller, also less optimizer state than unsharded.
void check_pipelined_zero(Device device, DType dtype, const std::vector<int64_t>& chunks, double rtol,
                          double atol, bool check_state_smaller);

// ZeRO-2 and ZeRO-3 (optim/zero_optimizer.h): 10 AdamW steps, clipped at kZeroClip (below the tiny models'
// gradient norms, so clipping is engaged).
constexpr int kZeroSteps = 10;
constexpr double kZeroClip = 0.05;
struct ZeroResult {
  std::vector<double> parameters;  // the whole model after training
  std::vector<double> norms;       // per step, before clipping
};

struct ZeroMemory {
  int64_t total_elements = 0, shard_elements = 0, largest_unit = 0;
  int64_t gradient_bytes = 0, parameter_bytes = 0, state_bytes = 0, peak_staging_bytes = 0;
  int gathered_units = 0, peak_gathered_units = 0;
  bool grads_detached = true;  // no parameter has a .grad between steps, no flat gradient buffer
};
// One process on the union of every rank's micro-batches, AdamW over the flat buffer, clipped. bf16_grads:
// gradients kept in bf16 (FlatParameters::set_grad_dtype), as bf16 training keeps them.
ZeroResult train_single(ModelKind kind, DType dtype, int micro_batches, Device device,
                        bool bf16_grads = false);
// Each rank on its own micro-batches through ZeroOptimizer at `stage`; the parameters gathered whole at the
// end; `memory`, when given, receives what this rank held after the last step.
ZeroResult train_sharded(ModelKind kind, DType dtype, int stage, int micro_batches, Device device,
                         ZeroMemory* memory = nullptr, bool bf16_grads = false);
// train_sharded equals train_single (f64: rtol 1e-7; f32: 1e-5; bf16 precision or gradients: 1e-3), the
// gradient norms too, every rank ends identical and clipping was engaged.
void check_zero_matches_single(ModelKind kind, DType dtype, int stage, int micro_batches, Device device,
                               bool bf16_grads = false);

// The step `train` runs (apps/lib/train_step.h) under mpirun, each rank on its own micro-batches, with DDP
// `strategy` (zero 0) or ZeRO stage `zero`, against the same step in one process on the union of the ranks'
// batches: the same loss and gradient norm at each of 6 clipped AdamW steps (within rtol; the later losses
// follow from the updates), on the tiny LM in f32 with `accum` micro-batches per step.
void check_train_step_matches_single(Device device, int zero, dist::DdpStrategy strategy, int64_t accum,
                                     double rtol);

// An in-place strided all-gather case: `start` is offset + (world - 1) * stride + count + tail values of -1
// with this rank's block (block(rank, count)) at offset + rank * stride; `expect` has every rank's block in
// its place and the gaps still -1.
struct StridedGatherCase {
  std::vector<float> start, expect;
};
StridedGatherCase strided_gather_case(int world, int rank, int64_t offset, int64_t count, int64_t stride,
                                      int64_t tail, std::vector<float> (*block)(int, int64_t));

}  // namespace tt::testing
