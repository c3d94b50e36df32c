// bench_attention: naive vs FlashAttention-2 (ours) on the configurations people compare: the course sweep,
// a causal latency/TFLOP/s sweep, and the course leaderboard case. Markdown to stdout, --json rows.
#include <cmath>
#include <cstdio>
#include <memory>

#include "apps/lib/bench.h"
#include "apps/lib/flags.h"
#include "apps/lib/report.h"
#include "apps/lib/run_setup.h"
#include "base/error.h"
#include "core/allocator.h"
#include "core/cuda_context.h"
#include "core/ops.h"
#include "core/rng.h"

using namespace tt;
using namespace tt::app;

namespace {

struct Config {
  std::string impl;  // naive | flash
  int64_t batch, heads, seq, d_head;
  DType dtype;
  bool causal;
};

struct Result {
  double forward_ms = NAN, backward_ms = NAN, total_ms = NAN, memory_before_backward_mib = NAN;
  bool oom = false;
};

Tensor random_input(const Config& c, uint64_t seed, Device device) {
  const int64_t n = c.batch * c.heads * c.seq * c.d_head;
  std::vector<float> values(static_cast<size_t>(n));
  CounterRng rng{seed, 0};
  for (float& v : values) v = static_cast<float>(rng.next_double() * 2.0 - 1.0);
  Tensor t = Tensor::from_floats(values, {c.batch, c.heads, c.seq, c.d_head}, device);
  if (c.dtype == DType::bf16) t = ops::cast(t, DType::bf16);
  t.set_requires_grad(true);
  return t;
}

// Forward FLOPs: QK^T and PV, 2 * 2 * B * H * T^2 * d, halved by the causal mask. Backward does 2.5x.
double forward_flops(const Config& c) {
  return 4.0 * c.batch * c.heads * static_cast<double>(c.seq) * c.seq * c.d_head * (c.causal ? 0.5 : 1.0);
}

Result run(const Config& c, Device device, int64_t warmup, int64_t iters, bool ones_grad) {
  Result r;
  try {
    Tensor q = random_input(c, 1, device), k = random_input(c, 2, device), v = random_input(c, 3, device);
    Tensor grad_out =
        ones_grad ? Tensor::full(q.shape(), 1.0, DType::f32, device) : random_input(c, 4, device);
    if (grad_out.dtype() != c.dtype) grad_out = ops::cast(grad_out, c.dtype);
    grad_out.set_requires_grad(false);
    auto attention = [&] {
      return c.impl == "flash" ? ops::flash_attention(q, k, v, c.causal)
                               : ops::naive_attention(q, k, v, c.causal);
    };
    auto clear = [&] {
      q.set_grad(Tensor());
      k.set_grad(Tensor());
      v.set_grad(Tensor());
    };
    for (int64_t i = 0; i < warmup; ++i) {
      attention().backward(grad_out);
      clear();
    }
    synchronize(device);
    // The protocol of apps/python/attention_baseline.py (torch.cuda.Event): per iteration, points before the
    // forward, between forward and backward and after the backward, then a synchronisation; forward+backward
    // as one span over back-to-back iterations. On CUDA the points are GPU time, on the CPU host time.
    DeviceClock clock(device);
    for (int k = 0; k < 3; ++k) clock.mark();  // creates the events before the first timed iteration
    synchronize(device);
    double forward_ms = 0, backward_ms = 0;
    for (int64_t i = 0; i < iters; ++i) {
      clock.clear();
      const size_t t0 = clock.mark();
      Tensor o = attention();
      const size_t t1 = clock.mark();
      if (i == 0)  // the allocator's count, known on the host without waiting
        r.memory_before_backward_mib = static_cast<double>(memory_stats(device).current_bytes) / (1 << 20);
      o.backward(grad_out);
      o = Tensor();
      const size_t t2 = clock.mark();
      synchronize(device);
      clear();
      forward_ms += clock.ms_between(t0, t1);
      backward_ms += clock.ms_between(t1, t2);
    }
    clock.clear();
    const size_t begin = clock.mark();
    for (int64_t i = 0; i < iters; ++i) {
      attention().backward(grad_out);
      clear();
    }
    const size_t end = clock.mark();
    r.forward_ms = forward_ms / static_cast<double>(iters);
    r.backward_ms = backward_ms / static_cast<double>(iters);
    r.total_ms = clock.ms_between(begin, end) / static_cast<double>(iters);
  } catch (const OutOfMemory&) {
    r.oom = true;
  }
  empty_cache(device);
  return r;
}

// Three decimals below 1 TFLOP/s, so that CPU rows do not all read 0.0.
std::string tflops(double flops, double ms) {
  const double value = flops / (ms * 1e-3) / 1e12;
  return format_fixed(value, value < 1 ? 3 : 1);
}

}  // namespace

