#include "dist/runtime.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "base/error.h"
#include "dist/collective_timeout.h"
#include "dist/mpi_check.h"
#ifdef TT_WITH_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace tt::dist {

void throw_mpi_error(int code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    std::snprintf(text, sizeof(text), "code %d", code);
  // Open MPI reports a failed allocation inside a collective as an internal error (seen with a memory
  // limit under ulimit -v), so both classes carry the hint.
  int error_class = 0;
  std::string detail = text;
  if (MPI_Error_class(code, &error_class) == MPI_SUCCESS &&
      (error_class == MPI_ERR_NO_MEM || error_class == MPI_ERR_INTERN))
    detail += " (out of host memory is a common cause: lower --batch or --ctx)";
  throw_call_error("MPI", call, detail, file, line);
}

bool started_as_mpi_rank() {
  for (const char* var :
       {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "PALS_RANKID"})
    if (std::getenv(var) != nullptr) return true;
  return false;
}

namespace {
int64_t srun_task_count() {
  // srun sets both in every task; a task's children inherit them, but not its process id.
  const char* tasks = std::getenv("SLURM_STEP_NUM_TASKS");
  const char* task_pid = std::getenv("SLURM_TASK_PID");
  if (tasks == nullptr || task_pid == nullptr || std::atoll(task_pid) != static_cast<long long>(getpid()))
    return 0;
  return std::atoll(tasks);
}
}  // namespace

std::string launched_process_count() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"})
    if (const char* count = std::getenv(var); count != nullptr) return count;
  const int64_t tasks = srun_task_count();
  return tasks > 0 ? std::to_string(tasks) : "";
}

void check_srun_tasks_share_one_world() {
  const int64_t tasks = srun_task_count();
  if (tasks <= 1 || started_as_mpi_rank()) return;
  throw Error("srun started " + std::to_string(tasks) +
              " tasks without an MPI plugin, so each would run alone: start them with srun --mpi=pmix (or "
              "under mpirun)");
}

DistRuntime::DistRuntime(int* argc, char*** argv) {
  check_srun_tasks_share_one_world();
  int initialized = 0;
  TT_MPI_CHECK(MPI_Initialized(&initialized));
  if (initialized) {
    TT_MPI_CHECK(MPI_Query_thread(&thread_level_));
  } else {
    // The collective watchdogs (MPI and NCCL) may end the job from their own threads, so ask for full thread
    // support; FUNNELED is enough for everything else (all collectives are issued by the thread that runs the
    // step).
    TT_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &thread_level_));
    owns_mpi_ = true;
  }
  // Failures must come back as return codes so they can be reported with the rank and the call.
  TT_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  TT_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  TT_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size_));
  set_process_rank(rank_);
  MPI_Comm host_comm = MPI_COMM_NULL;
  TT_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &host_comm));
  TT_MPI_CHECK(MPI_Comm_rank(host_comm, &local_rank_));
  TT_MPI_CHECK(MPI_Comm_size(host_comm, &local_size_));
  TT_MPI_CHECK(MPI_Comm_free(&host_comm));
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  TT_MPI_CHECK(MPI_Get_processor_name(name, &length));
  host_name_.assign(name, static_cast<size_t>(length));
  watchdog_ = std::make_unique<CollectiveWatchdog>("host " + host_name_);
}

DistRuntime::~DistRuntime() {
  watchdog_.reset();  // before MPI is finalised: it may call MPI_Abort
  if (!owns_mpi_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

int DistRuntime::gpu_index() const {
#ifdef TT_WITH_CUDA
  const int count = cuda::device_count();
  return count > 0 ? local_rank_ % count : 0;
#else
  return 0;
#endif
}

void abort_job(const std::string& why) {
  std::fprintf(stderr, "rank %d: %s\n", process_rank(), why.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

double max_over_ranks(double value) {
  const CollectiveWait wait("max_over_ranks");
  double result = value;
  TT_MPI_CHECK(MPI_Allreduce(&value, &result, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  return result;
}

double mean_over_ranks(double value) {
  const CollectiveWait wait("mean_over_ranks");
  double sum = value;
  TT_MPI_CHECK(MPI_Allreduce(&value, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
  int ranks = 1;
  TT_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &ranks));
  return sum / ranks;
}

void barrier() {
  const CollectiveWait wait("barrier");
  TT_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
}

}  // namespace tt::dist
