// Multi-rank suite on GPUs (NCCL backend, one GPU per rank): the collectives, stream ordering without host
// synchronisation, and every DDP strategy against single-process training on the union of the batches.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>

#include "core/cuda_context.h"
#include "core/ops.h"
#include "dist/peer_all_reduce.h"
#include "dist_test_util.h"

using namespace tt;
using namespace tt::testing;

namespace {

Device my_gpu() {
  const Device device = Device::cuda(runtime().gpu_index());
  set_current_device(device.index);
  return device;
}

std::vector<float> rank_floats(int rank, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    out[i] = static_cast<float>(0.25 * static_cast<double>(i % 13) + 5.0 * rank);
  return out;
}

}  // namespace

TEST_CASE("nccl all_reduce, broadcast, reduce_scatter and all_gather") {
  const Device gpu = my_gpu();
  dist::Communicator& comm = communicator(gpu);
  CHECK(std::string(comm.backend()) == "nccl");
  const int world = comm.world_size(), rank = comm.rank();
  const int64_t n = 4099;
  std::vector<float> sum(n, 0.0f);
  for (int r = 0; r < world; ++r) {
    const std::vector<float> part = rank_floats(r, n);
    for (int64_t i = 0; i < n; ++i) sum[i] += part[i];
  }
  Tensor a = Tensor::from_floats(rank_floats(rank, n), {n}, gpu);
  comm.all_reduce(a, dist::ReduceOp::sum);
  Tensor b = Tensor::from_floats(rank_floats(rank, n), {n}, gpu);
  // Queued behind compute work, and read by compute work, with no host synchronisation in between.
  Tensor doubled = ops::scale(b, 2.0);
  auto work = comm.all_reduce_async(doubled, dist::ReduceOp::avg);
  work->wait();
  Tensor halved = ops::scale(doubled, 0.5);
  const std::vector<float> got_sum = a.to_floats(), got_avg = halved.to_floats();
  for (int64_t i = 0; i < n; ++i) {
    CHECK(got_sum[i] == doctest::Approx(sum[i]).epsilon(1e-6));
    CHECK(got_avg[i] == doctest::Approx(sum[i] / world).epsilon(1e-6));
  }
  CHECK(same_on_all_ranks(std::vector<double>(got_avg.begin(), got_avg.end())));

  Tensor halves = ops::cast(Tensor::from_floats(rank_floats(rank, n), {n}, gpu), DType::bf16);
  comm.all_reduce(halves, dist::ReduceOp::sum);
  const std::vector<float> got_bf16 = halves.to_floats();
  for (int64_t i = 0; i < n; ++i) CHECK(got_bf16[i] == doctest::Approx(sum[i]).epsilon(2e-2));

  Tensor root_values = Tensor::from_floats(rank_floats(rank, 100), {100}, gpu);
  comm.broadcast(root_values, world - 1);
  CHECK(root_values.to_floats() == rank_floats(world - 1, 100));

  const int64_t block = 129;
  Tensor input = Tensor::from_floats(rank_floats(rank, world * block), {world * block}, gpu);
  Tensor my_block = input.narrow_view(0, rank * block, block);
  comm.reduce_scatter(input, my_block, dist::ReduceOp::sum);  // in place
  const std::vector<float> reduced = my_block.to_floats();
  for (int64_t j = 0; j < block; ++j) {
    float expect = 0;
    for (int r = 0; r < world; ++r) expect += rank_floats(r, world * block)[rank * block + j];
    CHECK(reduced[j] == doctest::Approx(expect).epsilon(1e-6));
  }
  Tensor mine = Tensor::from_floats(rank_floats(rank, block), {block}, gpu);
  Tensor gathered = Tensor::zeros({world * block}, DType::f32, gpu);
  comm.all_gather(mine, gathered);
  std::vector<float> expect;
  for (int r = 0; r < world; ++r) {
    const std::vector<float> part = rank_floats(r, block);
    expect.insert(expect.end(), part.begin(), part.end());
  }
  CHECK(gathered.to_floats() == expect);

  // Strided blocks, gathered in place; the gaps between them keep their values.
  const int64_t offset = 5, count = 77, stride = 100;
  const StridedGatherCase blocks = strided_gather_case(world, rank, offset, count, stride, 4, rank_floats);
  Tensor strided = Tensor::from_floats(blocks.start, {static_cast<int64_t>(blocks.start.size())}, gpu);
  comm.all_gather_blocks_async(strided, offset, count, stride)->wait();
  CHECK(strided.to_floats() == blocks.expect);

  auto timer = comm.start_timer();
  comm.all_reduce(a);
  timer->stop();
  CHECK(timer->elapsed_ms() >= 0);
  comm.barrier();
}

