#include "apps/lib/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "apps/lib/checkpoint.h"
#include "apps/lib/report.h"
#include "apps/lib/run_setup.h"
#include "core/autograd.h"
#include "core/cuda_context.h"
#include "core/ops.h"
#include "dist/data_parallel.h"
#include "dist/shard_collectives.h"
#include "optim/optimizer.h"

namespace tt::app {

namespace fs = std::filesystem;

void declare_train_flags(Flags& f) {
  declare_model_flags(f);
  f.add(
      "data", "",
      "folder with train.bin, val.bin (and meta.json); default: the built-in corpus, prepared on first use");
  f.add("out", "runs/tiny", "output folder: metrics.jsonl, loss.svg, checkpoints/, sample.txt");
  f.add("steps", "2000", "optimizer steps to train (total, also when resuming)");
  f.add("batch", "16", "sequences per micro-batch (per rank)");
  f.add("grad-accum", "1", "micro-batches accumulated per optimizer step");
  f.add("lr-max", "3e-3", "peak learning rate");
  f.add("lr-min", "3e-4", "final learning rate of the cosine schedule");
  f.add("warmup", "50", "linear warm-up steps");
  f.add("cosine-steps", "0", "step at which the cosine schedule reaches lr-min (0: --steps)");
  f.add("weight-decay", "0.1", "AdamW weight decay");
  f.add("beta1", "0.9", "AdamW beta1");
  f.add("beta2", "0.95", "AdamW beta2");
  f.add("clip", "1.0", "global gradient-norm clip (0: off)");
  f.add("seed", "1", "seed for initialisation and data sampling");
  f.add("sampling", "random", "random | sequential batches");
  f.add("eval-every", "200", "evaluate on val.bin every N steps (0: only at the end)");
  f.add("eval-batches", "20", "batches per evaluation (the first eval-batches*batch windows of val.bin)");
  f.add("ckpt-every", "500", "write a checkpoint every N steps; step 0 is written too (0: only at the end)");
  f.add("keep-ckpts", "3", "checkpoints to keep (0: all)");
  f.add("log-every", "10", "print a progress line every N steps");
  f.add("ddp", "bucketed", "data-parallel strategy under mpirun: naive | flat | overlap | bucketed");
  f.add("bucket-mb", "25", "gradient bucket capacity in MiB (2^20 bytes) for --ddp bucketed");
  f.add("grad-dtype", "f32",
        "dtype of the gradient buffer: f32 | bf16 (with --precision bf16: weight gradients rounded to bf16 "
        "once, as PyTorch's autocast rounds them; half the bytes to write, read and all-reduce; with "
        "--grad-accum each further micro-batch is added in f32 and rounded again)");
  f.add("grad-comm-dtype", "f32",
        "dtype gradients travel in under mpirun: f32 (exact average) | bf16 (half the bytes; each gradient "
        "rounded to bf16 before and after the average)");
  f.add("all-reduce", "auto",
        "how the DDP all-reduce moves gradients: library (NCCL on GPUs, MPI on CPU) | copy-engine (2 to 8 "
        "ranks, all on one host, with peer-to-peer GPUs: DMA copies and one add kernel instead of NCCL's "
        "kernels) | auto (copy-engine for 2 ranks on one host where it works, else library)");
  f.add("zero", "0", "1: shard the AdamW state across ranks (ZeRO-1); checkpoints load at any world size");
  f.add("gemm-sm-margin", "0",
        "SMs to keep free of matmuls (CUDA), so the gradient all-reduce's kernels overlap backward without "
        "waiting for SMs; 0: matmuls use the whole GPU");
  f.add("zero-grads", "reduce-scatter",
        "with --zero 1, how gradients are averaged: reduce-scatter (after backward, half the bytes of an "
        "all-reduce) | ddp (the --ddp strategy's all-reduce, overlapped with backward when bucketed)");
  f.add_switch("overwrite", "replace the checkpoints of an earlier run in --out (otherwise refused)");
  f.add("resume", "", "checkpoint to resume from (or, with --eval-only, to evaluate)");
  f.add_switch("eval-only", "evaluate --resume on val.bin and exit (prints and writes the mean loss)");
  f.add("json", "", "with --eval-only: write the result as JSON to this file");
  f.add("sample-tokens", "300", "tokens of text to generate at the end (0: none)");
  f.add("top-k", "10", "sample from the k most likely tokens (1: greedy)");
  f.add("prompt", "The ", "text the final sample starts from");
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
                int64_t batches, Device device) {
  NoGradGuard no_grad;
  double total = 0;
  for (int64_t i = 0; i < batches; ++i) {
    const Batch b = eval_batch(val, batch, ctx, i * batch);
    const Tensor x = Tensor::from_ints(b.inputs, {batch, ctx}, device);
    const Tensor y = Tensor::from_ints(b.targets, {batch, ctx}, device);
    total += model.loss(x, y).item();
  }
  return total / static_cast<double>(batches);
}

std::string generate(const nn::TransformerLM& model, const std::string& prompt, int64_t tokens, int64_t top_k,
                     uint64_t seed, Device device) {
  NoGradGuard no_grad;
  std::vector<int32_t> ids;
  for (unsigned char c : prompt) ids.push_back(c);
  if (ids.empty()) ids.push_back(kEndOfText);
  const int64_t vocab = model.config().vocab_size, ctx = model.config().context_length;
  CounterRng rng{seed ^ 0x5eed5eedULL, 0};
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(ids.size()) - ctx);
    const std::vector<int32_t> window(ids.begin() + start, ids.end());
    const Tensor x = Tensor::from_ints(window, {1, static_cast<int64_t>(window.size())}, device);
    const Tensor logits = model.forward(x);
    const std::vector<float> all = logits.to_floats();
    const float* last = all.data() + (window.size() - 1) * vocab;
    std::vector<int32_t> order(static_cast<size_t>(vocab));
    for (int32_t i = 0; i < vocab; ++i) order[i] = i;
    const int64_t k = std::clamp<int64_t>(top_k, 1, vocab);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return last[a] > last[b]; });
    std::vector<double> weights(static_cast<size_t>(k));
    double sum = 0;
    for (int64_t i = 0; i < k; ++i)
      sum += weights[i] = std::exp(static_cast<double>(last[order[i]] - last[order[0]]));
    double u = rng.next_double() * sum;
    int32_t chosen = order[0];
    for (int64_t i = 0; i < k; ++i) {
      if ((u -= weights[i]) <= 0) {
        chosen = order[i];
        break;
      }
    }
    ids.push_back(chosen);
  }
  return decode_bytes(ids);
}

