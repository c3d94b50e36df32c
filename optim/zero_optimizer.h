// ZeRO stages 2 and 3 (stage 1 is ShardedOptimizer): AdamW whose master weights, gradients and state are
// sharded across the data-parallel ranks by parameter unit (nn/parameter_units.h: the embedding, each
// Transformer block, the head).
//
// Layout: unit u covers the flat elements [begin_u, end_u) of its parameters, padded to a multiple of the
// world size W; rank r owns the r-th of its W equal chunks (chunk_u elements). A rank's shard is its chunks
// of every unit, one after another, so one reduce-scatter hands every rank its part of a unit's gradient
// and one all-gather rebuilds the unit (the layout of PyTorch FSDP's flat parameters). The shard holds the
// f32 master weights (f64 in tests), the gradient in the gradients' dtype (FlatParameters::grad_dtype: bf16
// by default in bf16 training) and AdamW's two moments.
//
// Gradients (both stages): before a unit's backward (before_backward, called by the model through
// run_unit) its parameters' .grad are pointed into a staging buffer the size of the unit, so the matmuls
// write gradients in place as they would into the flat buffer; when every trainable parameter of the unit
// has its gradient (the grad-ready hooks), the buffer is reduce-scattered (averaged) asynchronously and the
// result added into the shard gradient, in unit order (descending, as backward produces them) on every rank.
// Staging buffers are reused: a unit's is free again once its reduce-scatter has been added; two are
// enough when backward finishes units in order. Every micro-batch is reduce-scattered, so gradient
// accumulation needs no full-size buffer (the ZeRO paper's stage 2; more communication with --grad-accum).
// With bf16 gradients the micro-batches add up in the bf16 shard, as they do in DDP's bf16 gradient buffer.
// Between backward passes the only gradient memory is the shard.
//
// Parameters: stage 2 keeps the whole model in FlatParameters' flat buffer on every rank (and its bf16
// mirror) and all-gathers the updated shards into it unit by unit: step() issues the first unit's gather,
// and each unit's forward (before_forward) waits for its own and issues the next, so the gathers run beside
// the next forward instead of after the update; settle() completes them all, for readers of the weights
// outside a forward (checkpoints, generation). Stage 3 frees the flat buffer: a unit's parameters get
// storage only between before_forward and after_forward and again from before_backward until the next
// unit's backward starts (all-gathered into buffers of the unit's size); the next unit's gather is issued
// ahead (prefetch: on CUDA it runs on the communication stream while the current unit computes). The last
// unit stays gathered from its forward into its backward, which comes next.
//
// bf16 gathers (both stages, in bf16 training): a unit holding matmul weights (NamedParameter::
// matmul_weight) gathers its chunks rounded to bf16 (each rank casts its own just before the gather) into
// what the matmuls read (stage 2: the mirror; stage 3: the unit's bf16 buffer), half the bytes of f32 and
// no cast; only its other parameters (RMSNorm weights) travel in f32, packed into one small all-gather.
// The matmul weights' f32 values are then not gathered at all, and their f32 tensors have no storage
// (nothing reads them: the matmuls read the bf16 copy, checkpoints the shards). Stage 2 frees the flat f32
// buffer and keeps the f32-read parameters of the whole model in one buffer of their own (stage2_f32_),
// so a rank holds 2 bytes per parameter of the whole model, as in the ZeRO paper, besides its shards.
// A unit without matmul weights (the embedding) travels in f32 only: under stage 2 as its f32 pack (its
// bf16 copy in the mirror is then not kept current: nothing reads it), under stage 3 gathered and cast.
//
// The constructor takes each rank's chunks out of the flat buffer (which must hold the model: broadcast or
// loaded) before it allocates anything of its own, so stage 3 never holds the flat buffer beside the
// AdamW state; from then on load parameters through scatter_parameter (checkpoints do).
//
// Per step: for each micro-batch { loss = model.loss(...); zero.begin_backward(); loss.backward();
// zero.finish_backward(); }  norm = zero.step(max_norm);
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "nn/module.h"
#include "nn/parameter_units.h"
#include "optim/optimizer.h"
#include "optim/sharded_optimizer.h"