TEST_CASE("nccl: every strategy equals single-process training on the union of batches") {
  const Device gpu = my_gpu();
  for (ModelKind model : {ModelKind::mlp, ModelKind::transformer}) {
    for (OptimizerKind optimizer : {OptimizerKind::sgd, OptimizerKind::adamw}) {
      const std::string model_label = model_kind_name(model);
      CAPTURE(model_label);
      const std::string optimizer_label = optimizer_kind_name(optimizer);
      CAPTURE(optimizer_label);
      check_strategies_match_single_process(model, optimizer, gpu);
    }
  }
}

TEST_CASE("nccl: every strategy with gradients communicated in bf16 stays close to single-process training") {
  for (ModelKind kind : {ModelKind::mlp, ModelKind::transformer}) {
    const std::string model_label = model_kind_name(kind);
    CAPTURE(model_label);
    check_bf16_communication(kind, my_gpu());
  }
}

TEST_CASE("nccl: every strategy with bf16 gradient buffers stays close to single-process training") {
  for (ModelKind kind : {ModelKind::mlp, ModelKind::transformer, ModelKind::transformer_bf16}) {
    const std::string model_label = model_kind_name(kind);
    CAPTURE(model_label);
    check_bf16_gradients(kind, my_gpu());
  }
}

TEST_CASE("nccl: ZeRO-1 with bf16 gradient buffers equals unsharded AdamW with bf16 gradients") {
  check_zero_bf16_gradients(my_gpu());
}

TEST_CASE("nccl: gradient accumulation communicates on the last micro-batch only") {
  TrainSpec spec;
  spec.device = my_gpu();
  spec.micro_batches = 2;
  const std::vector<double> reference = train(spec, nullptr);
  for (const DdpConfig& config : ddp_configs(spec.model)) {
    CAPTURE(config.label);
    std::string why;
    CHECK_MESSAGE(allclose(train(spec, &config), reference, 1e-5, 1e-8, &why), why);
  }
}

TEST_CASE("nccl: ZeRO-2 and ZeRO-3 equal one process on the union of the batches (clipped, 10 steps)") {
  // f32 (AdamW on CUDA updates f32 parameters), gradient accumulation and recomputation included; bf16
  // precision and bf16 gradients within bf16's bounds.
  for (int stage : {2, 3}) {
    for (ModelKind kind : {ModelKind::mlp, ModelKind::transformer, ModelKind::transformer_recompute,
                           ModelKind::mlp_detached}) {
      for (int micro : {1, 3}) check_zero_matches_single(kind, DType::f32, stage, micro, my_gpu());
    }
    check_zero_matches_single(ModelKind::transformer_bf16, DType::f32, stage, 2, my_gpu());
    // bf16 gradients (what bf16 training keeps): reduce-scattered and held in bf16.
    for (int micro : {1, 2})
      check_zero_matches_single(ModelKind::transformer_bf16, DType::f32, stage, micro, my_gpu(), true);
  }
}

TEST_CASE(
    "nccl: train's step (update beside the next forward; DDP, ZeRO-1/2/3, accumulation) equals one GPU") {
  for (const int64_t accum : {int64_t{1}, int64_t{2}}) {
    check_train_step_matches_single(my_gpu(), 0, dist::DdpStrategy::bucketed, accum, 1e-4);
    for (const int zero : {1, 2, 3})
      check_train_step_matches_single(my_gpu(), zero, dist::DdpStrategy::bucketed, accum, 1e-4);
  }
}

