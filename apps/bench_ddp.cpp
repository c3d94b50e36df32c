// bench_ddp: the training step (forward + backward + gradient communication + AdamW) under each DDP
// strategy, run under mpirun with a fixed per-rank batch (weak scaling). The 'single' row skips all
// communication, so scaling efficiency = single step / distributed step; "comm wait" is the communication
// that backward did not hide (host time on CPU, compute-stream stall on CUDA). An OOM is a row.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>

#include "apps/lib/bench.h"
#include "apps/lib/flags.h"
#include "apps/lib/report.h"
#include "apps/lib/run_setup.h"
#include "base/error.h"
#include "core/allocator.h"
#include "core/cuda_context.h"
#include "core/rng.h"
#include "dist/data_parallel.h"
#include "dist/mpi_check.h"
#include "dist/runtime.h"
#include "dist/shard_collectives.h"
#include "optim/optimizer.h"
#include "optim/sharded_optimizer.h"

using namespace tt;
using namespace tt::app;

namespace {

struct Config {
  std::string label;  // "single", the strategy name, or "zero1"
  std::optional<dist::DdpStrategy> strategy;
  double bucket_mb = 0;
  // ZeRO-1: sharded AdamW and an all-gather; gradients averaged by a reduce-scatter after backward, or, when
  // a strategy is set too, by that strategy's all-reduce (overlapped with backward for bucketed).
  bool zero = false;
  int sm_margin = 0;  // SMs kept free of GEMMs for the communication kernels (cuBLASLt SM count target)
  double zero_chunk_mb = 0;         // MB of parameters per pipelined update + all-gather chunk of ZeRO-1
  bool bf16_communication = false;  // gradients all-reduced in bf16 (DDP strategies)
  dist::AllReduceTransport transport = dist::AllReduceTransport::library;
};

// Bytes per rank, measured from the allocator and the tensors.
struct Memory {
  int64_t params = 0, grads = 0, optimizer_state = 0;
  int64_t after_init = 0, before_step = 0, after_step = 0, peak = 0;
};

struct Result {
  bool oom = false;
  Summary step_ms, wait_ms;
  Memory memory;
};

// One model per preset, reused by all its rows (initialising a billion-parameter model takes seconds).
struct Bundle {
  Bundle(const nn::ModelConfig& c, Device device, int rank, int world, int64_t batch)
      : model(c), params(model, device, 1, DType::f32, world) {
    // Each rank its own tokens, as in training.
    CounterRng rng{77, static_cast<uint64_t>(rank) << 40};
    std::vector<int32_t> ids(static_cast<size_t>(batch * c.context_length)), targets(ids.size());
    for (auto& v : ids) v = static_cast<int32_t>(rng.next_below(static_cast<uint64_t>(c.vocab_size)));
    for (auto& v : targets) v = static_cast<int32_t>(rng.next_below(static_cast<uint64_t>(c.vocab_size)));
    x = Tensor::from_ints(ids, {batch, c.context_length}, device);
    y = Tensor::from_ints(targets, {batch, c.context_length}, device);
  }
  nn::TransformerLM model;
  nn::FlatParameters params;
  std::unique_ptr<optim::AdamW> optimizer;  // made by the first row that needs it, dropped for ZeRO rows
  Tensor x, y;
};

Result measure(Bundle& b, dist::Communicator& comm, const Config& config, int64_t warmup, int64_t steps) {
  Result result;
  const Device device = comm.device();
  set_matmul_sm_margin(config.sm_margin);
  comm.set_all_reduce_transport(config.transport);
  try {
    std::unique_ptr<dist::DataParallel> ddp;
    std::unique_ptr<optim::ShardCollectives> collectives;
    std::unique_ptr<optim::ShardedOptimizer> sharded;
    if (config.zero) {
      b.optimizer.reset();  // the whole AdamW state must not count against the sharded one
      empty_cache(device);
      collectives = dist::shard_collectives(comm);
      sharded = std::make_unique<optim::ShardedOptimizer>(b.params, *collectives);
      if (config.zero_chunk_mb > 0) {
        const double bytes = config.zero_chunk_mb * 1024.0 * 1024.0;
        const auto element = static_cast<double>(dtype_size(b.params.flat_params().dtype()));
        sharded->set_gather_chunk(std::max<int64_t>(1, static_cast<int64_t>(bytes / element)));
      }
      result.memory.optimizer_state = sharded->state_bytes();
      if (config.strategy)
        ddp = std::make_unique<dist::DataParallel>(b.params, comm, *config.strategy, config.bucket_mb,
                                                   config.bf16_communication);
    } else {
      if (!b.optimizer)
        b.optimizer = std::make_unique<optim::AdamW>(std::vector<Tensor>{b.params.flat_params()});
      result.memory.optimizer_state =
          static_cast<int64_t>(b.optimizer->exp_avg()[0].nbytes() + b.optimizer->exp_avg_sq()[0].nbytes());
      if (config.strategy)
        ddp = std::make_unique<dist::DataParallel>(b.params, comm, *config.strategy, config.bucket_mb,
                                                   config.bf16_communication);
    }
    // bf16 rows with plain AdamW read the bf16 weight copy AdamW writes (as train does); ZeRO's sharded
    // update does not write it, so those rows cast.
    if (b.model.config().precision == nn::Precision::bf16 && !config.zero) {
      b.params.enable_bf16_mirror();
      b.optimizer->write_bf16_mirror(&b.params);
    } else {
      b.params.disable_bf16_mirror();
    }
    result.memory.params = static_cast<int64_t>(b.params.flat_params().nbytes());
    result.memory.grads = static_cast<int64_t>(b.params.flat_grads().nbytes());
    synchronize(device);
    result.memory.after_init = memory_stats(device).current_bytes;
    reset_peak_memory(device);
    std::vector<double> waits;
    const std::vector<Phase> phases = {{"step", [&] {
                                          Tensor loss = b.model.loss(b.x, b.y);
                                          if (ddp) ddp->begin_backward();
                                          loss.backward();
                                          loss = Tensor();
                                          if (ddp) ddp->finish_backward();
                                          result.memory.before_step = memory_stats(device).current_bytes;
                                          if (sharded) {
                                            sharded->step(0.0, ddp != nullptr, false);
                                          } else {
                                            b.optimizer->step();
                                          }
                                          b.params.zero_grad();
                                          result.memory.after_step = memory_stats(device).current_bytes;
                                        }}};
    const StepTimings t = time_phases(
        warmup, steps, phases, [&] { synchronize(device); },
        [&](size_t) { waits.push_back(ddp ? ddp->communication_wait_ms() : 0.0); });
    result.memory.peak = memory_stats(device).peak_bytes;
    result.step_ms = summarize(t.step_ms);
    result.wait_ms = summarize(waits);
  } catch (const OutOfMemory&) {
    result.oom = true;
  }
  empty_cache(device);
  // A row is OOM when any rank ran out (they should agree; the table must).
  result.oom = dist::max_over_ranks(result.oom ? 1.0 : 0.0) > 0;
  if (!result.oom) result.step_ms.mean = dist::max_over_ranks(result.step_ms.mean);
  return result;
}

// Each row that `applies` to, once per value (set by `set`); the other rows once, as they are.
template <class Value, class Applies, class Set>
std::vector<Config> expand_rows(const std::vector<Config>& configs, const std::vector<Value>& values,
                                Applies applies, Set set) {
  std::vector<Config> expanded;
  for (const Config& c : configs) {
    if (!applies(c)) {
      expanded.push_back(c);
      continue;
    }
    for (const Value& v : values) {
      Config with = c;
      set(with, v);
      expanded.push_back(with);
    }
  }
  return expanded;
}

}  // namespace