namespace {

// The value of `--name` in a flags summary line ("--a 1 --b x ..."), or "" when absent.
std::string flag_value(const std::string& summary, const std::string& name) {
  std::istringstream in(summary);
  std::string token;
  while (in >> token) {
    if (token == "--" + name) {
      std::string value;
      in >> value;
      return value.rfind("--", 0) == 0 ? "" : value;
    }
  }
  return "";
}

// A resumed run reproduces the uninterrupted one only with the same learning-rate schedule; say so.
void warn_if_schedule_differs(const std::string& written_by, const Flags& flags) {
  if (written_by.empty()) return;
  auto effective_cosine = [](const std::string& cosine, const std::string& steps) {
    return cosine.empty() || cosine == "0" ? steps : cosine;
  };
  const std::string old_end =
      effective_cosine(flag_value(written_by, "cosine-steps"), flag_value(written_by, "steps"));
  const std::string new_end = effective_cosine(flags.str("cosine-steps"), flags.str("steps"));
  std::string differs;
  if (old_end != new_end) differs += " cosine end " + old_end + " -> " + new_end + ";";
  for (const char* name : {"warmup", "lr-max", "lr-min"}) {
    const std::string before = flag_value(written_by, name);
    if (!before.empty() && before != flags.str(name))
      differs += std::string(" --") + name + " " + before + " -> " + flags.str(name) + ";";
  }
  if (!differs.empty()) {
    std::printf(
        "note: the learning-rate schedule differs from the run that wrote the checkpoint (%s), so the "
        "losses will not match an uninterrupted run; pass --cosine-steps %s to keep its schedule\n",
        differs.c_str(), old_end.c_str());
  }
}

bool has_checkpoints(const std::string& dir) {
  if (!fs::exists(dir)) return false;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step_", 0) == 0 && entry.path().extension() == ".h5") return true;
  }
  return false;
}