TEST_CASE("nccl: ZeRO-1 with the update and all-gather pipelined in chunks equals unsharded AdamW") {
  // Chunks small enough that many gathers run on the communication stream while later chunks are updated on
  // the compute stream; the reduce-scatter and the bucketed all-reduce as gradient sources.
  check_pipelined_zero(my_gpu(), DType::f32, {257, int64_t{1} << 30}, 1e-5, 1e-8, true);
}

namespace {

// Switches the shared communicator to the copy-engine transport for one test case and back afterwards.
class CopyEngineTransport {
 public:
  explicit CopyEngineTransport(dist::Communicator& comm) : comm_(comm) {
    comm_.set_all_reduce_transport(dist::AllReduceTransport::copy_engine);
  }
  // Not throwing from here: when a check inside the scope threw with a buffer still registered, the switch
  // back fails too, and that failure would hide the first one behind std::terminate.
  ~CopyEngineTransport() {
    try {
      comm_.set_all_reduce_transport(dist::AllReduceTransport::library);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "copy-engine test: switching back to NCCL failed: %s\n", e.what());
    }
  }
  CopyEngineTransport(const CopyEngineTransport&) = delete;
  CopyEngineTransport& operator=(const CopyEngineTransport&) = delete;

 private:
  dist::Communicator& comm_;
};

bool ranks_on_one_host() {
  if (dist::copy_engine_layout(runtime().world_size(), runtime().local_size())) return true;
  MESSAGE("the copy-engine all-reduce needs 2 to 8 ranks, all on one host; skipped");
  return false;
}

}  // namespace

