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

// --- ZeRO-2 and ZeRO-3 (the training and the comparison: dist_test_util.h) ---

TEST_CASE("ZeRO-2 and ZeRO-3 AdamW equal one process on the union of the batches (clipped, 10 steps)") {
  for (int stage : {2, 3}) {
    for (DType dtype : {DType::f64, DType::f32}) {
      for (ModelKind kind : {ModelKind::mlp, ModelKind::transformer, ModelKind::transformer_recompute,
                             ModelKind::mlp_detached}) {
        for (int micro : {1, 3}) check_zero_matches_single(kind, dtype, stage, micro, Device::cpu());
      }
    }
  }
}

TEST_CASE("ZeRO-2 and ZeRO-3 in bf16 precision equal one process in bf16") {
  for (int stage : {2, 3})
    check_zero_matches_single(ModelKind::transformer_bf16, DType::f32, stage, 2, Device::cpu());
}

TEST_CASE("ZeRO-2 and ZeRO-3 with bf16 gradients equal one process with bf16 gradients") {
  for (int stage : {2, 3}) {
    for (ModelKind kind : {ModelKind::mlp, ModelKind::transformer_bf16}) {
      for (int micro : {1, 2}) check_zero_matches_single(kind, DType::f32, stage, micro, Device::cpu(), true);
    }
    // The shard holds them in bf16: 2 bytes per element, not 4.
    ZeroMemory m;
    train_sharded(ModelKind::transformer_bf16, DType::f32, stage, 1, Device::cpu(), &m, true);
    CHECK(m.gradient_bytes == m.shard_elements * 2);
    CHECK(m.state_bytes == 2 * m.shard_elements * 4);
  }
}

TEST_CASE("ZeRO-2 keeps 1/world of the gradients, ZeRO-3 of the parameters too, between steps") {
  const int world = runtime().world_size();
  for (int stage : {2, 3}) {
    for (ModelKind kind : {ModelKind::mlp, ModelKind::transformer, ModelKind::transformer_recompute}) {
      const std::string model_label = model_kind_name(kind);
      CAPTURE(model_label);
      CAPTURE(stage);
      ZeroMemory m;
      train_sharded(kind, DType::f32, stage, 2, Device::cpu(), &m);
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

TEST_CASE("train's step under mpirun (DDP, ZeRO-1/2/3, accumulation) equals it in one process") {
  for (const int64_t accum : {int64_t{1}, int64_t{2}}) {
    for (const dist::DdpStrategy strategy : {dist::DdpStrategy::bucketed, dist::DdpStrategy::flat})
      check_train_step_matches_single(Device::cpu(), 0, strategy, accum, 1e-5);
    for (const int zero : {1, 2, 3})
      check_train_step_matches_single(Device::cpu(), zero, dist::DdpStrategy::bucketed, accum, 1e-5);
  }
}