namespace tt::optim {

class ZeroOptimizer : public nn::ParameterUnits {
 public:
  // unit_first_parameters: the index of each unit's first parameter (0 first, ascending; units cover the
  // parameters in order). bf16_copies: the model computes in bf16 from bf16 copies of its weights. The
  // ranks' flat buffers must already hold the same model. `params` and `comm` must outlive this object.
  ZeroOptimizer(nn::FlatParameters& params, ShardCollectives& comm, std::vector<size_t> unit_first_parameters,
                int stage, const AdamWOptions& options, bool bf16_copies = false);
  ~ZeroOptimizer() override;
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  // Around every backward pass (each micro-batch): finish_backward reduce-scatters what is left, adds every
  // unit's result into the shard gradient and (stage 3) frees the gathered units.
  void begin_backward();
  void finish_backward();
  // Clips the shard gradient by the global norm when max_norm > 0 (the norm: the root of the all-reduced
  // sum of the shards' squared norms; returned, NaN when neither clipping nor measure_norm asks for it),
  // updates the shard, zeroes the shard gradient and (stage 2) all-gathers the parameters. A norm that is
  // not finite is returned before anything is updated.
  double step(double max_norm, bool measure_norm = true);
  // Stage 2: completes the parameter gathers the last step() left to the next forward, so that the flat
  // buffer (and its bf16 mirror) holds the updated model. Nothing to do otherwise. Collective: every rank
  // calls it. Call it before destroying this object if the model is used afterwards (in bf16 training only
  // its bf16 forward: the matmul weights' f32 values exist only in the shards).
  void settle();

  // Before capturing a forward and backward into a CUDA graph, which can wait only on collectives issued
  // inside the capture. Stage 2: completes the gathers in flight, marks every unit for gathering (so the
  // graph gathers them all, and each replay the weights of the update before it), and from now on step()
  // issues no gather ahead: the next forward issues each unit's itself. Collective.
  void prepare_capture();
  // After each replay of that graph is queued: the shard gradient is the replay's (the next backward adds
  // to it), and stage 2's units count as gathered (the replay gathers them).
  void replayed();

  int stage() const { return stage_; }
  void set_lr(double lr) { adamw_->set_lr(lr); }
  double lr() const { return adamw_->lr(); }
  int64_t step_count() const { return adamw_->step_count(); }
  void set_step_count(int64_t step) { adamw_->set_step_count(step); }
  const AdamWOptions& options() const { return adamw_->options(); }
  ShardCollectives& collectives() { return comm_; }

  // Checkpoints (collective: every rank calls them for every parameter, in the same order). A parameter's
  // full values, or its AdamW moment (which = 0: exp_avg, 1: exp_avg_sq), at flat [offset, offset + numel)
  // as a host tensor; and taking this rank's part of them from a host tensor every rank read. Memory: one
  // parameter at a time.
  Tensor gather_parameter(int64_t offset, const Shape& shape);
  void scatter_parameter(int64_t offset, const Tensor& full);
  Tensor gather_moment(int which, int64_t offset, const Shape& shape);
  void scatter_moment(int which, int64_t offset, const Tensor& full);

  // Bytes this rank holds now, measured from the tensors. Gradients: the shard and any staging and receive
  // buffers (none between backward passes). Parameters: the shard of master weights, plus the flat buffer
  // and its bf16 mirror (stage 2) or the units gathered now (stage 3).
  int64_t gradient_bytes() const;
  int64_t parameter_bytes() const;
  int64_t state_bytes() const;
  // The most gradient staging and receive bytes held at once during the backward passes so far.
  int64_t peak_staging_bytes() const { return peak_staging_bytes_; }
  int64_t shard_numel() const { return shard_numel_; }
  size_t unit_count() const { return units_.size(); }
  // Units holding gathered parameters now, and the most at once so far (stage 3).
  int gathered_units() const;
  int peak_gathered_units() const { return peak_gathered_units_; }

  // nn::ParameterUnits
  void before_forward(int unit) override;
  void after_forward(int unit, bool backward_follows) override;
  void before_backward(int unit) override;

 private:
  struct Piece {
    int64_t flat = 0, shard = 0, count = 0;
  };
  struct Unit {
    size_t first = 0, end = 0;      // parameter indices
    int64_t begin = 0, finish = 0;  // flat elements
    int64_t chunk = 0;              // elements per rank
    int64_t shard_offset = 0;       // of this rank's chunk in the shard
    int trainable = 0;
    // Per backward pass.
    int ready = 0;
    bool staged = false, launched = false;
    Tensor staging;
    // Stage 3: the gathered parameters (f32; with bf16 gathers only the f32-read ones) and their bf16
    // copies, while held.
    Tensor gathered, gathered_bf16;
    std::unique_ptr<ShardCollectives::Pending> gather;
    // Stage 2: updated since the flat buffer last received this unit; its gather when issued.
    bool stale = false;
    std::unique_ptr<ShardCollectives::Pending> refresh;
    // bf16 gathers (see the file comment): whether this unit gathers its bf16 copy; its f32-read
    // parameters' pieces as each rank owns them (flat offset and count; `shard`: the owner's shard offset)
    // and where each lands (stage 2: the flat offset; stage 3: the offset in `gathered`, which then holds
    // only these parameters, one after another), the elements per rank in the f32 pack, and the pack's
    // gather while in flight.
    bool gathers_bf16 = false, has_matmul_weights = false;
    Tensor sent;  // this rank's chunk rounded to bf16, while its gather is in flight
    std::vector<std::vector<Piece>> f32_pieces;    // per rank
    std::vector<std::vector<int64_t>> f32_places;  // per rank, per piece
    int64_t f32_pack = 0, f32_numel = 0;
    Tensor f32_sent, f32_received;
    std::unique_ptr<ShardCollectives::Pending> f32_gather;
    int64_t numel() const { return finish - begin; }
  };
  struct InFlight {
    size_t unit;
    Tensor staging, wire, received;
    std::unique_ptr<ShardCollectives::Pending> work;
  };

