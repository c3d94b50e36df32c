// ZeRO-1 under mpirun (2 and 3 ranks, so slices are uneven in content and the buffer needs padding): the
// sharded AdamW equals unsharded AdamW after DDP averaging, and the state it holds is 1/world of it.
#include <doctest/doctest.h>

#include <algorithm>

#include "core/ops.h"

#include "dist/shard_collectives.h"
#include "dist_test_util.h"
#include "optim/sharded_optimizer.h"
#include "optim/zero_optimizer.h"

using namespace tt;
using namespace tt::testing;

TEST_CASE("ZeRO-1 AdamW equals unsharded AdamW after 10 steps (MLP with a frozen parameter, tiny LM)") {
  for (DType dtype : {DType::f64, DType::f32}) {
    for (ModelKind kind : {ModelKind::mlp, ModelKind::transformer}) {
      const std::string model_label = model_kind_name(kind);
      CAPTURE(model_label);
      const std::string dtype_text = dtype_name(dtype);
      CAPTURE(dtype_text);
      int64_t sharded_bytes = 0, whole_bytes = 0;
      const std::vector<double> sharded = train_zero(kind, Device::cpu(), dtype, true, &sharded_bytes);
      const std::vector<double> whole = train_zero(kind, Device::cpu(), dtype, false, &whole_bytes);
      std::string why;
      // f64: the acceptance bar (rtol 1e-7). f32: the same result up to float rounding of the reduction.
      CHECK_MESSAGE(
          allclose(sharded, whole, dtype == DType::f64 ? 1e-7 : 1e-5, dtype == DType::f64 ? 0.0 : 1e-8, &why),
          why);
      CHECK(same_on_all_ranks(sharded));
      // The state of one slice: whole / world, up to the padding of the last slice.
      const int world = runtime().world_size();
      const int64_t elem = static_cast<int64_t>(dtype_size(dtype));
      CHECK(sharded_bytes * world >= whole_bytes);
      CHECK(sharded_bytes * world <= whole_bytes + 2 * elem * world * world);
    }
  }
}

TEST_CASE("ZeRO-1 over bucketed DDP (all-reduce overlapped with backward) equals unsharded AdamW") {
  // Bucket caps giving one tensor per bucket, a few buckets, and one bucket.
  for (double mb : {1e-6, 0.01, 1000.0}) {
    for (ModelKind kind : {ModelKind::mlp, ModelKind::transformer}) {
      const std::string model_label = model_kind_name(kind);
      CAPTURE(model_label);
      CAPTURE(mb);
      int64_t sharded_bytes = 0, whole_bytes = 0;
      const std::vector<double> sharded =
          train_zero(kind, Device::cpu(), DType::f64, true, &sharded_bytes, mb);
      const std::vector<double> whole = train_zero(kind, Device::cpu(), DType::f64, false, &whole_bytes);
      std::string why;
      CHECK_MESSAGE(allclose(sharded, whole, 1e-7, 0.0, &why), why);
      CHECK(same_on_all_ranks(sharded));
      CHECK(sharded_bytes * runtime().world_size() >= whole_bytes);
      if (runtime().world_size() > 1) CHECK(sharded_bytes < whole_bytes);
    }
  }
}

TEST_CASE("ZeRO-1 with bf16 gradient buffers equals unsharded AdamW with bf16 gradients") {
  check_zero_bf16_gradients(Device::cpu());
}

TEST_CASE("ZeRO-1 with the update and all-gather pipelined in chunks equals unsharded AdamW") {
  // Small chunks, chunks that leave a partial last one, and one chunk for the whole slice; with
  // the reduce-scatter and with bucketed DDP feeding the gradients.
  check_pipelined_zero(Device::cpu(), DType::f64, {5, 257, int64_t{1} << 30}, 1e-7, 0.0, false);
}

