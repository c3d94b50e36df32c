// Row-major batched GEMM on cuBLASLt. cuBLASLt is column-major, and a row-major matrix read as column-major
// is its transpose, so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: the operands swap places and
// no data moves. Descriptors, layouts and the heuristic's algorithm choice are built once per distinct
// problem (shape, transposes, dtype, strides, pointer alignment) and cached; a training step with fixed
// shapes never calls the heuristic again. With autotuning on (set_gemm_autotune), a new problem times the
// heuristic's first few candidates on its real operands (output to a scratch buffer) and keeps the fastest.
#include <cublasLt.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"

#define TT_CUBLASLT_CHECK(call)                                                                           \
  do {                                                                                                    \
    const cublasStatus_t tt_status_ = (call);                                                             \
    if (tt_status_ != CUBLAS_STATUS_SUCCESS)                                                              \
      ::tt::throw_call_error("cuBLASLt", #call, cublasLtGetStatusString(tt_status_), __FILE__, __LINE__); \
  } while (0)

namespace tt::cuda {

namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;
constexpr int kMaxDevices = 16;

struct DeviceState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};

using PlanKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           int64_t, int64_t, int, int, int, int, int>;

// cuBLASLt's algorithm type is an unnamed struct; nvcc's front end fails on it as a template argument.
struct Algo {
  cublasLtMatmulAlgo_t algo;
};

// Everything cuBLASLt needs for one problem; owned for the life of the process.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  // In cuBLASLt's (column-major) operand order: the first operand is our b, the second our a.
  cublasLtMatrixLayout_t layout_first = nullptr, layout_second = nullptr, layout_c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  // With autotuning: the heuristic's candidates, kept until they have been timed (a plan first made while
  // a graph was being captured is timed at its first use outside a capture).
  std::vector<Algo> untimed;

  void destroy() {
    if (layout_first) cublasLtMatrixLayoutDestroy(layout_first);
    if (layout_second) cublasLtMatrixLayoutDestroy(layout_second);
    if (layout_c) cublasLtMatrixLayoutDestroy(layout_c);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

std::mutex g_mutex;
DeviceState g_devices[kMaxDevices];
int g_sm_margin = 0;          // SMs to leave to concurrent kernels (set_gemm_sm_margin)
int g_autotune = 0;           // candidates to time per new problem (set_gemm_autotune); 0 or 1: the first
int g_sm_count[kMaxDevices];  // multiprocessors per device, read once
std::map<PlanKey, Plan> g_plans[kMaxDevices];

DeviceState& device_state(int device) {
  DeviceState& state = g_devices[device];
  if (!state.handle) {
    TT_CUBLASLT_CHECK(cublasLtCreate(&state.handle));
    TT_CUDA_CHECK(cudaMalloc(&state.workspace, kWorkspaceBytes));
    TT_CUDA_CHECK(cudaDeviceGetAttribute(&g_sm_count[device], cudaDevAttrMultiProcessorCount, device));
  }
  return state;
}

int alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  for (int align = 16; align > 1; align /= 2) {
    if (address % align == 0) return align;
  }
  return 1;
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                                   int64_t stride) {
  cublasLtMatrixLayout_t layout = nullptr;
  TT_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&layout, type, rows, cols, ld));
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    TT_CUBLASLT_CHECK(
        cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    TT_CUBLASLT_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                       &stride, sizeof(stride)));
  }
  return layout;
}

// Owns two timing events for the length of a tuning run (released on every exit path).
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    TT_CUDA_CHECK(cudaEventCreate(&start));
    if (cudaEventCreate(&stop) != cudaSuccess) {
      cudaEventDestroy(start);
      throw Error("cuda::gemm: cannot create a timing event for autotuning");
    }
  }
  ~EventPair() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};

// Stream-ordered scratch output for trials (no device-wide synchronisation to free it).
struct TrialOutput {
  void* ptr = nullptr;
  cudaStream_t stream;
  TrialOutput(size_t bytes, cudaStream_t s) : stream(s) {  // bytes = 0: none
    if (bytes > 0 && cudaMallocAsync(&ptr, bytes, stream) != cudaSuccess) {
      cudaGetLastError();
      ptr = nullptr;
    }
  }
  ~TrialOutput() {
    if (ptr != nullptr) cudaFreeAsync(ptr, stream);
  }
  TrialOutput(const TrialOutput&) = delete;
  TrialOutput& operator=(const TrialOutput&) = delete;
};