  void start();  // copies this rank's chunks out of the flat buffer (see above)
  void plan_bf16_gathers();
  // bf16 gathers: this rank's f32-read pieces of the unit packed and all-gathered; then every rank's
  // pieces put in place in `dst` (the flat buffer, or the unit's `gathered`).
  void issue_f32_pack(size_t unit);
  void complete_f32_pack(size_t unit, Tensor& dst);
  bool held(size_t unit) const;  // stage 3: gathered or being gathered
  // The pieces of flat [offset, offset + count) that `rank` (-1: this one) owns.
  std::vector<Piece> owned(int64_t offset, int64_t count, int rank = -1) const;
  Tensor gather_pieces(const Tensor& shard, int64_t offset, const Shape& shape);
  void scatter_pieces(Tensor& shard, int64_t offset, const Tensor& full);
  void on_grad_ready(size_t parameter);
  void launch_ready_units();
  void launch(size_t unit);
  void complete_oldest();
  Tensor acquire_staging();
  void note_staging_bytes();
  // Stage 2: the unit's updated chunks gathered into its place in the flat buffer, or (a unit padded to a
  // multiple of the world size) into a refresh buffer, then copied there.
  void issue_refresh(size_t unit);
  void complete_refresh(size_t unit);
  void refresh_in_order(size_t unit);  // issues the next unit's refresh, then completes this one's
  // Both stages: every rank's chunk of the unit all-gathered into `out`, in out's dtype (f32 or bf16).
  std::unique_ptr<ShardCollectives::Pending> gather_unit_async(size_t unit, Tensor& out);
  // Stage 3.
  void issue_gather(size_t unit);
  void ensure_gathered(size_t unit);
  void release(size_t unit);

  nn::FlatParameters& params_;
  ShardCollectives& comm_;
  const int stage_;
  const bool bf16_copies_;
  const DType param_dtype_, grad_dtype_;
  const Device device_;
  std::vector<Unit> units_;
  std::vector<size_t> unit_of_;  // per parameter
  std::vector<bool> trainable_;  // per parameter, fixed at construction
  std::vector<std::pair<size_t, uint64_t>> hooks_;
  std::vector<Tensor> bf16_copies_of_;  // stage 3 bf16: per parameter, the copy the matmuls read
  int64_t shard_numel_ = 0, max_unit_padded_ = 0;
  int64_t max_refresh_ = 0;  // stage 2: the largest padded unit (the only ones gathered through a buffer)
  bool armed_ = false;
  int next_launch_ = -1;  // the unit whose reduce-scatter comes next (descending order)
  Tensor shard_params_, shard_grads_;
  // bf16 gathers: where each f32-read parameter of a unit gathered that way lies among them (stage 2: in
  // stage2_f32_, which holds them all, the flat f32 buffer being freed; stage 3: in its unit's `gathered`);
  // -1 for the rest (matmul weights, not kept in f32).
  Tensor stage2_f32_;
  std::vector<int64_t> f32_place_of_;
  Tensor refresh_buffers_[2];            // stage 2: unit u gathers into buffer u % 2 (of its gather's dtype)
  int64_t refresh_owner_[2] = {-1, -1};  // the unit whose gather a buffer holds and has not copied out
  size_t stale_units_ = 0;
  bool gathers_in_forward_ = false;
  std::unique_ptr<AdamW> adamw_;
  // After an update: the shard's gradients are the last step's, and the next backward pass writes them
  // (units it does not reach are cleared) instead of adding to them.
  bool overwrite_shard_grads_ = false;
  std::vector<Tensor> free_staging_;
  std::deque<InFlight> in_flight_;
  int64_t peak_staging_bytes_ = 0;
  int peak_gathered_units_ = 0;
};

}  // namespace tt::optim