TEST_CASE("ZeRO-1 around SGD (sharded update, no state) equals unsharded SGD") {
  dist::DistRuntime& rt = runtime();
  dist::Communicator& comm = communicator(Device::cpu());
  for (int64_t chunk : {int64_t{3}, int64_t{1} << 30}) {
    for (ModelKind kind : {ModelKind::mlp, ModelKind::transformer}) {
      const std::string model_label = model_kind_name(kind);
      CAPTURE(model_label);
      CAPTURE(chunk);
      std::vector<double> result[2];
      for (int sharded = 0; sharded < 2; ++sharded) {
        std::unique_ptr<TestModel> model = make_test_model(kind);
        nn::FlatParameters params(model->module(), Device::cpu(), 5, DType::f64,
                                  sharded ? rt.world_size() : 1);
        model->freeze();
        std::unique_ptr<optim::ShardCollectives> collectives = dist::shard_collectives(comm);
        std::unique_ptr<optim::ShardedOptimizer> zero;
        std::unique_ptr<optim::SGD> sgd;
        std::unique_ptr<dist::DataParallel> ddp;
        if (sharded) {
          comm.broadcast(params.flat_params(), 0);
          zero = std::make_unique<optim::ShardedOptimizer>(params, *collectives, optim::SgdOptions{0.05});
          zero->set_gather_chunk(chunk);
          CHECK(zero->state_bytes() == 0);
          CHECK_THROWS_AS(zero->shard_exp_avg(), Error);
        } else {
          ddp = std::make_unique<dist::DataParallel>(params, comm, dist::DdpStrategy::flat);
          sgd = std::make_unique<optim::SGD>(std::vector<Tensor>{params.flat_params()}, 0.05);
        }
        for (int step = 0; step < 10; ++step) {
          params.zero_grad();
          const uint64_t id = static_cast<uint64_t>(step * rt.world_size() + rt.rank());
          const Tensor loss = model->loss({id}, Device::cpu());
          if (ddp) ddp->begin_backward();
          loss.backward();
          if (ddp) ddp->finish_backward();
          if (zero) {
            zero->step(0.0);
          } else {
            sgd->step();
          }
        }
        if (zero) CHECK(zero->step_count() == 10);
        result[sharded] = params.flat_params().to_doubles();
        result[sharded].resize(static_cast<size_t>(params.numel()));
      }
      std::string why;
      CHECK_MESSAGE(allclose(result[1], result[0], 1e-7, 0.0, &why), why);
      CHECK(same_on_all_ranks(result[1]));
    }
  }
}

// --- ZeRO-2 and ZeRO-3 ---

