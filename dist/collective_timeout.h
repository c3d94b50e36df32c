// The bound on how long a rank waits for the others in one collective. A rank that is stopped (SIGSTOP, a
// debugger, a frozen node), hung, or in a different collective than the others would otherwise leave them
// blocked until the scheduler's time limit; past the bound the job is ended (MPI_Abort) with one line
// naming the waiting rank and the collective, so mpirun ends every rank with a non-zero exit.
//
// MPI backend (CPU training) and dist/'s own MPI collectives: a watchdog thread, started by DistRuntime,
// counts the time this rank has been blocked in one collective (a blocking call, or Work::wait() of an
// asynchronous one; not the time an asynchronous collective is in flight while the rank computes, nor time
// this process itself was stopped). Default kDefaultMpiTimeoutS, or TT_MPI_TIMEOUT_S.
// NCCL backend: its own watchdog counts from the moment a collective is issued (nccl_communicator.cpp).
// Default kDefaultNcclTimeoutS, or TT_NCCL_TIMEOUT_S.
//
// What the MPI bound must cover: the ranks of a training step do the same work, and so do evaluations, so
// their waits are short; the long one is the other ranks' wait while rank 0 writes a checkpoint (weights
// and AdamW state, 12 bytes per parameter, fsynced) and reads it back to verify it. 600 s covers 30 GB
// each way at 100 MB/s (2.5B parameters; models trained on CPUs are far smaller). Raise it for larger
// models on slower disks. Waits that rank 0 may make long on purpose before training starts (preparing the
// data set, choosing the checkpoint to resume) are plain MPI calls in apps/, not watched.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace tt::dist {

constexpr double kDefaultMpiTimeoutS = 600.0;
constexpr double kDefaultNcclTimeoutS = 300.0;

// Sets both bounds for this process, overriding TT_MPI_TIMEOUT_S and TT_NCCL_TIMEOUT_S: MPI waits that begin
// from now on, and NCCL communicators made afterwards (call it before make_communicator). seconds > 0;
// infinity means no bound. Give every rank the same value. Throws tt::Error otherwise. `source` names the
// setting in the watchdog's message (an app passes its flag: "--collective-timeout-s").
void set_collective_timeout(double seconds, const std::string& source = "set_collective_timeout");
// A bound in force and what set it: set_collective_timeout's value and source, else the environment
// variable, else the default (source: the variable's name either way). Throw tt::Error when the variable is
// not a positive number of seconds.
struct CollectiveTimeout {
  double seconds;
  std::string source;
};
CollectiveTimeout mpi_timeout();
CollectiveTimeout nccl_timeout();
// "5 s (TT_NCCL_TIMEOUT_S)": the bound and what set it, as the watchdogs' messages give it.
std::string describe(const CollectiveTimeout& timeout);

// Marks the calling thread as blocked in the collective `what` (a string literal: "all_reduce") until
// destroyed. Collectives are issued by one thread; a mark inside another keeps the outer one.
class CollectiveWait {
 public:
  explicit CollectiveWait(const char* what);
  ~CollectiveWait();
  CollectiveWait(const CollectiveWait&) = delete;
  CollectiveWait& operator=(const CollectiveWait&) = delete;

 private:
  bool owner_ = false;
};

// The watchdog thread (DistRuntime holds one): ends the job when a CollectiveWait has lasted longer than
// mpi_timeout(). `who` describes this process in the message ("host node7").
class CollectiveWatchdog {
 public:
  explicit CollectiveWatchdog(std::string who);
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

 private:
  struct Thread;
  std::unique_ptr<Thread> thread_;
};

// For a watchdog whose own queries (CUDA, NCCL) can block while a collective hangs, which would leave the job
// hanging with it: a query runs between begin(what) and end(). When one has lasted longer than `timeout_s`,
// this object's thread, which makes no CUDA, NCCL or MPI call, calls fail(what) once (fail normally ends
// the job). Checked every `period_s`.
class StuckQueryMonitor {
 public:
  StuckQueryMonitor(double timeout_s, std::function<void(const std::string& what)> fail,
                    double period_s = 1.0);
  ~StuckQueryMonitor();
  StuckQueryMonitor(const StuckQueryMonitor&) = delete;
  StuckQueryMonitor& operator=(const StuckQueryMonitor&) = delete;

  void begin(const std::string& what);
  void end();

 private:
  using Clock = std::chrono::steady_clock;
  void run();

  std::chrono::duration<double> timeout_, period_;
  std::function<void(const std::string&)> fail_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::optional<Clock::time_point> since_;  // the query in progress
  std::string what_;
  std::thread thread_;  // last: starts once everything it reads is initialised
};

}  // namespace tt::dist
