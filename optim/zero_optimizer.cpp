#include "optim/zero_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>

#include "core/autograd.h"
#include "core/ops.h"

namespace tt::optim {

namespace {
// Staging buffers kept for reuse before a unit waits for the oldest reduce-scatter to free one: one unit
// being written by backward while the previous one is on the wire.
constexpr size_t kStagingBuffers = 2;
}  // namespace

ZeroOptimizer::ZeroOptimizer(nn::FlatParameters& params, ShardCollectives& comm,
                             std::vector<size_t> unit_first_parameters, int stage,
                             const AdamWOptions& options, bool bf16_copies)
    : params_(params),
      comm_(comm),
      stage_(stage),
      bf16_copies_(bf16_copies),
      param_dtype_(params.flat_params().dtype()),
      grad_dtype_(params.grad_dtype()),
      device_(params.flat_params().device()) {
  TT_CHECK(stage == 2 || stage == 3, "ZeroOptimizer: stage must be 2 or 3, got " + std::to_string(stage));
  const auto& list = params.parameters();
  TT_ASSERT(!unit_first_parameters.empty() && unit_first_parameters[0] == 0 &&
                std::is_sorted(unit_first_parameters.begin(), unit_first_parameters.end()) &&
                unit_first_parameters.back() < list.size(),
            "ZeroOptimizer: unit_first_parameters must start at 0 and ascend within the parameters");
  const int64_t world = comm.world_size();
  unit_of_.assign(list.size(), 0);
  for (size_t u = 0; u < unit_first_parameters.size(); ++u) {
    Unit unit;
    unit.first = unit_first_parameters[u];
    unit.end = u + 1 < unit_first_parameters.size() ? unit_first_parameters[u + 1] : list.size();
    TT_ASSERT(unit.end > unit.first, "ZeroOptimizer: a unit without parameters");
    unit.begin = params.offsets()[unit.first];
    unit.finish = params.offsets()[unit.end - 1] + list[unit.end - 1].tensor->numel();
    unit.chunk = (unit.numel() + world - 1) / world;
    unit.shard_offset = shard_numel_;
    shard_numel_ += unit.chunk;
    max_unit_padded_ = std::max(max_unit_padded_, unit.chunk * world);
    if (unit.numel() < unit.chunk * world) max_refresh_ = std::max(max_refresh_, unit.chunk * world);
    for (size_t i = unit.first; i < unit.end; ++i) {
      unit_of_[i] = u;
      trainable_.push_back(list[i].tensor->requires_grad());
      unit.trainable += trainable_.back() ? 1 : 0;
    }
    units_.push_back(std::move(unit));
  }
  // Gradients live in staging buffers and the shard from now on; the model's buffers go before the
  // shards come (a 7b model's f32 parameters are 28 GB).
  params.release_gradient_buffer();
  // The shard's padding stays zero: no gradient reaches it, so AdamW leaves it zero.
  shard_params_ = Tensor::zeros({shard_numel_}, param_dtype_, device_);
  start();
  shard_params_.set_requires_grad(true);
  // In the gradients' dtype: bf16 gradients (the default of bf16 training) arrive from the reduce-scatter
  // in bf16, so an f32 shard would only widen them, at 2 more bytes per parameter over N.
  shard_grads_ = Tensor::zeros({shard_numel_}, grad_dtype_, device_);
  shard_params_.set_grad(shard_grads_);
  adamw_ = std::make_unique<AdamW>(std::vector<Tensor>{shard_params_}, options);
  for (size_t i = 0; i < list.size(); ++i) {
    if (!trainable_[i]) continue;
    hooks_.emplace_back(i,
                        list[i].tensor->register_grad_ready_hook([this, i](Tensor&) { on_grad_ready(i); }));
  }
}

ZeroOptimizer::~ZeroOptimizer() {
  // Collectives in flight write into buffers this object owns.
  try {
    for (Unit& unit : units_) {
      if (unit.gather) unit.gather->wait();
      if (unit.refresh) unit.refresh->wait();
      if (unit.f32_gather) unit.f32_gather->wait();
    }
    for (InFlight& f : in_flight_) f.work->wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ZeroOptimizer: %s\n", e.what());
  }
  for (const auto& [index, handle] : hooks_)
    params_.parameters()[index].tensor->remove_grad_ready_hook(handle);
}

void ZeroOptimizer::start() {
  const Tensor& flat = params_.flat_params();
  for (const Piece& piece : owned(0, params_.numel())) {
    Tensor dst = shard_params_.narrow_view(0, piece.shard, piece.count);
    dst.copy_(flat.narrow_view(0, piece.flat, piece.count));
  }
  const auto& list = params_.parameters();
  if (stage_ == 2) {
    if (!bf16_copies_) return;
    params_.enable_bf16_mirror();
    plan_bf16_gathers();
    return;
  }
  params_.release_parameter_buffer();
  if (!bf16_copies_) return;
  plan_bf16_gathers();
  // One bf16 tensor per parameter for the model's whole life, its storage pointed into the unit's bf16
  // buffer while gathered: a matmul's backward saves this handle and sees the unit gathered again.
  for (const nn::NamedParameter& p : list) {
    auto impl = std::make_shared<TensorImpl>();
    impl->shape = p.tensor->shape();
    impl->strides = contiguous_strides(impl->shape);
    impl->dtype = DType::bf16;
    impl->device = device_;
    bf16_copies_of_.emplace_back(impl);
    p.tensor->set_low_precision_copy(bf16_copies_of_.back());
  }
}

void ZeroOptimizer::plan_bf16_gathers() {
  const auto& list = params_.parameters();
  f32_place_of_.assign(list.size(), -1);
  int64_t stage2_f32 = 0;  // stage 2: the f32-read parameters of every unit, one after another
  for (Unit& unit : units_) {
    for (size_t i = unit.first; i < unit.end; ++i) unit.has_matmul_weights |= list[i].matmul_weight;
    // Stage 2 keeps no f32 copy of the whole model, so every unit comes back this way.
    unit.gathers_bf16 = stage_ == 2 || unit.has_matmul_weights;
    if (!unit.gathers_bf16) continue;
    // The f32-read parameters one after another: in a buffer of the unit's own (stage 3), or in
    // stage2_f32_ after the previous units' (stage 2).
    const int64_t base = stage_ == 2 ? stage2_f32 : 0;
    for (size_t i = unit.first; i < unit.end; ++i) {
      if (list[i].matmul_weight) continue;
      f32_place_of_[i] = base + unit.f32_numel;
      unit.f32_numel += list[i].tensor->numel();
    }
    stage2_f32 += unit.f32_numel;
    unit.f32_pieces.resize(static_cast<size_t>(comm_.world_size()));
    unit.f32_places.resize(static_cast<size_t>(comm_.world_size()));
    for (int r = 0; r < comm_.world_size(); ++r) {
      int64_t packed = 0;
      for (size_t i = unit.first; i < unit.end; ++i) {
        if (list[i].matmul_weight) continue;
        for (const Piece& piece : owned(params_.offsets()[i], list[i].tensor->numel(), r)) {
          unit.f32_pieces[static_cast<size_t>(r)].push_back(piece);
          unit.f32_places[static_cast<size_t>(r)].push_back(f32_place_of_[i] +
                                                            (piece.flat - params_.offsets()[i]));
          packed += piece.count;
        }
      }
      unit.f32_pack = std::max(unit.f32_pack, packed);
    }
  }
  if (stage_ != 2) return;
  // Stage 2: the f32-read parameters move into stage2_f32_ and the flat f32 buffer goes (the mirror stays).
  stage2_f32_ = Tensor::empty({std::max<int64_t>(stage2_f32, 1)}, param_dtype_, device_);
  for (size_t i = 0; i < list.size(); ++i) {
    if (f32_place_of_[i] < 0) continue;
    const int64_t n = list[i].tensor->numel();
    Tensor place = stage2_f32_.narrow_view(0, f32_place_of_[i], n);
    place.copy_(params_.flat_params().narrow_view(0, params_.offsets()[i], n));
  }
  params_.release_parameter_values();
  for (size_t i = 0; i < list.size(); ++i) {
    if (f32_place_of_[i] < 0) continue;
    TensorImpl* impl = list[i].tensor->impl();
    impl->storage = stage2_f32_.storage();
    impl->offset = stage2_f32_.offset() + f32_place_of_[i];
  }
}

void ZeroOptimizer::issue_f32_pack(size_t u) {
  Unit& unit = units_[u];
  if (unit.f32_pack == 0) return;
  // This rank's pieces of the f32-read parameters, packed (the rest of the pack is never read).
  unit.f32_sent = Tensor::empty({unit.f32_pack}, param_dtype_, device_);
  int64_t at = 0;
  for (const Piece& piece : unit.f32_pieces[static_cast<size_t>(comm_.rank())]) {
    Tensor dst = unit.f32_sent.narrow_view(0, at, piece.count);
    dst.copy_(shard_params_.narrow_view(0, piece.shard, piece.count));
    at += piece.count;
  }
  unit.f32_received = Tensor::empty({unit.f32_pack * comm_.world_size()}, param_dtype_, device_);
  unit.f32_gather = comm_.all_gather_async(unit.f32_sent, unit.f32_received);
}

void ZeroOptimizer::complete_f32_pack(size_t u, Tensor& dst) {
  Unit& unit = units_[u];
  if (!unit.f32_gather) return;
  unit.f32_gather->wait();
  unit.f32_gather.reset();
  // Every rank's pack back to the places its pieces came from.
  for (size_t r = 0; r < unit.f32_pieces.size(); ++r) {
    int64_t at = static_cast<int64_t>(r) * unit.f32_pack;
    for (size_t k = 0; k < unit.f32_pieces[r].size(); ++k) {
      const int64_t count = unit.f32_pieces[r][k].count;
      Tensor place = dst.narrow_view(0, unit.f32_places[r][k], count);
      place.copy_(unit.f32_received.narrow_view(0, at, count));
      at += count;
    }
  }
  unit.f32_sent = unit.f32_received = Tensor();
}

std::vector<ZeroOptimizer::Piece> ZeroOptimizer::owned(int64_t offset, int64_t count, int of_rank) const {
  std::vector<Piece> pieces;
  const int64_t rank = of_rank >= 0 ? of_rank : comm_.rank(), end = offset + count;
  for (const Unit& unit : units_) {
    if (unit.finish <= offset || unit.begin >= end) continue;
    const int64_t chunk_begin = unit.begin + rank * unit.chunk;
    const int64_t lo = std::max(offset, chunk_begin);
    const int64_t hi = std::min({end, chunk_begin + unit.chunk, unit.finish});
    if (lo < hi) pieces.push_back({lo, unit.shard_offset + (lo - chunk_begin), hi - lo});
  }
  return pieces;
}

Tensor ZeroOptimizer::gather_pieces(const Tensor& shard, int64_t offset, const Shape& shape) {
  const int64_t n = shape_numel(shape);
  // Each rank contributes its pieces, zeros elsewhere; the sum over ranks is the whole (adding zeros is
  // exact).
  Tensor full = Tensor::zeros({n}, shard.dtype(), device_);
  for (const Piece& piece : owned(offset, n)) {
    Tensor dst = full.narrow_view(0, piece.flat - offset, piece.count);
    dst.copy_(shard.narrow_view(0, piece.shard, piece.count));
  }
  comm_.all_reduce_sum(full);
  return full.view(shape).to(Device::cpu());
}

void ZeroOptimizer::scatter_pieces(Tensor& shard, int64_t offset, const Tensor& full) {
  const Tensor flat = full.view({full.numel()});
  for (const Piece& piece : owned(offset, full.numel())) {
    Tensor dst = shard.narrow_view(0, piece.shard, piece.count);
    dst.copy_(flat.narrow_view(0, piece.flat - offset, piece.count).to(device_));
  }
}

Tensor ZeroOptimizer::gather_parameter(int64_t offset, const Shape& shape) {
  // In stage 2 every rank holds the parameter whole (in f32 unless it gathers bf16 copies).
  if (params_.flat_params().defined()) {
    settle();
    return params_.flat_params().narrow_view(0, offset, shape_numel(shape)).view(shape).to(Device::cpu());
  }
  return gather_pieces(shard_params_, offset, shape);
}

void ZeroOptimizer::scatter_parameter(int64_t offset, const Tensor& full) {
  if (stage2_f32_.defined()) {
    settle();  // a gather still to come would overwrite what is loaded here
    const Tensor values = full.view({full.numel()}).to(device_);
    Tensor mirror = params_.bf16_mirror().narrow_view(0, offset, full.numel());
    ops::cast_into(mirror, values);
    const auto& offsets = params_.offsets();
    const size_t i =
        static_cast<size_t>(std::lower_bound(offsets.begin(), offsets.end(), offset) - offsets.begin());
    TT_ASSERT(i < offsets.size() && offsets[i] == offset,
              "ZeroOptimizer: no parameter starts at that offset");
    if (f32_place_of_[i] >= 0) {
      Tensor place = stage2_f32_.narrow_view(0, f32_place_of_[i], full.numel());
      place.copy_(values);
    }
  } else if (params_.flat_params().defined()) {
    settle();  // a gather still to come would overwrite what is loaded here
    Tensor dst = params_.flat_params().narrow_view(0, offset, full.numel());
    dst.copy_(full.view({full.numel()}).to(device_));
    if (params_.bf16_mirror().defined()) {
      Tensor mirror = params_.bf16_mirror().narrow_view(0, offset, full.numel());
      ops::cast_into(mirror, dst);
    }
  }
  scatter_pieces(shard_params_, offset, full);
}

Tensor ZeroOptimizer::gather_moment(int which, int64_t offset, const Shape& shape) {
  return gather_pieces(which == 0 ? adamw_->exp_avg()[0] : adamw_->exp_avg_sq()[0], offset, shape);
}

void ZeroOptimizer::scatter_moment(int which, int64_t offset, const Tensor& full) {
  scatter_pieces(which == 0 ? adamw_->exp_avg()[0] : adamw_->exp_avg_sq()[0], offset, full);
}

// --- gradients ---

void ZeroOptimizer::begin_backward() {
  TT_ASSERT(!armed_, "ZeroOptimizer::begin_backward twice without finish_backward");
  armed_ = true;
  for (Unit& unit : units_) {
    unit.ready = 0;
    unit.staged = unit.launched = false;
  }
  next_launch_ = static_cast<int>(units_.size()) - 1;
}

Tensor ZeroOptimizer::acquire_staging() {
  if (free_staging_.empty() && !in_flight_.empty() &&
      in_flight_.size() + 1 >= kStagingBuffers) {  // the one being written plus those on the wire
    complete_oldest();
  }
  if (free_staging_.empty()) {
    free_staging_.push_back(Tensor::empty({max_unit_padded_}, grad_dtype_, device_));
  }
  Tensor staging = std::move(free_staging_.back());
  free_staging_.pop_back();
  return staging;
}

void ZeroOptimizer::before_backward(int index) {
  TT_ASSERT(armed_, "ZeroOptimizer: a unit's backward began outside begin_backward/finish_backward");
  const size_t u = static_cast<size_t>(index);
  if (stage_ == 3) {
    // Units after this one have finished their backward (see run_unit): their parameters go.
    for (size_t v = u + 1; v < units_.size(); ++v) release(v);
    ensure_gathered(u);
    if (u > 0) issue_gather(u - 1);
  }
  Unit& unit = units_[u];
  if (unit.staged || unit.trainable == 0) return;
  unit.staging = acquire_staging();
  const int64_t padded = unit.chunk * comm_.world_size();
  Tensor used = unit.staging.narrow_view(0, 0, padded);
  // Zeros where no gradient is written (frozen parameters, padding) and under the accumulator's additions.
  used.zero_();
  const auto& list = params_.parameters();
  for (size_t i = unit.first; i < unit.end; ++i) {
    if (!trainable_[i]) continue;
    const Tensor& t = *list[i].tensor;
    t.set_grad(unit.staging.narrow_view(0, params_.offsets()[i] - unit.begin, t.numel()).view(t.shape()));
    mark_grad_zeroed_in_current_pass(t);
  }
  unit.staged = true;
  note_staging_bytes();
}

void ZeroOptimizer::on_grad_ready(size_t parameter) {
  if (!armed_) return;
  Unit& unit = units_[unit_of_[parameter]];
  if (!unit.staged) {
    throw Error(
        "ZeroOptimizer: the gradient of " + params_.parameters()[parameter].name +
        " arrived before its unit's backward began; the model must run its units through nn::run_unit");
  }
  if (++unit.ready == unit.trainable) launch_ready_units();
}

void ZeroOptimizer::launch_ready_units() {
  // Strictly in descending unit order, so every rank issues the same collectives in the same order.
  while (next_launch_ >= 0) {
    Unit& unit = units_[static_cast<size_t>(next_launch_)];
    if (unit.trainable > 0 && unit.ready < unit.trainable) return;
    if (unit.trainable > 0) launch(static_cast<size_t>(next_launch_));
    --next_launch_;
  }
}

void ZeroOptimizer::launch(size_t u) {
  Unit& unit = units_[u];
  unit.launched = true;
  const auto& list = params_.parameters();
  // No gradient of this unit is written again in this pass; the buffer may serve another unit next.
  for (size_t i = unit.first; i < unit.end; ++i) list[i].tensor->set_grad(Tensor());
  InFlight f;
  f.unit = u;
  f.staging = std::move(unit.staging);
  const int64_t padded = unit.chunk * comm_.world_size();
  f.wire = f.staging.narrow_view(0, 0, padded);
  if (f.wire.dtype() == DType::bf16 && device_.is_cpu()) {
    // MPI reduces no bf16: widen (exact) and reduce in f32.
    Tensor wide = Tensor::empty({padded}, DType::f32, device_);
    ops::cast_into(wide, f.wire);
    f.wire = wide;
  }
  f.received = Tensor::empty({unit.chunk}, f.wire.dtype(), device_);
  f.work = comm_.reduce_scatter_avg_async(f.wire, f.received);
  in_flight_.push_back(std::move(f));
  note_staging_bytes();
}

void ZeroOptimizer::complete_oldest() {
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  f.work->wait();
  const Unit& unit = units_[f.unit];
  Tensor dst = shard_grads_.narrow_view(0, unit.shard_offset, unit.chunk);
  if (overwrite_shard_grads_) {
    ops::cast_into(dst, f.received);  // a copy when the dtypes agree
  } else {
    ops::add_into(dst, f.received.dtype() == dst.dtype() ? f.received : ops::cast(f.received, dst.dtype()));
  }
  free_staging_.push_back(std::move(f.staging));
}

void ZeroOptimizer::finish_backward() {
  TT_ASSERT(armed_, "ZeroOptimizer::finish_backward without begin_backward");
  armed_ = false;
  // Units whose parameters did not all get a gradient in this pass (the same on every rank): their staged
  // gradients go now, in the same descending order.
  for (int u = next_launch_; u >= 0; --u) {
    if (units_[static_cast<size_t>(u)].staged && !units_[static_cast<size_t>(u)].launched)
      launch(static_cast<size_t>(u));
  }
  next_launch_ = -1;
  while (!in_flight_.empty()) complete_oldest();
  if (overwrite_shard_grads_) {
    // The step's first pass: a unit that got no gradient in it still holds the last step's.
    for (const Unit& unit : units_) {
      if (unit.trainable > 0 && !unit.launched)
        shard_grads_.narrow_view(0, unit.shard_offset, unit.chunk).zero_();
    }
    overwrite_shard_grads_ = false;
  }
  // Between passes the shard is the only gradient memory (the caching allocator keeps the blocks on CUDA).
  free_staging_.clear();
  for (Unit& unit : units_) unit.staging = Tensor();
  const auto& list = params_.parameters();
  for (const nn::NamedParameter& p : list) p.tensor->set_grad(Tensor());
  if (stage_ == 3) {
    for (size_t u = 0; u < units_.size(); ++u) release(u);
  }
}

void ZeroOptimizer::note_staging_bytes() {
  int64_t bytes = 0;
  for (const Tensor& t : free_staging_) bytes += static_cast<int64_t>(t.nbytes());
  for (const Unit& unit : units_)
    bytes += unit.staging.defined() ? static_cast<int64_t>(unit.staging.nbytes()) : 0;
  for (const InFlight& f : in_flight_) {
    bytes += static_cast<int64_t>(f.staging.nbytes() + f.received.nbytes());
    if (f.wire.storage() != f.staging.storage()) bytes += static_cast<int64_t>(f.wire.nbytes());
  }
  peak_staging_bytes_ = std::max(peak_staging_bytes_, bytes);
}

// --- the update ---

double ZeroOptimizer::step(double max_norm, bool measure_norm) {
  TT_ASSERT(!armed_, "ZeroOptimizer::step between begin_backward and finish_backward");
  TT_ASSERT(!overwrite_shard_grads_, "ZeroOptimizer::step twice without a backward pass in between");
  double norm = std::nan("");
  Tensor grad_scale;  // the clipping factor on the device (undefined: 1)
  if (max_norm > 0 || measure_norm) {
    const double local = ops::sum_squares(shard_grads_);
    Tensor total = device_.is_cpu() ? Tensor::from_doubles({local}, {1})
                                    : Tensor::from_floats({static_cast<float>(local)}, {1}, device_);
    comm_.all_reduce_sum(total);
    norm = std::sqrt(total.item());
    if (!std::isfinite(norm)) return norm;  // diverged: the caller stops; nothing is updated
    if (max_norm > 0) {
      const double scale = std::min(1.0, max_norm / (norm + 1e-6));
      // On CUDA AdamW multiplies each gradient as it reads it (the same f32 product), without a pass of
      // its own over the shard.
      if (scale < 1.0 && device_.is_cuda()) {
        grad_scale = Tensor::from_floats({static_cast<float>(scale)}, {1}, device_);
      } else if (scale < 1.0) {
        scale_gradients(shard_grads_, scale);
      }
    }
  }
  adamw_->set_grad_scale(grad_scale);
  settle();  // stage 2: no gather may still be reading the shard the update writes
  adamw_->step();
  // The next pass writes the shard instead of adding to it: no pass to clear it.
  overwrite_shard_grads_ = true;
  if (stage_ == 3) return norm;
  for (Unit& unit : units_) unit.stale = true;
  stale_units_ = units_.size();
  if (!gathers_in_forward_) issue_refresh(0);
  return norm;
}

// Every rank's chunk of unit u into `out` (the unit padded to a multiple of the world size), in out's dtype:
// the f32 master weights, or their bf16 rounding (cast into a buffer kept until the gather is complete).
std::unique_ptr<ShardCollectives::Pending> ZeroOptimizer::gather_unit_async(size_t u, Tensor& out) {
  Unit& unit = units_[u];
  const Tensor chunk = shard_params_.narrow_view(0, unit.shard_offset, unit.chunk);
  if (out.dtype() == chunk.dtype()) return comm_.all_gather_async(chunk, out);
  unit.sent = Tensor::empty({unit.chunk}, out.dtype(), device_);
  ops::cast_into(unit.sent, chunk);
  return comm_.all_gather_async(unit.sent, out);
}

// --- stage 2: the updated shards back into the flat buffer ---

void ZeroOptimizer::issue_refresh(size_t u) {
  Unit& unit = units_[u];
  if (!unit.stale || unit.refresh || unit.f32_gather) return;
  const int64_t world = comm_.world_size();
  if (unit.gathers_bf16) issue_f32_pack(u);
  // Nothing reads the bf16 copy of a unit without matmul weights (the embedding): its f32 pack is all.
  if (unit.gathers_bf16 && !unit.has_matmul_weights) return;
  // The bf16 copy into the mirror, or the f32 values into the flat buffer.
  Tensor target = unit.gathers_bf16 ? params_.bf16_mirror() : params_.flat_params();
  if (unit.numel() == unit.chunk * world) {
    // No padding: the ranks' chunks laid end to end are the unit's place in the target.
    Tensor out = target.narrow_view(0, unit.begin, unit.numel());
    unit.refresh = gather_unit_async(u, out);
    return;
  }
  const size_t slot = u % 2;
  // The buffer's previous unit is copied out first (in practice it already is: units go in order).
  if (refresh_owner_[slot] >= 0) complete_refresh(static_cast<size_t>(refresh_owner_[slot]));
  Tensor& buffer = refresh_buffers_[slot];
  const DType dtype = unit.gathers_bf16 ? DType::bf16 : param_dtype_;
  if (!buffer.defined() || buffer.dtype() != dtype) buffer = Tensor::empty({max_refresh_}, dtype, device_);
  Tensor out = buffer.narrow_view(0, 0, unit.chunk * world);
  unit.refresh = gather_unit_async(u, out);
  refresh_owner_[slot] = static_cast<int64_t>(u);
}

void ZeroOptimizer::complete_refresh(size_t u) {
  Unit& unit = units_[u];
  if (!unit.stale) return;
  issue_refresh(u);
  if (unit.refresh) {
    unit.refresh->wait();
    unit.refresh.reset();
    unit.sent = Tensor();
    Tensor dst = (unit.gathers_bf16 ? params_.bf16_mirror() : params_.flat_params())
                     .narrow_view(0, unit.begin, unit.numel());
    const size_t slot = u % 2;
    if (refresh_owner_[slot] == static_cast<int64_t>(u)) {  // gathered into a buffer (a padded unit)
      dst.copy_(refresh_buffers_[slot].narrow_view(0, 0, unit.numel()));
      refresh_owner_[slot] = -1;
    }
    if (!unit.gathers_bf16 && params_.bf16_mirror().defined()) {
      Tensor mirror = params_.bf16_mirror().narrow_view(0, unit.begin, unit.numel());
      ops::cast_into(mirror, dst);
    }
  }
  if (unit.gathers_bf16) complete_f32_pack(u, stage2_f32_);
  unit.stale = false;
  // The buffers go back to the pool once the whole model is current (they are a unit's size each).
  if (--stale_units_ == 0) {
    for (Tensor& buffer : refresh_buffers_) buffer = Tensor();
  }
}

void ZeroOptimizer::refresh_in_order(size_t u) {
  if (u + 1 < units_.size()) issue_refresh(u + 1);  // on the wire while unit u is copied and cast
  complete_refresh(u);
}

void ZeroOptimizer::prepare_capture() {
  if (stage_ != 2) return;
  settle();
  gathers_in_forward_ = true;
  for (Unit& unit : units_) unit.stale = true;
  stale_units_ = units_.size();
}

void ZeroOptimizer::replayed() {
  // What the captured backward passes did to the host's state, which a replay leaves as it was.
  overwrite_shard_grads_ = false;
  if (stage_ != 2) return;
  for (Unit& unit : units_) unit.stale = false;
  stale_units_ = 0;
}

void ZeroOptimizer::settle() {
  if (stage_ != 2) return;
  for (size_t u = 0; u < units_.size(); ++u) refresh_in_order(u);
}

// --- stage 3: parameters gathered per unit ---

bool ZeroOptimizer::held(size_t u) const {
  return units_[u].gathered.defined() || units_[u].gathered_bf16.defined();
}

void ZeroOptimizer::issue_gather(size_t u) {
  Unit& unit = units_[u];
  if (held(u)) return;
  if (unit.gathers_bf16) {
    unit.gathered_bf16 = Tensor::empty({unit.chunk * comm_.world_size()}, DType::bf16, device_);
    unit.gather = gather_unit_async(u, unit.gathered_bf16);
    if (unit.f32_numel > 0) unit.gathered = Tensor::empty({unit.f32_numel}, param_dtype_, device_);
    issue_f32_pack(u);
  } else {
    unit.gathered = Tensor::empty({unit.chunk * comm_.world_size()}, param_dtype_, device_);
    unit.gather = gather_unit_async(u, unit.gathered);
  }
  peak_gathered_units_ = std::max(peak_gathered_units_, gathered_units());
}

void ZeroOptimizer::ensure_gathered(size_t u) {
  Unit& unit = units_[u];
  issue_gather(u);
  if (!unit.gather) return;  // pointed at it already
  unit.gather->wait();
  unit.gather.reset();
  unit.sent = Tensor();
  const auto& list = params_.parameters();
  if (unit.gathers_bf16) {
    complete_f32_pack(u, unit.gathered);
    for (size_t i = unit.first; i < unit.end; ++i) {
      TensorImpl* copy = bf16_copies_of_[i].impl();
      copy->storage = unit.gathered_bf16.storage();
      copy->offset = unit.gathered_bf16.offset() + (params_.offsets()[i] - unit.begin);
      if (f32_place_of_[i] < 0) continue;  // no f32 values: only the matmuls read it, through the copy
      TensorImpl* impl = list[i].tensor->impl();
      impl->storage = unit.gathered.storage();
      impl->offset = unit.gathered.offset() + f32_place_of_[i];
    }
    return;
  }
  for (size_t i = unit.first; i < unit.end; ++i) {
    TensorImpl* impl = list[i].tensor->impl();
    impl->storage = unit.gathered.storage();
    impl->offset = unit.gathered.offset() + (params_.offsets()[i] - unit.begin);
  }
  if (!bf16_copies_) return;
  unit.gathered_bf16 = Tensor::empty({unit.numel()}, DType::bf16, device_);
  ops::cast_into(unit.gathered_bf16, unit.gathered.narrow_view(0, 0, unit.numel()));
  for (size_t i = unit.first; i < unit.end; ++i) {
    TensorImpl* impl = bf16_copies_of_[i].impl();
    impl->storage = unit.gathered_bf16.storage();
    impl->offset = unit.gathered_bf16.offset() + (params_.offsets()[i] - unit.begin);
  }
}

void ZeroOptimizer::release(size_t u) {
  Unit& unit = units_[u];
  if (!held(u)) return;
  if (unit.gather) unit.gather->wait();  // a prefetch nobody used
  unit.gather.reset();
  unit.sent = Tensor();
  if (unit.f32_gather) unit.f32_gather->wait();
  unit.f32_gather.reset();
  unit.f32_sent = unit.f32_received = Tensor();
  const auto& list = params_.parameters();
  for (size_t i = unit.first; i < unit.end; ++i) {
    list[i].tensor->impl()->storage.reset();
    if (bf16_copies_) bf16_copies_of_[i].impl()->storage.reset();
  }
  unit.gathered = Tensor();
  unit.gathered_bf16 = Tensor();
}

void ZeroOptimizer::before_forward(int index) {
  const size_t u = static_cast<size_t>(index);
  if (stage_ == 2) {
    refresh_in_order(u);
    return;
  }
  ensure_gathered(u);
  if (u + 1 < units_.size()) issue_gather(u + 1);
}

void ZeroOptimizer::after_forward(int index, bool backward_follows) {
  if (stage_ != 3) return;
  const size_t u = static_cast<size_t>(index);
  // The last unit's backward comes first: keep it.
  if (backward_follows && u + 1 == units_.size()) return;
  release(u);
}

int ZeroOptimizer::gathered_units() const {
  int n = 0;
  for (size_t u = 0; u < units_.size(); ++u) n += held(u) ? 1 : 0;
  return n;
}

// --- memory ---

int64_t ZeroOptimizer::gradient_bytes() const {
  int64_t bytes = static_cast<int64_t>(shard_grads_.nbytes());
  for (const Tensor& t : free_staging_) bytes += static_cast<int64_t>(t.nbytes());
  for (const Unit& unit : units_)
    bytes += unit.staging.defined() ? static_cast<int64_t>(unit.staging.nbytes()) : 0;
  for (const InFlight& f : in_flight_)
    bytes += static_cast<int64_t>(f.staging.nbytes() + f.received.nbytes());
  // Anything still attached to the parameters outside a staging buffer.
  if (params_.flat_grads().defined()) bytes += static_cast<int64_t>(params_.flat_grads().nbytes());
  return bytes;
}

int64_t ZeroOptimizer::parameter_bytes() const {
  int64_t bytes = static_cast<int64_t>(shard_params_.nbytes());
  if (stage2_f32_.defined()) bytes += static_cast<int64_t>(stage2_f32_.nbytes());
  const Tensor& flat = params_.flat_params();
  if (flat.defined()) bytes += static_cast<int64_t>(flat.nbytes());
  if (params_.bf16_mirror().defined()) bytes += static_cast<int64_t>(params_.bf16_mirror().nbytes());
  for (const Tensor& buffer : refresh_buffers_) {
    if (buffer.defined()) bytes += static_cast<int64_t>(buffer.nbytes());
  }
  for (const Unit& unit : units_) {
    if (unit.gathered.defined()) bytes += static_cast<int64_t>(unit.gathered.nbytes());
    if (unit.gathered_bf16.defined()) bytes += static_cast<int64_t>(unit.gathered_bf16.nbytes());
  }
  return bytes;
}

int64_t ZeroOptimizer::state_bytes() const {
  return static_cast<int64_t>(adamw_->exp_avg()[0].nbytes() + adamw_->exp_avg_sq()[0].nbytes());
}

}  // namespace tt::optim