// Deletes step_N.h5 files with N > step (all of them for step < 0).
void remove_checkpoints_after(const std::string& dir, int64_t step) {
  if (!fs::exists(dir)) return;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step_", 0) != 0 || entry.path().extension() != ".h5") continue;
    try {
      if (std::stoll(name.substr(5)) > step) fs::remove(entry.path());
    } catch (const std::exception&) {
    }
  }
}

std::string format_entropy(double nats) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f", nats);
  return buf;
}

std::string checkpoint_path(const std::string& out, int64_t step) {
  return out + "/checkpoints/step_" + std::to_string(step) + ".h5";
}

// Keeps the metrics of steps <= `step` (a resumed run rewrites what came after its checkpoint).
void truncate_metrics(const std::string& path, int64_t step) {
  if (!fs::exists(path)) return;
  std::ifstream in(path);
  std::vector<std::string> kept;
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find("\"step\": ");
    if (at == std::string::npos) continue;
    int64_t line_step = 0;
    try {
      line_step = std::stoll(line.substr(at + 8));
    } catch (const std::exception&) {
      throw Error("cannot read the step of a line of " + path + ": '" + line.substr(0, 60) + "'");
    }
    if (line_step <= step) kept.push_back(line);
  }
  in.close();
  std::ofstream out(path, std::ios::trunc);
  for (const std::string& l : kept) out << l << "\n";
}

// The numbers the optimizer, schedule and logging take, checked before anything runs.
void check_training_numbers(const Flags& flags) {
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
  for (const char* name :
       {"warmup", "cosine-steps", "eval-every", "ckpt-every", "keep-ckpts", "sample-tokens"})
    TT_CHECK(flags.integer(name) >= 0, std::string("--") + name + " must be >= 0, got " + flags.str(name));
  for (const char* name : {"eval-batches", "log-every", "top-k"})
    TT_CHECK(flags.integer(name) >= 1, std::string("--") + name + " must be >= 1, got " + flags.str(name));
  TT_CHECK(flags.str("json").empty() || flags.boolean("eval-only"),
           "--json writes the result of --eval-only; training writes metrics.jsonl in --out");
}

}  // namespace

