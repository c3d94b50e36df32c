// Main of the multi-rank suites, run under mpirun: starts the MPI runtime before doctest, ends the whole job
// when a test throws on one rank (the others would wait in a collective forever), and exits non-zero when
// any rank saw a failure. The GPU suite (TT_DIST_GPU_SUITE) exits 77, "skipped", without enough GPUs.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "dist/mpi_check.h"
#include "dist_test_util.h"
#ifdef TT_WITH_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace {

#ifdef TT_DIST_GPU_SUITE
int visible_gpus() {
#ifdef TT_WITH_CUDA
  return tt::cuda::device_count();
#else
  return 0;
#endif
}
#endif

// Only the exception hook matters; doctest requires the whole interface.
struct AbortOnException : doctest::IReporter {
  explicit AbortOnException(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException& e) override {
    tt::dist::abort_job(std::string("exception in a test: ") + e.error_string.c_str());
  }
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};
DOCTEST_REGISTER_LISTENER("abort_on_exception", 1, AbortOnException);

}  // namespace

int main(int argc, char** argv) {
#ifdef TT_DIST_GPU_SUITE
  if (visible_gpus() == 0) {
    std::printf("no CUDA device: GPU tests skipped\n");
    return 77;
  }
#endif
  try {
    tt::dist::DistRuntime runtime(&argc, &argv);
#ifdef TT_DIST_GPU_SUITE
    // Every rank of a host needs a GPU of its own; all ranks of the host see the same count and agree.
    if (visible_gpus() < runtime.local_size()) {
      std::printf("rank %d: %d GPUs for %d ranks on this host: GPU tests skipped\n", runtime.rank(),
                  visible_gpus(), runtime.local_size());
      return 77;
    }
#endif
    tt::testing::set_runtime(&runtime);
    doctest::Context context(argc, argv);
    // Rank 0 reports everything; the others only their failures.
    if (!runtime.is_root()) context.setOption("minimal", true);
    const int failed_here = context.run() != 0 ? 1 : 0;
    int failed_ranks = 0;
    TT_MPI_CHECK(MPI_Allreduce(&failed_here, &failed_ranks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    tt::testing::release_communicators();
    tt::testing::set_runtime(nullptr);
    if (runtime.is_root()) {
      std::printf("%d of %d ranks saw failures\n", failed_ranks, runtime.world_size());
    }
    return failed_ranks > 0 ? 1 : 0;
  } catch (const std::exception& e) {
    tt::dist::abort_job(e.what());
  }
}