// Times each candidate (one untimed run, then three) on the caller's operands and returns the index of the
// fastest, or -1 when none could be timed: while the stream is being captured into a graph, or when no
// memory is left for a trial output. The trials write the output d itself (the real call overwrites it
// anyway) unless it is also the addend (beta != 0 and c == d): then a scratch buffer of d_bytes.
int fastest_candidate(const DeviceState& state, const Plan& plan, const std::vector<Algo>& algos,
                      const float* alpha, const void* a, const void* b, const float* beta, const void* c,
                      void* d, size_t d_bytes, cudaStream_t stream) {
  if (capturing(stream)) return -1;
  const bool reads_d = *beta != 0.0f && c == d;
  const TrialOutput scratch(reads_d ? d_bytes : 0, stream);
  if (reads_d && scratch.ptr == nullptr) return -1;
  void* out = reads_d ? scratch.ptr : d;
  const EventPair events;
  int best = -1;
  float best_ms = 0.0f;
  for (size_t i = 0; i < algos.size(); ++i) {
    const auto run = [&] {
      return cublasLtMatmul(state.handle, plan.desc, alpha, b, plan.layout_first, a, plan.layout_second, beta,
                            c, plan.layout_c, out, plan.layout_c, &algos[i].algo, state.workspace,
                            kWorkspaceBytes, stream);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) continue;  // a candidate that refuses these operands is skipped
    TT_CUDA_CHECK(cudaEventRecord(events.start, stream));
    for (int r = 0; r < 3; ++r) TT_CUBLASLT_CHECK(run());
    TT_CUDA_CHECK(cudaEventRecord(events.stop, stream));
    TT_CUDA_CHECK(cudaEventSynchronize(events.stop));
    float ms = 0.0f;
    TT_CUDA_CHECK(cudaEventElapsedTime(&ms, events.start, events.stop));
    if (best < 0 || ms < best_ms) best = static_cast<int>(i), best_ms = ms;
  }
  return best;
}

}  // namespace

void set_gemm_autotune(int candidates) {
  TT_CHECK(candidates >= 0 && candidates <= 32,
           "GEMM autotuning takes 0..32 candidates, got " + std::to_string(candidates));
  std::lock_guard<std::mutex> lock(g_mutex);
  g_autotune = candidates;
}