int run_training(const Flags& flags, Device device, const std::string& data_dir, dist::DistRuntime* runtime) {
  const int rank = runtime ? runtime->rank() : 0, world = runtime ? runtime->world_size() : 1;
  const bool root = rank == 0;
  const int64_t data_vocab = read_vocab_size(data_dir);
  nn::ModelConfig config = model_config_from_flags(flags, device, data_vocab);
  const std::string out = flags.str("out");
  const int64_t steps = flags.integer("steps"), batch = flags.integer("batch"),
                accum = flags.integer("grad-accum");
  const int64_t ctx = config.context_length, zero = flags.integer("zero");
  TT_CHECK(steps > 0, "--steps must be positive");
  TT_CHECK(batch > 0 && accum > 0, "--batch and --grad-accum must be positive");
  check_training_numbers(flags);
  TT_CHECK(!out.empty(), "--out must name a folder");
  TT_CHECK(zero == 0 || zero == 1, "--zero must be 0 or 1");
  const std::string zero_grads = flags.str("zero-grads");
  const std::string grad_comm = flags.str("grad-comm-dtype");
  TT_CHECK(grad_comm == "f32" || grad_comm == "bf16",
           "--grad-comm-dtype must be f32 or bf16, got '" + grad_comm + "'");
  TT_CHECK(grad_comm == "f32" || !zero || zero_grads == "ddp",
           "--grad-comm-dtype bf16 applies to the DDP all-reduce; with --zero 1 use --zero-grads ddp");
  const bool grad_comm_bf16 = grad_comm == "bf16";
  const bool grads_bf16 =
      grads_bf16_from_flags(flags, config.precision == nn::Precision::bf16, grad_comm_bf16);
  TT_CHECK(zero_grads == "reduce-scatter" || zero_grads == "ddp",
           "--zero-grads must be reduce-scatter or ddp, got '" + zero_grads + "'");
  // Checked in a single process too, so that a launch script's flags fail on one machine before many.
  dist::parse_ddp_strategy(flags.str("ddp"));
  TT_CHECK(std::isfinite(flags.number("bucket-mb")) && flags.number("bucket-mb") > 0,
           "--bucket-mb must be positive, got " + flags.str("bucket-mb"));
  const TokenFile train_file(data_dir + "/train.bin", config.vocab_size);
  const TokenFile val_file(data_dir + "/val.bin", config.vocab_size);
  check_context_fits(val_file, ctx);  // now, not at the first evaluation
  const Sampling sampling = parse_sampling(flags.str("sampling"));
  const uint64_t seed = static_cast<uint64_t>(flags.integer("seed"));

  // Every rank builds the same initial model from the seed (rank 0's is broadcast as well, below).
  nn::TransformerLM model(config);
  nn::FlatParameters params(model, device, seed, DType::f32, zero ? world : 1);
  if (grads_bf16) params.set_grad_dtype(DType::bf16);
  optim::AdamWOptions adam;
  adam.lr = flags.number("lr-max");
  adam.beta1 = flags.number("beta1");
  adam.beta2 = flags.number("beta2");
  adam.weight_decay = flags.number("weight-decay");
  std::unique_ptr<dist::Communicator> comm;
  std::unique_ptr<dist::DataParallel> ddp;
  std::unique_ptr<optim::ShardCollectives> collectives;
  std::unique_ptr<optim::AdamW> adamw;
  std::unique_ptr<optim::ShardedOptimizer> sharded;
  const int64_t sm_margin = flags.integer("gemm-sm-margin");
  TT_CHECK(sm_margin >= 0, "--gemm-sm-margin must be >= 0");
  set_matmul_sm_margin(static_cast<int>(sm_margin));
  const std::string transport_text = flags.str("all-reduce");
  dist::check_all_reduce_flag(transport_text);  // before any rank starts communicating
  if (world > 1) {
    comm = dist::make_communicator(device, *runtime);
    // Only DDP all-reduces gradients; ZeRO's reduce-scatter has nothing for the copy engine to carry.
    const bool ddp_all_reduce = !zero || zero_grads == "ddp";
    const std::string note =
        dist::select_all_reduce_transport(*comm, transport_text, *runtime, ddp_all_reduce);
    if (root && !note.empty()) std::fprintf(stderr, "note: %s\n", note.c_str());
  }
  if (zero) {
    TT_CHECK(comm != nullptr || world == 1, "--zero 1 needs a communicator");
    collectives = comm ? dist::shard_collectives(*comm) : dist::single_process_collectives();
    if (comm) comm->broadcast(params.flat_params(), 0);
    sharded = std::make_unique<optim::ShardedOptimizer>(params, *collectives, adam);
  } else {
    adamw = std::make_unique<optim::AdamW>(std::vector<Tensor>{params.flat_params()}, adam);
  }
  // Gradients are averaged by a DDP strategy, unless ZeRO reduce-scatters them itself.
  if (comm && (!zero || zero_grads == "ddp")) {
    ddp = std::make_unique<dist::DataParallel>(params, *comm, dist::parse_ddp_strategy(flags.str("ddp")),
                                               flags.number("bucket-mb"), grad_comm_bf16);
  }
  std::unique_ptr<OptimizerState> opt_state = zero ? optimizer_state(*sharded) : optimizer_state(*adamw);
  auto set_lr = [&](double lr) { zero ? sharded->set_lr(lr) : adamw->set_lr(lr); };
  // Each rank draws its own batches: the stream is seeded by (seed, rank).
  BatchSampler sampler(train_file, batch, ctx, sampling,
                       (seed * 0x9E3779B97F4A7C15ULL + 1) ^ (uint64_t(rank) << 48), rank, world);
  auto global_mean = [&](double local) {
    if (!comm) return local;
    Tensor t = Tensor::from_floats({static_cast<float>(local)}, {1}, device);
    comm->all_reduce(t, dist::ReduceOp::avg);
    return t.item();
  };

  TrainState state;
  state.rng_seed = sampler.rng().seed;
  state.args = flags.summary_line();
  const std::string resume = flags.str("resume");
  if (!resume.empty()) {
    load_checkpoint(resume, params, opt_state.get(), &state);
    const std::string written_by = state.args;
    state.args = flags.summary_line();  // later checkpoints record this run's flags
    // Each rank keeps its own seed; the draw count is the same on every rank.
    sampler.rng().counter = state.rng_counter;
    // Before anything in --out changes: a run with nothing to do must not cut its folder back.
    TT_CHECK(state.step < steps, "nothing to do: the checkpoint is at step " + std::to_string(state.step) +
                                     " and --steps is " + std::to_string(steps));
    if (root) {
      std::printf("resumed from %s at step %lld\n", resume.c_str(), static_cast<long long>(state.step));
      warn_if_schedule_differs(written_by, flags);
      // The folder the checkpoint really lies in (links resolved) against --out's checkpoints folder.
      std::error_code ec;
      const fs::path from = fs::weakly_canonical(fs::absolute(resume), ec).parent_path();
      const bool own = !ec && fs::equivalent(from, out + "/checkpoints", ec) && !ec;
      if (own) {
        // What came after the checkpoint in this folder belongs to a future this run replaces.
        truncate_metrics(out + "/metrics.jsonl", state.step);
        remove_checkpoints_after(out + "/checkpoints", state.step);
      } else {
        // A checkpoint from another folder: this folder's checkpoints and metrics belong to another run.
        if (has_checkpoints(out + "/checkpoints")) {
          TT_CHECK(flags.boolean("overwrite"),
                   out + "/checkpoints already holds checkpoints of another run than " + resume +
                       "; pass a new --out, or --overwrite to replace them");
          remove_checkpoints_after(out + "/checkpoints", -1);
        }
        std::remove((out + "/metrics.jsonl").c_str());
      }
    }
  } else if (root) {
    if (has_checkpoints(out + "/checkpoints")) {
      TT_CHECK(flags.boolean("overwrite"),
               out +
                   "/checkpoints already holds checkpoints of another run; pass --resume "
                   "to continue it, a new --out, or --overwrite to replace them");
      remove_checkpoints_after(out + "/checkpoints", -1);
    }
    std::remove((out + "/metrics.jsonl").c_str());
  }
  // Only now, so that a refused run leaves no new folder behind.
  if (root) fs::create_directories(out + "/checkpoints");

  const double entropy = unigram_entropy(train_file, config.vocab_size);
  const PeakFlops peak = device_peak_flops(device_name(device), config.precision == nn::Precision::bf16);
  if (root) {
    std::printf(
        "model %s: %lld parameters (d_model %lld, %lld layers, %lld heads, d_ff %lld, vocab %lld, ctx "
        "%lld)\n",
        flags.str("preset").c_str(), static_cast<long long>(params.numel()),
        static_cast<long long>(config.d_model), static_cast<long long>(config.num_layers),
        static_cast<long long>(config.num_heads), static_cast<long long>(config.d_ff),
        static_cast<long long>(config.vocab_size), static_cast<long long>(ctx));
    std::printf("device %s (%s), precision %s%s, attention %s; data %s: %lld train / %lld val tokens\n",
                device.str().c_str(), device_name(device).c_str(), nn::precision_name(config.precision),
                grads_bf16 ? " (bf16 gradients)" : "", nn::attention_name(config.attention), data_dir.c_str(),
                static_cast<long long>(train_file.size()), static_cast<long long>(val_file.size()));
    if (world > 1) {
      std::printf("data parallel: %d ranks, %s, all-reduce by %s, global batch %lld sequences\n", world,
                  zero ? "ZeRO-1 (sharded AdamW state)" : (std::string("DDP ") + flags.str("ddp")).c_str(),
                  comm->all_reduce_transport() == dist::AllReduceTransport::library
                      ? comm->backend()
                      : dist::all_reduce_transport_name(comm->all_reduce_transport()),
                  static_cast<long long>(batch * accum * world));
    }
    std::printf("unigram entropy of the training data: %.4f nats/token (a model must beat this)\n", entropy);
    std::printf("MFU peak: %s\n",
                peak.flops_per_s > 0 ? peak.description.c_str() : "unknown for this device (MFU not shown)");
  }

  const int64_t eval_every = flags.integer("eval-every"), ckpt_every = flags.integer("ckpt-every");
  const int64_t eval_batches = flags.integer("eval-batches");
  const int64_t log_every = std::max<int64_t>(1, flags.integer("log-every"));
  const int64_t keep = flags.integer("keep-ckpts");
  const double clip = flags.number("clip"), lr_max = flags.number("lr-max"), lr_min = flags.number("lr-min");
  const int64_t warmup = flags.integer("warmup");
  const int64_t cosine_steps = flags.integer("cosine-steps") > 0 ? flags.integer("cosine-steps") : steps;
  std::string last_checkpoint = resume;
  auto save = [&](int64_t step) {
    state.step = step;
    state.rng_counter = sampler.rng().counter;
    const std::string path = checkpoint_path(out, step);
    save_checkpoint(path, config, params, opt_state.get(), state, root);
    if (root) prune_checkpoints(out + "/checkpoints", keep, step);
    last_checkpoint = path;
  };
  if (resume.empty()) save(0);

  std::vector<LossPoint> train_curve, val_curve;
  std::unique_ptr<JsonlWriter> metrics;
  if (root) {
    read_metrics(out + "/metrics.jsonl", state.step, train_curve, val_curve);
    metrics = std::make_unique<JsonlWriter>(out + "/metrics.jsonl", true);
  }
  const double flops_per_step =
      config.training_flops_per_sequence(ctx) * static_cast<double>(batch * accum * world);
  const double tokens_per_step = static_cast<double>(batch * accum * ctx * world);
  // bf16 with one AdamW over the flat buffer: the matmuls read a bf16 copy of the weights that AdamW writes
  // with each update, instead of casting every weight in every forward. From here on only that AdamW changes
  // the parameters (loading and the DDP broadcast are done), so the copy stays current.
  if (config.precision == nn::Precision::bf16 && adamw) {
    params.enable_bf16_mirror();
    adamw->write_bf16_mirror(&params);
  }
  // bf16 gradients on the GPU are clipped by AdamW itself: the norm and the factor are computed on the device
  // and the update scales each gradient in f32 as it reads it (no second rounding, no extra pass).
  Tensor clip_norm, clip_factor;
  if (grads_bf16 && device.is_cuda() && adamw) {
    clip_norm = Tensor::zeros({1}, DType::f32, device);
    clip_factor = Tensor::zeros({1}, DType::f32, device);
    adamw->set_grad_scale(clip_factor);
  }
  Progress progress(state.step + 1, steps);
  double last_val = NAN;
  for (int64_t step = state.step + 1; step <= steps; ++step) {
    const double t0 = now_seconds();
    const double lr = optim::cosine_lr(step - 1, lr_max, lr_min, warmup, cosine_steps);
    set_lr(lr);
    params.zero_grad();
    double loss_sum = 0;
    for (int64_t micro = 0; micro < accum; ++micro) {
      const Batch b = sampler.next((step - 1) * accum + micro + 1);
      const Tensor x = Tensor::from_ints(b.inputs, {batch, ctx}, device);
      const Tensor y = Tensor::from_ints(b.targets, {batch, ctx}, device);
      const Tensor loss = model.loss(x, y);
      if (ddp) {
        ddp->set_sync(micro == accum - 1);  // only the last micro-batch communicates
        ddp->begin_backward();
      }
      (accum == 1 ? loss : ops::scale(loss, 1.0 / static_cast<double>(accum))).backward();
      if (ddp) ddp->finish_backward();
      loss_sum += loss.item();
    }
    const double loss = global_mean(loss_sum / static_cast<double>(accum));
    if (!std::isfinite(loss)) {
      progress.finish();
      throw Error("loss is " + std::string(std::isnan(loss) ? "NaN" : "infinite") + " at step " +
                  std::to_string(step) + "; stopping (last good checkpoint: " +
                  (last_checkpoint.empty() ? "none" : last_checkpoint) + ")");
    }
    double grad_norm = 0;
    if (zero) {
      grad_norm = sharded->step(clip, ddp != nullptr);
    } else if (clip_factor.defined()) {
      optim::clip_factor_on_device(params.flat_grads(), clip, clip_norm, clip_factor);
      adamw->step();
      grad_norm = clip_norm.item();
    } else {
      grad_norm = optim::clip_grad_norm({params.flat_grads()}, clip);
      adamw->step();
    }
    synchronize(device);
    const double step_s = now_seconds() - t0;
    state.tokens_seen += static_cast<int64_t>(tokens_per_step);
    const double tokens_per_s = tokens_per_step / step_s;
    const double mfu = peak.flops_per_s > 0 ? flops_per_step / step_s / (peak.flops_per_s * world) : NAN;

    const bool eval_now = (eval_every > 0 && step % eval_every == 0) || step == steps;
    double val = NAN;
    if (eval_now) {
      val = evaluate(model, val_file, batch, ctx, eval_batches, device);
      last_val = val;
      val_curve.push_back({step, val});
    }
    train_curve.push_back({step, loss});
    if (root) {
      std::vector<std::pair<std::string, std::string>> fields = {
          {"step", std::to_string(step)},
          {"loss", JsonlWriter::number(loss)},
          {"lr", JsonlWriter::number(lr)},
          {"grad_norm", JsonlWriter::number(grad_norm)},
          {"tokens_per_s", JsonlWriter::number(tokens_per_s)},
          {"step_ms", JsonlWriter::number(step_s * 1e3)},
          {"mfu", JsonlWriter::number(mfu)},
          {"tokens_seen", std::to_string(state.tokens_seen)}};
      if (eval_now) fields.emplace_back("val_loss", JsonlWriter::number(val));
      metrics->write(fields);
      char line[320];
      std::snprintf(
          line, sizeof(line),
          "step %5lld/%lld | loss %.4f%s | lr %.2e | grad norm %.3f | %.0f tok/s | %.1f ms%s",
          static_cast<long long>(step), static_cast<long long>(steps), loss,
          eval_now ? (" | val " + std::to_string(val).substr(0, 6)).c_str() : "", lr, grad_norm, tokens_per_s,
          step_s * 1e3,
          std::isfinite(mfu) ? (" | MFU " + std::to_string(mfu * 100).substr(0, 5) + "%").c_str() : "");
      if (step % log_every == 0 || eval_now || step == state.step + 1) progress.update(step, line);
      if (eval_now) {
        if (progress.interactive()) std::printf("\n");
        write_loss_svg(
            out + "/loss.svg", train_curve, val_curve,
            "train " + flags.str("preset") + " (" + std::to_string(params.numel()) + " parameters)", entropy,
            "unigram entropy " + format_entropy(entropy));
      }
    }
    if ((ckpt_every > 0 && step % ckpt_every == 0) || step == steps) save(step);
  }
  if (!root) return 0;
  progress.finish();
  std::printf("done: final validation loss %.4f (unigram entropy %.4f); checkpoint %s\n", last_val, entropy,
              last_checkpoint.c_str());
  const int64_t sample_tokens = flags.integer("sample-tokens");
  if (sample_tokens > 0 && read_tokenizer(data_dir) != "bytes") {
    std::printf(
        "no text sample: %s was not made by the byte-level tokenizer (prepare_data), so ids cannot be "
        "decoded\n",
        data_dir.c_str());
  } else if (sample_tokens > 0) {
    const std::string text =
        generate(model, flags.str("prompt"), sample_tokens, flags.integer("top-k"), seed, device);
    std::ofstream(out + "/sample.txt") << text << "\n";
    std::printf("sample (%s/sample.txt):\n----\n%s\n----\n", out.c_str(), text.c_str());
  }
  std::printf("outputs: %s/metrics.jsonl, %s/loss.svg, %s/checkpoints/\n", out.c_str(), out.c_str(),
              out.c_str());
  return 0;
}

}  // namespace tt::app
