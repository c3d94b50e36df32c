// Flags and choices shared by the apps that build a model: preset and dimensions, precision, attention
// kind and device.
#pragma once

#include <vector>

#include "apps/lib/flags.h"
#include "core/device.h"
#include "dist/communicator.h"
#include "nn/transformer.h"

namespace tt::dist {
class DistRuntime;
}

namespace tt::app {

void declare_model_flags(Flags& flags);
// --device, read by pick_device: cpu | cuda | cuda:N | auto; `per_rank` (an app run under mpirun): cpu |
// cuda | auto, rank i taking its host's GPU i.
void declare_device_flag(Flags& flags, bool per_rank = false);
// auto: cuda:<local rank> when a GPU is present, else cpu.
Device pick_device(const std::string& text, int local_rank = 0);
// The model of --preset with --d-model/--layers/--heads/--d-ff/--ctx/--vocab overrides, precision and
// attention resolved for `device`. --vocab 0 takes `data_vocab` (read_vocab_size of the data folder); when
// that is 0 too (no meta.json) it is an error naming --vocab.
nn::ModelConfig model_config_from_flags(const Flags& flags, Device device, int64_t data_vocab);
// One micro-batch's tokens are one host array and one device tensor, indexed in 32 bits: --batch x --ctx
// at most 2^31, else an error naming both; `hint` ends it (train: "use --grad-accum for larger steps").
void check_micro_batch_tokens(int64_t batch, int64_t ctx, const std::string& hint = "");
// The device's name ("NVIDIA H100 80GB HBM3", or "cpu"): tables, JSON rows and the MFU peak use it.
std::string device_name(Device device);
// naive | flash | auto (flash on CUDA, naive on the CPU).
nn::AttentionKind resolve_attention(const std::string& text, Device device);
// --grad-dtype (f32 | bf16): whether the gradient buffer is bf16. bf16 needs bf16 precision, and excludes
// bf16 gradient communication (`bf16_communication`), which is for f32 gradients.
bool grads_bf16_from_flags(const Flags& flags, bool bf16_precision, bool bf16_communication);
// What `--grad-dtype auto` resolves to: bf16 gradients in a bf16 model (weight gradients rounded once, as
// autocast rounds them), unless the all-reduce is asked to round f32 gradients itself.
bool auto_grads_bf16(bool bf16_precision, bool bf16_communication);
// Only the settings that may differ between runs of one checkpoint (precision, attention).
void apply_runtime_model_flags(const Flags& flags, nn::ModelConfig& config, Device device);
// --gemm-autotune (train, benchmark): how many of cuBLASLt's candidate kernels to time per new matmul shape.
// `with_deterministic`: the app also has --deterministic, which makes auto 0.
void declare_gemm_autotune_flag(Flags& flags, bool with_deterministic);
// Its count: auto is 8, or 0 for a `deterministic` run (timings differ from run to run, so the kernels
// chosen, and with them the rounding, could too). apply_ also sets it for this process.
int gemm_autotune_from_flags(const Flags& flags, bool deterministic);
int apply_gemm_autotune_flag(const Flags& flags, bool deterministic);

// Whether mpirun or srun started this process (as one rank of a job, perhaps of one). Throws when srun
// started several tasks without an MPI plugin (dist::check_srun_tasks_share_one_world).
bool started_by_launcher();
// Apps that write one output (export, import, prepare_data), print one text (generate) or time one GPU
// (benchmark, bench_attention) run as one process: started as several by mpirun or srun, the copies would
// race to write the same files. An error naming `app` then.
void require_one_process(const std::string& app);

// A flag's value as it means rather than as it is spelled, for comparing settings: a number in its shortest
// form (1e-2 and 0.01 agree), a file or folder as an absolute path (data/f and ./data/f/ agree).
std::string comparable_flag_value(const std::string& name, const std::string& value);
// Collective under mpirun, first thing after the runtime starts: every rank must have been given the same
// flags (as they mean), else every rank throws the same dist::RanksDisagree naming the first that differs.
// Ranks started differently would otherwise hang in a collective only some enter, or report rank 0's
// settings for a job that ran others.
void check_ranks_have_same_flags(const Flags& flags, const dist::DistRuntime& runtime);
// The end of an app run under mpirun that failed with `e`; returns the exit code. A failure every rank shares
// (dist::SameOnEveryRank) is rank 0's one line; before every rank has checked its flags (`flags_checked`
// false) a rank's own failure still ends the job with one line (dist::end_start_up_failure); later it aborts
// the job. `runtime` null: a single process, the error line.
int end_job_with_error(const std::exception& e, dist::DistRuntime* runtime, bool flags_checked);
// The benchmarks' comma-separated --all-reduce list: library and/or copy-engine, the copy engines only where
// they serve this job (CUDA, 2 to dist::kCopyEngineMaxRanks ranks on one host), else a line saying why.
std::vector<dist::AllReduceTransport> all_reduce_transports(const Flags& flags, Device device,
                                                            const dist::DistRuntime& runtime);

}  // namespace tt::app
