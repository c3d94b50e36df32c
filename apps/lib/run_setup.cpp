#include "apps/lib/run_setup.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "apps/lib/data.h"
#include "core/cuda_context.h"
#include "dist/agreement.h"
#include "dist/runtime.h"
#ifdef TT_WITH_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace tt::app {

void declare_device_flag(Flags& f, bool per_rank) {
  if (per_rank) {
    f.add("device", "auto", "rank i uses its host's GPU i; auto: GPUs when there are",
          {"cpu", "cuda", "auto"});
  } else {
    f.add("device", "auto", "cuda:N: GPU N; auto: a GPU when there is one",
          {"cpu", "cuda", "cuda:N", "auto"});
  }
}

void declare_model_flags(Flags& f) {
  f.group("model");
  f.add("preset", "tiny", "model size", nn::preset_names());
  f.add("vocab", "0",
        "vocabulary size (0: DATA/meta.json's vocab_size; token files without meta.json need --vocab)");
  f.add("d-model", "0", "override the preset's d_model");
  f.add("layers", "0", "override the preset's number of layers");
  f.add("heads", "0", "override the preset's number of heads");
  f.add("d-ff", "0", "override the preset's feed-forward size");
  f.add("ctx", std::to_string(kDefaultContext), "context length in tokens");
  f.add("precision", "f32", "bf16: bf16 matmul/attention inputs, f32 master weights and reductions",
        {"f32", "bf16"});
  f.add("attention", "auto", "auto: flash on CUDA, naive on CPU", {"naive", "flash", "auto"});
  declare_device_flag(f);
  f.add("recompute", "none",
        "less activation memory for more forward work, the same results: selective keeps the outputs of "
        "each block's linear layers and of flash attention and runs the rest again in backward (with flash "
        "attention its norms and SwiGLU gate: a quarter of each block's activations, a few percent "
        "slower); block keeps only each block's input and runs the whole block again",
        {"none", "selective", "block"});
  f.add("recompute-blocks", "0",
        "apply --recompute to the first N blocks only (0: all); the others keep everything, or with block "
        "are recomputed selectively (faster where memory allows)");
  f.add_switch(
      "deterministic",
      "bit-identical CUDA runs (exact resume on GPU): deterministic attention backward, a little slower");
}

void declare_gemm_autotune_flag(Flags& f, bool with_deterministic) {
  f.add("gemm-autotune", "auto",
        std::string("cuBLASLt kernels timed per new matmul shape in the first step, the fastest kept: 1-2% "
                    "faster steps at GPT-2 shapes on an H100 (docs/speed.md); auto: 8") +
            (with_deterministic ? ", or 0 with --deterministic" : "") +
            "; 0: the heuristic's first (the same kernel every run)");
}

int gemm_autotune_from_flags(const Flags& flags, bool deterministic) {
  constexpr int kAutoCandidates = 8;
  const std::string text = flags.str("gemm-autotune");
  if (text == "auto") return deterministic ? 0 : kAutoCandidates;
  const int64_t given = flags.integer("gemm-autotune");
  TT_CHECK(given >= 0 && given <= 32, "--gemm-autotune takes auto or 0..32 candidates, got " + text);
  return static_cast<int>(given);
}

int apply_gemm_autotune_flag(const Flags& flags, bool deterministic) {
  const int candidates = gemm_autotune_from_flags(flags, deterministic);
  set_matmul_autotune(candidates);
  return candidates;
}

bool started_by_launcher() {
  if (dist::started_as_mpi_rank()) return true;
  dist::check_srun_tasks_share_one_world();
  return false;
}

void require_one_process(const std::string& app) {
  const std::string count = dist::launched_process_count();
  TT_CHECK(count.empty() || count == "1", app + " runs as one process, but was started as " + count +
                                              " (by mpirun or srun): the copies would write the same files; "
                                              "start it without a launcher");
}