namespace {

constexpr int kZeroSteps = 10;
constexpr double kClip = 0.05;  // below the tiny models' gradient norms: clipping is engaged

uint64_t zero_batch(int rank, int step, int micro) {
  return static_cast<uint64_t>(rank) * 10000 + static_cast<uint64_t>(step) * 100 +
         static_cast<uint64_t>(micro);
}

optim::AdamWOptions zero_adamw(DType dtype) {
  optim::AdamWOptions options;
  options.lr = 1e-2;
  // As in train_zero: in f32 the cross-rank sum's order moves near-cancelling gradients by an ulp, which
  // AdamW's default eps would amplify; eps = lr bounds it.
  if (dtype == DType::f32) options.eps = options.lr;
  return options;
}

struct ZeroResult {
  std::vector<double> parameters;  // the whole model after training
  std::vector<double> norms;       // per step, before clipping
};

// One process on the union of every rank's micro-batches, AdamW over the flat buffer, clipped.
ZeroResult train_single(ModelKind kind, DType dtype, int micro_batches) {
  const int world = runtime().world_size();
  std::unique_ptr<TestModel> model = make_test_model(kind);
  nn::FlatParameters params(model->module(), Device::cpu(), 5, dtype);
  model->freeze();
  optim::AdamW adamw({params.flat_params()}, zero_adamw(dtype));
  ZeroResult result;
  for (int step = 0; step < kZeroSteps; ++step) {
    params.zero_grad();
    std::vector<uint64_t> ids;
    for (int r = 0; r < world; ++r) {
      for (int m = 0; m < micro_batches; ++m) ids.push_back(zero_batch(r, step, m));
    }
    model->loss(ids, Device::cpu()).backward();
    result.norms.push_back(optim::clip_grad_norm({params.flat_grads()}, kClip));
    adamw.step();
  }
  result.parameters = params.flat_params().to_doubles();
  result.parameters.resize(static_cast<size_t>(params.numel()));
  return result;
}

struct ZeroMemory {
  int64_t total_elements = 0, shard_elements = 0, largest_unit = 0;
  int64_t gradient_bytes = 0, parameter_bytes = 0, state_bytes = 0, peak_staging_bytes = 0;
  int gathered_units = 0, peak_gathered_units = 0;
  bool grads_detached = true;  // no parameter has a .grad between steps, no flat gradient buffer
};

// Each rank on its own micro-batches through ZeroOptimizer; the parameters gathered whole at the end.
ZeroResult train_sharded(ModelKind kind, DType dtype, int stage, int micro_batches,
                         ZeroMemory* memory = nullptr) {
  dist::DistRuntime& rt = runtime();
  dist::Communicator& comm = communicator(Device::cpu());
  std::unique_ptr<TestModel> model = make_test_model(kind);
  nn::FlatParameters params(model->module(), Device::cpu(), 5, dtype);
  model->freeze();
  comm.broadcast(params.flat_params(), 0);
  std::unique_ptr<optim::ShardCollectives> collectives = dist::shard_collectives(comm);
  const bool bf16 = kind == ModelKind::transformer_bf16;
  optim::ZeroOptimizer zero(params, *collectives, model->unit_first_parameters(), stage, zero_adamw(dtype),
                            bf16);
  model->set_parameter_units(&zero);
  ZeroResult result;
  for (int step = 0; step < kZeroSteps; ++step) {
    for (int m = 0; m < micro_batches; ++m) {
      Tensor loss = model->loss({zero_batch(rt.rank(), step, m)}, Device::cpu());
      if (micro_batches > 1) loss = ops::scale(loss, 1.0 / micro_batches);
      zero.begin_backward();
      loss.backward();
      zero.finish_backward();
    }
    result.norms.push_back(zero.step(kClip));
  }
  if (memory) {
    memory->total_elements = params.numel();
    memory->shard_elements = zero.shard_numel();
    memory->gradient_bytes = zero.gradient_bytes();
    memory->parameter_bytes = zero.parameter_bytes();
    memory->state_bytes = zero.state_bytes();
    memory->peak_staging_bytes = zero.peak_staging_bytes();
    memory->gathered_units = zero.gathered_units();
    memory->peak_gathered_units = zero.peak_gathered_units();
    const auto& list = params.parameters();
    const std::vector<size_t> first = model->unit_first_parameters();
    for (size_t u = 0; u < first.size(); ++u) {
      const size_t end = u + 1 < first.size() ? first[u + 1] : list.size();
      const int64_t n =
          params.offsets()[end - 1] + list[end - 1].tensor->numel() - params.offsets()[first[u]];
      memory->largest_unit = std::max(memory->largest_unit, n);
    }
    memory->grads_detached = !params.flat_grads().defined();
    for (const nn::NamedParameter& p : list)
      memory->grads_detached = memory->grads_detached && !p.tensor->grad().defined();
  }
  for (size_t i = 0; i < params.parameters().size(); ++i) {
    const Tensor& t = *params.parameters()[i].tensor;
    const std::vector<double> values = zero.gather_parameter(params.offsets()[i], t.shape()).to_doubles();
    result.parameters.insert(result.parameters.end(), values.begin(), values.end());
  }
  model->set_parameter_units(nullptr);
  return result;
}

void check_zero_matches_single(ModelKind kind, DType dtype, int stage, int micro_batches) {
  const std::string model_label = model_kind_name(kind);
  const std::string dtype_text = dtype_name(dtype);
  CAPTURE(model_label);
  CAPTURE(dtype_text);
  CAPTURE(stage);
  CAPTURE(micro_batches);
  const ZeroResult sharded = train_sharded(kind, dtype, stage, micro_batches);
  const ZeroResult single = train_single(kind, dtype, micro_batches);
  double rtol = dtype == DType::f64 ? 1e-7 : 1e-5, atol = dtype == DType::f64 ? 0.0 : 1e-8;
  if (kind == ModelKind::transformer_bf16) {
    // bf16 matmuls round the loss gradient 1/rows to bf16 before the average over ranks, not after (exact
    // only when the world size is a power of two): with 3 ranks gradients differ by a bf16 unit, which AdamW
    // carries into the parameters (measured: 5e-4 relative in 10 steps). Bounds as check_bf16_gradients'.
    rtol = 1e-3;
    atol = 3e-4;
  }
  std::string why;
  CHECK_MESSAGE(allclose(sharded.parameters, single.parameters, rtol, atol, &why), why);
  CHECK_MESSAGE(allclose(sharded.norms, single.norms, rtol, 0.0, &why), "gradient norms: " << why);
  CHECK(same_on_all_ranks(sharded.parameters));
  // Clipping was engaged.
  CHECK(*std::max_element(single.norms.begin(), single.norms.end()) > kClip);
}

}  // namespace

