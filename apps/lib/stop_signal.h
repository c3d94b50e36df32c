// Graceful stops: SIGINT, SIGTERM (what Slurm and most schedulers send before they kill or preempt a job) and
// SIGUSR1 (what `sbatch --signal=USR1@SECONDS` sends), SIGUSR2 (what the launch scripts send mpirun, which
// passes it on, where some Open MPI builds keep SIGUSR1) and SIGHUP (a closed terminal) only set a flag; the
// training loop reads it after each step, writes a checkpoint and exits with kExitStopped. The same SIGINT or
// SIGTERM again ends the process at once (another of the two within 2 s is the same request passed on).
// During a StartUp there is nothing to save: a stop request ends the process at once, by the signal.
// SIGHUP, when the process was started ignoring it (nohup), stays ignored.
#pragma once

namespace tt::app {

// Exit codes of `train` besides 0 (finished) and 1 (an error).
constexpr int kExitDiverged = 3;  // non-finite loss or gradient norm; the last good checkpoint is named
constexpr int kExitStopped = 75;  // stopped by a signal after writing a checkpoint; `--resume latest` goes on

void install_stop_handlers();
// Whether a signal now is a stop request (the default); false when nothing is left to finish (an error being
// reported, an abort under mpirun): a signal then takes its default action and ends the process.
void accept_stop_requests(bool accept);
// While one lives, train is starting up: reading the data and the checkpoint it resumes or starts from and
// building the model, with nothing written yet but its folder and lock. A stop request then ends the process
// at once by the signal's default action (not kExitStopped: no checkpoint, so nothing to requeue for).
class StartUp {
 public:
  StartUp();
  ~StartUp();
  StartUp(const StartUp&) = delete;
  StartUp& operator=(const StartUp&) = delete;
};
// Under mpirun: a stop request is announced by rank 0 once the step it ends has finished, not when the signal
// comes. mpirun ends a job whose rank has failed with the same SIGTERM, and then no step finishes.
// `announce_start_up_stops`: whether this rank says "stop requested during start-up" (rank 0 says it for
// the job; every rank ends).
void report_stops_after_the_step(bool announce_start_up_stops);
// Training has ended and its checkpoint is written: a stop request now ends the text sample early (what it
// has is written) and the run exits 0, as it would have; a second request still ends it at once.
void finishing_outputs();
// The signal that asked for a stop, or 0.
int stop_signal();
const char* signal_name(int signal);

}  // namespace tt::app