static void check_copy_engine_all_reduce() {
  const Device gpu = my_gpu();
  dist::Communicator& comm = communicator(gpu);
  const CopyEngineTransport transport(comm);
  CHECK(comm.all_reduce_transport() == dist::AllReduceTransport::copy_engine);
  const int rank = comm.rank(), world = comm.world_size();
  // Rank r holds 0.25 * (i % 13) + 5 r: sums are multiples of 1/4 below 256, exact in f32 in any order of
  // adding them, so results must match exactly (bf16 ones: the exact sum rounded once).
  auto expect_sum = [world](int64_t i) {
    return static_cast<float>(0.25 * static_cast<double>(i % 13) * world + 2.5 * world * (world - 1));
  };
  // The average is the sum times 1/N, rounded as the transport rounds it (one f32 product).
  const float inverse = 1.0f / static_cast<float>(world);
  auto expect_avg = [&](int64_t i) { return expect_sum(i) * inverse; };

  // 40 M f32 elements: each rank's slice (160 MB / N) is more than its scratch slot (64 MiB / (N - 1)), so
  // it is reduced in chunks.
  const int64_t n = 40'000'003;
  Tensor big = Tensor::from_floats(rank_floats(rank, n), {n}, gpu);
  comm.register_buffer(big);
  comm.all_reduce(big, dist::ReduceOp::sum);
  {
    const std::vector<float> got = big.to_floats();
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += got[i] != expect_sum(i);
    CHECK(wrong == 0);
    // Each rank owns a slice: look at both sides of the borders near n * r / N and at the ends.
    std::vector<double> borders = {got[0], got[n - 1]};
    for (int r = 1; r < world; ++r) {
      for (int64_t i = n * r / world - 70; i < n * r / world + 2; ++i) {
        CHECK(got[i] == expect_sum(i));
        borders.push_back(got[i]);
      }
    }
    CHECK(same_on_all_ranks(borders));
  }
  comm.unregister_buffer(big);
  big = Tensor();

  // Views at odd offsets and of odd lengths (1, 7, 129, 100003 elements), queued back to back without
  // waiting, averaged, each then doubled on the compute stream.
  const int64_t m = 300'001;
  Tensor buffer = Tensor::from_floats(rank_floats(rank, m), {m}, gpu);
  comm.register_buffer(buffer);
  const std::vector<std::pair<int64_t, int64_t>> views = {
      {0, 1}, {3, 7}, {11, 129}, {1001, 100'003}, {200'000, 100'001}};
  std::vector<std::unique_ptr<dist::Work>> works;
  std::vector<Tensor> parts;
  for (const auto& [offset, count] : views) {
    parts.push_back(buffer.narrow_view(0, offset, count));
    works.push_back(comm.all_reduce_async(parts.back(), dist::ReduceOp::avg));
  }
  for (auto& w : works) w->wait();
  std::vector<float> got = buffer.to_floats();
  const std::vector<float> original = rank_floats(rank, m);
  std::vector<bool> in_view(static_cast<size_t>(m), false);
  for (const auto& [offset, count] : views)
    for (int64_t i = offset; i < offset + count; ++i) in_view[i] = true;
  int64_t wrong = 0;
  for (int64_t i = 0; i < m; ++i) wrong += got[i] != (in_view[i] ? expect_avg(i) : original[i]);
  CHECK(wrong == 0);
  CHECK(same_on_all_ranks(std::vector<double>(got.begin() + 1001, got.begin() + 101'004)));

  // Many small collectives in a row (the signals' sequence numbers advance), then the whole buffer.
  for (int k = 0; k < 200; ++k) {
    Tensor slice = buffer.narrow_view(0, 250'000 + k * 7, 5);
    comm.all_reduce(slice, dist::ReduceOp::sum);
  }
  comm.all_reduce(buffer, dist::ReduceOp::sum);
  got = buffer.to_floats();
  // Now every element is a sum over the ranks, so the whole buffer must agree.
  CHECK(same_on_all_ranks(std::vector<double>(got.begin(), got.end())));
  // Element 250'000 (i % 13 = 10) was averaged by the view {200'000, 100'001}, to fl(S * fl(1/N)), which is
  // S / N exactly for this element for every N from 2 to 8 (not for every residue when N = 7); the first of
  // the 200 small sums made it S again, and the whole-buffer sum N * S.
  CHECK(got[250'000] == world * expect_sum(250'000));
  comm.unregister_buffer(buffer);

  // bf16, and a tensor outside every registered buffer (NCCL carries it).
  Tensor halves = ops::cast(Tensor::from_floats(rank_floats(rank, 4099), {4099}, gpu), DType::bf16);
  comm.register_buffer(halves);
  comm.all_reduce(halves, dist::ReduceOp::sum);
  const std::vector<float> got_bf16 = halves.to_floats();
  wrong = 0;
  for (int64_t i = 0; i < 4099; ++i) wrong += got_bf16[i] != static_cast<float>(bf16(expect_sum(i)));
  CHECK(wrong == 0);
  comm.unregister_buffer(halves);
  Tensor outside = Tensor::from_floats(rank_floats(rank, 1000), {1000}, gpu);
  comm.all_reduce(outside, dist::ReduceOp::sum);
  const std::vector<float> got_outside = outside.to_floats();
  for (int64_t i = 0; i < 1000; ++i) CHECK(got_outside[i] == expect_sum(i));
}

TEST_CASE("copy-engine all-reduce: sums and averages of views of a registered buffer, f32 and bf16") {
  if (!ranks_on_one_host()) return;
  check_copy_engine_all_reduce();
}

TEST_CASE(
    "copy-engine all-reduce: every strategy equals single-process training; bf16 communication and buffers") {
  if (!ranks_on_one_host()) return;
  const Device gpu = my_gpu();
  const CopyEngineTransport transport(communicator(gpu));
  for (ModelKind model : {ModelKind::mlp, ModelKind::transformer}) {
    for (OptimizerKind optimizer : {OptimizerKind::sgd, OptimizerKind::adamw}) {
      const std::string model_label = model_kind_name(model);
      CAPTURE(model_label);
      const std::string optimizer_label = optimizer_kind_name(optimizer);
      CAPTURE(optimizer_label);
      check_strategies_match_single_process(model, optimizer, gpu);
    }
    check_bf16_communication(model, gpu);
    check_bf16_gradients(model, gpu);
  }
  check_bf16_gradients(ModelKind::transformer_bf16, gpu);
}