TEST_CASE("ZeRO-2 and ZeRO-3 AdamW equal one process on the union of the batches (clipped, 10 steps)") {
  for (int stage : {2, 3}) {
    for (DType dtype : {DType::f64, DType::f32}) {
      for (ModelKind kind : {ModelKind::mlp, ModelKind::transformer, ModelKind::transformer_recompute}) {
        for (int micro : {1, 3}) check_zero_matches_single(kind, dtype, stage, micro);
      }
    }
  }
}

TEST_CASE("ZeRO-2 and ZeRO-3 in bf16 precision equal one process in bf16") {
  for (int stage : {2, 3}) check_zero_matches_single(ModelKind::transformer_bf16, DType::f32, stage, 2);
}

TEST_CASE("ZeRO-2 keeps 1/world of the gradients, ZeRO-3 of the parameters too, between steps") {
  const int world = runtime().world_size();
  for (int stage : {2, 3}) {
    for (ModelKind kind : {ModelKind::mlp, ModelKind::transformer, ModelKind::transformer_recompute}) {
      const std::string model_label = model_kind_name(kind);
      CAPTURE(model_label);
      CAPTURE(stage);
      ZeroMemory m;
      train_sharded(kind, DType::f32, stage, 2, &m);
      const int64_t elem = 4;
      // Each unit is padded to a multiple of the world size: at most world - 1 elements per unit.
      CHECK(m.shard_elements * world >= m.total_elements);
      CHECK(m.shard_elements * world <= m.total_elements + 8 * (world - 1));
      CHECK(m.grads_detached);
      CHECK(m.gradient_bytes == m.shard_elements * elem);
      CHECK(m.state_bytes == 2 * m.shard_elements * elem);
      // Staging: at most two units' gradients at once (plus the received chunks).
      CHECK(m.peak_staging_bytes > 0);
      CHECK(m.peak_staging_bytes <=
            2 * (m.largest_unit + world) * elem + 2 * (m.largest_unit / world + 1) * elem);
      if (stage == 3) {
        CHECK(m.gathered_units == 0);
        CHECK(m.parameter_bytes == m.shard_elements * elem);
        // The unit computing, the one prefetched and the one whose backward just ended.
        CHECK(m.peak_gathered_units >= 1);
        CHECK(m.peak_gathered_units <= 3);
      } else {
        CHECK(m.parameter_bytes == (m.shard_elements + m.total_elements) * elem);
      }
    }
  }
}
