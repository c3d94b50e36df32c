// bench_ddp: one training step under each data-parallel strategy (DDP strategies and ZeRO stages), run
// under mpirun with a fixed per-rank batch (weak scaling). Every row runs the step `train` runs
// (apps/lib/train_step.h: forward, backward, gradient averaging, clipping, AdamW) on a fresh model. The
// 'single' row skips all communication, so scaling efficiency = single step / distributed step; "comm wait"
// is the communication that backward did not hide (host time on CPU, compute-stream stall on CUDA; DDP
// strategies only). An OOM is a row.
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
#include "apps/lib/train_step.h"
#include "base/error.h"
#include "core/allocator.h"
#include "core/cuda_context.h"
#include "core/rng.h"
#include "dist/agreement.h"
#include "dist/data_parallel.h"
#include "dist/mpi_check.h"
#include "dist/runtime.h"

using namespace tt;
using namespace tt::app;

namespace {

struct Config {
  std::string label;  // "single", the strategy name, "zero1", "zero1+bucketed", "zero2" or "zero3"
  std::optional<dist::DdpStrategy> strategy;
  double bucket_mb = 0;
  // ZeRO stage (0: none). Stage 1 with a strategy set: gradients averaged by that strategy's all-reduce
  // (overlapped with backward for bucketed) instead of a reduce-scatter after backward.
  int zero = 0;
  int sm_margin = 0;  // SMs kept free of GEMMs for the communication kernels (cuBLASLt SM count target)
  double zero_chunk_mb = 0;         // MB of parameters per pipelined update + all-gather chunk of ZeRO-1
  bool bf16_communication = false;  // gradients all-reduced in bf16 (DDP strategies)
  dist::AllReduceTransport transport = dist::AllReduceTransport::library;
};

// Bytes per rank, measured from the tensors and the allocator.
struct Memory {
  StateBytes state;
  int64_t between_steps = 0, peak = 0;
};

struct Result {
  bool oom = false;
  bool wait_measured = false;  // only DDP strategies measure what backward did not hide
  bool graph = false;          // steps after the first replayed train's CUDA graph
  Summary step_ms, wait_ms;
  Memory memory;
};

struct RowSetup {
  nn::ModelConfig model;
  Device device;
  bool grads_bf16 = false;
  int64_t batch = 1, warmup = 0, steps = 1;
  double clip = 1.0;
  GraphUse cuda_graph = GraphUse::automatic;
};

// A fresh model per row: ZeRO-2 and 3 move the parameters and gradients out of the flat buffers into shards.
Result measure(const RowSetup& setup, dist::DistRuntime& runtime, const Config& config) {
  Result result;
  const Device device = setup.device;
  set_matmul_sm_margin(config.sm_margin);
  try {
    nn::TransformerLM model(setup.model);
    nn::FlatParameters params(model, device, 1, DType::f32, runtime.world_size());
    if (setup.grads_bf16) params.set_grad_dtype(DType::bf16);
    // Each rank its own tokens, as in training.
    CounterRng rng{77, static_cast<uint64_t>(runtime.rank()) << 40};
    Batch batch;
    const auto vocab = static_cast<uint64_t>(setup.model.vocab_size);
    for (int64_t i = 0; i < setup.batch * setup.model.context_length; ++i) {
      batch.inputs.push_back(static_cast<int32_t>(rng.next_below(vocab)));
      batch.targets.push_back(static_cast<int32_t>(rng.next_below(vocab)));
    }
    TrainStepOptions options;
    options.batch = setup.batch;
    options.ctx = setup.model.context_length;
    options.clip = setup.clip;
    options.zero = config.zero;
    options.zero_grads_by_ddp = config.zero == 1 && config.strategy.has_value();
    options.ddp = config.strategy.value_or(dist::DdpStrategy::bucketed);
    options.bucket_mb = config.bucket_mb > 0 ? config.bucket_mb : 25;
    options.grad_comm_bf16 = config.bf16_communication;
    options.all_reduce = dist::all_reduce_transport_name(config.transport);
    options.zero1_gather_chunk_mb = config.zero_chunk_mb;
    // As train runs it (where the step can be captured: not with the copy-engine all-reduce).
    options.cuda_graph = setup.cuda_graph;
    TrainStep step(model, params, device, config.label == "single" ? nullptr : &runtime, options);
    std::vector<double> waits;
    int64_t count = 0;
    const std::vector<Phase> phases = {
        {"step", [&] { step.run([&](int64_t) { return batch; }, 1e-4, false, ++count); }}};
    reset_peak_memory(device);
    const StepTimings t = time_phases(
        setup.warmup, setup.steps, phases,
        // Everything queued so far has run; what the step leaves to the next forward (ZeRO-2's parameter
        // gathers) is timed in the next step, as in training.
        [&] { synchronize(device); }, [&](size_t) { waits.push_back(step.communication_wait_ms()); });
    step.settle();
    synchronize(device);
    result.memory.state = step.state_bytes();
    result.memory.between_steps = memory_stats(device).current_bytes;
    result.memory.peak = memory_stats(device).peak_bytes;
    result.step_ms = summarize(t.step_ms);
    result.wait_ms = summarize(waits);
    result.wait_measured = step.measures_communication_wait();
    result.graph = step.cuda_graph();
  } catch (const OutOfMemory&) {
    result.oom = true;
  }
  empty_cache(device);
  // A row is OOM when any rank ran out (they should agree; the table must).
  result.oom = dist::max_over_ranks(result.oom ? 1.0 : 0.0) > 0;
  if (!result.oom) result.step_ms.mean = dist::max_over_ranks(result.step_ms.mean);
  return result;
}

// Bytes per rank of parameters, gradients and optimizer state in the ZeRO paper's accounting (mixed
// precision with Adam: 2 bytes of fp16 parameters and 2 of gradients per parameter, K = 12 of optimizer
// state: fp32 master weights and two moments), for `psi` parameters on `world` ranks at `stage`.
double zero_paper_bytes(double psi, int world, int stage) {
  const double n = world;
  switch (stage) {
    case 0:
      return 16 * psi;
    case 1:
      return 4 * psi + 12 * psi / n;
    case 2:
      return 2 * psi + 14 * psi / n;
    default:
      return 16 * psi / n;
  }
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
      "Training step time per data-parallel strategy under mpirun (one rank per GPU), weak scaling: the\n"
      "per-rank batch is fixed. Rows: 'single' (no communication, the baseline), each DDP strategy\n"
      "(bucketed once per --bucket-mb) and the ZeRO stages asked for. Each row runs train's step\n"
      "(forward, backward, averaging, clipping, AdamW) on a fresh model; times are the slowest rank's mean.");
  flags.add("preset", "xl", "comma-separated presets (tiny, small, medium, large, xl, 2.7b, 7b)");
  flags.add("strategy", "naive,flat,overlap,bucketed", "comma-separated DDP strategies");
  flags.add("bucket-mb", "1,10,100,1000", "comma-separated bucket caps for 'bucketed', in MB (2^20 bytes)");
  flags.add("precision", "bf16", "dtype of matmul and attention inputs", {"f32", "bf16"});
  flags.add("attention", "auto", "auto: flash on CUDA", {"naive", "flash", "auto"});
  flags.add("ctx", "512", "context length");
  flags.add("batch", "4", "sequences per rank");
  flags.add("vocab", "10000", "vocabulary size");
  flags.add(
      "warmup-iters", "3",
      "untimed steps per row, before the timed ones (at least 2 on CUDA unless --cuda-graph off: the second "
      "captures the graph)");
  flags.alias("warmup", "warmup-iters");
  flags.add("steps", "10", "timed steps per row");
  declare_device_flag(flags, true);
  flags.add_switch("single-gpu-baseline",
                   "also time the 'single' row: every rank alone, no communication (the scaling baseline)",
                   true);
  flags.add("zero", "0",
            "comma-separated ZeRO stages to add rows for (0: none): 1 (sharded AdamW state: gradients "
            "reduce-scattered after backward, 'zero1', and, with bucketed among the strategies, averaged by "
            "the bucketed all-reduce during backward, 'zero1+bucketed'), 2 (gradients sharded too), 3 "
            "(parameters too)");
  flags.add("clip", "1.0", "global gradient-norm clip, as train's --clip (0: off)");
  flags.add(
      "cuda-graph", "auto",
      "as train's --cuda-graph: each row's step replayed as a CUDA graph after the first where it can be "
      "captured (the 'graph' column says where)",
      {"auto", "on", "off"});
  flags.add("gemm-sm-margin", "0",
            "comma-separated SM counts to keep free of matmuls in the communicating rows (cuBLASLt plans "
            "for fewer SMs), so NCCL's kernels overlap backward without waiting for SMs; 0: all SMs");
  flags.add(
      "grad-dtype", "auto",
      "dtype of every row's gradient buffer, as train's: auto (bf16 with --precision bf16, unless "
      "--grad-comm-dtype has bf16) | f32 | bf16 (with --precision bf16: weight gradients rounded to bf16 "
      "once, as PyTorch's autocast rounds them, and all-reduced (or reduce-scattered) in bf16)");
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
  // Until every rank has checked the flags, an error is every rank's (the same flags): it ends the job with
  // one line from rank 0 instead of an abort per rank.
  bool checked = false;
  try {
    if (!flags.parse(argc, argv)) return 0;
    runtime = std::make_unique<dist::DistRuntime>(&argc, &argv);
    check_ranks_have_same_flags(flags, *runtime);
    const Device device = pick_device(flags.str("device"), runtime->gpu_index());
    nn::parse_precision(flags.str("precision"));
    resolve_attention(flags.str("attention"), device);
    const int64_t batch = flags.integer("batch"), ctx = flags.integer("ctx"), steps = flags.integer("steps");
    int64_t warmup = flags.integer("warmup-iters");
    TT_CHECK(batch > 0, "--batch must be positive, got " + flags.str("batch"));
    TT_CHECK(ctx > 0, "--ctx must be positive, got " + flags.str("ctx"));
    TT_CHECK(steps > 0, "--steps must be positive, got " + flags.str("steps"));
    TT_CHECK(warmup >= 0, "--warmup-iters must be >= 0, got " + flags.str("warmup-iters"));
    check_micro_batch_tokens(batch, ctx);
    const GraphUse cuda_graph = parse_graph_use(flags.str("cuda-graph"));
    TT_CHECK(device.is_cuda() || cuda_graph != GraphUse::on,
             "--cuda-graph on needs a CUDA device (CUDA graphs); use auto or off on the CPU");
    if (cuda_graph != GraphUse::off && device.is_cuda()) warmup = std::max<int64_t>(warmup, 2);
    TT_CHECK(flags.integer("vocab") > 0, "--vocab must be positive");
    const bool single = flags.boolean("single-gpu-baseline");
    std::vector<int64_t> zero_stages = flags.int_list("zero");
    for (int64_t z : zero_stages) TT_CHECK(z >= 0 && z <= 3, "--zero takes stages 0 to 3");
    const auto wants_stage = [&](int64_t z) {
      return std::find(zero_stages.begin(), zero_stages.end(), z) != zero_stages.end();
    };
    TT_CHECK(std::isfinite(flags.number("clip")) && flags.number("clip") >= 0, "--clip must be >= 0");
    // Every preset and bucket size is checked before the first row runs.
    for (const std::string& preset : flags.list("preset")) nn::preset(preset);
    for (double mb : flags.number_list("bucket-mb"))
      TT_CHECK(std::isfinite(mb) && mb > 0,
               "--bucket-mb takes positive sizes, got '" + flags.str("bucket-mb") + "'");
    std::vector<Config> configs;
    if (single) configs.push_back({"single", std::nullopt, 0});
    for (const std::string& name : flags.list("strategy")) {
      const dist::DdpStrategy strategy = dist::parse_ddp_strategy(name);
      if (strategy != dist::DdpStrategy::bucketed) {
        configs.push_back({name, strategy, 25});
        continue;
      }
      for (double mb : flags.number_list("bucket-mb")) configs.push_back({name, strategy, mb});
    }
    if (wants_stage(1)) {
      configs.push_back({"zero1", std::nullopt, 0, 1});
      // ZeRO-1 fed by the bucketed all-reduce, for each bucket size asked for.
      const std::vector<std::string> names = flags.list("strategy");
      if (std::find(names.begin(), names.end(), "bucketed") != names.end()) {
        for (double mb : flags.number_list("bucket-mb"))
          configs.push_back({"zero1+bucketed", dist::DdpStrategy::bucketed, mb, 1});
      }
    }
    if (wants_stage(2)) configs.push_back({"zero2", std::nullopt, 0, 2});
    if (wants_stage(3)) configs.push_back({"zero3", std::nullopt, 0, 3});
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
      if (c.bf16_communication) c.label += " (sent in bf16)";
    });
    // Checked before any row runs, not at the first copy-engine row.
    const std::vector<dist::AllReduceTransport> transports = all_reduce_transports(flags, device, *runtime);
    configs = expand_rows(configs, transports, runs_ddp, [](Config& c, dist::AllReduceTransport t) {
      c.transport = t;
      if (t != dist::AllReduceTransport::library) c.label += " (copy engine)";
    });
    const double chunk_mb = flags.number("zero-chunk-mb");
    TT_CHECK(chunk_mb > 0, "--zero-chunk-mb must be positive");
    for (Config& c : configs) c.zero_chunk_mb = chunk_mb;
    const bool root = runtime->is_root();
    const int world = runtime->world_size();
    std::unique_ptr<JsonlWriter> json;
    if (root && !flags.str("json").empty()) json = std::make_unique<JsonlWriter>(flags.str("json"), false);
    // The header once every rank has checked every flag: an error is then the only line.
    dist::raise_if_any_rank_failed(*runtime, "");
    checked = true;
    if (root) {
      std::printf(
          "%d rank%s (%s on %s), batch %lld x ctx %lld per rank, %s, %s gradients, clip %g, warm-up %lld, "
          "timed %lld, --cuda-graph %s%s\n\n",
          world, world == 1 ? "" : "s", device.is_cuda() ? "NCCL" : "MPI", device.is_cuda() ? "GPUs" : "CPUs",
          static_cast<long long>(batch), static_cast<long long>(ctx), flags.str("precision").c_str(),
          grad_dtype.c_str(), flags.number("clip"), static_cast<long long>(warmup),
          static_cast<long long>(steps), flags.str("cuda-graph").c_str(),
          device.is_cuda() ? "" : " (no CUDA graphs on CPUs)");
      if (world == 1)
        std::fprintf(stderr,
                     "note: one rank, so no scaling to measure; start it as mpirun -np N bench_ddp ...\n");
    }
    StreamedTable table({"preset", "strategy", "bucket MB", "ranks", "step ms", "comm wait ms", "comm share",
                         "tokens/s (all ranks)", "scaling efficiency", "graph"},
                        root);
    std::vector<std::vector<std::string>> memory_rows;
    for (const std::string& preset : flags.list("preset")) {
      RowSetup setup;
      setup.model = nn::preset(preset);
      setup.model.vocab_size = flags.integer("vocab");
      setup.model.context_length = ctx;
      apply_runtime_model_flags(flags, setup.model, device);
      setup.device = device;
      setup.grads_bf16 = grads_bf16;
      setup.batch = batch;
      setup.warmup = warmup;
      setup.cuda_graph = cuda_graph;
      setup.steps = steps;
      setup.clip = flags.number("clip");
      double single_ms = 0;
      for (const Config& c : configs) {
        const double row_start = now_seconds();
        const Result r = measure(setup, *runtime, c);
        const double row_seconds = now_seconds() - row_start;
        const bool bucketed = c.strategy == dist::DdpStrategy::bucketed;
        const std::string shown =
            c.sm_margin > 0 ? c.label + " (" + std::to_string(c.sm_margin) + " SMs free)" : c.label;
        if (!r.oom) {
          // Four decimals under 0.1 GiB, so that a small model's rows do not all read 0.00.
          auto gib = [](double bytes) {
            const double value = bytes / (1 << 30);
            return format_fixed(value, std::abs(value) < 0.1 ? 4 : 2);
          };
          const StateBytes& b = r.memory.state;
          const double psi = static_cast<double>(setup.model.parameter_count());
          memory_rows.push_back({preset, bucketed ? shown + " (" + format_mb(c.bucket_mb) + " MB)" : shown,
                                 gib(static_cast<double>(b.parameters)),
                                 gib(static_cast<double>(b.gradients)), gib(static_cast<double>(b.optimizer)),
                                 gib(static_cast<double>(b.parameters + b.gradients + b.optimizer)),
                                 gib(zero_paper_bytes(psi, c.label == "single" ? 1 : world, c.zero)),
                                 gib(static_cast<double>(r.memory.between_steps)),
                                 gib(static_cast<double>(r.memory.peak)),
                                 gib(static_cast<double>(r.memory.peak - r.memory.between_steps))});
        }
        if (!r.oom && c.label == "single") single_ms = r.step_ms.mean;
        const double share = r.step_ms.mean > 0 ? r.wait_ms.mean / r.step_ms.mean : 0;
        // Weak scaling needs ranks to scale over: one rank's rows differ from 'single' by noise alone.
        const double efficiency = single_ms > 0 && !r.oom && world > 1 ? single_ms / r.step_ms.mean : 0;
        const double tokens_per_s =
            r.oom ? 0 : static_cast<double>(world * batch * ctx) / (r.step_ms.mean * 1e-3);
        std::vector<std::string> cells = {preset, shown, bucketed ? format_mb(c.bucket_mb) : "-",
                                          std::to_string(world)};
        if (r.oom) {
          cells.insert(cells.end(), {"OOM", "-", "-", "-", "-", "-"});
        } else {
          cells.insert(
              cells.end(),
              {format_mean_std(r.step_ms, 2), r.wait_measured ? format_fixed(r.wait_ms.mean, 2) : "-",
               r.wait_measured ? format_fixed(share * 100, 1) + "%" : "-", format_fixed(tokens_per_s, 0),
               efficiency > 0 ? format_fixed(efficiency * 100, 1) + "%" : "-", r.graph ? "on" : "off"});
        }
        table.row(cells);
        if (json) {
          json->write(
              {{"preset", JsonlWriter::quote(preset)},
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
               {"cuda_graph", r.graph ? "true" : "false"},
               {"step_ms", r.oom ? "null" : JsonlWriter::number(r.step_ms.mean)},
               {"step_std_ms", r.oom ? "null" : JsonlWriter::number(r.step_ms.std)},
               {"comm_wait_ms", r.oom || !r.wait_measured ? "null" : JsonlWriter::number(r.wait_ms.mean)},
               {"comm_share", r.oom || !r.wait_measured ? "null" : JsonlWriter::number(share)},
               {"tokens_per_s", r.oom ? "null" : JsonlWriter::number(tokens_per_s)},
               {"scaling_efficiency", efficiency > 0 ? JsonlWriter::number(efficiency) : "null"},
               {"zero_stage", std::to_string(c.zero)},
               {"param_bytes", std::to_string(r.memory.state.parameters)},
               {"grad_bytes", std::to_string(r.memory.state.gradients)},
               {"optimizer_state_bytes", std::to_string(r.memory.state.optimizer)},
               {"bytes_between_steps", std::to_string(r.memory.between_steps)},
               {"peak_bytes", std::to_string(r.memory.peak)}});
        }
        if (root)
          std::fprintf(stderr, "  measured %s %s in %.1f s\n", preset.c_str(), shown.c_str(), row_seconds);
      }
    }
    if (root) {
      std::printf(
          "\nmemory per rank (GiB, rank 0): parameters, gradients and optimizer state measured from the "
          "tensors,\nbeside the ZeRO paper's P+G+O (2 + 2 + 12 bytes per parameter, sharded by stage); then "
          "the allocator\n\n%s",
          markdown_table({"preset", "row", "params", "grads", "optimizer state", "P+G+O", "ZeRO paper P+G+O",
                          "between steps", "peak", "activations (peak - between steps)"},
                         memory_rows)
              .c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    return end_job_with_error(e, runtime.get(), checked);
  }
}