std::string comparable_flag_value(const std::string& name, const std::string& value) {
  static const std::set<std::string> paths = {"data",   "out",  "resume", "init-from",
                                              "config", "json", "logits", "memory-timeline"};
  if (value.empty()) return value;
  if (paths.count(name)) {
    if (name == "resume" && value == "latest") return value;
    std::error_code ec;
    const std::filesystem::path absolute = std::filesystem::absolute(value, ec).lexically_normal();
    if (ec) return value;
    const std::string text = absolute.string();
    return text.size() > 1 && text.back() == '/' ? text.substr(0, text.size() - 1) : text;
  }
  // Integers as integers (a double would merge seeds past 2^53), anything else numeric in its shortest form.
  char* end = nullptr;
  errno = 0;
  const long long integer = std::strtoll(value.c_str(), &end, 10);
  if (end == value.c_str() + value.size() && errno == 0) return std::to_string(integer);
  const double number = std::strtod(value.c_str(), &end);
  if (end != value.c_str() + value.size() || !std::isfinite(number)) return value;
  char shortest[32];
  const auto [last, error] = std::to_chars(shortest, shortest + sizeof(shortest), number);
  return error == std::errc() ? std::string(shortest, last) : value;
}

void check_ranks_have_same_flags(const Flags& flags, const dist::DistRuntime& runtime) {
  std::vector<std::pair<std::string, std::string>> settings = flags.values();
  for (auto& [name, value] : settings) value = comparable_flag_value(name.substr(2), value);
  dist::check_ranks_agree(runtime, settings);
}

std::vector<dist::AllReduceTransport> all_reduce_transports(const Flags& flags, Device device,
                                                            const dist::DistRuntime& runtime) {
  std::vector<dist::AllReduceTransport> transports;
  for (const std::string& name : flags.list("all-reduce"))
    transports.push_back(dist::parse_all_reduce_transport(name));
  TT_CHECK(!transports.empty(), "--all-reduce needs library and/or copy-engine");
  const bool copy_engine = std::find(transports.begin(), transports.end(),
                                     dist::AllReduceTransport::copy_engine) != transports.end();
  TT_CHECK(!copy_engine ||
               (device.is_cuda() && dist::copy_engine_layout(runtime.world_size(), runtime.local_size())),
           "--all-reduce copy-engine needs CUDA and 2 to " + std::to_string(dist::kCopyEngineMaxRanks) +
               " ranks, all on one host; this job has " + std::to_string(runtime.world_size()) + " ranks, " +
               std::to_string(runtime.local_size()) + " on this host, device " + device.str());
  return transports;
}

