// The process-wide MPI runtime of a data-parallel job: one rank per GPU, started by mpirun (or alone, as a
// world of one). Create exactly one DistRuntime at the top of main, before any communicator, and let it
// outlive them: MPI can be initialised and finalised only once per process.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

namespace tt::dist {

class CollectiveWatchdog;

class DistRuntime {
 public:
  // argc/argv may be null. Initialises MPI unless something else already did (then it is not finalised
  // here either).
  DistRuntime(int* argc = nullptr, char*** argv = nullptr);
  ~DistRuntime();
  DistRuntime(const DistRuntime&) = delete;
  DistRuntime& operator=(const DistRuntime&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  // Rank among the processes of this host; rank i of a host drives GPU i of that host.
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  bool is_root() const { return rank_ == 0; }
  // The thread support MPI granted (MPI_THREAD_MULTIPLE when available).
  int thread_level() const { return thread_level_; }
  // The GPU this rank drives: local_rank modulo the visible devices, so a launcher that shows each rank
  // only its own GPU (CUDA_VISIBLE_DEVICES per task) still works. 0 without CUDA.
  int gpu_index() const;
  std::string host_name() const { return host_name_; }

 private:
  bool owns_mpi_ = false;
  // Ends the job when this rank waits longer than mpi_timeout() in one collective (collective_timeout.h).
  std::unique_ptr<CollectiveWatchdog> watchdog_;
  int rank_ = 0, world_size_ = 1, local_rank_ = 0, local_size_ = 1, thread_level_ = MPI_THREAD_SINGLE;
  std::string host_name_;
};

// Whether a launcher started this process as an MPI rank: mpirun (Open MPI), srun through an MPI plugin
// (PMIx, PMI2), MPICH's Hydra, MVAPICH or Cray's PALS (a job of one rank included).
bool started_as_mpi_rank();
// How many processes the launcher started this one with: mpirun's (or PMI's, MVAPICH's) count where it set
// one, else that of srun's step when srun started this very process as one of its tasks (a program run from
// a task's shell or script is not one; an mpirun inside an srun step inherits srun's, so it comes second);
// "" when no launcher started it.
std::string launched_process_count();
// Throws when srun started this process as one of several tasks without an MPI plugin (`srun --mpi=none`, or
// a cluster whose MpiDefault is none): MPI would make each task a world of one, and every task would run the
// whole job alone, writing the same files. Reads the environment only, so it may run before MPI starts.
void check_srun_tasks_share_one_world();

// Ends the whole job: prints "rank R: why" to stderr and calls MPI_Abort, so that one failing rank cannot
// leave the others blocked in a collective until the scheduler's time limit.
[[noreturn]] void abort_job(const std::string& why);

// The largest `value` over all ranks (collective): benchmarks report the slowest rank.
double max_over_ranks(double value);
// The mean of `value` over all ranks (collective): a validation loss of which each rank measured its share.
double mean_over_ranks(double value);
// Every rank waits until all have arrived, under the collective watchdog (collective_timeout.h).
void barrier();

}  // namespace tt::dist
