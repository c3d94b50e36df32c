// train: the framework's main job. Trains the Transformer LM on token files, evaluates, writes metrics,
// the loss plot, HDF5 checkpoints (exact resume) and a text sample. `train --help` lists every flag.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "apps/lib/checkpoint.h"
#include "apps/lib/data.h"
#include "apps/lib/flags.h"
#include "apps/lib/prepare.h"
#include "apps/lib/report.h"
#include "apps/lib/run_folder.h"
#include "apps/lib/run_setup.h"
#include "apps/lib/stop_signal.h"
#include "apps/lib/train_step.h"
#include "apps/lib/trainer.h"
#include "base/error.h"
#include "core/autograd.h"
#include "core/cuda_context.h"
#include "core/ops.h"
#include "dist/agreement.h"
#include "dist/runtime.h"

namespace fs = std::filesystem;
using namespace tt;
using namespace tt::app;

namespace {

std::string data_dir_or_default(const Flags& flags) {
  if (flags.given("data")) {
    check_data_folder_path(flags.str("data"));
    return flags.str("data");
  }
  const std::string dir = kBuiltinDataDir;
  if (!fs::exists(dir + "/train.bin")) {
    const std::string corpus = "/usr/share/games/fortunes";
    if (!fs::exists(corpus)) {
      throw Error("the built-in corpus needs Debian's 'fortunes' package (" + corpus +
                  "); install it or pass --data");
    }
    std::printf("preparing the built-in corpus from %s into %s ...\n", corpus.c_str(), dir.c_str());
    const PrepareStats s = prepare_text(corpus, dir, "%");
    std::printf("  %lld documents, %lld train and %lld validation tokens\n",
                static_cast<long long>(s.documents), static_cast<long long>(s.train_tokens),
                static_cast<long long>(s.val_tokens));
  }
  return dir;
}

// "FOLDER, which is gone" (or has no meta.json): why a recorded data folder cannot be read.
std::string unusable_data(const std::string& folder) {
  return folder + (fs::exists(folder) ? ", which has no meta.json" : ", which is gone");
}

// A resumed run's own data: without --data, what the checkpoint --resume names was trained on, as recorded
// in it. "" when --data is given, nothing is resumed, or that is the built-in corpus. `announce`: say which.
std::string resumed_run_data(const Flags& flags, bool announce) {
  if (flags.given("data") || flags.str("resume").empty()) return "";
  const std::string resume = flags.str("resume");
  std::string checkpoint, trained_on;
  const std::string dir = resume_checkpoints_dir(resume, flags.str("out"));
  if (!dir.empty()) {
    // The newest checkpoint that reads (the set-up resumes the newest that loads, and refuses it if it was
    // trained on other data than this).
    const auto found = list_checkpoints(dir);
    for (auto it = found.rbegin(); it != found.rend() && checkpoint.empty(); ++it) {
      try {
        trained_on = training_data_folder(it->second);
        checkpoint = it->second;
      } catch (const Error&) {
        // does not read: the set-up says why
      }
    }
  } else {
    checkpoint = resume;
    trained_on = training_data_folder(resume);  // a file that does not read: that error, nothing prepared
  }
  if (trained_on.empty() || trained_on == kBuiltinDataDir) return "";
  TT_CHECK(fs::exists(trained_on + "/meta.json"), "--resume: " + checkpoint + " was trained on " +
                                                      unusable_data(trained_on) +
                                                      "; pass --data with the data to go on with");
  if (announce)
    std::printf("data: %s (what %s was trained on; --data gives other data)\n", trained_on.c_str(),
                checkpoint.c_str());
  return trained_on;
}

// The flags an evaluation reads; the model's shape comes from the checkpoint.
const std::set<std::string> kEvalOnlyFlags = {
    "--eval-only",    "--resume", "--out",           "--data",      "--batch",
    "--eval-batches", "--ctx",    "--json",          "--logits",    "--precision",
    "--attention",    "--device", "--deterministic", "--recompute", "--recompute-blocks",
    "--config"};

int run_eval_only(const Flags& flags, Device device) {
  TT_CHECK(flags.str("init-from").empty(),
           "--eval-only evaluates --resume CHECKPOINT; --init-from is for training");
  if (flags.str("resume").empty()) throw Error("--eval-only needs --resume CHECKPOINT");
  // Training flags left in a command line (or a --config file) change nothing here; say so rather than
  // let a user believe they did.
  std::string ignored;
  for (const auto& [name, value] : flags.values())
    if (!kEvalOnlyFlags.count(name) && flags.given(name.substr(2)))
      ignored += (ignored.empty() ? "" : ", ") + name;
  if (!ignored.empty())
    std::printf("note: --eval-only ignores %s: it evaluates the checkpoint's model as saved\n",
                ignored.c_str());
  // A run folder (or latest: --out's) means its newest checkpoint whose weights load (damaged optimizer
  // state does not matter here, as when the file is named directly).
  const LockedCheckpoint chosen =
      resolve_resume(flags.str("resume"), flags.str("out"), /*weights_only=*/true);
  const std::string& ckpt = chosen.path;
  TT_CHECK(!ckpt.empty(),
           "--resume latest: no checkpoint in " + flags.str("out") + "/checkpoints to evaluate");
  // The result's files are checked before the evaluation, which can take long.
  std::unique_ptr<JsonlWriter> json;
  if (!flags.str("json").empty()) json = std::make_unique<JsonlWriter>(flags.str("json"), false);
  if (!flags.str("logits").empty()) {
    const fs::path parent = fs::absolute(flags.str("logits")).parent_path();
    TT_CHECK(fs::is_directory(parent) && ::access(parent.c_str(), W_OK) == 0,
             "--logits " + flags.str("logits") + ": cannot write in " + parent.string());
    TT_CHECK(!fs::is_directory(flags.str("logits")), "--logits " + flags.str("logits") + " is a folder");
  }
  nn::ModelConfig config = read_checkpoint_config(ckpt);
  apply_runtime_model_flags(flags, config, device);
  const int64_t ctx = flags.given("ctx") ? flags.integer("ctx") : config.context_length;
  TT_CHECK(ctx <= config.context_length, "--ctx " + std::to_string(ctx) +
                                             " exceeds the checkpoint's context length " +
                                             std::to_string(config.context_length));
  // Without --data: the data the checkpoint was trained on, where it can be found.
  const std::string trained_on = flags.given("data") ? "" : training_data_folder(ckpt);
  const bool found = !trained_on.empty() && fs::exists(trained_on + "/meta.json");
  // A checkpoint of other data than the built-in corpus is not measured on that corpus instead.
  TT_CHECK(
      found || trained_on.empty() || trained_on == kBuiltinDataDir,
      "pass --data with the data to evaluate on: " + ckpt + " was trained on " + unusable_data(trained_on));
  // The built-in corpus is byte tokens: only a byte-level model can be measured on it.
  TT_CHECK(
      found || flags.given("data") || config.vocab_size == kByteVocab,
      "pass --data with the data to evaluate on: " + ckpt +
          (trained_on.empty() ? " records no data folder" : " was trained on " + unusable_data(trained_on)) +
          ", and its " + std::to_string(config.vocab_size) + " ids are not the built-in corpus's bytes");
  const std::string data = found ? trained_on : data_dir_or_default(flags);
  check_training_tokenizer(ckpt, data, "pass --data with the data it was trained on");
  const int64_t data_vocab = read_vocab_size(data);
  // A model may have more ids than its data (a vocabulary padded for speed), never fewer.
  TT_CHECK(data_vocab <= config.vocab_size, "the checkpoint " + ckpt + " holds a model of " +
                                                std::to_string(config.vocab_size) + " ids, but " + data +
                                                "/meta.json gives " + std::to_string(data_vocab) +
                                                ": pass --data with data prepared by the model's tokenizer");
  const TokenFile val(data + "/val.bin", config.vocab_size);
  check_token_count(data, val);
  nn::TransformerLM model(config);
  nn::FlatParameters params(model, device, 0);
  load_checkpoint(ckpt, params, nullptr, nullptr);
  const int64_t batch = flags.integer("batch");
  TT_CHECK(batch > 0 && flags.integer("eval-batches") > 0, "--batch and --eval-batches must be positive");
  const int64_t batches =
      eval_batches_to_use(val, batch, ctx, flags.integer("eval-batches"), flags.given("eval-batches"), true);
  check_eval_fits(val, batch, ctx, batches);
  const double loss = evaluate(model, val, batch, ctx, batches, device);
  TT_CHECK(std::isfinite(loss), "the mean loss of " + ckpt + " is not finite (" + std::to_string(loss) + ")");
  std::printf("eval %s: mean loss %.6f (perplexity %.4f) over %lld windows of %lld tokens from %s/val.bin\n",
              ckpt.c_str(), loss, std::exp(loss), static_cast<long long>(batch * batches),
              static_cast<long long>(ctx), data.c_str());
  if (!flags.str("logits").empty()) {
    // The first window, as a model on another framework would be given it.
    std::vector<int32_t> ids(val.data(), val.data() + ctx);
    NoGradGuard no_grad;
    const Tensor logits = model.forward(Tensor::from_ints(ids, {1, ctx}, device));
    write_npy_f32(flags.str("logits"), logits.to_floats(), {ctx, config.vocab_size});
    std::printf("logits of window 0: %s\n", flags.str("logits").c_str());
  }
  if (json) {
    json->write({{"checkpoint", JsonlWriter::quote(ckpt)},
                 {"loss", JsonlWriter::number(loss)},
                 {"perplexity", JsonlWriter::number(std::exp(loss))},
                 {"windows", std::to_string(batch * batches)},
                 {"context", std::to_string(ctx)}});
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGXFSZ, SIG_IGN);  // a full disk (or file-size limit) is reported as a write error
  // A reader of the log that goes away (`train | head`, a killed tee) must not end the run: it trains on
  // and writes its checkpoints, its log lines lost.
  std::signal(SIGPIPE, SIG_IGN);
  // Logs redirected to a file (mpirun, Slurm, nohup) appear line by line, and survive a kill.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  install_stop_handlers();
  std::unique_ptr<dist::DistRuntime> runtime;
  bool exchanged = false;  // until the ranks part ways, a failure goes to every rank (see the catch below)
  bool alone = false;      // rank 0 evaluating after the others have ended: its failure ends it alone
  try {
    // One rank per GPU under mpirun/srun; a plain start is a single process and does not touch MPI (a
    // singleton MPI start needs resources a simple run should not depend on).
    if (started_by_launcher()) runtime = std::make_unique<dist::DistRuntime>(&argc, &argv);
    if (runtime && runtime->world_size() > 1) report_stops_after_the_step(runtime->rank() == 0);
    Flags flags("train",
                "Train the Transformer LM; see README.md for the data and checkpoint formats.\n"
                "Under mpirun (one rank per GPU) it trains data-parallel; rank 0 logs and writes.\n"
                "SIGINT, SIGTERM, SIGUSR1, SIGUSR2 or SIGHUP: finish the step, write a checkpoint, exit 75\n"
                "(during start-up, with nothing written yet: end at once).\n"
                "Exit codes: 0 done, 1 error, 3 diverged (non-finite loss or gradient norm; the last\n"
                "good checkpoint is named), 75 stopped by a signal (continue with --resume latest).");
    declare_train_flags(flags);
    if (!flags.parse(argc, argv)) {
      // --help or --version: this rank ends, once it has taken part in the exchange below.
      if (runtime && runtime->world_size() > 1) dist::raise_if_any_rank_failed(*runtime, "");
      return 0;
    }
    const int rank = runtime ? runtime->rank() : 0;
    const Device device = pick_device(flags.str("device"), runtime ? runtime->gpu_index() : 0);
    // Here the ranks part ways (an evaluation runs on rank 0 alone): a rank that failed so far (a bad flag,
    // no device) meets the others in this exchange from its catch below, and every rank ends with its line.
    if (runtime && runtime->world_size() > 1) dist::raise_if_any_rank_failed(*runtime, "");
    exchanged = true;
    if (flags.boolean("eval-only")) {
      if (rank != 0) return 0;
      alone = true;
      return run_eval_only(flags, device);
    }
    check_train_flags(flags, runtime.get());  // before the built-in corpus is prepared
    // A resumed run's data, checked on every rank: a problem ends the job with one line.
    std::string data;
    check_on_every_rank(runtime.get(), [&] { data = resumed_run_data(flags, rank == 0); });
    // Else --data, or the built-in corpus: rank 0 prepares it (if needed) while the others wait.
    if (data.empty() && rank == 0) data = data_dir_or_default(flags);
    if (runtime) dist::barrier();
    if (data.empty() && rank != 0) data = data_dir_or_default(flags);
    return run_training(flags, device, data, runtime.get());
  } catch (const RunEnded& e) {
    // Reached by every rank at the same step (divergence, a stop signal): a clean end, not an abort. The
    // SIGTERM mpirun sends ranks still exiting when the first has exited non-zero is not a stop request.
    accept_stop_requests(false);
    end_progress_line();
    std::fflush(stdout);
    if (!runtime || runtime->rank() == 0)
      std::fprintf(stderr, "%s: %s\n", e.exit_code() == kExitStopped ? "stopped" : "error", e.what());
    return e.exit_code();
  } catch (const dist::SameOnEveryRank& e) {
    // Thrown by every rank at once at start-up: one line, a clean exit.
    accept_stop_requests(false);
    if (!runtime || runtime->rank() == 0) std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    accept_stop_requests(false);  // mpirun's SIGTERM after the abort is not a stop request
    std::fflush(stdout);
    const std::string why = "out of host memory (std::bad_alloc); lower --batch, --ctx or the model size";
    if (runtime && runtime->world_size() > 1 && !alone) dist::abort_job(why);
    end_progress_line();
    std::fprintf(stderr, "error: %s\n", why.c_str());
    return 1;
  } catch (const std::exception& e) {
    accept_stop_requests(false);  // mpirun's SIGTERM after the abort is not a stop request
    std::fflush(stdout);
    // A bad command line: one line, the lowest failing rank's, through rank 0.
    if (runtime && runtime->world_size() > 1 && !exchanged)
      return dist::end_start_up_failure(*runtime, e.what());
    if (runtime && runtime->world_size() > 1 && !alone) dist::abort_job(e.what());
    end_progress_line();
    std::fprintf(stderr, "%s\n", tt::error_line(e).c_str());
    return 1;
  }
}