int main(int argc, char** argv) {
  stream_rows_to_stdout();
  try {
    Flags flags(
        "bench_attention",
        "Naive attention vs FlashAttention-2: --suite course (batch 8, 1 head, d x T grid, naive and "
        "flash),\n"
        "sweep (batch 1, causal, T 128..65536, d 16..128, bf16 and f32), leaderboard (1x16x16384x64 bf16), "
        "models (GPT-2 small..xl's heads at T 1024, bf16, causal).");
    flags.add("suite", "leaderboard", "course | sweep | leaderboard | models (comma-separated for several)");
    flags.add("warmup-iters", "10", "untimed iterations before the timed ones");
    flags.alias("warmup", "warmup-iters");
    flags.add("steps", "100", "timed iterations (forward, backward, forward+backward each)");
    flags.alias("iters", "steps");
    flags.add("precision", "f32", "the course suite's dtype of q, k and v", {"f32", "bf16"});
    flags.alias("dtype", "precision");
    flags.add("max-seq", "65536", "sweep: largest T");
    declare_device_flag(flags);
    flags.add("json", "", "also write one JSON object per row to this file");
    if (!flags.parse(argc, argv)) return 0;
    // Copies started by a launcher would time the same GPU at once and write the same --json file.
    require_one_process("bench_attention");
    const Device device = pick_device(flags.str("device"));
    std::unique_ptr<JsonlWriter> json;
    if (!flags.str("json").empty()) json = std::make_unique<JsonlWriter>(flags.str("json"), false);
    const int64_t warmup = flags.integer("warmup-iters"), iters = flags.integer("steps");
    TT_CHECK(warmup >= 0, "--warmup-iters must be >= 0, got " + flags.str("warmup-iters"));
    TT_CHECK(iters > 0, "--steps must be positive, got " + flags.str("steps"));
    TT_CHECK(flags.integer("max-seq") >= 128 && flags.integer("max-seq") <= (int64_t{1} << 24),
             "--max-seq must be in 128..16777216 (2^24), got " + flags.str("max-seq"));
    TT_CHECK(flags.str("precision") == "f32" || flags.str("precision") == "bf16",
             "--precision must be f32 or bf16, got '" + flags.str("precision") + "'");
    for (const std::string& suite : flags.list("suite")) {
      TT_CHECK(suite == "course" || suite == "sweep" || suite == "leaderboard" || suite == "models",
               "unknown --suite '" + suite + "' (expected course, sweep, leaderboard or models)");
    }
    const std::string device_label = device_name(device);
    std::printf("device: %s; %lld warm-up and %lld timed iterations per row\n\n", device_label.c_str(),
                static_cast<long long>(warmup), static_cast<long long>(iters));
    for (const std::string& suite : flags.list("suite")) {
      std::vector<Config> configs;
      bool ones = false;
      if (suite == "course") {
        const DType dtype = flags.str("precision") == "bf16" ? DType::bf16 : DType::f32;
        for (int64_t d : {16, 32, 64, 128}) {
          for (int64_t t : {256, 1024, 4096, 8192, 16384}) {
            for (const char* impl : {"naive", "flash"}) configs.push_back({impl, 8, 1, t, d, dtype, true});
          }
        }
      } else if (suite == "sweep") {
        for (DType dtype : {DType::bf16, DType::f32}) {
          for (int64_t d : {16, 32, 64, 128}) {
            for (int64_t t = 128; t <= flags.integer("max-seq"); t *= 2)
              configs.push_back({"flash", 1, 1, t, d, dtype, true});
          }
        }
      } else if (suite == "leaderboard") {
        configs.push_back({"flash", 1, 16, 16384, 64, DType::bf16, true});
        ones = true;
      } else if (suite == "models") {
        // The attention of GPT-2 small, medium, large and xl at context 1024 and docs/speed.md's batches.
        for (const auto& [batch, heads] : {std::pair<int64_t, int64_t>{32, 12}, {16, 16}, {12, 20}, {8, 25}})
          configs.push_back({"flash", batch, heads, 1024, 64, DType::bf16, true});
      } else {
        throw Error("unknown --suite '" + suite + "' (expected course, sweep, leaderboard or models)");
      }
      std::printf("## suite: %s\n\n", suite.c_str());
      StreamedTable table({"impl", "BxHxTxd", "dtype", "causal", "fwd ms", "bwd ms", "fwd+bwd ms",
                           "fwd TFLOP/s", "fwd+bwd TFLOP/s", "MiB before bwd"});
      for (size_t i = 0; i < configs.size(); ++i) {
        const Config& c = configs[i];
        // Announced before it runs: a large case on the CPU takes minutes.
        std::fprintf(stderr, "  [%zu/%zu] %s %lldx%lldx%lldx%lld %s ...\n", i + 1, configs.size(),
                     c.impl.c_str(), static_cast<long long>(c.batch), static_cast<long long>(c.heads),
                     static_cast<long long>(c.seq), static_cast<long long>(c.d_head), dtype_name(c.dtype));
        const Result r = run(c, device, warmup, iters, ones);
        const double f = forward_flops(c);
        table.row(
            {c.impl,
             std::to_string(c.batch) + "x" + std::to_string(c.heads) + "x" + std::to_string(c.seq) + "x" +
                 std::to_string(c.d_head),
             dtype_name(c.dtype), c.causal ? "yes" : "no", r.oom ? "OOM" : format_fixed(r.forward_ms, 3),
             r.oom ? "-" : format_fixed(r.backward_ms, 3), r.oom ? "-" : format_fixed(r.total_ms, 3),
             r.oom ? "-" : tflops(f, r.forward_ms), r.oom ? "-" : tflops(3.5 * f, r.total_ms),
             r.oom ? "-"
                   : format_fixed(r.memory_before_backward_mib, r.memory_before_backward_mib < 10 ? 2 : 0)});
        if (json) {
          json->write({{"suite", JsonlWriter::quote(suite)},
                       {"impl", JsonlWriter::quote(c.impl)},
                       {"batch", std::to_string(c.batch)},
                       {"heads", std::to_string(c.heads)},
                       {"seq", std::to_string(c.seq)},
                       {"d_head", std::to_string(c.d_head)},
                       {"dtype", JsonlWriter::quote(dtype_name(c.dtype))},
                       {"causal", c.causal ? "true" : "false"},
                       {"oom", r.oom ? "true" : "false"},
                       {"forward_ms", JsonlWriter::number(r.forward_ms)},
                       {"backward_ms", JsonlWriter::number(r.backward_ms)},
                       {"forward_backward_ms", JsonlWriter::number(r.total_ms)},
                       {"forward_tflops", JsonlWriter::number(f / (r.forward_ms * 1e-3) / 1e12)},
                       {"forward_backward_tflops", JsonlWriter::number(3.5 * f / (r.total_ms * 1e-3) / 1e12)},
                       {"memory_before_backward_mib", JsonlWriter::number(r.memory_before_backward_mib)},
                       {"device", JsonlWriter::quote(device_label)}});
        }
      }
      std::printf("\n");
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", tt::error_line(e).c_str());
    return 1;
  }
}
