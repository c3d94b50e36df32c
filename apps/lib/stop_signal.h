// Graceful stops: SIGINT, SIGTERM (what Slurm and most schedulers send before they kill or preempt a job) and
// SIGUSR1 (what `sbatch --signal=USR1@SECONDS` sends) and SIGHUP (a closed terminal) only set a flag; the
// training loop reads it after each step, writes a checkpoint and exits with kExitStopped. A second SIGINT or
// SIGTERM ends the process at once.
#pragma once

namespace tt::app {

// Exit codes of `train` besides 0 (finished) and 1 (an error).
constexpr int kExitDiverged = 3;  // non-finite loss or gradient norm; the last good checkpoint is named
constexpr int kExitStopped = 75;  // stopped by a signal after writing a checkpoint; `--resume latest` goes on

void install_stop_handlers();
// The signal that asked for a stop, or 0.
int stop_signal();
const char* signal_name(int signal);

}  // namespace tt::app
