// FlashAttention-2, forward and backward: the CPU tiled reference and the CUDA kernels share this
// description of the problem. Tensors are (batch, heads, seq, d_head) with arbitrary strides for the first
// three dims and a contiguous last dim, so q/k/v can be views of a (batch, seq, heads*d_head) projection.
#pragma once

#include <cstdint>

#include "base/dtype.h"

namespace tt {

struct AttentionStrides {
  int64_t batch = 0, head = 0, seq = 0;  // in elements; the d_head dim has stride 1
};

// Which CUDA kernels run; the CPU ignores it. `automatic` (what the model uses) takes the fastest tier that
// applies to the dtype, the row alignment and the GPU (docs/attention.md has the table). Tests pin the
// other tiers to check each of them on one GPU: `cp_async_forward` runs the Hopper forward fed by cp.async
// for d_head 64 too (its fallback where no TMA tensor map can be made), `mma_sync` keeps bf16 off the Hopper
// kernels, `simple` runs the FMA kernels for every dtype.
enum class AttentionKernels { automatic, cp_async_forward, mma_sync, simple };

struct AttentionProblem {
  int64_t batch = 1, heads = 1, seq = 1, d_head = 64;
  bool causal = true;
  float scale = 0.125f;  // usually 1/sqrt(d_head)
  // Bit-identical results run to run (the CUDA backward then avoids atomic dQ accumulation; slower).
  bool deterministic = false;
  AttentionKernels kernels = AttentionKernels::automatic;
  AttentionStrides q, k, v, o;  // layouts of Q, K, V, O (dO/dQ/dK/dV use the same strides as O/Q/K/V)
  // Contiguous (batch, heads, seq, d_head) strides.
  static AttentionStrides contiguous(int64_t heads, int64_t seq, int64_t d_head) {
    return {heads * seq * d_head, seq * d_head, d_head};
  }
};

namespace cpu {
// O (same type as Q) and L = logsumexp of the scaled, masked scores per (batch*heads, seq) row, in f32/T.
template <class T>
void flash_attention_forward(const AttentionProblem& p, const T* q, const T* k, const T* v, T* o, T* lse,
                             int64_t tile_q = 64, int64_t tile_k = 64);
// dQ, dK, dV are overwritten (same layouts as Q, K, V).
template <class T>
void flash_attention_backward(const AttentionProblem& p, const T* q, const T* k, const T* v, const T* o,
                              const T* d_o, const T* lse, T* dq, T* dk, T* dv, int64_t tile_q = 64,
                              int64_t tile_k = 64);
}  // namespace cpu

#ifdef TT_WITH_CUDA
namespace cuda {
// dtype is f32 or bf16 for q, k, v, o, dO, dQ, dK, dV; lse is always f32 (batch*heads*seq).
// Scratch: the backward needs f32 scratch (D = rowsum(dO*O) and a dQ accumulator) and allocates it
// stream-ordered itself.
void flash_attention_forward(const AttentionProblem& p, DType dtype, const void* q, const void* k,
                             const void* v, void* o, float* lse, void* stream);
void flash_attention_backward(const AttentionProblem& p, DType dtype, const void* q, const void* k,
                              const void* v, const void* o, const void* d_o, const float* lse, void* dq,
                              void* dk, void* dv, void* stream);
}  // namespace cuda
#endif

}  // namespace tt
