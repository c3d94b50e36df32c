// benchmark: times the model's forward, backward and optimizer step for several sizes and context lengths
// (the measurements of the CS336 systems assignment), with peak memory, tokens/s and MFU. An OOM is a row.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <tuple>

#include "apps/lib/bench.h"
#include "apps/lib/flags.h"
#include "apps/lib/memory_timeline.h"
#include "apps/lib/report.h"
#include "apps/lib/run_setup.h"
#include "apps/lib/train_step.h"
#include "base/error.h"
#include "core/allocator.h"
#include "core/autograd.h"
#include "core/cuda_context.h"
#include "core/cuda_graph.h"
#include "core/ops.h"
#include "core/profile.h"
#include "core/rng.h"
#include "optim/optimizer.h"
#include "optim/update_in_backward.h"

using namespace tt;
using namespace tt::app;

namespace {

// One model per size, reused by all its rows (initialising a billion-parameter model takes seconds).
struct Bundle {
  explicit Bundle(const nn::ModelConfig& c, Device device) : config(c), model(c), params(model, device, 1) {}
  nn::ModelConfig config;
  nn::TransformerLM model;
  nn::FlatParameters params;
  // Made by the first row that steps: forward-only rows do not count AdamW's state in their memory.
  std::unique_ptr<optim::AdamW> optimizer;
};

struct Row {
  std::vector<std::string> cells;
  std::string json;
};

nn::ModelConfig bench_config(const Flags& flags, Device device, const std::string& size, int64_t max_ctx,
                             const std::string& precision, const std::string& attention) {
  nn::ModelConfig config = nn::preset(size);
  config.vocab_size = flags.integer("vocab");
  config.context_length = max_ctx;
  config.precision = nn::parse_precision(precision);
  config.attention = resolve_attention(attention, device);
  config.recompute = nn::parse_recompute(flags.str("recompute"));
  config.recompute_blocks = flags.integer("recompute-blocks");
  return config;
}

// The untimed runs a row gets for `warmup_asked`: train's step at least 2 (it captures its graph in the
// second); a graph row at least 1 eager run, then its capture and 1 replay; others as asked. Rows that come
// to the same count are measured once.
int64_t untimed_runs(const std::string& mode, bool graph, int64_t warmup_asked) {
  if (mode == "train") return std::max<int64_t>(warmup_asked, 2);
  if (graph) return std::max<int64_t>(warmup_asked, 1) + 1;
  return warmup_asked;
}

// `bundle` is null when the model itself did not fit (every row of the size is then an OOM row).
// mirror (bf16 only): the matmuls read a bf16 copy of the weights that AdamW writes with each update,
// instead of casting every weight in every forward.
Row measure(const Flags& flags, Device device, Bundle* bundle, const nn::ModelConfig& config,
            const std::string& size, int64_t ctx, const std::string& mode, bool graph, int64_t warmup_asked,
            bool mirror, bool grads_bf16) {
  const int64_t batch = flags.integer("batch"), steps = flags.integer("steps");
  const int64_t untimed_total = untimed_runs(mode, graph, warmup_asked);
  const int64_t warmup = mode == "train" ? untimed_total : warmup_asked;  // eager runs before the timed ones
  const bool bf16 = config.precision == nn::Precision::bf16;
  const std::string precision = std::string(nn::precision_name(config.precision)) +
                                (bf16 && !mirror ? " (cast)" : "") + (grads_bf16 ? ", bf16 grads" : ""),
                    attention = nn::attention_name(config.attention);
  Row row;
  row.cells = {size,
               std::to_string(ctx),
               precision,
               attention,
               mode,
               graph ? "on" : "off",
               std::to_string(untimed_total)};
  auto json_head = [&] {
    return "\"size\": " + JsonlWriter::quote(size) + ", \"ctx\": " + std::to_string(ctx) +
           ", \"batch\": " + std::to_string(batch) + ", \"precision\": " + JsonlWriter::quote(precision) +
           ", \"attention\": " + JsonlWriter::quote(attention) + ", \"mode\": " + JsonlWriter::quote(mode) +
           ", \"vocab\": " + std::to_string(config.vocab_size) +
           ", \"graph\": " + (row.cells[5] == "on" ? "true" : "false") +
           ", \"clip\": " + (mode == "train" ? JsonlWriter::number(flags.number("clip")) : "null") +
           ", \"warmup\": " + row.cells[6] + ", \"steps\": " + std::to_string(steps) +
           ", \"bf16_weights\": " +
           JsonlWriter::quote(!bf16    ? "-"
                              : mirror ? "mirror"
                                       : "cast") +
           ", \"grad_dtype\": " + JsonlWriter::quote(grads_bf16 ? "bf16" : "f32") +
           ", \"recompute\": " + JsonlWriter::quote(nn::recompute_name(config.recompute)) +
           ", \"recompute_blocks\": " + std::to_string(config.recompute_blocks) +
           ", \"gemm_autotune\": " + std::to_string(gemm_autotune_from_flags(flags, false)) +
           ", \"device\": " + JsonlWriter::quote(device_name(device));
  };
  try {
    if (!bundle) throw OutOfMemory("model does not fit");
    nn::TransformerLM& model = bundle->model;
    nn::FlatParameters& params = bundle->params;
    params.set_grad_dtype(grads_bf16 ? DType::bf16 : DType::f32);  // before anything takes the gradients
    // Rows share the model of a size; only a step row keeps AdamW state, so a forward or forward+backward row
    // measured after one does not count the optimizer's memory.
    const bool fused = mode == "step-fused", with_optimizer = mode == "step" || fused;
    if (!with_optimizer) bundle->optimizer.reset();
    if (with_optimizer && !bundle->optimizer) {
      bundle->optimizer = std::make_unique<optim::AdamW>(std::vector<Tensor>{params.flat_params()});
    }
    optim::AdamW* optimizer = with_optimizer ? bundle->optimizer.get() : nullptr;
    if (bf16 && mirror) {
      params.enable_bf16_mirror();  // (re)filled from the current parameters
      if (optimizer) optimizer->write_bf16_mirror(&params);
    } else {
      params.disable_bf16_mirror();
      if (optimizer) optimizer->write_bf16_mirror(nullptr);
    }
    // step-fused: each parameter's AdamW update runs as soon as backward has finished its gradient.
    std::unique_ptr<optim::UpdateInBackward> update_in_backward;
    // With --update-in-matmul, linear weights are updated inside their weight-gradient matmul instead.
    const bool in_matmul = fused && flags.boolean("update-in-matmul");
    if (fused) update_in_backward = std::make_unique<optim::UpdateInBackward>(params, *optimizer, in_matmul);
    // train: the step `train` runs (apps/lib/train_step.h), clipping included; it owns its optimizer.
    std::unique_ptr<TrainStep> train_step;
    if (mode == "train") {
      bundle->optimizer.reset();
      reset_peak_memory(device);  // the row's peak counts from here (see peak_of_all_runs below)
      TrainStepOptions options;
      options.batch = batch;
      options.ctx = ctx;
      options.clip = flags.number("clip");
      train_step = std::make_unique<TrainStep>(model, params, device, nullptr, options);
      row.cells[5] = train_step->cuda_graph() ? "on" : "off";  // train's step decides for itself
    }
    params.zero_grad();
    CounterRng rng{7, 0};
    std::vector<int32_t> ids(static_cast<size_t>(batch * ctx)), targets(ids.size());
    for (auto& v : ids) v = static_cast<int32_t>(rng.next_below(static_cast<uint64_t>(config.vocab_size)));
    for (auto& v : targets)
      v = static_cast<int32_t>(rng.next_below(static_cast<uint64_t>(config.vocab_size)));
    const Tensor x = Tensor::from_ints(ids, {batch, ctx}, device),
                 y = Tensor::from_ints(targets, {batch, ctx}, device);
    Tensor loss;
    std::vector<Phase> phases;
    int64_t train_steps = 0;
    Batch train_batch{ids, targets};
    if (mode == "train") {
      phases.push_back({"step", [&] {
                          train_step->run([&](int64_t) { return train_batch; }, 1e-4, false, ++train_steps);
                        }});
    } else if (mode == "forward") {
      phases.push_back({"forward", [&] {
                          NoGradGuard no_grad;
                          loss = model.loss(x, y);
                        }});
    } else {
      phases.push_back({"forward", [&] { loss = model.loss(x, y); }});
      phases.push_back({"backward", [&] {
                          if (fused) {
                            // A graph replay gets its step's scalars uploaded before the launch instead.
                            if (!graph) optimizer->prepare_step();
                            update_in_backward->begin();
                          }
                          loss.backward();
                          loss = Tensor();
                          if (fused) update_in_backward->finish();
                        }});
      if (mode == "step") {
        phases.push_back({"optimizer", [&] {
                            optimizer->step();
                            params.zero_grad();
                          }});
      }
    }
    const std::vector<Phase> eager_phases = phases;  // the memory timeline records these, never a replay
    std::unique_ptr<CudaGraph> cuda_graph;
    int64_t capture_peak = 0;
    if (graph) {
      // Warm up eagerly (cuBLASLt plans, allocator cache), capture one whole iteration, then time replays.
      TT_CHECK(device.is_cuda(), "--graph on needs a CUDA device");
      // The graph holds the update but not the step's scalars, which prepare_step() uploads before each
      // launch.
      auto iteration_body = [&] {
        for (const Phase& p : phases) {
          if (p.name == "optimizer") {
            optimizer->apply();
            params.zero_grad();
          } else {
            p.run();
          }
        }
      };
      for (int64_t i = 0; i < std::max<int64_t>(1, warmup); ++i) {
        if (optimizer) optimizer->prepare_step();
        iteration_body();
      }
      synchronize(device);
      // The capture allocates from a private pool; blocks the eager warm-up left in the general cache could
      // not serve it, so they go back to the driver first (otherwise a model that fits eagerly may not fit).
      empty_cache(device);
      cuda_graph = std::make_unique<CudaGraph>(device);
      // A replay allocates nothing: its footprint is what the captured iteration held at its peak (the pool
      // keeps those blocks reserved for the graph), so that peak stands for the graph phase below.
      reset_peak_memory(device);
      cuda_graph->capture(iteration_body);
      capture_peak = memory_stats(device).peak_bytes;
      const bool has_optimizer = with_optimizer;
      phases = {{"graph", [&, has_optimizer] {
                   if (has_optimizer) optimizer->prepare_step();
                   cuda_graph->replay();
                 }}};
    }
    // Peak memory of each phase: reset at its start, read at its end. Not for train's step: from its second
    // run on it replays its own CUDA graph, which allocates nothing, so its peak is that of its untimed first
    // runs (the eager step and the capture), as `train` reports it.
    std::vector<int64_t> phase_peak(phases.size(), capture_peak);
    const bool peak_of_all_runs = mode == "train";
    for (size_t p = 0; p < phases.size() && !peak_of_all_runs; ++p) {
      auto inner = phases[p].run;
      phases[p].run = [inner, device] {
        reset_peak_memory(device);
        inner();
      };
    }
    // NVTX names each phase; with --profile-steps only the measured iterations are inside the profiler range.
    for (Phase& p : phases) {
      auto inner = p.run;
      const std::string name = p.name;
      p.run = [inner, name] {
        const NvtxRange range(name.c_str());
        inner();
      };
    }
    const bool profile = flags.boolean("profile-steps");
    int64_t iteration = 0;
    // train's step captures its graph in its second run: that run stays out of the timing.
    const int64_t untimed = graph ? 1 : warmup;
    if (profile && !phases.empty()) {
      auto first = phases.front().run;
      phases.front().run = [first, &iteration, untimed] {
        if (iteration++ == untimed) profiler_start();
        first();
      };
    }
    if (!peak_of_all_runs) reset_peak_memory(device);
    const StepTimings t = time_phases(
        untimed, steps, phases, [&] { synchronize(device); },
        [&](size_t p) { phase_peak[p] = std::max(phase_peak[p], memory_stats(device).peak_bytes); });
    if (profile) profiler_stop();
    const std::string timeline = flags.str("memory-timeline");
    // One timeline per run (the first row), from an eager step: a graph replay allocates nothing (train's
    // step replays its own graph by now, so its timeline shows little).
    static bool timeline_written = false;
    if (!timeline.empty() && !timeline_written) {
      record_memory_timeline(timeline, device, eager_phases, [&] { synchronize(device); });
      timeline_written = true;
    }
    const Summary step = summarize(t.step_ms);
    const double tokens = static_cast<double>(batch * ctx);
    const double flops = config.training_flops_per_sequence(ctx) * static_cast<double>(batch) /
                         (mode == "forward" ? 3.0 : 1.0);
    const PeakFlops peak = device_peak_flops(device_name(device), config.precision == nn::Precision::bf16);
    const double mfu = peak.flops_per_s > 0 ? flops / (step.mean * 1e-3) / peak.flops_per_s : NAN;
    int64_t peak_all = 0;
    for (int64_t b : phase_peak) peak_all = std::max(peak_all, b);
    std::string json = json_head();
    auto phase_cell = [&](const std::string& name) -> std::string {
      for (size_t p = 0; p < t.phase_names.size(); ++p) {
        if (t.phase_names[p] != name) continue;
        const Summary s = summarize(t.phase_ms[p]);
        json += ", \"" + name + "_ms\": " + JsonlWriter::number(s.mean) + ", \"" + name +
                "_std_ms\": " + JsonlWriter::number(s.std) + ", \"" + name +
                "_peak_mib\": " + JsonlWriter::number(static_cast<double>(phase_peak[p]) / (1 << 20));
        return format_mean_std(s, 2);
      }
      return "-";
    };
    row.cells.push_back(phase_cell("forward"));
    row.cells.push_back(phase_cell("backward"));
    row.cells.push_back(phase_cell("optimizer"));
    row.cells.push_back(format_mean_std(step, 2));
    row.cells.push_back(format_fixed(tokens / (step.mean * 1e-3), 0));
    row.cells.push_back(std::isfinite(mfu) ? format_fixed(mfu * 100, 1) + "%" : "-");
    row.cells.push_back(format_fixed(static_cast<double>(peak_all) / (1 << 20), 0));
    json += ", \"step_ms\": " + JsonlWriter::number(step.mean) +
            ", \"step_std_ms\": " + JsonlWriter::number(step.std) +
            ", \"tokens_per_s\": " + JsonlWriter::number(tokens / (step.mean * 1e-3)) +
            ", \"mfu\": " + JsonlWriter::number(mfu) +
            ", \"peak_mib\": " + JsonlWriter::number(static_cast<double>(peak_all) / (1 << 20)) +
            ", \"oom\": false";
    if (fused) {
      // How many weights the matmul kernel took (the rest, and all of them off Hopper, used the side stream).
      const int64_t in_matmul = update_in_backward->updated_in_matmul();
      json += ", \"updated_in_matmul\": " + std::to_string(in_matmul) +
              ", \"parameters\": " + std::to_string(params.parameters().size());
      if (in_matmul) {
        std::fprintf(stderr, "  %s ctx %lld step-fused: %lld of %zu parameters updated inside their matmul\n",
                     size.c_str(), static_cast<long long>(ctx), static_cast<long long>(in_matmul),
                     params.parameters().size());
      }
    }
    row.json = "{" + json + "}";
  } catch (const OutOfMemory&) {
    for (int i = 0; i < 7; ++i) row.cells.push_back(i == 3 ? "OOM" : "-");
    row.json = "{" + json_head() + ", \"oom\": true}";
  } catch (const Error& e) {
    // A capture that fails (an op that cannot run inside a graph) is reported, not fatal for the sweep.
    if (!graph) throw;
    for (int i = 0; i < 7; ++i) row.cells.push_back(i == 3 ? "error" : "-");
    std::fprintf(stderr, "  %s ctx %lld graph capture failed: %s\n", size.c_str(),
                 static_cast<long long>(ctx), e.what());
    row.json = "{" + json_head() + ", \"oom\": false, \"error\": " + JsonlWriter::quote(e.what()) + "}";
  }
  empty_cache(device);
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  stream_rows_to_stdout();
  try {
    Flags flags("benchmark",
                "Time forward / backward / optimizer of the Transformer LM over sizes and context lengths.\n"
                "Phases are timed between device synchronisations; warm-up iterations are not timed.");
    flags.add("sizes", "small", "comma-separated presets: tiny, small, medium, large, xl, 2.7b, 7b");
    flags.alias("preset", "sizes");
    flags.add("ctx", "256", "comma-separated context lengths");
    flags.add("batch", "4", "batch size");
    flags.add("vocab", "10000", "vocabulary size");
    flags.add("precision", "f32", "comma-separated: f32 | bf16");
    flags.add("attention", "auto", "comma-separated: naive | flash | auto (flash on CUDA)");
    flags.add(
        "mode", "step",
        "comma-separated: forward | backward (forward+backward) | step (+ AdamW) | step-fused (AdamW "
        "fused into backward: each parameter updated on a side stream as soon as its gradient is final) | "
        "train (the step `train` runs, apps/lib/train_step.h: loss read back, --clip, AdamW). Where a "
        "gradient is due, the loss computes the classifier's gradients with it, chunk by chunk: the "
        "'forward ms' column of backward and step rows includes them, a forward row does not");
    flags.add("recompute", "none",
              "as train's --recompute: selective runs each block's norms and SwiGLU gate again in backward, "
              "block the whole block",
              {"none", "selective", "block"});
    flags.add("recompute-blocks", "0", "as train's --recompute-blocks");
    flags.add("clip", "1.0", "train rows: global gradient-norm clip, as train's --clip (0: off)");
    flags.add_switch(
        "update-in-matmul",
        "in step-fused rows, update each linear weight inside the matmul that computes its gradient, a "
        "group of weights per launch, so the gradient is never stored: on Hopper GPUs a fused kernel, on "
        "the CPU its reference; on other GPUs, and for weights the kernel does not take, on the side "
        "stream like the other parameters (figures: docs/course.md)",
        true);
    flags.add("gemm-sm-margin", "0",
              "SMs to keep free of matmuls (cuBLASLt plans for the rest), e.g. for step-fused's side stream");
    declare_gemm_autotune_flag(
        flags,
        /*with_deterministic=*/false);  // as train's; tuning happens in a row's first iteration (warm-up)
    flags.add(
        "warmup-iters", "5",
        "comma-separated counts of untimed iterations before the timed ones (e.g. 0,1,2,5); one row each. "
        "The 'warm-up' column shows what a row got: train rows at least 2 (the second captures its graph), "
        "graph rows at least 1 eager iteration, then the capture and 1 replay; counts that come to the same "
        "give one row");
    flags.alias("warmup", "warmup-iters");
    flags.add("steps", "10", "timed iterations per row");
    declare_device_flag(flags);
    flags.add_switch(
        "profile-steps",
        "call cudaProfilerStart/Stop around the measured steps (nsys --capture-range=cudaProfilerApi)");
    flags.add(
        "bf16-weights", "mirror",
        "comma-separated, bf16 rows: mirror (matmuls read a bf16 copy of the weights that AdamW writes "
        "with each update) | cast (every weight cast to bf16 in every forward); one row each (train rows: "
        "mirror, as train's step)");
    flags.add("grad-dtype", "auto",
              "comma-separated, bf16 rows: f32 | bf16 (the gradient buffer in bf16: weight gradients "
              "rounded to bf16 once, as PyTorch's autocast rounds them) | auto (bf16, as train's "
              "default); one row each (f32 rows: f32). backward rows never "
              "zero the gradients, so there every pass after the first adds to them (bf16: through an f32 "
              "temporary); step and step-fused rows time what training does");
    flags.add("graph", "auto",
              "capture the whole iteration in a CUDA graph; both: a row each; auto: on for CUDA",
              {"on", "off", "both", "auto"});
    flags.add("json", "", "also write one JSON object per row to this file");
    flags.add("memory-timeline", "",
              "record every allocation of one step into FILE.svg (plot), FILE.jsonl (events) and FILE.pickle "
              "(a snapshot for pytorch.org/memory_viz, Active Memory Timeline)");
    if (!flags.parse(argc, argv)) return 0;
    // Every rank would run every row on the same GPU and write the same --json file.
    require_one_process("benchmark");
    const Device device = pick_device(flags.str("device"));
    const int64_t sm_margin = flags.integer("gemm-sm-margin");
    TT_CHECK(sm_margin >= 0, "--gemm-sm-margin must be >= 0");
    set_matmul_sm_margin(static_cast<int>(sm_margin));
    apply_gemm_autotune_flag(flags, /*deterministic=*/false);
    std::unique_ptr<JsonlWriter> json;
    if (!flags.str("json").empty()) json = std::make_unique<JsonlWriter>(flags.str("json"), false);
    if (!flags.str("memory-timeline").empty()) check_memory_timeline_writable(flags.str("memory-timeline"));
    const std::string graph_flag = flags.str("graph");
    std::vector<bool> graph_modes;
    if (graph_flag == "both")
      graph_modes = {false, true};
    else if (graph_flag == "on" || (graph_flag == "auto" && device.is_cuda()))
      graph_modes = {true};
    else if (graph_flag == "off" || graph_flag == "auto")
      graph_modes = {false};
    else
      throw Error("unknown --graph '" + graph_flag + "' (expected on, off, both or auto)");
    std::vector<bool> weight_modes;
    for (const std::string& w : flags.list("bf16-weights")) {
      TT_CHECK(w == "mirror" || w == "cast", "unknown --bf16-weights '" + w + "' (expected mirror or cast)");
      weight_modes.push_back(w == "mirror");
    }
    TT_CHECK(!weight_modes.empty(), "--bf16-weights needs mirror and/or cast");
    std::vector<bool> grad_modes;
    for (const std::string& g : flags.list("grad-dtype")) {
      TT_CHECK(g == "f32" || g == "bf16" || g == "auto",
               "unknown --grad-dtype '" + g + "' (expected f32, bf16 or auto)");
      grad_modes.push_back(g != "f32");
    }
    TT_CHECK(!grad_modes.empty(), "--grad-dtype needs f32 and/or bf16");
    const std::vector<int64_t> contexts = flags.int_list("ctx");
    TT_CHECK(!contexts.empty(), "--ctx needs at least one context length");
    const std::vector<int64_t> warmups = flags.int_list("warmup-iters");
    TT_CHECK(!warmups.empty(), "--warmup-iters needs at least one value");
    for (int64_t w : warmups) TT_CHECK(w >= 0, "--warmup-iters values must not be negative");
    for (int64_t c : contexts) TT_CHECK(c > 0, "--ctx values must be positive");
    TT_CHECK(flags.integer("batch") > 0, "--batch must be positive");
    for (int64_t c : contexts) check_micro_batch_tokens(flags.integer("batch"), c);
    TT_CHECK(flags.integer("steps") > 0, "--steps must be positive");
    TT_CHECK(flags.integer("vocab") > 0, "--vocab must be positive");
    TT_CHECK(std::isfinite(flags.number("clip")) && flags.number("clip") >= 0,
             "--clip must be a finite number >= 0.0, got " + flags.str("clip"));
    TT_CHECK(device.is_cuda() || graph_flag == "off" || graph_flag == "auto",
             "--graph " + graph_flag + " needs a CUDA device (CUDA graphs); use --graph off on the CPU");
    // Every list item is checked before the first row runs, so a typo does not end a long sweep midway.
    for (const std::string& size : flags.list("sizes")) {
      nn::ModelConfig config = nn::preset(size);
      config.recompute = nn::parse_recompute(flags.str("recompute"));
      config.recompute_blocks = flags.integer("recompute-blocks");
      config.validate();  // --recompute-blocks against each size's layers
    }
    for (const std::string& precision : flags.list("precision")) nn::parse_precision(precision);
    for (const std::string& attention : flags.list("attention")) resolve_attention(attention, device);
    for (const std::string& mode : flags.list("mode")) {
      TT_CHECK(mode == "forward" || mode == "backward" || mode == "step" || mode == "step-fused" ||
                   mode == "train",
               "unknown --mode '" + mode + "' (expected forward, backward, step, step-fused or train)");
    }
    const std::vector<std::string> modes = flags.list("mode");
    // Also the check that its value is on or off, before any row runs; asking for it without a row it
    // applies to is a mistake (the default applies where it can).
    TT_CHECK(!flags.boolean("update-in-matmul") || !flags.given("update-in-matmul") ||
                 std::find(modes.begin(), modes.end(), "step-fused") != modes.end(),
             "--update-in-matmul on applies to step-fused rows; add step-fused to --mode");
    const int64_t max_ctx = *std::max_element(contexts.begin(), contexts.end());
    // The header once every flag has been checked: an error is then the only line.
    std::string recompute;
    if (flags.str("recompute") != "none") {
      recompute = ", recompute " + flags.str("recompute");
      if (flags.integer("recompute-blocks") > 0)
        recompute += " (first " + flags.str("recompute-blocks") + " blocks)";
    }
    std::printf("device: %s, batch %lld, vocabulary %lld, timed steps %lld%s\n\n",
                device_name(device).c_str(), static_cast<long long>(flags.integer("batch")),
                static_cast<long long>(flags.integer("vocab")),
                static_cast<long long>(flags.integer("steps")), recompute.c_str());
    StreamedTable table({"size", "ctx", "precision", "attention", "mode", "graph", "warm-up", "forward ms",
                         "backward ms", "optimizer ms", "step ms", "tokens/s", "MFU", "peak MiB"});
    for (const std::string& size : flags.list("sizes")) {
      for (const std::string& precision : flags.list("precision")) {
        for (const std::string& attention : flags.list("attention")) {
          // One model per size, precision and attention kind, reused by all its rows.
          const nn::ModelConfig config = bench_config(flags, device, size, max_ctx, precision, attention);
          std::unique_ptr<Bundle> bundle;
          try {
            bundle = std::make_unique<Bundle>(config, device);
          } catch (const OutOfMemory&) {
            empty_cache(device);
          }
          for (int64_t ctx : contexts) {
            for (const std::string& mode : flags.list("mode")) {
              // (untimed runs, graph, bf16 weight mirror, bf16 gradients) of the rows measured so far.
              std::set<std::tuple<int64_t, bool, bool, bool>> measured;
              for (int64_t warmup : warmups) {
                for (bool graph_mode : graph_modes) {
                  // train rows run train's own step, which decides about graphs itself: one row each.
                  if (mode == "train" && graph_mode != graph_modes.front()) continue;
                  const bool graph = graph_mode && mode != "train";
                  for (bool mirror : weight_modes) {
                    for (bool grads_bf16 : grad_modes) {
                      // f32 rows once (f32 gradients), whatever was asked for bf16's weights and gradients;
                      // train's step always reads the bf16 mirror.
                      const bool f32_row = config.precision != nn::Precision::bf16;
                      const bool row_mirror = f32_row || mode == "train" || mirror;
                      const bool row_grads_bf16 = grads_bf16 && !f32_row;
                      if (!measured
                               .insert({untimed_runs(mode, graph, warmup), graph, row_mirror, row_grads_bf16})
                               .second)
                        continue;
                      std::fprintf(stderr, "  measuring %s %s%s %s ctx %lld %s warm-up %lld graph %s ...\n",
                                   size.c_str(), precision.c_str(),
                                   grads_bf16 && !f32_row ? " (bf16 grads)" : "", attention.c_str(),
                                   static_cast<long long>(ctx), mode.c_str(), static_cast<long long>(warmup),
                                   graph ? "on" : "off");
                      const Row row = measure(flags, device, bundle.get(), config, size, ctx, mode, graph,
                                              warmup, row_mirror, row_grads_bf16);
                      table.row(row.cells);
                      if (json) json->write_raw(row.json);
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", tt::error_line(e).c_str());
    return 1;
  }
}