int end_job_with_error(const std::exception& e, dist::DistRuntime* runtime, bool flags_checked) {
  if (dynamic_cast<const dist::SameOnEveryRank*>(&e)) {
    if (!runtime || runtime->is_root()) std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  if (runtime && runtime->world_size() > 1) {
    if (!flags_checked) return dist::end_start_up_failure(*runtime, e.what());
    dist::abort_job(e.what());
  }
  std::fprintf(stderr, "%s\n", error_line(e).c_str());
  return 1;
}

Device pick_device(const std::string& text, int local_rank) {
  Device device;
  if (text == "auto") {
    device = cuda_available() ? Device::cuda(local_rank) : Device::cpu();
  } else {
    try {
      device = Device::parse(text);
    } catch (const Error&) {
      throw Error("unknown --device '" + text + "' (expected auto, cpu, cuda or cuda:N)");
    }
    if (device.is_cuda() && text == "cuda") device.index = local_rank;
    if (device.is_cuda() && !cuda_available())
      throw Error("--device " + text + ": no CUDA device is available");
  }
  if (device.is_cuda()) set_current_device(device.index);
  return device;
}

void check_micro_batch_tokens(int64_t batch, int64_t ctx, const std::string& hint) {
  TT_CHECK(batch <= (int64_t{1} << 31) / ctx, "--batch " + std::to_string(batch) + " x --ctx " +
                                                  std::to_string(ctx) +
                                                  " tokens per micro-batch is more than 2^31; lower them" +
                                                  (hint.empty() ? "" : " (" + hint + ")"));
}

std::string device_name(Device device) {
#ifdef TT_WITH_CUDA
  if (device.is_cuda()) return cuda::device_name(device.index);
#endif
  return "cpu";
}

nn::AttentionKind resolve_attention(const std::string& text, Device device) {
  if (text == "auto") return device.is_cuda() ? nn::AttentionKind::flash : nn::AttentionKind::naive;
  if (text != "naive" && text != "flash")
    throw Error("unknown attention '" + text + "' (expected naive, flash or auto)");
  return nn::parse_attention(text);
}

void apply_runtime_model_flags(const Flags& flags, nn::ModelConfig& config, Device device) {
  config.precision = nn::parse_precision(flags.str("precision"));
  config.deterministic = flags.declared("deterministic") && flags.boolean("deterministic");
  config.attention = resolve_attention(flags.str("attention"), device);
  // Apps that declare their own model flags (bench_ddp) may lack it.
  if (flags.declared("recompute")) config.recompute = nn::parse_recompute(flags.str("recompute"));
  if (flags.declared("recompute-blocks")) config.recompute_blocks = flags.integer("recompute-blocks");
}

nn::ModelConfig model_config_from_flags(const Flags& flags, Device device, int64_t data_vocab) {
  nn::ModelConfig config = nn::preset(flags.str("preset"));
  // 0 keeps the preset's value (the data's vocabulary for --vocab); anything else must be a real size.
  for (const char* name : {"vocab", "d-model", "layers", "heads", "d-ff"})
    TT_CHECK(flags.integer(name) >= 0,
             std::string("--") + name + " must be >= 0 (0: the preset's), got " + flags.str(name));
  const int64_t vocab = flags.integer("vocab");
  if (vocab == 0 && data_vocab == 0) {
    // No guess: a wrong vocabulary trains a wrong model, or fails only at the first large id.
    const bool named = flags.declared("data") && flags.given("data");
    TT_CHECK(!named || std::filesystem::is_directory(flags.str("data")),
             "data folder '" + flags.str("data") + "' does not exist");
    // A folder of text, say, given where its dataset belongs.
    TT_CHECK(!named || std::filesystem::exists(flags.str("data") + "/train.bin"),
             "data folder '" + flags.str("data") +
                 "' holds no train.bin and no meta.json: it is not a dataset; make one from text with "
                 "prepare_data --input TEXT --out DATA");
    const std::string meta = named ? flags.str("data") + "/meta.json" : "the data folder's meta.json";
    throw Error("no vocabulary size: " + meta +
                " does not exist; pass --vocab N for token files without one (every id must be below N)");
  }
  config.vocab_size = vocab > 0 ? vocab : data_vocab;
  if (flags.integer("d-model") > 0) config.d_model = flags.integer("d-model");
  if (flags.integer("layers") > 0) config.num_layers = flags.integer("layers");
  if (flags.integer("heads") > 0) config.num_heads = flags.integer("heads");
  if (flags.integer("d-ff") > 0) config.d_ff = flags.integer("d-ff");
  config.context_length = flags.integer("ctx");
  apply_runtime_model_flags(flags, config, device);
  config.validate();
  return config;
}

bool auto_grads_bf16(bool bf16_precision, bool bf16_communication) {
  return bf16_precision && !bf16_communication;
}

bool grads_bf16_from_flags(const Flags& flags, bool bf16_precision, bool bf16_communication) {
  const std::string grad_dtype = flags.str("grad-dtype");
  TT_CHECK(grad_dtype == "f32" || grad_dtype == "bf16" || grad_dtype == "auto",
           "--grad-dtype must be auto, f32 or bf16, got '" + grad_dtype + "'");
  if (grad_dtype == "auto") return auto_grads_bf16(bf16_precision, bf16_communication);
  const bool grads_bf16 = grad_dtype == "bf16";
  TT_CHECK(!grads_bf16 || bf16_precision, "--grad-dtype bf16 needs --precision bf16");
  TT_CHECK(!grads_bf16 || !bf16_communication,
           "--grad-comm-dtype bf16 is for f32 gradients; with --grad-dtype bf16 they already travel in bf16");
  return grads_bf16;
}

}  // namespace tt::app
