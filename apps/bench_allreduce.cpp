// bench_allreduce: all-reduce time and bandwidth over the ranks of an mpirun job, as nccl-tests reports them:
// algorithm bandwidth = bytes / time, bus bandwidth = algorithm bandwidth * 2(N-1)/N (what each link
// carries in a ring), so numbers compare across world sizes and with nccl-tests. NCCL on GPUs, MPI on CPUs.
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <memory>

#include "apps/lib/bench.h"
#include "apps/lib/flags.h"
#include "apps/lib/report.h"
#include "apps/lib/run_setup.h"
#include "base/error.h"
#include "core/cuda_context.h"
#include "core/ops.h"
#include "dist/agreement.h"
#include "dist/communicator.h"
#include "dist/mpi_check.h"
#include "dist/runtime.h"

using namespace tt;
using namespace tt::app;

namespace {

constexpr double kBytesPerMb = 1024.0 * 1024.0;

struct Measurement {
  double mb = 0, bytes = 0, ms = 0, algorithm_gbps = 0, bus_gbps = 0;
  bool correct = false;
};

// CUDA fills f32 only: bf16 buffers are cast from an f32 one.
Tensor filled(int64_t numel, double value, DType dtype, Device device) {
  const Tensor values = Tensor::full({numel}, value, DType::f32, device);
  return dtype == DType::f32 ? values : ops::cast(values, dtype);
}

// The slowest rank's time is the collective's time.
Measurement measure(dist::Communicator& comm, double mb, DType dtype, int64_t warmup, int64_t iters,
                    dist::AllReduceTransport transport) {
  const int64_t numel = static_cast<int64_t>(mb * kBytesPerMb) / static_cast<int64_t>(dtype_size(dtype));
  TT_CHECK(numel > 0, "--sizes-mb: " + std::to_string(mb) + " MB holds no element");
  comm.set_all_reduce_transport(transport);
  Tensor buffer = filled(numel, 1.0, dtype, comm.device());
  comm.register_buffer(buffer);
  // One checked reduction first: every element must come back as the world size.
  comm.all_reduce(buffer, dist::ReduceOp::sum);
  Measurement m;
  m.mb = mb;
  m.correct = buffer.narrow_view(0, numel - 1, 1).item() == comm.world_size() &&
              buffer.narrow_view(0, 0, 1).item() == comm.world_size();
  buffer.zero_();  // sums of zeros never overflow
  for (int64_t i = 0; i < warmup; ++i) comm.all_reduce(buffer, dist::ReduceOp::sum);
  synchronize(comm.device());
  comm.barrier();
  // Timed back to back on the device (CUDA events around the loop) or on the host (CPU).
  std::unique_ptr<dist::StreamTimer> timer = comm.start_timer();
  for (int64_t i = 0; i < iters; ++i) comm.all_reduce(buffer, dist::ReduceOp::sum);
  timer->stop();
  m.ms = dist::max_over_ranks(timer->elapsed_ms() / static_cast<double>(iters));
  m.bytes = static_cast<double>(numel) * static_cast<double>(dtype_size(dtype));
  const int world = comm.world_size();
  m.algorithm_gbps = m.bytes / (m.ms * 1e-3) / 1e9;
  m.bus_gbps = m.algorithm_gbps * 2.0 * (world - 1) / world;
  comm.unregister_buffer(buffer);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  stream_rows_to_stdout();
  Flags flags(
      "bench_allreduce",
      "All-reduce (sum) time, algorithm and bus bandwidth per message size; run under mpirun, one rank\n"
      "per GPU. 1 MB = 2^20 bytes; bandwidths in GB/s (1e9 bytes/s); time = slowest rank's mean.");
  flags.add("sizes-mb", "1,10,100,1000", "comma-separated message sizes in MB");
  flags.add("dtype", "f32", "bf16 needs CUDA", {"f32", "bf16"});
  declare_device_flag(flags, true);
  flags.add(
      "all-reduce", "library",
      "comma-separated transports: library (NCCL on GPUs, MPI on CPU) | copy-engine (CUDA, 2 to 8 ranks, "
      "all on one host: peer DMA copies and one add kernel)");
  flags.add("warmup-iters", "5", "untimed all-reduces per size, before the timed ones");
  flags.alias("warmup", "warmup-iters");
  flags.add("steps", "20", "timed all-reduces per size");
  flags.alias("iters", "steps");
  flags.add("json", "", "also write one JSON object per size to this file (rank 0)");
  std::unique_ptr<dist::DistRuntime> runtime;
  // Until every rank has checked the flags, an error is every rank's (the same flags): it ends the job with
  // one line from rank 0 instead of an abort per rank.
  bool checked = false;
  try {
    if (!flags.parse(argc, argv)) return 0;
    runtime = std::make_unique<dist::DistRuntime>(&argc, &argv);
    check_ranks_have_same_flags(flags, *runtime);
    TT_CHECK(runtime->world_size() >= 2,
             "bench_allreduce times an all-reduce between ranks: start it with 2 or more under mpirun "
             "(mpirun -np 2 bench_allreduce ...)");
    const Device device = pick_device(flags.str("device"), runtime->gpu_index());
    const std::string dtype_text = flags.str("dtype");
    TT_CHECK(dtype_text == "f32" || dtype_text == "bf16", "--dtype must be f32 or bf16");
    const DType dtype = dtype_text == "f32" ? DType::f32 : DType::bf16;
    TT_CHECK(
        dtype == DType::f32 || device.is_cuda(),
        "--dtype bf16 is measured on CUDA only (the MPI backend adds bf16 element by element on the host)");
    for (double mb : flags.number_list("sizes-mb")) {
      TT_CHECK(std::isfinite(mb) && mb > 0,
               "--sizes-mb takes positive sizes, got '" + flags.str("sizes-mb") + "'");
      TT_CHECK(static_cast<int64_t>(mb * kBytesPerMb) >= static_cast<int64_t>(dtype_size(dtype)),
               "--sizes-mb: " + format_mb(mb) + " MB holds no " + dtype_text + " element");
    }
    const int64_t warmup = flags.integer("warmup-iters"), iters = flags.integer("steps");
    TT_CHECK(warmup >= 0 && iters > 0, "--warmup-iters must be >= 0 and --steps positive");
    const std::vector<dist::AllReduceTransport> transports = all_reduce_transports(flags, device, *runtime);
    const bool root = runtime->is_root();
    std::unique_ptr<JsonlWriter> json;
    if (root && !flags.str("json").empty()) json = std::make_unique<JsonlWriter>(flags.str("json"), false);
    dist::raise_if_any_rank_failed(*runtime, "");
    checked = true;
    std::unique_ptr<dist::Communicator> comm = dist::make_communicator(device, *runtime);
    if (root) {
      std::printf("%d ranks, backend %s, device %s, %s, warm-up %lld, timed %lld\n\n", comm->world_size(),
                  comm->backend(), device.is_cpu() ? "cpu" : "cuda (local rank)", dtype_text.c_str(),
                  static_cast<long long>(warmup), static_cast<long long>(iters));
    }
    StreamedTable table(
        {"size MB", "dtype", "transport", "ranks", "time ms", "algbw GB/s", "busbw GB/s", "correct"}, root);
    for (dist::AllReduceTransport transport : transports) {
      for (double mb : flags.number_list("sizes-mb")) {
        const Measurement m = measure(*comm, mb, dtype, warmup, iters, transport);
        const std::string how = transport == dist::AllReduceTransport::library
                                    ? std::string(comm->backend())
                                    : std::string(dist::all_reduce_transport_name(transport));
        table.row({format_mb(mb), dtype_text, how, std::to_string(comm->world_size()), format_fixed(m.ms, 3),
                   format_fixed(m.algorithm_gbps, 2), format_fixed(m.bus_gbps, 2), m.correct ? "yes" : "NO"});
        if (json) {
          json->write({{"size_mb", JsonlWriter::number(mb)},
                       {"bytes", JsonlWriter::number(m.bytes)},
                       {"dtype", JsonlWriter::quote(dtype_text)},
                       {"backend", JsonlWriter::quote(comm->backend())},
                       {"all_reduce", JsonlWriter::quote(how)},
                       {"ranks", std::to_string(comm->world_size())},
                       {"time_ms", JsonlWriter::number(m.ms)},
                       {"algbw_gbps", JsonlWriter::number(m.algorithm_gbps)},
                       {"busbw_gbps", JsonlWriter::number(m.bus_gbps)},
                       {"correct", m.correct ? "true" : "false"}});
        }
      }
    }
    comm.reset();
    return 0;
  } catch (const std::exception& e) {
    return end_job_with_error(e, runtime.get(), checked);
  }
}
