// CUDA kernels, the device twins of kernels/cpu/cpu_kernels.h. The same meaning, with dtype and fused-output
// arguments where the bf16 path needs them; every launch goes on the given stream and is checked. f32
// everywhere, bf16 where the mixed-precision path needs it (matmul inputs, casts). Pointers are device
// pointers; scalars that the host must not wait for (the loss gradient) are passed as device pointers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "base/dtype.h"
#include "base/error.h"

#define TT_CUDA_CHECK(call)                                                                   \
  do {                                                                                        \
    const cudaError_t tt_err_ = (call);                                                       \
    if (tt_err_ != cudaSuccess) {                                                             \
      if (tt_err_ == cudaErrorMemoryAllocation)                                               \
        throw ::tt::OutOfMemory(std::string("CUDA out of memory in ") + #call);               \
      ::tt::throw_call_error("CUDA", #call, cudaGetErrorString(tt_err_), __FILE__, __LINE__); \
    }                                                                                         \
  } while (0)

// After a kernel launch: reports launch-configuration errors at the launch site.
#define TT_CUDA_LAUNCH_CHECK() TT_CUDA_CHECK(cudaGetLastError())

namespace tt::cuda {

// Number of CUDA devices; 0 when there is no driver or device (never throws).
int device_count();
// The device's marketing name ("NVIDIA H100 80GB HBM3").
std::string device_name(int device);
// Whether `device` can map `peer`'s memory (NVLink or PCIe peer-to-peer); false for invalid indices.
bool can_access_peer(int device, int peer);
// Compute capability major of the current device (9 for Hopper), looked up once per device.
int current_device_major();
// Whether work queued on `stream` now is being captured into a CUDA graph instead of run.
bool capturing(cudaStream_t stream);

// Batched row-major GEMM through cuBLASLt, c = alpha op(a) op(b) + beta c, same contract as cpu::gemm.
// a_type = b_type in {f32, bf16}; f32 accumulation; c is f32, or bf16 for bf16 inputs (rounded once at the
// end). beta = 1 adds into c (gradients accumulated in place); beta = 0 never reads c. With `addend`, c =
// alpha op(a) op(b) + beta addend instead (addend laid out like c: a residual added in the epilogue).
// Layouts and the algorithm are cached.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
          int64_t lda, int64_t stride_a, const void* b, int64_t ldb, int64_t stride_b, DType ab_type,
          float beta, void* c, DType c_type, int64_t ldc, int64_t stride_c, int64_t batch,
          cudaStream_t stream, const void* addend = nullptr);

// Plans later GEMMs for all SMs but `sms` (0: all), so that a kernel on another stream (an NCCL all-reduce
// overlapping backward) finds SMs free instead of waiting behind a GEMM that fills the device.
void set_gemm_sm_margin(int sms);
// Each new GEMM problem times cuBLASLt's first `candidates` heuristic choices on its operands and keeps the
// fastest (0 or 1: the heuristic's first, the default). The choice then depends on timings, so two processes
// may pick different algorithms and round differently; runs that must repeat bit for bit leave it off.
void set_gemm_autotune(int candidates);

void embedding_forward(const float* weight, const int32_t* ids, float* out, int64_t n, int64_t dim,
                       cudaStream_t stream);
void embedding_backward(const float* grad_out, const int32_t* ids, float* grad_weight, int64_t n, int64_t dim,
                        cudaStream_t stream);

// y is f32 or bf16 (y_type): a bf16 y is the f32 result rounded once, for a bf16 consumer. x_copy
// (nullable): also a copy of x, written in the same pass (the buffer a residual addition over x then makes
// its sum in, in place).
void rms_norm_forward(const float* x, const float* w, void* y, DType y_type, float* inv_rms, int64_t rows,
                      int64_t dim, double eps, cudaStream_t stream, float* x_copy = nullptr);
// dy is f32 or bf16 (dy_type; a bf16 consumer's gradient, widened exactly). accumulate_dx: dx += the gradient
// (a separate addition's rounding) instead of dx = the gradient. dw is f32, or bf16 (dw_type; a bf16 gradient
// buffer takes the f32 sum rounded once). dx_bf16 (nullable): also the final dx rounded to bf16, for bf16
// consumers.
void rms_norm_backward(const void* dy, DType dy_type, const float* x, const float* w, const float* inv_rms,
                       float* dx, void* dw, int64_t rows, int64_t dim, cudaStream_t stream,
                       bool accumulate_dx = false, DType dw_type = DType::f32, void* dx_bf16 = nullptr);

// x and y each f32 or bf16 (x_type, y_type): computed in f32, a bf16 y rounded once. ld_x, ld_y: the rows'
// strides in elements (0: dim), and starts (nullable, a device array of batch positions), as in cpu::rope.
void rope(const void* x, DType x_type, void* y, DType y_type, int64_t batch, int64_t seq, int64_t dim,
          int64_t d_head, double theta, bool inverse, cudaStream_t stream, int64_t ld_x = 0, int64_t ld_y = 0,
          const int32_t* starts = nullptr);

// ops::rope_into_cache on the device: q, k, v and q_out (n * count rows of dim), keys and values (cache rows,
// capacity, dim), all of one `type` (f32 or bf16); table as for cached_attention. q_out and the cache's k
// equal cuda::rope's at those positions, bit for bit.
void rope_into_cache(const void* q, const void* k, const void* v, void* q_out, void* keys, void* values,
                     DType type, const int32_t* table, int64_t n, int64_t count, int64_t dim, int64_t d_head,
                     double theta, int64_t capacity, cudaStream_t stream);

// a, b, out (and da, db) of one `type`, f32 or bf16, computed in f32; dout f32 or bf16.
void swiglu_forward(const void* a, const void* b, void* out, DType type, int64_t n, cudaStream_t stream);
void swiglu_backward(const void* dout, DType dout_type, const void* a, const void* b, void* da, void* db,
                     DType type, int64_t n, cudaStream_t stream);
// The same over one matmul's output holding both inputs: ab (rows, 2 cols) is a | b, out (rows, cols); dab
// (rows, 2 cols) receives da | db, dout (rows, cols).
void swiglu_forward_rows(const void* ab, void* out, DType type, int64_t rows, int64_t cols,
                         cudaStream_t stream);
void swiglu_backward_rows(const void* dout, DType dout_type, const void* ab, void* dab, DType type,
                          int64_t rows, int64_t cols, cudaStream_t stream);

void softmax_forward(const float* s, float* p, int64_t batch, int64_t rows, int64_t cols, double scale,
                     bool causal, cudaStream_t stream);
void softmax_backward(const float* dp, const float* p, float* ds, int64_t batch, int64_t rows, int64_t cols,
                      double scale, cudaStream_t stream);

// Attention over a key/value cache (cpu::cached_attention, cpu::cached_attention_bf16; decode_attention.cu):
// q, keys, values and out of one `type`, f32 or bf16, laid out as on the CPU; scores, an online softmax and
// the weighted sums in f32, out rounded once (the probabilities are not rounded to bf16 on their own, so a
// bf16 result may differ from the CPU's by bf16 rounding). `table` is a device array of 2 n i32: the
// entries' rows, then their starts (ops::CacheEntries), read by the kernels, which is what lets a CUDA graph
// replay with other entries. d_head up to 512; 16, 32, 64, 128 and 256 with 16-byte aligned buffers load
// 16 bytes at a time.
void cached_attention(const void* q, const void* keys, const void* values, void* out, DType type,
                      const int32_t* table, int64_t n, int64_t count, int64_t heads, int64_t d_head,
                      int64_t capacity, double scale, cudaStream_t stream);
// cpu::cache_append on the device (store, src and table device pointers; table as for cached_attention).
void cache_append(void* store, const void* src, int64_t elem_bytes, const int32_t* table, int64_t n,
                  int64_t count, int64_t capacity, int64_t dim, cudaStream_t stream);

void cross_entropy_forward(const float* logits, const int32_t* targets, float* losses, float* lse, int64_t n,
                           int64_t vocab, cudaStream_t stream);
void cross_entropy_backward(const float* logits, const int32_t* targets, const float* lse, const float* dloss,
                            double scale, float* dlogits, int64_t n, int64_t vocab, cudaStream_t stream);
// The fused classifier's loss over a chunk (cpu::cross_entropy_rows, cpu::cross_entropy_rows_bf16): rows ld
// elements apart (ld a multiple of 4, at least vocab; buffers aligned to four elements), logits f32 or bf16
// (logits_type), computed in f32; dlogits (nullable) f32 or bf16 (dlogits_type; bf16 for bf16 logits), zeros
// in the padding columns, and it may be the logits themselves. One read of the logits where a row fits in
// shared memory. An out-of-range target gives a NaN loss.
void cross_entropy_rows(const void* logits, DType logits_type, int64_t ld, const int32_t* targets,
                        float* losses, void* dlogits, DType dlogits_type, double grad_scale, int64_t n,
                        int64_t vocab, cudaStream_t stream);
// x *= *factor (one f32 in device memory, so the host never waits for it), a no-op when it is exactly 1: the
// scaling of gradients computed ahead of time by a loss's incoming gradient.
void scale_by_device_factor(float* x, int64_t n, const float* factor, cudaStream_t stream);

void add(const float* a, const float* b, float* out, int64_t n, double alpha, cudaStream_t stream);
void scale(const float* a, float* out, int64_t n, double s, cudaStream_t stream);
void fill(float* x, int64_t n, double value, cudaStream_t stream);
void fill_i32(int32_t* x, int64_t n, int32_t value, cudaStream_t stream);
// *out = sum(x) (sum of squares when squares): a deterministic two-pass reduction accumulated in double,
// the result in f32.
void sum(const float* x, int64_t n, bool squares, float* out, cudaStream_t stream);
// The same over bf16 elements (each widened exactly).
void sum(const bf16* x, int64_t n, bool squares, float* out, cudaStream_t stream);
// f32 <-> bf16 and i32 <-> f32 conversions (round to nearest even, like the CPU cast).
void cast(const void* in, DType in_type, void* out, DType out_type, int64_t n, cudaStream_t stream);
void strided_copy(const void* in, void* out, int64_t elem_bytes, int ndim, const int64_t* shape,
                  const int64_t* in_strides, cudaStream_t stream);
// dst = (inputs[0] + ... + inputs[count - 1]) * scale, f32 or bf16 (added in that order and scaled in f32,
// rounded once), 1 <= count <= kMaxAddInputs; dst may be one of the inputs. The reduction step of the
// copy-engine all-reduce: the ranks' copies of a slice, in rank order.
constexpr int kMaxAddInputs = 8;
void add_ranks_scaled(void* dst, const void* const* inputs, int count, DType type, int64_t n, float scale,
                      cudaStream_t stream);

// AdamW in two parts so a CUDA graph can hold the update: the step's factors (lr / (1 - beta1^t),
// sqrt(1 - beta2^t), 1 - lr * wd, and 1: apply) are uploaded to 4 floats of device memory outside any
// capture, and the update kernel reads them there. grad_scale (nullable, device) multiplies the gradient
// (clipping).
void adamw_upload_factors(float* device_factors, double lr, double beta1, double beta2, double weight_decay,
                          int64_t step, cudaStream_t stream);
// Sets the fourth factor to 0: adamw_apply launches after this, until the next upload, change nothing
// (a graph replay's update whose step already ran eagerly). gemm_adamw does not read it.
void adamw_cancel_factors(float* device_factors, cudaStream_t stream);
// grad: n f32 elements, or bf16 ones when grad_bf16 (widened exactly before use).
// bf16_copy (nullable, n bf16 elements) receives the updated parameters rounded to bf16 in the same pass.
void adamw_apply(float* param, const void* grad, bool grad_bf16, float* exp_avg, float* exp_avg_sq, int64_t n,
                 const float* device_factors, const float* grad_scale, double beta1, double beta2, double eps,
                 cudaStream_t stream, void* bf16_copy = nullptr);
// One weight for gemm_adamw: W (out, in) row-major f32 with its moments and optional bf16 copy (receives the
// updated W rounded to bf16), updated from the weight gradient of y = x W^T, dW = dY^T X, with dY (tokens,
// out) and X (tokens, in) bf16, rows ld_dy and ld_x elements apart. dW is never stored.
struct GemmAdamwProblem {
  const void* dy;
  const void* x;
  int64_t ld_dy, ld_x, out, in;
  float* param;
  float* exp_avg;
  float* exp_avg_sq;
  void* bf16_copy;  // nullable
};
constexpr int kGemmAdamwMaxProblems = 32;  // weights one gemm_adamw launch takes
// Whether gemm_adamw takes this weight: a Hopper GPU, in, ld_dy and ld_x multiples of 8, dy and x 16-byte
// aligned, W and the moments 16-byte aligned, bf16_copy 8-byte aligned.
bool gemm_adamw_takes(const GemmAdamwProblem& problem, int64_t tokens);
// AdamW (adamw.cu's update, step factors from prepare_step) of `count` weights (1 to kGemmAdamwMaxProblems,
// each one gemm_adamw_takes), each from its gradient dW = dY^T X computed in the same kernel, rounded to
// bf16 first when round_grad_bf16. One launch on `stream` (gemm_adamw.cu, Hopper).
void gemm_adamw(const GemmAdamwProblem* problems, int count, int64_t tokens, bool round_grad_bf16,
                const float* device_factors, double beta1, double beta2, double eps, cudaStream_t stream);
// *scale = min(1, max_norm / (sqrt(*norm_sq) + 1e-6)) (1 when max_norm <= 0), *norm = sqrt(*norm_sq).
void clip_scale(const float* norm_sq, double max_norm, float* scale, float* norm, cudaStream_t stream);

}  // namespace tt::cuda
