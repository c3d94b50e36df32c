#include "apps/lib/trainer.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>

#include <mpi.h>

#include "apps/lib/bench.h"
#include "apps/lib/checkpoint.h"
#include "apps/lib/generation.h"
#include "apps/lib/report.h"
#include "apps/lib/run_folder.h"
#include "apps/lib/run_setup.h"
#include "apps/lib/stop_signal.h"
#include "apps/lib/tokenizer.h"
#include "apps/lib/train_step.h"
#include "core/allocator.h"
#include "core/autograd.h"
#include "core/cuda_context.h"
#include "core/ops.h"
#include "dist/agreement.h"
#include "dist/runtime.h"
#include "optim/optimizer.h"

namespace tt::app {

namespace fs = std::filesystem;

void declare_train_flags(Flags& f) {
  declare_model_flags(f);
  f.group("data");
  f.add("data", "",
        "folder with train.bin, val.bin (and meta.json); default: the built-in corpus, prepared on first use "
        "(resuming, and with --eval-only: the data the checkpoint was trained on, when it is found)");
  f.group("schedule");
  f.add("steps", "2000", "optimizer steps to train (total, also when resuming)");
  f.group("data");
  f.add("batch", "16", "sequences per micro-batch (per rank)");
  f.add("grad-accum", "1", "micro-batches accumulated per optimizer step");
  f.group("schedule");
  f.add("lr-max", "3e-3", "peak learning rate");
  f.add("lr-min", "3e-4", "final learning rate of the cosine schedule");
  f.add(
      "warmup", "50",
      "learning-rate warm-up: steps of linear increase from 0 (step 1) to lr-max (reached at step N+1; step "
      "s trains at the schedule's t = s-1)");
  f.add("cosine-steps", "0", "t at which the cosine schedule reaches lr-min, just after step t (0: --steps)");
  f.add("weight-decay", "0.1", "AdamW weight decay");
  f.add("beta1", "0.9", "AdamW beta1");
  f.add("beta2", "0.95", "AdamW beta2");
  f.add("clip", "1.0", "global gradient-norm clip (0: off)");
  f.add("cuda-graph", "auto",
        "on: from step 2 the step is replayed as one CUDA graph (the same kernels and collectives, launched "
        "at once) where it can be captured: the whole step with bf16 gradients (one process, or DDP over "
        "NCCL), forward and backward under ZeRO; auto: on, except under ZeRO (the graph's own memory pool "
        "costs about 2 GiB a GPU at 7b); off: launch each kernel from the host every step",
        {"auto", "on", "off"});
  f.group("data");
  f.add("seed", "1", "seed for initialisation and data sampling");
  f.add("sampling", "random", "order of the training batches", {"random", "sequential"});
  f.group("evaluation");
  f.add("eval-every", "200", "evaluate on val.bin every N steps (0: only at the end)");
  f.add("eval-batches", "20",
        "batches per evaluation (the first eval-batches*batch windows of val.bin; when training under "
        "mpirun eval-batches*batch*ranks, each rank its share); unless given, at most what val.bin holds");
  f.group("checkpoints");
  f.add("ckpt-every", "500",
        "write a checkpoint every N steps; step 0 is written too (0: step 0 and the end only; -1: none, for "
        "benchmarks and throwaway runs, though a stop signal still writes one)");
  f.add("keep-ckpts", "3", "checkpoints to keep (0: all)");
  f.group("distributed");
  f.add("ddp", "bucketed", "how DDP (and --zero 1 with --zero-grads ddp) averages gradients under mpirun",
        {"naive", "flat", "overlap", "bucketed"});
  f.add("bucket-mb", "25", "gradient bucket capacity in MiB (2^20 bytes) for --ddp bucketed");
  f.add("grad-dtype", "auto",
        "dtype of the gradient buffer: auto: bf16 with --precision bf16, else f32; bf16 (with "
        "--precision bf16): weight gradients rounded to bf16 "
        "once, as PyTorch's autocast rounds them; half the bytes to write, read and all-reduce; with "
        "--grad-accum each further micro-batch is added in f32 and rounded again",
        {"auto", "f32", "bf16"});
  f.add("grad-comm-dtype", "f32",
        "dtype gradients travel in under mpirun: f32: the exact average; bf16: half the bytes, each "
        "gradient rounded to bf16 before and after the average",
        {"f32", "bf16"});
  f.add("all-reduce", "auto",
        "how the DDP all-reduce moves gradients: library: NCCL on GPUs, MPI on CPU; copy-engine: 2 to 8 "
        "ranks, all on one host, with peer-to-peer GPUs: DMA copies and one add kernel instead of NCCL's "
        "kernels; auto: copy-engine for 2 ranks on one host where it works, else library",
        {"library", "copy-engine", "auto"});
  f.add("zero", "0",
        "ZeRO stage: 1: shard the AdamW state across ranks; 2: and the gradients (reduce-scattered per "
        "Transformer block during backward); 3: and the parameters (each block's gathered just before use); "
        "checkpoints load at any world size and stage",
        {"0", "1", "2", "3"});
  f.add("gemm-sm-margin", "0",
        "SMs to keep free of matmuls (CUDA), so the gradient all-reduce's kernels overlap backward without "
        "waiting for SMs; 0: matmuls use the whole GPU");
  declare_gemm_autotune_flag(f, /*with_deterministic=*/true);
  f.add("zero-grads", "reduce-scatter",
        "with --zero 1, how gradients are averaged: reduce-scatter: after backward, half the bytes of an "
        "all-reduce; ddp: the --ddp strategy's all-reduce, overlapped with backward when bucketed",
        {"reduce-scatter", "ddp"});
  f.group("checkpoints");
  f.add_switch("overwrite", "replace the checkpoints of an earlier run in --out (otherwise refused)");
  f.add("resume", "",
        "checkpoint to resume from; 'latest': the newest checkpoint of --out that loads (a new run when "
        "there is none); a run folder: its newest. With --eval-only: the checkpoint to evaluate");
  f.add("init-from", "",
        "checkpoint whose weights a new run starts from (its optimizer state and step are not used), e.g. "
        "one written by `import` from a Hugging Face folder; a run folder: its newest");
  f.group("evaluation");
  f.add_switch("eval-only",
               "evaluate --resume on val.bin and exit (prints and writes the mean loss); under mpirun rank 0 "
               "alone evaluates, eval-batches*batch windows as one process would");
  f.add("json", "", "with --eval-only: write the result as JSON to this file");
  f.add("logits", "",
        "with --eval-only: also write the logits of the first window (val.bin tokens 0..ctx-1) to this "
        "file, f32 (ctx, vocab) in NumPy's .npy format, to compare with another implementation");
  f.group("output");
  f.add("out", "runs/tiny", "output folder: metrics.jsonl, loss.svg, checkpoints/, sample.txt");
  f.add("log-every", "10", "print a progress line every N steps");
  f.add("sample-tokens", "300", "tokens of text to generate at the end (0: none)");
  f.add("top-k", "10", "sample from the k most likely tokens (1: greedy; 0: all)");
  f.add("prompt", "The", "text the final sample starts from");
}

double unigram_entropy(const TokenFile& file, int64_t vocab) {
  std::vector<double> counts(static_cast<size_t>(vocab), 0.0);
  for (int64_t i = 0; i < file.size(); ++i) counts[file.data()[i]] += 1;
  double h = 0;
  for (double c : counts) {
    if (c > 0) h -= c / file.size() * std::log(c / file.size());
  }
  return h;
}

double evaluate(const nn::TransformerLM& model, const TokenFile& val, int64_t batch, int64_t ctx,
                int64_t batches, Device device, int64_t rank, int64_t ranks) {
  NoGradGuard no_grad;
  double total = 0;
  for (int64_t i = 0; i < batches; ++i) {
    const Batch b = eval_batch(val, batch, ctx, (i * ranks + rank) * batch);
    const Tensor x = Tensor::from_ints(b.inputs, {batch, ctx}, device);
    const Tensor y = Tensor::from_ints(b.targets, {batch, ctx}, device);
    total += model.loss(x, y).item();
  }
  return total / static_cast<double>(batches);
}

namespace {

// A resumed run reproduces the uninterrupted one only with the same learning-rate schedule and optimizer,
// sampling and precision settings; say which differ.
void warn_if_settings_differ(const std::string& written_by, const Flags& flags) {
  // Checkpoints written by `import` record no schedule.
  if (written_by.empty() || recorded_flag(written_by, "steps").empty()) return;
  auto effective_cosine = [](const std::string& cosine, const std::string& steps) {
    return cosine.empty() || cosine == "0" ? steps : cosine;
  };
  const std::string old_end =
      effective_cosine(recorded_flag(written_by, "cosine-steps"), recorded_flag(written_by, "steps"));
  const std::string new_end = effective_cosine(flags.str("cosine-steps"), flags.str("steps"));
  std::string differs, keep;  // what changed, and the flags that would keep the old schedule
  auto add = [&](const std::string& change, const std::string& flag) {
    differs += (differs.empty() ? "" : "; ") + change;
    keep += (keep.empty() ? "" : " ") + flag;
  };
  if (comparable_flag_value("steps", old_end) != comparable_flag_value("steps", new_end))
    add("cosine end " + old_end + " -> " + new_end, "--cosine-steps " + old_end);
  for (const char* name : {"warmup", "lr-max", "lr-min"}) {
    const std::string before = recorded_flag(written_by, name);
    if (!before.empty() &&
        comparable_flag_value(name, before) != comparable_flag_value(name, flags.str(name)))
      add(std::string("--") + name + " " + before + " -> " + flags.str(name),
          std::string("--") + name + " " + before);
  }
  if (!differs.empty()) {
    std::printf(
        "note: the learning-rate schedule differs from the run that wrote the checkpoint (%s), so the "
        "losses will not match an uninterrupted run; pass %s to keep its schedule\n",
        differs.c_str(), keep.c_str());
  }
  // The other settings a step's result depends on; the gradients' dtype compared as each run resolved
  // `auto`, and shown as "auto (bf16)".
  auto grad_dtype = [](const std::string& grad_dtype, const std::string& precision, const std::string& comm) {
    if (grad_dtype != "auto") return grad_dtype;
    return std::string(auto_grads_bf16(precision == "bf16", comm == "bf16") ? "bf16" : "f32");
  };
  std::string others;
  for (const char* name : {"seed", "sampling", "clip", "weight-decay", "beta1", "beta2", "precision",
                           "grad-dtype", "grad-comm-dtype"}) {
    const std::string before = recorded_flag(written_by, name), now = flags.str(name);
    std::string before_value = before, now_value = now, before_shown = before, now_shown = now;
    if (std::string(name) == "grad-dtype" && !before.empty()) {
      before_value = grad_dtype(before, recorded_flag(written_by, "precision"),
                                recorded_flag(written_by, "grad-comm-dtype"));
      now_value = grad_dtype(now, flags.str("precision"), flags.str("grad-comm-dtype"));
      if (before != before_value) before_shown += " (" + before_value + ")";
      if (now != now_value) now_shown += " (" + now_value + ")";
    }
    if (!before.empty() &&
        comparable_flag_value(name, before_value) != comparable_flag_value(name, now_value))
      others +=
          (others.empty() ? "" : ", ") + std::string("--") + name + " " + before_shown + " -> " + now_shown;
  }
  if (!others.empty())
    std::printf(
        "note: %s differ%s from the run that wrote the checkpoint, so the losses will not match an "
        "uninterrupted run\n",
        others.c_str(), others.find(',') == std::string::npos ? "s" : "");
}

// Whether two paths name one folder (as the file system resolves them now).
bool same_folder(const std::string& a, const std::string& b) {
  std::error_code a_error, b_error;
  const fs::path ca = fs::weakly_canonical(a, a_error), cb = fs::weakly_canonical(b, b_error);
  return a_error || b_error ? fs::path(a).lexically_normal() == fs::path(b).lexically_normal() : ca == cb;
}

// The data of a resumed run against its checkpoint's. With --data, going on with other data (new text to
// fine-tune on) is a use, but should not pass unsaid: a note (rank 0). Without, train reads what the newest
// readable checkpoint records; the one resumed, when a newer one does not load, may say otherwise: then the
// user chooses.
void check_resumed_data(const std::string& checkpoint, const std::string& data_dir, bool data_given,
                        bool root) {
  const std::string trained_on = training_data_folder(checkpoint);
  if (trained_on.empty() || same_folder(trained_on, data_dir)) return;
  TT_CHECK(data_given, checkpoint + " was trained on " + trained_on + ", not on " + data_dir +
                           " (what a newer checkpoint of the run, which does not load, records); pass --data "
                           "with the data to go on with");
  if (root)
    std::printf("note: %s was trained on %s; this run goes on with %s\n", checkpoint.c_str(),
                trained_on.c_str(), data_dir.c_str());
}

// A count the resumed run recorded (--batch, --ranks, ...); none for a checkpoint that records none (written
// by `import`, or before that setting was recorded).
std::optional<int64_t> recorded_count(const std::string& written_by, const std::string& name) {
  const std::string text = recorded_flag(written_by, name);
  try {
    size_t used = 0;
    const long long value = std::stoll(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

// The same for the step's global batch (sequences over all ranks and micro-batches), from the flags and the
// rank count the writer recorded (checkpoints before that was recorded say nothing of it).
// Random batches are drawn per rank (seeded by --seed and the rank), so at another rank count the same global
// batch holds other sequences.
void warn_if_global_batch_differs(const std::string& written_by, int64_t global_batch, int world,
                                  const std::string& sampling) {
  const auto ranks = recorded_count(written_by, "ranks"), batch = recorded_count(written_by, "batch"),
             accum = recorded_count(written_by, "grad-accum");
  if (!ranks || !batch || !accum) return;
  const int64_t before = *ranks * *batch * *accum;
  if (before == global_batch) {
    if (sampling == "random" && *ranks != world)
      std::printf(
          "note: at %d rank%s the random batches differ from those of the run that wrote the checkpoint "
          "(%lld rank%s), so the losses will not match an uninterrupted run (--sampling sequential draws the "
          "same ones at any rank count)\n",
          world, world == 1 ? "" : "s", static_cast<long long>(*ranks), *ranks == 1 ? "" : "s");
    return;
  }
  std::printf(
      "note: the step's global batch is %lld sequences, against %lld in the run that wrote the checkpoint "
      "(%lld rank%s x --batch %lld x --grad-accum %lld), so the losses will not match an uninterrupted run\n",
      static_cast<long long>(global_batch), static_cast<long long>(before), static_cast<long long>(*ranks),
      *ranks == 1 ? "" : "s", static_cast<long long>(*batch), static_cast<long long>(*accum));
}

// The validation windows (--eval-batches x --batch x ranks) against the resumed run's: another split of the
// same global batch (more micro-batches, fewer ranks) evaluates fewer or more windows, a curve that jumps.
void warn_if_validation_differs(const std::string& written_by, int64_t windows) {
  const auto ranks = recorded_count(written_by, "ranks"), batch = recorded_count(written_by, "batch"),
             batches = recorded_count(written_by, "eval-batches");
  if (!ranks || !batch || !batches) return;
  const int64_t before = *ranks * *batch * *batches;
  if (before == windows) return;
  std::printf(
      "note: validation reads %lld window%s of val.bin, against %lld in the run that wrote the checkpoint "
      "(%lld rank%s x --batch %lld x --eval-batches %lld), so val_loss will not continue its curve exactly\n",
      static_cast<long long>(windows), windows == 1 ? "" : "s", static_cast<long long>(before),
      static_cast<long long>(*ranks), *ranks == 1 ? "" : "s", static_cast<long long>(*batch),
      static_cast<long long>(*batches));
}

// A checkpoint's vocabulary against the data's (meta.json): a model trained on another tokenizer's ids would
// go on training, without a word, on ids that mean something else to it.
void check_data_vocabulary(const std::string& checkpoint, const std::string& data_dir, const Flags& flags,
                           bool root) {
  const int64_t data_vocab = read_vocab_size(data_dir);
  if (data_vocab == 0) return;  // token files without meta.json: --vocab says what they are
  const int64_t model_vocab = read_checkpoint_config(checkpoint).vocab_size;
  if (model_vocab == data_vocab) {
    // The same size is not the same tokenizer: another SentencePiece model of as many pieces.
    if (flags.integer("vocab") == 0)
      check_training_tokenizer(checkpoint, data_dir,
                               "pass --data with data prepared by the same tokenizer (or --vocab " +
                                   std::to_string(model_vocab) + " if these ids are meant for that model)");
    return;
  }
  const std::string tokenizer = read_tokenizer(data_dir);
  const std::string data = data_dir + "/meta.json gives " + std::to_string(data_vocab) + " ids (tokenizer " +
                           (tokenizer.empty() ? "not named" : tokenizer) + ")";
  if (flags.integer("vocab") == 0) {
    // Reading the data as the model's ids (--vocab) can only work when they all fit.
    throw Error("the checkpoint " + checkpoint + " holds a model of " + std::to_string(model_vocab) +
                " ids, but " + data +
                ": it was trained on data of another tokenizer; pass --data with data "
                "prepared by the same tokenizer" +
                (data_vocab < model_vocab ? " (or --vocab " + std::to_string(model_vocab) +
                                                " if these ids are meant for that model)"
                                          : std::string()));
  }
  if (root && flags.integer("vocab") == model_vocab) {
    std::printf("note: the model has %lld ids and %s; the data's ids are read as the model's\n",
                static_cast<long long>(model_vocab), data.c_str());
  }
}

std::string format_entropy(double nats) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f", nats);
  return buf;
}

}  // namespace

// The numbers the optimizer, schedule and logging take, checked before anything runs.
void check_train_flag_values(const Flags& flags) {
  TT_CHECK(flags.integer("steps") > 0, "--steps must be positive");
  gemm_autotune_from_flags(flags, false);  // refuses a bad count before anything is written
  TT_CHECK(flags.integer("batch") > 0 && flags.integer("grad-accum") > 0,
           "--batch and --grad-accum must be positive");
  auto finite_at_least = [&](const char* name, double low) {
    const double v = flags.number(name);
    TT_CHECK(std::isfinite(v) && v >= low, std::string("--") + name + " must be a finite number >= " +
                                               std::to_string(low).substr(0, 3) + ", got " + flags.str(name));
  };
  finite_at_least("lr-max", 0);
  finite_at_least("lr-min", 0);
  finite_at_least("weight-decay", 0);
  finite_at_least("clip", 0);
  for (const char* name : {"beta1", "beta2"}) {
    const double v = flags.number(name);
    TT_CHECK(std::isfinite(v) && v >= 0 && v < 1,
             std::string("--") + name + " must be in [0, 1), got " + flags.str(name));
  }
  for (const char* name : {"seed", "warmup", "cosine-steps", "eval-every", "keep-ckpts", "sample-tokens"})
    TT_CHECK(flags.integer(name) >= 0, std::string("--") + name + " must be >= 0, got " + flags.str(name));
  TT_CHECK(flags.integer("ckpt-every") >= -1,
           "--ckpt-every must be >= 0, or -1 for none, got " + flags.str("ckpt-every"));
  TT_CHECK(flags.integer("top-k") >= 0, "--top-k must be >= 0 (0: all tokens), got " + flags.str("top-k"));
  for (const char* name : {"eval-batches", "log-every"})
    TT_CHECK(flags.integer(name) >= 1, std::string("--") + name + " must be >= 1, got " + flags.str(name));
  TT_CHECK(flags.str("json").empty() || flags.boolean("eval-only"),
           "--json writes the result of --eval-only; training writes metrics.jsonl in --out");
  TT_CHECK(flags.str("logits").empty() || flags.boolean("eval-only"), "--logits is a file of --eval-only");
  TT_CHECK(
      flags.str("init-from").empty() || flags.str("resume").empty() || flags.str("resume") == "latest",
      "--init-from starts a new run from a checkpoint's weights; --resume continues one: pass one of them");
  // Each one-of-a-list flag before anything is written (the built-in corpus); its reader would say so later.
  for (const auto& [name, value] : flags.values()) {
    const std::vector<std::string>& allowed = flags.choices(name.substr(2));
    if (allowed.empty() || name == "--device" || std::count(allowed.begin(), allowed.end(), value)) continue;
    std::string list;
    for (size_t i = 0; i < allowed.size(); ++i)
      list += (i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") + allowed[i];
    throw Error(name + " takes " + list + ", got '" + value + "'");
  }
  // A strategy other than the default asks for something ZeRO-2/3 do not do; the default spelled out (a
  // config file listing every flag) asks for nothing.
  TT_CHECK(flags.integer("zero") < 2 || !flags.given("ddp") || flags.str("ddp") == flags.default_value("ddp"),
           "--ddp chooses how DDP (and --zero 1 with --zero-grads ddp) averages gradients; --zero " +
               flags.str("zero") + " reduce-scatters them itself (drop --ddp)");
  // The model's settings that depend on flags alone (the vocabulary comes with the data, later).
  nn::ModelConfig model = nn::preset(flags.str("preset"));
  if (flags.integer("layers") > 0) model.num_layers = flags.integer("layers");
  model.recompute = nn::parse_recompute(flags.str("recompute"));
  model.recompute_blocks = flags.integer("recompute-blocks");
  model.validate();
}

void check_train_flags(const Flags& flags, dist::DistRuntime* runtime) {
  if (!runtime || runtime->world_size() == 1) return check_train_flag_values(flags);
  // Each rank checks its own values first (one can hold 2.0 where an integer is due and another 2, which
  // agree below), and every rank ends with the first bad one's line.
  std::string problem;
  try {
    check_train_flag_values(flags);
  } catch (const Error& e) {
    problem = e.what();
  }
  dist::raise_if_any_rank_failed(*runtime, problem);
  check_ranks_have_same_flags(flags, *runtime);
}

namespace {

// Everything a run is made of, resolved from the flags and checked before anything is written.
struct RunPlan {
  nn::ModelConfig config;
  std::string out, data_dir;
  int64_t steps = 0, batch = 0, accum = 1, ctx = 0;
  int rank = 0, world = 1;
  bool root = true, grads_bf16 = false;
  int gemm_autotune = 0;  // cuBLASLt candidates timed per matmul shape (--gemm-autotune)
  uint64_t seed = 0;
  Sampling sampling = Sampling::random;
  TrainStepOptions step;
};

RunPlan plan_run(const Flags& flags, Device device, const std::string& data_dir, dist::DistRuntime* runtime) {
  RunPlan p;
  p.rank = runtime ? runtime->rank() : 0;
  p.world = runtime ? runtime->world_size() : 1;
  p.root = p.rank == 0;
  p.data_dir = data_dir;
  p.config = model_config_from_flags(flags, device, read_vocab_size(data_dir));
  p.out = flags.str("out");
  p.steps = flags.integer("steps");
  p.batch = flags.integer("batch");
  p.accum = flags.integer("grad-accum");
  p.ctx = p.config.context_length;
  check_train_flag_values(flags);
  check_micro_batch_tokens(p.batch, p.ctx, "use --grad-accum for larger steps");
  TT_CHECK(flags.number("lr-min") <= flags.number("lr-max"),
           "--lr-min " + flags.str("lr-min") + " is above --lr-max " + flags.str("lr-max"));
  TT_CHECK(!p.out.empty(), "--out must name a folder");
  // --zero, --zero-grads and --grad-comm-dtype hold one of their choices (check_train_flag_values).
  const int64_t zero = flags.integer("zero");
  const std::string zero_grads = flags.str("zero-grads");
  const std::string grad_comm = flags.str("grad-comm-dtype");
  TT_CHECK(grad_comm == "f32" || zero == 0 || (zero == 1 && zero_grads == "ddp"),
           "--grad-comm-dtype bf16 applies to the DDP all-reduce; with --zero 1 use --zero-grads ddp, with "
           "--zero 2 or 3 gradients are reduce-scattered in their own dtype");
  TT_CHECK(zero_grads == "reduce-scatter" || zero == 1,
           "--zero-grads ddp chooses how --zero 1 averages gradients; it needs --zero 1");
  p.grads_bf16 = grads_bf16_from_flags(flags, p.config.precision == nn::Precision::bf16, grad_comm == "bf16");
  TT_CHECK(std::isfinite(flags.number("bucket-mb")) && flags.number("bucket-mb") > 0,
           "--bucket-mb must be positive, got " + flags.str("bucket-mb"));
  const int64_t sm_margin = flags.integer("gemm-sm-margin");
  TT_CHECK(sm_margin >= 0, "--gemm-sm-margin must be >= 0");
  set_matmul_sm_margin(static_cast<int>(sm_margin));
  p.gemm_autotune = apply_gemm_autotune_flag(flags, p.config.deterministic);
  p.sampling = parse_sampling(flags.str("sampling"));
  p.seed = static_cast<uint64_t>(flags.integer("seed"));

  TrainStepOptions& s = p.step;
  s.batch = p.batch;
  s.ctx = p.ctx;
  s.grad_accum = p.accum;
  s.clip = flags.number("clip");
  s.cuda_graph = parse_graph_use(flags.str("cuda-graph"));
  s.zero = static_cast<int>(zero);
  s.zero_grads_by_ddp = zero_grads == "ddp";
  // Checked in a single process too, so that a launch script's flags fail on one machine before many.
  s.ddp = dist::parse_ddp_strategy(flags.str("ddp"));
  s.bucket_mb = flags.number("bucket-mb");
  // A launch script's common flags may size buckets that this run does not have: said, not refused.
  // (The default spelled out, as in a config file listing every flag, asks for nothing.)
  if (p.root && flags.given("bucket-mb") &&
      comparable_flag_value("bucket-mb", flags.str("bucket-mb")) !=
          comparable_flag_value("bucket-mb", flags.default_value("bucket-mb")) &&
      (!ddp_averages_gradients(s) || s.ddp != dist::DdpStrategy::bucketed)) {
    const std::string how = ddp_averages_gradients(s)
                                ? "averages gradients with --ddp " + flags.str("ddp")
                                : "reduce-scatters gradients (--zero " + flags.str("zero") + ")";
    std::printf("note: --bucket-mb is not used: it sizes the buckets of --ddp bucketed, and %s %s\n",
                p.world > 1 ? "this run" : "under mpirun this run", how.c_str());
  }
  s.grad_comm_bf16 = grad_comm == "bf16";
  s.all_reduce = flags.str("all-reduce");
  TT_CHECK(s.all_reduce != "copy-engine" || device.is_cuda(),
           "--all-reduce copy-engine copies gradients between GPUs; on the CPU use --all-reduce library "
           "(MPI) or auto");
  s.adamw.lr = flags.number("lr-max");
  s.adamw.beta1 = flags.number("beta1");
  s.adamw.beta2 = flags.number("beta2");
  s.adamw.weight_decay = flags.number("weight-decay");
  return p;
}

// Under mpirun every rank must train the same thing: the flags (compared by check_train_flags) and what was
// resolved from the data each rank read. A difference ends every rank with one message.
void check_data_agrees(const RunPlan& plan, const TokenFile& train_file, dist::DistRuntime* runtime) {
  if (!runtime || runtime->world_size() == 1) return;
  dist::check_ranks_agree(*runtime, {{"vocabulary (resolved)", std::to_string(plan.config.vocab_size)},
                                     {"train.bin tokens", std::to_string(train_file.size())}});
}

// The message of an exception, without the "error: " the report's line adds.
std::string problem_text(const std::exception& e) {
  std::string line = error_line(e);
  if (line.rfind("error: ", 0) == 0) line.erase(0, 7);
  return line;
}

// Rank 0's string on every rank: what rank 0 alone decides (the checkpoint a run resumes from, "latest"
// being resolved against the run folder it holds the lock of) or found (a problem with that file).
std::string rank0_string(const std::string& chosen, dist::DistRuntime* runtime) {
  if (!runtime || runtime->world_size() == 1) return chosen;
  int64_t size = static_cast<int64_t>(chosen.size());
  MPI_Bcast(&size, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  std::string path = chosen;
  path.resize(static_cast<size_t>(size));
  MPI_Bcast(path.data(), static_cast<int>(size), MPI_CHAR, 0, MPI_COMM_WORLD);
  return path;
}

// A run's stages, in the order run_training calls them; each uses what the ones before it set.
class TrainingRun {
 public:
  TrainingRun(const Flags& flags, Device device, const std::string& data_dir, dist::DistRuntime* runtime)
      : flags_(flags), device_(device), data_dir_(data_dir), runtime_(runtime) {}

  // Set-up: every setting checked and every input opened before the run folder is touched.
  void set_up() {
    check_on_every_rank(runtime_, [&] {
      plan_ = plan_run(flags_, device_, data_dir_, runtime_);
      root_ = plan_.root;
      train_file_ = std::make_unique<TokenFile>(data_dir_ + "/train.bin", plan_.config.vocab_size);
      val_file_ = std::make_unique<TokenFile>(data_dir_ + "/val.bin", plan_.config.vocab_size);
      check_token_count(data_dir_, *train_file_);
      check_token_count(data_dir_, *val_file_);
      check_context_fits(*val_file_, plan_.ctx);  // now, not at the first evaluation
      eval_batches_ = eval_batches_to_use(*val_file_, plan_.batch, plan_.ctx, flags_.integer("eval-batches"),
                                          flags_.given("eval-batches"), root_, plan_.world);
      check_eval_fits(*val_file_, plan_.batch, plan_.ctx, eval_batches_, plan_.world);
      check_sample_settings();
    });
    check_data_agrees(plan_, *train_file_, runtime_);
  }

  // The final text sample's settings, checked now rather than after the training.
  void check_sample_settings() const {
    if (flags_.integer("sample-tokens") <= 0 || plan_.step.zero == 3) return;
    SamplingOptions sampling;
    sampling.top_k = flags_.integer("top-k");
    check_sampling_options(sampling);
    std::unique_ptr<Tokenizer> tokenizer;
    try {
      tokenizer = load_data_tokenizer(data_dir_);
    } catch (const Error&) {
      return;  // no sample; the end of the run says why
    }
    const auto tokens = static_cast<int64_t>(prompt_ids(*tokenizer, flags_.str("prompt")).size());
    TT_CHECK(tokens <= plan_.ctx, "--prompt has " + std::to_string(tokens) +
                                      " tokens, more than the context length " + std::to_string(plan_.ctx) +
                                      " (--ctx): shorten it, or pass --sample-tokens 0");
  }

  // Run folder: rank 0 holds its lock for the whole run and decides what the run starts from (a checkpoint
  // to resume, weights to start from, or the seed); every rank then reads that checkpoint.
  void open_run_folder() {
    check_on_every_rank(runtime_, [&] {
      if (root_) take_run_folder();
    });
    resume_ = rank0_string(resume_, runtime_);
    // --init-from: the weights only; the optimizer and the step start fresh. With --resume latest a job
    // script passes both every time: the first start takes the weights, a restart continues its own
    // checkpoints.
    if (resume_.empty() && !flags_.str("init-from").empty()) {
      // A run folder means its newest checkpoint, as for --resume: rank 0 looks, the others take its answer.
      check_on_every_rank(runtime_, [&] {
        if (!root_) return;
        LockedCheckpoint chosen = lock_newest_checkpoint(flags_.str("init-from"), "--init-from");
        init_from_ = chosen.path;
        start_lock_ = std::move(chosen.lock);
      });
      init_from_ = rank0_string(init_from_, runtime_);
    }
    const std::string start = resume_.empty() ? init_from_ : resume_;
    if (!start.empty()) {
      // Another run still writing the folder the start point comes from leaves it alone until it is loaded.
      check_on_every_rank(runtime_, [&] {
        if (!root_ || start_lock_) return;
        start_lock_ = std::make_unique<CheckpointReadLock>(start);
        TT_CHECK(start_lock_->held(), start + " was removed (or cannot be read) before it could be read");
      });
      check_on_every_rank(runtime_, [&] {
        // Under mpirun rank 0 opens the start point first: a file that does not fit ends every rank with
        // rank 0's one line, rather than each rank failing on it with its own.
        if (root_ && plan_.world > 1) read_checkpoint_config(start);
      });
      if (!resume_.empty())
        check_on_every_rank(runtime_,
                            [&] { check_resumed_data(resume_, data_dir_, flags_.given("data"), root_); });
      // The model the file holds: its RoPE theta and RMSNorm epsilon (not flags) come from it.
      check_on_every_rank(runtime_, [&] { check_data_vocabulary(start, data_dir_, flags_, root_); });
    }
    // A checkpoint of another shape is refused by every rank alike: rank 0's line alone.
    check_on_every_rank(runtime_, [&] {
      if (!resume_.empty()) {
        plan_.config = config_for_checkpoint(resume_, plan_.config, true);
      } else if (!init_from_.empty()) {
        plan_.config = config_for_checkpoint(init_from_, plan_.config, false);
      }
    });
  }

  // Rank 0: the lock of --out, the checkpoint --resume names, and whether this run may replace what --out
  // holds.
  void take_run_folder() {
    folder_ = std::make_unique<RunFolder>(plan_.out);
    LockedCheckpoint chosen = resolve_resume(flags_.str("resume"), plan_.out);
    resume_ = chosen.path;
    start_lock_ = std::move(chosen.lock);  // another run's folder: not pruned until loaded
    const bool overwrite = flags_.boolean("overwrite");
    if (resume_.empty() && flags_.str("resume") == "latest") {
      // Checkpoints that are there but do not load (each note above says why) are not "none yet".
      TT_CHECK(!folder_->has_checkpoints() || overwrite,
               "--resume latest: no checkpoint in " + folder_->checkpoints_dir() +
                   " loads; pass --resume FILE for another one, or --overwrite to start a new run over them");
      std::printf("--resume latest: no %scheckpoint in %s, starting a new run\n",
                  folder_->has_checkpoints() ? "loadable " : "", folder_->checkpoints_dir().c_str());
    }
    if (resume_.empty()) check_may_replace_folder();  // a resumed run checks once its file has loaded
    // A run that wrote metrics but no checkpoint (--ckpt-every -1, or killed before its first): its
    // metrics.jsonl is replaced only as another run's checkpoints are. A job restarted with --resume latest
    // before its first checkpoint is that run again.
    if (resume_.empty() && !folder_->has_checkpoints() && folder_->has_metrics_lines() && !overwrite) {
      TT_CHECK(flags_.str("resume") == "latest",
               folder_->metrics_path() +
                   " holds the metrics of another run (which left no checkpoint); pass a new --out, or "
                   "--overwrite to replace them");
      std::printf("--resume latest: replacing %s, of a run that left no checkpoint\n",
                  folder_->metrics_path().c_str());
    }
  }

  // Rank 0, for a run that does not continue --out's own checkpoints: whether it may replace them.
  void check_may_replace_folder() const {
    if (!folder_->has_checkpoints() || flags_.boolean("overwrite")) return;
    if (!folder_->holds_trained_run()) {
      // A run that ended in its first step without removing its start point (a rank of an mpirun job
      // failing, a kill): nothing the seed cannot recreate, and refusing would only stop the corrected rerun.
      std::printf("replacing %s: the start point of a run that ended before its first step\n",
                  folder_->checkpoint_path(0).c_str());
      return;
    }
    // Typically a run that ran out of memory after its first step: say what is there to keep or replace.
    TT_CHECK(!resume_.empty() || !folder_->holds_only_start_point() || !folder_->has_metrics_lines(),
             plan_.out + "/checkpoints holds only the start point (step 0) of another run, whose " +
                 folder_->metrics_path() +
                 " logs steps it did not checkpoint; pass --overwrite to replace them, --resume latest "
                 "to continue that run from step 0, or a new --out");
    if (!resume_.empty() && started_from_same_checkpoint())
      throw Error(plan_.out + "/checkpoints holds the checkpoints of a run started from " + resume_ +
                  " as this one is (the same command, stopped before?); pass --resume latest to continue "
                  "it, a new --out, or --overwrite to start again from " +
                  resume_);
    throw Error(resume_.empty()
                    ? plan_.out +
                          "/checkpoints already holds checkpoints of another run; pass --resume to "
                          "continue it (--resume latest: its newest), a new --out, or --overwrite "
                          "to replace them"
                    : plan_.out + "/checkpoints already holds checkpoints of another run than " + resume_ +
                          "; pass a new --out, or --overwrite to replace them");
  }

  // Whether --out's newest checkpoint was written by a run that resumed from the checkpoint this one names.
  bool started_from_same_checkpoint() const {
    const auto found = list_checkpoints(folder_->checkpoints_dir());
    if (found.empty()) return false;
    try {
      const std::string before = recorded_flag(read_checkpoint_args(found.back().second), "resume");
      return !before.empty() && before != "latest" &&
             comparable_flag_value("resume", before) == comparable_flag_value("resume", flags_.str("resume"));
    } catch (const std::exception&) {
      return false;
    }
  }

  // Rank 0: the checkpoints this run will remove once it has written one of trained steps (a resume from an
  // older checkpoint of the folder: its later ones; --overwrite: the other run's).
  void announce_replacements() const {
    const std::vector<std::string>& replaced = folder_->replaced_checkpoints();
    // A new run's lone start point of a run that ended in its first step: check_may_replace_folder said so.
    if (replaced.empty() || (resume_.empty() && !folder_->replaces_another_run())) return;
    if (flags_.integer("ckpt-every") < 0) {
      if (flags_.boolean("overwrite"))
        std::printf("note: --overwrite with --ckpt-every -1: the checkpoints in %s are removed now\n",
                    folder_->checkpoints_dir().c_str());
      return;  // without --overwrite, refused below
    }
    std::string names;
    for (size_t i = 0; i < replaced.size() && i < 3; ++i)
      names += (i > 0 ? ", " : "") + fs::path(replaced[i]).filename().string();
    if (replaced.size() > 3) names += " and " + std::to_string(replaced.size() - 3) + " more";
    std::printf(
        "note: %s in %s %s replaced, with %s metrics lines, once this run writes a checkpoint of "
        "trained steps (until then the folder keeps them whole)\n",
        names.c_str(), folder_->checkpoints_dir().c_str(), replaced.size() == 1 ? "is" : "are",
        resume_.empty() || !resumes_own_folder() ? "the other run's" : "their");
  }

  // Whether the checkpoint resumed from lies in --out's own checkpoints folder (links resolved).
  bool resumes_own_folder() const {
    std::error_code ec;
    const fs::path from = fs::weakly_canonical(fs::absolute(resume_), ec).parent_path();
    return !ec && fs::equivalent(from, folder_->checkpoints_dir(), ec) && !ec;
  }

  // Model: every rank builds the same initial model from the seed (rank 0's is broadcast as well), then
  // loads the start point; the run folder learns what this run replaces.
  void build_model() {
    const nn::ModelConfig& config = plan_.config;
    model_ = std::make_unique<nn::TransformerLM>(config);
    params_ = std::make_unique<nn::FlatParameters>(*model_, device_, plan_.seed, DType::f32,
                                                   plan_.step.zero == 1 ? plan_.world : 1);
    if (plan_.grads_bf16) params_->set_grad_dtype(DType::bf16);
    step_ = std::make_unique<TrainStep>(*model_, *params_, device_, runtime_, plan_.step);
    // Each rank draws its own batches: the stream is seeded by (seed, rank).
    sampler_ = std::make_unique<BatchSampler>(
        *train_file_, plan_.batch, plan_.ctx, plan_.sampling,
        (plan_.seed * 0x9E3779B97F4A7C15ULL + 1) ^ (uint64_t(plan_.rank) << 48), plan_.rank, plan_.world);
    // A large checkpoint takes minutes to read: say so first. Ranks loading together leave their broadcast
    // buffers in the allocator's cache; they go back to the driver for NCCL's and cuBLAS's own allocations.
    const auto announce_load = [&](const std::string& path) {
      std::error_code size_error;
      const auto size = fs::file_size(path, size_error);
      if (!root_ || size_error) return;
      std::printf("loading checkpoint %s (%s)...\n", path.c_str(),
                  format_bytes(static_cast<double>(size)).c_str());
      std::fflush(stdout);
    };
    if (!init_from_.empty()) {
      announce_load(init_from_);
      load_checkpoint_weights(init_from_, *params_, &step_->optimizer_state(), step_->shared_read());
      if (step_->shared_read()) empty_cache(device_);
      if (plan_.world > 1) dist::barrier();  // every rank done with the file
      start_lock_.reset();
    }
    state_.rng_seed = sampler_->rng().seed;
    state_.args = recorded_args();
    const std::optional<DataMeta> meta = read_meta(data_dir_);
    const std::string data_tokenizer = meta ? data_tokenizer_id(*meta) : "";  // what checkpoints record
    state_.data_tokenizer = data_tokenizer;
    if (!resume_.empty()) {
      announce_load(resume_);
      const double t0 = now_seconds();
      load_checkpoint(resume_, *params_, &step_->optimizer_state(), &state_, step_->shared_read());
      synchronize(device_);                  // the last broadcasts included
      if (plan_.world > 1) dist::barrier();  // every rank done with the file
      start_lock_.reset();                   // before this run's own pruning, which would leave a locked file
      const double load_s = now_seconds() - t0;
      if (step_->shared_read()) empty_cache(device_);
      const std::string written_by = state_.args;
      // Pruning removes saved work: a resumed run keeps the checkpoints its run kept unless told otherwise.
      const std::optional<int64_t> kept_before = recorded_count(written_by, "keep-ckpts");
      if (!flags_.given("keep-ckpts") && kept_before && *kept_before >= 0 && *kept_before != keep_ckpts_) {
        keep_ckpts_ = *kept_before;
        const std::string kept = std::to_string(keep_ckpts_);
        if (root_)
          std::printf("keeping %s, as the run did (--keep-ckpts %s); pass --keep-ckpts to change it\n",
                      keep_ckpts_ == 0 ? "every checkpoint" : ("the newest " + kept + " checkpoints").c_str(),
                      kept.c_str());
      }
      state_.args = recorded_args();  // later checkpoints record this run's flags and data
      state_.data_tokenizer = data_tokenizer;
      // Each rank keeps its own seed; the draw count is the same on every rank.
      sampler_->rng().counter = state_.rng_counter;
      // The same `--resume latest` (or RUN_FOLDER) line run again after the run ended: done, not an error
      // (job scripts).
      complete_ = (flags_.str("resume") == "latest" || fs::is_directory(flags_.str("resume"))) &&
                  state_.step == plan_.steps;
      if (complete_) {
        // --resume FOLDER names the run; --resume latest, the one in --out.
        const std::string run = flags_.str("resume") == "latest" ? plan_.out : flags_.str("resume");
        if (root_)
          std::printf(
              "nothing to do: the run in %s already ended at step %lld (%s, --steps %lld); raise "
              "--steps to train longer\n",
              run.c_str(), static_cast<long long>(state_.step), resume_.c_str(),
              static_cast<long long>(plan_.steps));
        return;
      }
      check_on_every_rank(runtime_, [&] {
        const std::string at = std::to_string(state_.step);
        TT_CHECK(state_.step < plan_.steps, "nothing to do: the checkpoint is at step " + at +
                                                " and --steps is " + std::to_string(plan_.steps) +
                                                "; pass --steps above " + at + " to train longer");
      });
      check_on_every_rank(runtime_, [&] {
        if (root_ && !resumes_own_folder()) check_may_replace_folder();
      });
      if (root_) {
        const double bytes = static_cast<double>(fs::file_size(resume_));
        std::printf("resumed from %s at step %lld (%s read in %s, %s)\n", resume_.c_str(),
                    static_cast<long long>(state_.step), format_bytes(bytes).c_str(),
                    format_seconds(load_s).c_str(), format_rate(bytes, load_s).c_str());
        warn_if_settings_differ(written_by, flags_);
        const std::string train_before = recorded_flag(written_by, "train-tokens"),
                          val_before = recorded_flag(written_by, "val-tokens");
        if (!train_before.empty() && !val_before.empty() &&
            (train_before != std::to_string(train_file_->size()) ||
             val_before != std::to_string(val_file_->size())))
          std::printf(
              "note: %s holds %lld training and %lld validation tokens, against %s and %s when the "
              "checkpoint "
              "was written: the data changed, so the losses will not match an uninterrupted run\n",
              data_dir_.c_str(), static_cast<long long>(train_file_->size()),
              static_cast<long long>(val_file_->size()), train_before.c_str(), val_before.c_str());
        // A job script passes --init-from and --resume latest every time: the weights served the first start.
        const std::string init_before = recorded_flag(written_by, "init-from"),
                          init_now = flags_.str("init-from");
        if (!init_now.empty() &&
            comparable_flag_value("init-from", init_before) != comparable_flag_value("init-from", init_now))
          std::printf("note: --init-from %s is not used: --resume continues a run that started from %s\n",
                      init_now.c_str(), init_before.empty() ? "its seed" : init_before.c_str());
        warn_if_global_batch_differs(written_by, plan_.batch * plan_.accum * plan_.world, plan_.world,
                                     flags_.str("sampling"));
        warn_if_validation_differs(written_by, flags_.integer("eval-batches") * plan_.batch * plan_.world);
        // What came after the checkpoint in its own folder belongs to a future this run replaces; another
        // folder's run is replaced whole. Either way only once this run has written a checkpoint.
        const bool own = resumes_own_folder();
        folder_->start(own ? state_.step : -1, own ? resume_ : "");
        announce_replacements();
      }
    } else if (root_) {
      if (!init_from_.empty()) std::printf("new run from the weights of %s\n", init_from_.c_str());
      folder_->start(-1);
      announce_replacements();
    }
    // Without checkpoints nothing would ever replace what the folder's later or other checkpoints hold:
    // removing them at once takes --overwrite.
    check_on_every_rank(runtime_, [&] {
      if (!root_ || flags_.integer("ckpt-every") >= 0 || folder_->replaced_checkpoints().empty() ||
          flags_.boolean("overwrite"))
        return;
      throw Error("--ckpt-every -1 writes no checkpoint, so this run would remove " +
                  std::to_string(folder_->replaced_checkpoints().size()) + " checkpoint(s) of " +
                  folder_->checkpoints_dir() +
                  " for nothing; pass a new --out, a --ckpt-every, or --overwrite to remove them");
    });
    // Rank 0's folder decides whether the collective save of the start point happens on every rank.
    if (resume_.empty())
      replaces_another_run_ =
          !rank0_string(root_ && folder_->replaces_another_run() ? "1" : "", runtime_).empty();
  }

  bool complete() const { return complete_; }

  // What checkpoints record of the run that writes them: its flags, its rank count as "--ranks N", and the
  // data it reads as "--data" also when it came from the resumed checkpoint (or is the built-in corpus).
  std::string recorded_args() const {
    // The data as an absolute path (a run may be resumed from anywhere), but the built-in corpus by its
    // name: wherever it is prepared.
    const std::string data =
        data_dir_ == kBuiltinDataDir ? data_dir_ : fs::absolute(data_dir_).lexically_normal().string();
    std::vector<std::pair<std::string, std::string>> args = flags_.values();
    for (auto& [name, value] : args) {
      if (name == "--data") value = data;
      if (name == "--keep-ckpts") value = std::to_string(keep_ckpts_);
    }
    args.emplace_back("--ranks", std::to_string(plan_.world));
    // What the data held, so a resumed run sees data replaced at the same path.
    args.emplace_back("--train-tokens", std::to_string(train_file_->size()));
    args.emplace_back("--val-tokens", std::to_string(val_file_->size()));
    return recorded_args_line(args);
  }

  // What an out-of-memory error adds: the flags that would lower this run's memory, from what it uses now.
  std::string memory_hint() const {
    const nn::ModelConfig& c = plan_.config;
    std::string hint = "to fit, lower --batch (--grad-accum keeps the step's batch)";
    if (c.recompute == nn::Recompute::none)
      hint += ", add --recompute selective (or block)";
    else if (c.recompute == nn::Recompute::selective)
      hint += c.recompute_blocks > 0 && c.recompute_blocks < c.num_layers
                  ? ", raise --recompute-blocks (now " + std::to_string(c.recompute_blocks) + " of " +
                        std::to_string(c.num_layers) + ") or use --recompute block"
                  : ", use --recompute block";
    else if (c.recompute_blocks > 0 && c.recompute_blocks < c.num_layers)
      hint += ", raise --recompute-blocks (now " + std::to_string(c.recompute_blocks) + " of " +
              std::to_string(c.num_layers) + ")";
    if (c.precision == nn::Precision::f32) hint += ", use --precision bf16";
    if (plan_.world > 1 && plan_.step.zero < 3)
      hint += ", or shard more with --zero " + std::to_string(plan_.step.zero + 1);
    else if (plan_.world == 1 && device_.is_cuda())
      hint += ", or spread the model over GPUs: mpirun with --zero 3";
    return hint;
  }

  void print_banner() {
    const nn::ModelConfig& config = plan_.config;
    entropy_ = unigram_entropy(*train_file_, config.vocab_size);
    peak_ = device_peak_flops(device_name(device_), config.precision == nn::Precision::bf16);
    if (!root_) return;
    // The preset's name, and the sizes given instead of its own.
    std::string model = flags_.str("preset");
    for (const char* name : {"d-model", "layers", "heads", "d-ff"})
      if (flags_.integer(name) > 0) model += std::string(" --") + name + " " + flags_.str(name);
    std::printf(
        "model %s: %lld parameters (d_model %lld, %lld layers, %lld heads, d_ff %lld, vocab %lld, ctx "
        "%lld)\n",
        model.c_str(), static_cast<long long>(params_->numel()), static_cast<long long>(config.d_model),
        static_cast<long long>(config.num_layers), static_cast<long long>(config.num_heads),
        static_cast<long long>(config.d_ff), static_cast<long long>(config.vocab_size),
        static_cast<long long>(plan_.ctx));
    std::printf("device %s (%s), precision %s%s, attention %s; data %s: %lld train / %lld val tokens\n",
                device_.str().c_str(), device_name(device_).c_str(), nn::precision_name(config.precision),
                plan_.grads_bf16 ? " (bf16 gradients)" : "", nn::attention_name(config.attention),
                data_dir_.c_str(), static_cast<long long>(train_file_->size()),
                static_cast<long long>(val_file_->size()));
    if (config.recompute != nn::Recompute::none) {
      int64_t whole = 0, selective = 0;
      for (int64_t i = 0; i < config.num_layers; ++i) {
        const nn::Recompute how = config.block_recompute(i);
        whole += how == nn::Recompute::block ? 1 : 0;
        selective += how == nn::Recompute::selective ? 1 : 0;
      }
      const char* kept = config.attention == nn::AttentionKind::flash ? "all but their matmuls and attention"
                                                                      : "all but their linear layers";
      const int64_t rest = config.num_layers - whole - selective;
      std::printf(
          "recomputation: of %lld blocks, %lld run again whole in backward, %lld selectively (%s)%s\n",
          static_cast<long long>(config.num_layers), static_cast<long long>(whole),
          static_cast<long long>(selective), kept,
          rest > 0 ? (", " + std::to_string(rest) + " keep everything").c_str() : "");
    }
    if (plan_.world > 1) {
      std::printf("data parallel: %d ranks, %s, global batch %lld sequences\n", plan_.world,
                  step_->describe().c_str(), static_cast<long long>(plan_.batch * plan_.accum * plan_.world));
    } else {
      std::printf("batch: %lld sequences of %lld tokens per step%s\n",
                  static_cast<long long>(plan_.batch * plan_.accum), static_cast<long long>(plan_.ctx),
                  plan_.accum > 1 ? (" (" + std::to_string(plan_.accum) + " micro-batches of " +
                                     std::to_string(plan_.batch) + ")")
                                        .c_str()
                                  : "");
    }
    if (plan_.world == 1 && plan_.step.zero > 0) {
      std::printf(
          "note: --zero %d in one process shards nothing (its one rank holds every shard); under "
          "mpirun each of N ranks holds 1/N\n",
          plan_.step.zero);
    }
    std::printf("update: %s\n", step_->update_path().c_str());
    if (device_.is_cuda()) {
      std::printf("matmuls: cuBLASLt, %s\n",
                  plan_.gemm_autotune > 1
                      ? ("the fastest of " + std::to_string(plan_.gemm_autotune) +
                         " candidate kernels per shape, timed in the first step (--gemm-autotune)")
                            .c_str()
                      : "its heuristic's first kernel per shape (--gemm-autotune 0: the same every run)");
    }
    if (!step_->graph_declined().empty())
      std::printf("note: --cuda-graph on: %s; the step runs kernel by kernel\n",
                  step_->graph_declined().c_str());
    std::printf("unigram entropy of the training data: %.4f nats/token (a model must beat this)\n", entropy_);
    std::printf("MFU peak: %s\n", peak_.flops_per_s > 0 ? peak_.description.c_str()
                                                        : "unknown for this device (MFU not shown)");
  }

  // The loop: a step, then its metrics line, an evaluation, a checkpoint, a stop, as they fall due.
  void loop() {
    const int64_t steps = plan_.steps, eval_every = flags_.integer("eval-every");
    const int64_t ckpt_every = flags_.integer("ckpt-every");
    const int64_t log_every = std::max<int64_t>(1, flags_.integer("log-every"));
    const double lr_max = flags_.number("lr-max"), lr_min = flags_.number("lr-min");
    const int64_t warmup = flags_.integer("warmup");
    const int64_t cosine_steps = flags_.integer("cosine-steps") > 0 ? flags_.integer("cosine-steps") : steps;
    if (root_ && warmup >= steps && steps == 1)
      std::printf(
          "note: a warm-up's first step has learning rate 0, so with --warmup %lld the one step of --steps 1 "
          "changes no weight; pass --warmup 0\n",
          static_cast<long long>(warmup));
    else if (root_ && warmup >= steps)
      std::printf(
          "note: --warmup %lld is not below --steps %lld: the learning rate rises all run, never reaching "
          "--lr-max or decaying; pass a shorter --warmup\n",
          static_cast<long long>(warmup), static_cast<long long>(steps));
    last_checkpoint_ = resume_;
    last_checkpoint_step_ = state_.step;
    const bool checkpoints = ckpt_every >= 0;
    if (!checkpoints && root_) folder_->commit(-1, keep_ckpts_);  // the folder is this run's
    if (resume_.empty() && checkpoints && !replaces_another_run_) save(0);

    bool plot_due = false;  // an evaluation since loss.svg was last written
    std::vector<LossPoint> train_curve, val_curve;
    if (root_)
      read_metrics(plan_.out + "/metrics.jsonl", resume_.empty() ? -1 : state_.step, train_curve, val_curve);
    const double flops_per_step = plan_.config.training_flops_per_sequence(plan_.ctx) *
                                  static_cast<double>(plan_.batch * plan_.accum * plan_.world);
    const double tokens_per_step = static_cast<double>(plan_.batch * plan_.accum * plan_.ctx * plan_.world);
    const std::string plot_title =
        "train " + flags_.str("preset") + " (" + std::to_string(params_->numel()) + " parameters)";
    progress_ = std::make_unique<Progress>(state_.step + 1, steps);
    loader_ = std::make_unique<BatchLoader>(*sampler_, state_.step * plan_.accum + 1, steps * plan_.accum);
    for (int64_t step = state_.step + 1; step <= steps; ++step) {
      const double t0 = now_seconds();
      const double lr = optim::cosine_lr(step - 1, lr_max, lr_min, warmup, cosine_steps);
      const StepResult result = run_step(step, lr);
      const double step_s = now_seconds() - t0;
      state_.tokens_seen += static_cast<int64_t>(tokens_per_step);
      const double tokens_per_s = tokens_per_step / step_s;
      const double mfu =
          peak_.flops_per_s > 0 ? flops_per_step / step_s / (peak_.flops_per_s * plan_.world) : NAN;

      const bool eval_now = (eval_every > 0 && step % eval_every == 0) || step == steps;
      double val = NAN;
      if (eval_now) {
        val = evaluate(*model_, *val_file_, plan_.batch, plan_.ctx, eval_batches_, device_, plan_.rank,
                       plan_.world);
        if (plan_.world > 1) val = dist::mean_over_ranks(val);
        if (!std::isfinite(val)) {
          progress_->finish();
          throw RunEnded(kExitDiverged, "the validation loss is not finite at step " + std::to_string(step) +
                                            " (last good checkpoint: " +
                                            (last_checkpoint_.empty() ? "none" : last_checkpoint_) + ")");
        }
        last_val_ = val;
        val_curve.push_back({step, val});
      }
      train_curve.push_back({step, result.loss});
      if (root_) {
        std::vector<std::pair<std::string, std::string>> fields = {
            {"step", std::to_string(step)},
            {"loss", JsonlWriter::number(result.loss)},
            {"lr", JsonlWriter::number(lr)},
            {"grad_norm", JsonlWriter::number(result.grad_norm)},
            {"tokens_per_s", JsonlWriter::number(tokens_per_s)},
            {"step_ms", JsonlWriter::number(step_s * 1e3)},
            {"mfu", JsonlWriter::number(mfu)},
            {"tokens_seen", std::to_string(state_.tokens_seen)}};
        if (device_.is_cuda()) {
          fields.emplace_back(
              "peak_mib",
              JsonlWriter::number(static_cast<double>(memory_stats(device_).peak_bytes) / (1 << 20)));
        }
        if (std::isfinite(result.gpu_ms)) fields.emplace_back("gpu_ms", JsonlWriter::number(result.gpu_ms));
        if (eval_now) fields.emplace_back("val_loss", JsonlWriter::number(val));
        folder_->append_metrics(JsonlWriter::object(fields));
        char line[320];
        std::snprintf(
            line, sizeof(line),
            "step %5lld/%lld | loss %.4f%s | lr %.2e | grad norm %.3f | %.0f tok/s | %.1f ms%s",
            static_cast<long long>(step), static_cast<long long>(steps), result.loss,
            eval_now ? (" | val " + format_fixed(val, 4)).c_str() : "", lr, result.grad_norm, tokens_per_s,
            step_s * 1e3,
            std::isfinite(mfu) ? (" | MFU " + std::to_string(mfu * 100).substr(0, 5) + "%").c_str() : "");
        if (step % log_every == 0 || eval_now || step == state_.step + 1) progress_->update(step, line);
        if (eval_now) {
          end_progress_line();  // the validation line stays on the terminal
          plot_due = true;
        }
      }
      const bool save_now = checkpoints && ((ckpt_every > 0 && step % ckpt_every == 0) || step == steps);
      if (result.stop_requested && root_ && plan_.world > 1) {
        end_progress_line();
        std::printf("stop requested (%s): writing a checkpoint after step %lld\n", signal_name(stop_signal()),
                    static_cast<long long>(step));
        std::fflush(stdout);
      }
      if (save_now || result.stop_requested) save(step);
      // A stop requested during this step's evaluation or scheduled checkpoint stops at that checkpoint,
      // not after one more step and a second write. Every rank agrees, as on the step's own request.
      bool stop = result.stop_requested;
      if (!stop && save_now && step < steps) {
        stop = stop_signal() != 0;
        if (plan_.world > 1) stop = dist::mean_over_ranks(stop ? 1.0 : 0.0) > 0;
      }
      // The plot of a run replacing another waits for its first checkpoint: until then loss.svg is the
      // other run's, which the folder keeps whole.
      if (root_ && plot_due && folder_->holds_this_run()) {
        write_loss_svg(plan_.out + "/loss.svg", train_curve, val_curve, plot_title, entropy_,
                       "unigram entropy " + format_entropy(entropy_));
        plot_due = false;
      }
      if (stop && step < steps) {
        progress_->finish();
        throw RunEnded(kExitStopped, std::string("got ") + signal_name(stop_signal()) + " after step " +
                                         std::to_string(step) + "; checkpoint " + last_checkpoint_ +
                                         " written; continue with --resume latest");
      }
    }
  }

  // Final outputs: the summary line and a text sample (rank 0).
  int final_outputs() {
    finishing_outputs();  // the last checkpoint is written: a signal now cuts the sample short, exit 0
    // Collective under ZeRO-2 (the last update's gathers): every rank, before rank 0 samples alone.
    step_->settle();
    if (!root_) return 0;
    progress_->finish();
    // With --ckpt-every -1 the newest checkpoint may be the resumed one, older than the final weights.
    std::string checkpoint = last_checkpoint_.empty() ? "none (--ckpt-every -1)" : last_checkpoint_;
    if (!last_checkpoint_.empty() && last_checkpoint_step_ < plan_.steps) {
      checkpoint += " of step " + std::to_string(last_checkpoint_step_) + " (--ckpt-every -1: steps " +
                    std::to_string(last_checkpoint_step_ + 1) + " to " + std::to_string(plan_.steps) +
                    " are not saved)";
    }
    std::printf("done: final validation loss %.4f (unigram entropy %.4f); checkpoint %s\n", last_val_,
                entropy_, checkpoint.c_str());
    const int64_t sample_tokens = flags_.integer("sample-tokens");
    bool wrote_sample = false;
    if (sample_tokens > 0 && plan_.step.zero == 3) {
      // Generation runs on this rank alone and needs every weight here.
      std::printf("no text sample with --zero 3 (the weights are sharded): run generate on %s\n",
                  last_checkpoint_.empty() ? "a checkpoint" : last_checkpoint_.c_str());
    } else if (sample_tokens > 0 && stop_signal() != 0) {
      // Asked to stop during the last step or evaluation: a sample cut at its first token says nothing.
      std::printf("no text sample: %s came before it; generate --checkpoint %s writes one\n",
                  signal_name(stop_signal()),
                  last_checkpoint_.empty() ? "CHECKPOINT" : last_checkpoint_.c_str());
    } else if (sample_tokens > 0) {
      std::unique_ptr<Tokenizer> tokenizer;
      try {
        tokenizer = load_data_tokenizer(data_dir_);
      } catch (const Error& e) {
        std::printf("no text sample: %s\n", e.what());
      }
      if (tokenizer) {
        SamplingOptions sampling;
        sampling.max_tokens = sample_tokens;
        sampling.top_k = flags_.integer("top-k");
        sampling.seed = plan_.seed;
        sampling.stop_at_end_of_text = false;  // a sample may run across documents
        sampling.stop = [] { return stop_signal() != 0; };
        step_->settle();
        const std::string text = generate_text(*model_, *tokenizer, flags_.str("prompt"), sampling, device_);
        write_file_atomically(plan_.out + "/sample.txt", text + "\n");
        std::printf("sample (%s/sample.txt):\n----\n%s\n----\n", plan_.out.c_str(), text.c_str());
        wrote_sample = true;
      }
    }
    std::printf("outputs: %s/metrics.jsonl, %s/loss.svg%s%s\n", plan_.out.c_str(), plan_.out.c_str(),
                last_checkpoint_.empty() ? "" : (", " + plan_.out + "/checkpoints/").c_str(),
                wrote_sample ? (", " + plan_.out + "/sample.txt").c_str() : "");
    return 0;
  }

 private:
  StepResult run_step(int64_t step, double lr) {
    try {
      return step_->run([&](int64_t micro) { return loader_->next((step - 1) * plan_.accum + micro + 1); },
                        lr, stop_signal() != 0, step);
    } catch (const RunEnded& e) {
      progress_->finish();
      throw RunEnded(e.exit_code(), std::string(e.what()) + " (last good checkpoint: " +
                                        (last_checkpoint_.empty() ? "none" : last_checkpoint_) + ")");
    } catch (const std::exception&) {
      // A new run that fails in its first step (a batch too large for memory, say) leaves nothing behind:
      // its step_0 holds nothing the seed cannot recreate, and the corrected rerun must not be refused.
      if (root_ && resume_.empty() && step == 1) folder_->discard_new_run();
      throw;
    }
  }

  void save(int64_t step) {
    step_->settle();
    state_.step = step;
    // The loader draws ahead: what the checkpoint records is the position after the batches trained on.
    state_.rng_counter = loader_ ? loader_->consumed_rng_counter() : sampler_->rng().counter;
    const std::string path = checkpoint_file(plan_.out, step);
    // A large model's checkpoint takes minutes (12 bytes per parameter, written then read back): say so
    // before the terminal goes quiet, the start point's (step 0) included.
    const double expected_gb = 12.0 * static_cast<double>(params_->numel()) / 1e9;
    const bool large = expected_gb > 4;
    if (root_ && large) {
      end_progress_line();
      std::printf("writing checkpoint %s (about %.0f GB)...\n", path.c_str(), expected_gb);
      std::fflush(stdout);
    }
    const double t0 = now_seconds();
    double verify_s = 0;
    // Verified before it takes its name: a kill during the read-back leaves no step_N.h5 beside the
    // checkpoints commit() would have replaced. Nothing older goes before this one is known to load.
    save_checkpoint(path, plan_.config, *params_, &step_->optimizer_state(), state_, root_,
                    [&](const std::string& written) {
                      const double v0 = now_seconds();
                      verify_checkpoint(written);
                      verify_s = now_seconds() - v0;
                    });
    if (root_) {
      const double written_s = now_seconds() - t0 - verify_s;
      for (const std::string& kept : folder_->commit(step, keep_ckpts_)) {
        if (!noted_kept_.insert(kept).second) continue;
        end_progress_line();
        std::printf(
            "note: %s is being read by another program, so it stays past --keep-ckpts; a later "
            "checkpoint of this run removes it once it is free (or remove it yourself)\n",
            kept.c_str());
      }
      if (step > 0 || large) {
        const double bytes = static_cast<double>(fs::file_size(path));
        end_progress_line();
        std::printf("checkpoint %s: %s written in %s (%s), verified in %s\n", path.c_str(),
                    format_bytes(bytes).c_str(), format_seconds(written_s).c_str(),
                    format_rate(bytes, written_s).c_str(), format_seconds(verify_s).c_str());
      }
    }
    // Every rank waits here for rank 0's verification (it re-reads the whole file), under the MPI watchdog,
    // rather than inside the next step's first NCCL collective, whose shorter timeout would count it.
    if (plan_.world > 1) dist::barrier();
    last_checkpoint_ = path;
    last_checkpoint_step_ = step;
  }

  const Flags& flags_;
  const Device device_;
  const std::string data_dir_;
  bool complete_ = false;              // --resume latest found the run ended: nothing to do
  std::set<std::string> noted_kept_;   // checkpoints left for a reader, each said once
  bool replaces_another_run_ = false;  // RunFolder::replaces_another_run: no step 0 is written
  dist::DistRuntime* const runtime_;
  RunPlan plan_;
  bool root_ = true;
  std::unique_ptr<TokenFile> train_file_, val_file_;
  int64_t eval_batches_ = 0;
  int64_t keep_ckpts_ = flags_.integer("keep-ckpts");  // the resumed run's when not given
  std::unique_ptr<RunFolder> folder_;
  std::string resume_, init_from_, last_checkpoint_;
  std::unique_ptr<CheckpointReadLock> start_lock_;  // rank 0, on the start point until it is loaded
  int64_t last_checkpoint_step_ = 0;
  // Declared before the step, which is destroyed first (it detaches itself from the model).
  std::unique_ptr<nn::TransformerLM> model_;
  std::unique_ptr<nn::FlatParameters> params_;
  std::unique_ptr<TrainStep> step_;
  std::unique_ptr<BatchSampler> sampler_;
  std::unique_ptr<BatchLoader> loader_;  // draws from sampler_ from the first step on
  TrainState state_;
  double entropy_ = 0, last_val_ = NAN;
  PeakFlops peak_;
  std::unique_ptr<Progress> progress_;
};

}  // namespace

void check_on_every_rank(dist::DistRuntime* runtime, const std::function<void()>& checks) {
  if (!runtime || runtime->world_size() == 1) return checks();
  std::string problem;
  try {
    checks();
  } catch (const std::exception& e) {
    problem = problem_text(e);
  }
  dist::raise_if_any_rank_failed(*runtime, problem);
}

int run_training(const Flags& flags, Device device, const std::string& data_dir, dist::DistRuntime* runtime) {
  TrainingRun run(flags, device, data_dir, runtime);
  try {
    {
      const StartUp start_up;
      run.set_up();
      run.open_run_folder();
      run.build_model();
    }
    if (run.complete()) return 0;
    run.print_banner();
    run.loop();
    return run.final_outputs();
  } catch (const OutOfMemory& e) {
    throw OutOfMemory(std::string(e.what()) + "; " + run.memory_hint());
  }
}

}  // namespace tt::app