int main(int argc, char** argv) {
  stream_rows_to_stdout();
  Flags flags(
      "bench_ddp",
      "DDP step time per strategy under mpirun (one rank per GPU), weak scaling: the per-rank batch is\n"
      "fixed. Rows: 'single' (no communication, the baseline) and each strategy; bucketed once per\n"
      "--bucket-mb. Step = forward + backward + communication + AdamW; times are the slowest rank's mean.");
  flags.add("preset", "xl", "comma-separated presets (tiny, small, medium, large, xl, 2.7b, 7b)");
  flags.add("strategy", "naive,flat,overlap,bucketed", "comma-separated DDP strategies");
  flags.add("bucket-mb", "1,10,100,1000", "comma-separated bucket caps for 'bucketed', in MB (2^20 bytes)");
  flags.add("precision", "bf16", "dtype of matmul and attention inputs", {"f32", "bf16"});
  flags.add("attention", "auto", "auto: flash on CUDA", {"naive", "flash", "auto"});
  flags.add("ctx", "512", "context length");
  flags.add("batch", "4", "sequences per rank");
  flags.add("vocab", "10000", "vocabulary size");
  flags.add("warmup-iters", "3", "untimed steps per row, before the timed ones");
  flags.alias("warmup", "warmup-iters");
  flags.add("steps", "10", "timed steps per row");
  flags.add("device", "auto", "rank i uses GPU local rank i", {"cpu", "cuda", "auto"});
  flags.add("single-gpu-baseline", "1",
            "1: also time the 'single' row: every rank alone, no communication (the scaling baseline)");
  flags.add(
      "zero", "0",
      "1: add ZeRO-1 rows (sharded AdamW state + all-gather): gradients reduce-scattered after backward "
      "('zero1'), and, with bucketed among the strategies, averaged by the bucketed all-reduce during "
      "backward ('zero1+bucketed')");
  flags.add("gemm-sm-margin", "0",
            "comma-separated SM counts to keep free of matmuls in the communicating rows (cuBLASLt plans "
            "for fewer SMs), so NCCL's kernels overlap backward without waiting for SMs; 0: all SMs");
  flags.add(
      "grad-dtype", "f32",
      "dtype of every row's gradient buffer: f32 | bf16 (with --precision bf16: weight gradients rounded "
      "to bf16 once, as PyTorch's autocast rounds them, and all-reduced (or reduce-scattered) in bf16; not "
      "with --grad-comm-dtype bf16)");
  flags.add("grad-comm-dtype", "f32",
            "comma-separated dtypes the DDP strategies' gradients travel in: f32 | bf16 (half the bytes, "
            "gradients rounded to bf16); each communicating row once per dtype");
  flags.add(
      "all-reduce", "library",
      "comma-separated transports of the DDP all-reduce: library (NCCL) | copy-engine (2 to 8 ranks, all "
      "on one host: peer DMA copies and one add kernel, no NCCL kernels); each DDP row once per transport");
  flags.add("zero-chunk-mb", "128",
            "ZeRO-1 updates its slice and all-gathers it in chunks of this many MB of parameters per rank, "
            "each chunk's gather overlapping the next chunk's update");
  flags.add("json", "", "also write one JSON object per row to this file (rank 0)");
  std::unique_ptr<dist::DistRuntime> runtime;
  try {
    if (!flags.parse(argc, argv)) return 0;
    runtime = std::make_unique<dist::DistRuntime>(&argc, &argv);
    const Device device = pick_device(flags.str("device"), runtime->gpu_index());
    const int64_t batch = flags.integer("batch"), ctx = flags.integer("ctx"),
                  warmup = flags.integer("warmup-iters"), steps = flags.integer("steps");
    TT_CHECK(batch > 0 && ctx > 0 && steps > 0 && warmup >= 0,
             "--batch, --ctx and --steps must be positive and --warmup-iters >= 0");
    TT_CHECK(flags.integer("vocab") > 0, "--vocab must be positive");
    const int64_t single = flags.integer("single-gpu-baseline"), zero = flags.integer("zero");
    TT_CHECK(single == 0 || single == 1, "--single-gpu-baseline takes 0 or 1");
    TT_CHECK(zero == 0 || zero == 1, "--zero takes 0 or 1 (ZeRO stage 1)");
    // Every preset and bucket size is checked before the first row runs.
    for (const std::string& preset : flags.list("preset")) nn::preset(preset);
    for (double mb : flags.number_list("bucket-mb"))
      TT_CHECK(std::isfinite(mb) && mb > 0,
               "--bucket-mb takes positive sizes, got '" + flags.str("bucket-mb") + "'");
    std::vector<Config> configs;
    if (single == 1) configs.push_back({"single", std::nullopt, 0});
    for (const std::string& name : flags.list("strategy")) {
      const dist::DdpStrategy strategy = dist::parse_ddp_strategy(name);
      if (strategy != dist::DdpStrategy::bucketed) {
        configs.push_back({name, strategy, 25});
        continue;
      }
      for (double mb : flags.number_list("bucket-mb")) configs.push_back({name, strategy, mb});
    }
    if (zero == 1) {
      configs.push_back({"zero1", std::nullopt, 0, true});
      // ZeRO-1 fed by the bucketed all-reduce, for each bucket size asked for.
      const std::vector<std::string> names = flags.list("strategy");
      if (std::find(names.begin(), names.end(), "bucketed") != names.end()) {
        for (double mb : flags.number_list("bucket-mb"))
          configs.push_back({"zero1+bucketed", dist::DdpStrategy::bucketed, mb, true});
      }
    }
    // Every communicating row again for each SM margin asked for (the single-GPU baseline uses the whole
    // GPU).
    const std::vector<double> margins = flags.number_list("gemm-sm-margin");
    for (double m : margins)
      TT_CHECK(m >= 0 && m == static_cast<int>(m), "--gemm-sm-margin takes whole numbers >= 0");
    configs = expand_rows(
        configs, margins, [](const Config& c) { return c.label != "single"; },
        [](Config& c, double m) { c.sm_margin = static_cast<int>(m); });
    // Every row that runs a DDP strategy once per gradient dtype asked for ('single' and 'zero1' have no
    // DDP all-reduce and stay as they are), and once per all-reduce transport.
    const std::vector<std::string> dtypes = flags.list("grad-comm-dtype");
    for (const std::string& dtype : dtypes) {
      TT_CHECK(dtype == "f32" || dtype == "bf16",
               "--grad-comm-dtype takes f32 and/or bf16, got '" + dtype + "'");
    }
    const bool grads_bf16 =
        grads_bf16_from_flags(flags, flags.str("precision") == "bf16",
                              std::find(dtypes.begin(), dtypes.end(), "bf16") != dtypes.end());
    const std::string grad_dtype = grads_bf16 ? "bf16" : "f32";
    const auto runs_ddp = [](const Config& c) { return c.strategy.has_value(); };
    configs = expand_rows(configs, dtypes, runs_ddp, [](Config& c, const std::string& dtype) {
      c.bf16_communication = dtype == "bf16";
      if (c.bf16_communication) c.label += " (bf16 grads)";
    });
    std::vector<dist::AllReduceTransport> transports;
    for (const std::string& name : flags.list("all-reduce"))
      transports.push_back(dist::parse_all_reduce_transport(name));
    TT_CHECK(!transports.empty(), "--all-reduce needs library and/or copy-engine");
    const bool copy_engine = std::find(transports.begin(), transports.end(),
                                       dist::AllReduceTransport::copy_engine) != transports.end();
    // Checked before any row runs, not at the first copy-engine row.
    TT_CHECK(!copy_engine ||
                 (device.is_cuda() && dist::copy_engine_layout(runtime->world_size(), runtime->local_size())),
             "--all-reduce copy-engine needs CUDA and 2 to " + std::to_string(dist::kCopyEngineMaxRanks) +
                 " ranks, all on one host; this job has " + std::to_string(runtime->world_size()) +
                 " ranks, " + std::to_string(runtime->local_size()) + " on this host, device " +
                 device.str());
    configs = expand_rows(configs, transports, runs_ddp, [](Config& c, dist::AllReduceTransport t) {
      c.transport = t;
      if (t != dist::AllReduceTransport::library) c.label += " (copy engine)";
    });
    const double chunk_mb = flags.number("zero-chunk-mb");
    TT_CHECK(chunk_mb > 0, "--zero-chunk-mb must be positive");
    for (Config& c : configs) c.zero_chunk_mb = chunk_mb;
    std::unique_ptr<dist::Communicator> comm = dist::make_communicator(device, *runtime);
    const bool root = runtime->is_root();
    const int world = runtime->world_size();
    std::unique_ptr<JsonlWriter> json;
    if (root && !flags.str("json").empty()) json = std::make_unique<JsonlWriter>(flags.str("json"), false);
    if (root) {
      std::printf(
          "%d ranks (%s), batch %lld x ctx %lld per rank, %s, %s gradients, warm-up %lld, timed %lld\n\n",
          world, comm->backend(), static_cast<long long>(batch), static_cast<long long>(ctx),
          flags.str("precision").c_str(), grad_dtype.c_str(), static_cast<long long>(warmup),
          static_cast<long long>(steps));
    }
    std::vector<std::vector<std::string>> rows, memory_rows;
    for (const std::string& preset : flags.list("preset")) {
      nn::ModelConfig config = nn::preset(preset);
      config.vocab_size = flags.integer("vocab");
      config.context_length = ctx;
      apply_runtime_model_flags(flags, config, device);
      std::unique_ptr<Bundle> bundle;
      bool oom = false;
      const double build_start = now_seconds();
      try {
        bundle = std::make_unique<Bundle>(config, device, runtime->rank(), runtime->world_size(), batch);
        if (grads_bf16) bundle->params.set_grad_dtype(DType::bf16);
      } catch (const OutOfMemory&) {
        oom = true;
      }
      if (root) {
        std::fprintf(stderr, "  built %s (%s) in %.1f s\n", preset.c_str(),
                     oom ? "out of memory" : (std::to_string(bundle->params.numel()) + " parameters").c_str(),
                     now_seconds() - build_start);
      }
      oom = dist::max_over_ranks(oom ? 1.0 : 0.0) > 0;
      double single_ms = 0;
      for (const Config& c : configs) {
        const double row_start = now_seconds();
        const Result r = oom ? Result{true, {}, {}, {}} : measure(*bundle, *comm, c, warmup, steps);
        const double row_seconds = now_seconds() - row_start;
        if (!r.oom) {
          auto gib = [](int64_t bytes) { return format_fixed(static_cast<double>(bytes) / (1 << 30), 2); };
          const double psi = static_cast<double>(bundle->params.numel());
          // ZeRO paper's accounting for this setup: f32 parameters (4 bytes) and gradients (4, or 2 in bf16)
          // on every rank, Adam's two f32 moments (8) divided by the world size with stage 1.
          const double formula = 4 * psi + (grads_bf16 ? 2 : 4) * psi + 8 * psi / (c.zero ? world : 1);
          memory_rows.push_back(
              {preset, c.label, gib(r.memory.params), gib(r.memory.grads), gib(r.memory.optimizer_state),
               format_fixed(formula / (1 << 30), 2), gib(r.memory.after_init), gib(r.memory.before_step),
               gib(r.memory.after_step), gib(r.memory.peak), gib(r.memory.peak - r.memory.after_init)});
        }
        if (!r.oom && c.label == "single") single_ms = r.step_ms.mean;
        const bool bucketed = c.strategy == dist::DdpStrategy::bucketed;
        const double share = r.step_ms.mean > 0 ? r.wait_ms.mean / r.step_ms.mean : 0;
        const double efficiency = single_ms > 0 && !r.oom ? single_ms / r.step_ms.mean : 0;
        const double tokens_per_s =
            r.oom ? 0 : static_cast<double>(world * batch * ctx) / (r.step_ms.mean * 1e-3);
        const std::string shown =
            c.sm_margin > 0 ? c.label + " (" + std::to_string(c.sm_margin) + " SMs free)" : c.label;
        std::vector<std::string> cells = {preset, shown,
                                          bucketed ? format_fixed(c.bucket_mb, c.bucket_mb < 1 ? 3 : 0) : "-",
                                          std::to_string(world)};
        if (r.oom) {
          cells.insert(cells.end(), {"OOM", "-", "-", "-", "-"});
        } else {
          cells.insert(cells.end(), {format_fixed(r.step_ms.mean, 2) + " ± " + format_fixed(r.step_ms.std, 2),
                                     format_fixed(r.wait_ms.mean, 2), format_fixed(share * 100, 1) + "%",
                                     format_fixed(tokens_per_s, 0),
                                     efficiency > 0 ? format_fixed(efficiency * 100, 1) + "%" : "-"});
        }
        rows.push_back(cells);
        if (json) {
          json->write({{"preset", JsonlWriter::quote(preset)},
                       {"strategy", JsonlWriter::quote(c.label)},
                       {"bucket_mb", bucketed ? JsonlWriter::number(c.bucket_mb) : "null"},
                       {"gemm_sm_margin", std::to_string(c.sm_margin)},
                       {"all_reduce", JsonlWriter::quote(dist::all_reduce_transport_name(c.transport))},
                       {"ranks", std::to_string(world)},
                       {"batch_per_rank", std::to_string(batch)},
                       {"ctx", std::to_string(ctx)},
                       {"precision", JsonlWriter::quote(flags.str("precision"))},
                       {"grad_dtype", JsonlWriter::quote(grad_dtype)},
                       {"oom", r.oom ? "true" : "false"},
                       {"step_ms", r.oom ? "null" : JsonlWriter::number(r.step_ms.mean)},
                       {"step_std_ms", r.oom ? "null" : JsonlWriter::number(r.step_ms.std)},
                       {"comm_wait_ms", r.oom ? "null" : JsonlWriter::number(r.wait_ms.mean)},
                       {"comm_share", r.oom ? "null" : JsonlWriter::number(share)},
                       {"tokens_per_s", r.oom ? "null" : JsonlWriter::number(tokens_per_s)},
                       {"scaling_efficiency", efficiency > 0 ? JsonlWriter::number(efficiency) : "null"},
                       {"param_bytes", std::to_string(r.memory.params)},
                       {"grad_bytes", std::to_string(r.memory.grads)},
                       {"optimizer_state_bytes", std::to_string(r.memory.optimizer_state)},
                       {"bytes_after_init", std::to_string(r.memory.after_init)},
                       {"bytes_before_step", std::to_string(r.memory.before_step)},
                       {"bytes_after_step", std::to_string(r.memory.after_step)},
                       {"peak_bytes", std::to_string(r.memory.peak)}});
        }
        if (root)
          std::fprintf(stderr, "  measured %s %s in %.1f s\n", preset.c_str(), shown.c_str(), row_seconds);
      }
    }
    if (root) {
      std::printf("%s", markdown_table({"preset", "strategy", "bucket MB", "ranks", "step ms", "comm wait ms",
                                        "comm share", "tokens/s (all ranks)", "scaling efficiency"},
                                       rows)
                            .c_str());
      std::printf("\nmemory per rank (GiB; rank 0's allocator): measured, and the ZeRO paper's formula\n\n%s",
                  markdown_table(
                      {"preset", "row", "params", "grads", "optimizer state", "formula (P+G+O)", "after init",
                       "before step", "after step", "peak", "activations (peak - after init)"},
                      memory_rows)
                      .c_str());
    }
    comm.reset();
    return 0;
  } catch (const std::exception& e) {
    if (runtime && runtime->world_size() > 1) dist::abort_job(e.what());
    std::fprintf(stderr, "%s\n", tt::error_line(e).c_str());
    return 1;
  }
}
