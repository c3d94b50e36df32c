// Multi-rank suite on GPUs (NCCL backend, one GPU per rank): the collectives, stream ordering without host
// synchronisation, and every DDP strategy against single-process training on the union of the batches.
#include <doctest/doctest.h>

#include "core/cuda_context.h"
#include "core/ops.h"
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
      CAPTURE(model_kind_name(model));
      CAPTURE(optimizer_kind_name(optimizer));
      check_strategies_match_single_process(model, optimizer, gpu);
    }
  }
}

TEST_CASE("nccl: every strategy with gradients communicated in bf16 stays close to single-process training") {
  for (ModelKind kind : {ModelKind::mlp, ModelKind::transformer}) {
    CAPTURE(model_kind_name(kind));
    check_bf16_communication(kind, my_gpu());
  }
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

TEST_CASE("nccl: ZeRO-1 with the update and all-gather pipelined in chunks equals unsharded AdamW") {
  // Chunks small enough that many gathers run on the communication stream while later chunks are updated on
  // the compute stream; the reduce-scatter and the bucketed all-reduce as gradient sources.
  check_pipelined_zero(my_gpu(), DType::f32, {257, int64_t{1} << 30}, 1e-5, 1e-8, true);
}
