// The training loop behind `train`, its flags, and the evaluation it uses.
#pragma once

#include <functional>
#include <string>

#include "apps/lib/data.h"
#include "apps/lib/flags.h"
#include "dist/runtime.h"
#include "nn/transformer.h"

namespace tt::app {

// Declares every flag of `train` (model, data, schedule, checkpoints, evaluation, sampling).
void declare_train_flags(Flags& flags);

// The values of `train`'s flags that need no data or model (numbers, ranges), checked before anything is
// read or written: one line naming the flag.
void check_train_flag_values(const Flags& flags);

// The same under mpirun, as a job's start: each rank checks its own values, the first bad one ends every rank
// (dist::SameOnEveryRank, for rank 0 alone to report); then the ranks check that they were given the same
// flags (dist::RanksDisagree otherwise). `runtime` null: check_train_flag_values.
void check_train_flags(const Flags& flags, dist::DistRuntime* runtime);

// Checks each rank makes for itself: the same flags against the same files, or rank 0's run folder. Under
// mpirun a failure on any rank ends every rank with one line (dist::raise_if_any_rank_failed) instead of an
// abort per rank; every rank must call it at the same point. `runtime` null or one rank: `checks` as it is.
void check_on_every_rank(dist::DistRuntime* runtime, const std::function<void()>& checks);

// Trains with the flags of `train` (declare_train_flags); returns the process exit code.
// `runtime` (null for a single process) gives rank and world size under mpirun; the caller has passed the
// flags through check_train_flags with it.
int run_training(const Flags& flags, Device device, const std::string& data_dir, dist::DistRuntime* runtime);

// Mean loss over windows 0 .. batches*batch*ranks-1 of `val`: this rank's share of them, batch i taking
// windows (i*ranks + rank)*batch onwards, so that a run of N ranks at --batch b evaluates what one process at
// --batch N*b does. The caller averages the ranks' results (equal shares: the mean of the means).
double evaluate(const nn::TransformerLM& model, const TokenFile& val, int64_t batch, int64_t ctx,
                int64_t batches, Device device, int64_t rank = 0, int64_t ranks = 1);
double unigram_entropy(const TokenFile& file, int64_t vocab);

}  // namespace tt::app