void set_gemm_sm_margin(int sms) {
  TT_CHECK(sms >= 0, "the GEMM SM margin must be >= 0, got " + std::to_string(sms));
  std::lock_guard<std::mutex> lock(g_mutex);
  g_sm_margin = sms;
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
          int64_t lda, int64_t stride_a, const void* b, int64_t ldb, int64_t stride_b, DType ab_type,
          float beta, void* c, DType c_type, int64_t ldc, int64_t stride_c, int64_t batch,
          cudaStream_t stream, const void* addend) {
  if (m == 0 || n == 0 || batch == 0) return;
  // The matrix added with beta: c itself, or another of c's layout.
  const void* c_in = addend != nullptr ? addend : c;
  TT_ASSERT(ab_type == DType::f32 || ab_type == DType::bf16, "cuda::gemm: inputs must be f32 or bf16");
  TT_ASSERT(c_type == DType::f32 || (c_type == DType::bf16 && ab_type == DType::bf16),
            "cuda::gemm: the output must be f32, or bf16 for bf16 inputs");
  int device = 0;
  TT_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceState& state = device_state(device);
  const int align_ab = std::min(alignment_of(a), alignment_of(b));
  const int align_c = std::min(alignment_of(c), alignment_of(c_in));
  // 0: the whole device; else plan for that many SMs, leaving the margin to a concurrent stream (NCCL).
  TT_CHECK(g_sm_margin < g_sm_count[device], "the GEMM SM margin (" + std::to_string(g_sm_margin) +
                                                 ") leaves no SM of the device's " +
                                                 std::to_string(g_sm_count[device]) + " for matmuls");
  const int sm_target = g_sm_margin > 0 ? g_sm_count[device] - g_sm_margin : 0;
  const PlanKey key{trans_a,
                    trans_b,
                    m,
                    n,
                    k,
                    lda,
                    ldb,
                    ldc,
                    stride_a,
                    stride_b,
                    stride_c,
                    batch,
                    static_cast<int>(ab_type),
                    static_cast<int>(c_type),
                    align_ab,
                    align_c,
                    sm_target};
  auto found = g_plans[device].find(key);
  if (found == g_plans[device].end()) {
    Plan plan;
    try {
      const cudaDataType_t in_type = ab_type == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F;
      TT_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      if (sm_target > 0) {
        const int32_t target = sm_target;
        TT_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
                                                         &target, sizeof(target)));
      }
      // Column-major view: Lt's first operand is our B, its second our A (see the file comment).
      const cublasOperation_t op_first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
      const cublasOperation_t op_second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
      TT_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first,
                                                       sizeof(op_first)));
      TT_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second,
                                                       sizeof(op_second)));
      plan.layout_first = make_layout(in_type, trans_b ? k : n, trans_b ? n : k, ldb, batch, stride_b);
      plan.layout_second = make_layout(in_type, trans_a ? m : k, trans_a ? k : m, lda, batch, stride_a);
      // f32 accumulation either way; a bf16 output is rounded once in the epilogue.
      plan.layout_c =
          make_layout(c_type == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F, n, m, ldc, batch, stride_c);

      cublasLtMatmulPreference_t pref = nullptr;
      TT_CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      const uint64_t workspace = kWorkspaceBytes;
      const uint32_t align_ab_u = static_cast<uint32_t>(align_ab), align_c_u = static_cast<uint32_t>(align_c);
      TT_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &workspace, sizeof(workspace)));
      TT_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                             &align_ab_u, sizeof(align_ab_u)));
      TT_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                             &align_ab_u, sizeof(align_ab_u)));
      TT_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                             &align_c_u, sizeof(align_c_u)));
      TT_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                             &align_c_u, sizeof(align_c_u)));
      if (c_type == DType::bf16) {
        // Split-K partial sums must meet in f32 (workspace), not in the bf16 output, so that a bf16 result is
        // the f32 product rounded once, as the CPU twin computes it.
        const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
        TT_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes)));
      }
      cublasLtMatmulHeuristicResult_t results[32]{};
      int found_count = 0;
      const cublasStatus_t searched = cublasLtMatmulAlgoGetHeuristic(
          state.handle, plan.desc, plan.layout_first, plan.layout_second, plan.layout_c, plan.layout_c, pref,
          std::max(1, g_autotune), results, &found_count);
      cublasLtMatmulPreferenceDestroy(pref);
      TT_CUBLASLT_CHECK(searched);
      if (found_count == 0) {
        throw Error("cuBLASLt found no algorithm for a " + std::to_string(m) + "x" + std::to_string(n) + "x" +
                    std::to_string(k) + " matmul (batch " + std::to_string(batch) + ")");
      }
      plan.algo = results[0].algo;
      if (found_count > 1) {
        for (int i = 0; i < found_count; ++i) plan.untimed.push_back({results[i].algo});
      }
    } catch (...) {
      plan.destroy();
      throw;
    }
    found = g_plans[device].emplace(key, plan).first;
  }
  if (!found->second.untimed.empty()) {
    // Column-major n x m output with leading dimension ldc, per batch entry.
    const size_t c_elements = static_cast<size_t>(stride_c) * static_cast<size_t>(batch - 1) +
                              static_cast<size_t>(ldc) * static_cast<size_t>(m - 1) + static_cast<size_t>(n);
    Plan& plan = found->second;
    const int best = fastest_candidate(state, plan, plan.untimed, &alpha, a, b, &beta, c_in, c,
                                       c_elements * dtype_size(c_type), stream);
    if (best >= 0) {
      plan.algo = plan.untimed[static_cast<size_t>(best)].algo;
      plan.untimed.clear();
    }
  }
  const Plan& plan = found->second;
  TT_CUBLASLT_CHECK(cublasLtMatmul(state.handle, plan.desc, &alpha, b, plan.layout_first, a,
                                   plan.layout_second, &beta, c_in, plan.layout_c, c, plan.layout_c,
                                   &plan.algo, state.workspace, kWorkspaceBytes, stream));
}

}  // namespace tt::cuda
