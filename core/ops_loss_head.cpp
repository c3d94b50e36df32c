// The classifier and its cross-entropy as one op (ops::linear_cross_entropy): logits = x W^T, the mean loss,
// and both gradients, computed a chunk of rows at a time.
//
// Why chunks: at GPT-2 sizes (32k tokens, vocabulary 50257) the f32 logits of a batch are 6.6 GB, written by
// the forward GEMM and read back by the loss, its backward and a cast to bf16. A chunk's logits (about
// 1 GiB in f32, half that in bf16) are made, turned into the loss and the logits' gradient, and consumed by
// the two gradient GEMMs right away, so the batch's logits never exist at once.
// Why padding: cuBLASLt runs its fast kernels only when the vocabulary dimension is aligned, both as the
// logits' leading dimension and as a GEMM extent; with 50257 it fell back to an alignment-1 kernel, about six
// times slower on an H100 (one chunk's forward product: 3.8 ms against 0.63 ms with 50304). So the logits'
// rows are `ld` apart and the weight (a copy in the compute dtype) gets zero rows up to `ld`, the vocabulary
// rounded up to 64: the padding columns of the logits are zeros, the loss skips them and their gradient is
// zero, so the gradient GEMMs run over the padded extent too.
//
// Why bf16 logits in a bf16 model: that is what autocast's matmul returns (f32 accumulation, rounded once),
// and the loss then upcasts it to f32. Storing them so halves what the logits GEMM writes and the loss
// kernel reads, and the logits' gradient (bf16 too, the gradient GEMMs' operand) takes their place in the
// same buffer.
#include <algorithm>

#include "core/ops_internal.h"

namespace tt::ops {

namespace {

constexpr int64_t kVocabAlignment = 64;
constexpr int64_t kChunkRowMultiple = 128;
constexpr int64_t kChunkLogitBytes = int64_t{1} << 30;

int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// Rows per chunk: as asked (tests), or chunks of equal size (a multiple of 128 rows) whose f32 logits take at
// most about 1 GiB (bf16 logits the same rows, in half the bytes); never more than there are rows.
int64_t rows_per_chunk(int64_t requested, int64_t rows, int64_t padded_vocab) {
  if (requested > 0) return std::min(requested, rows);
  const int64_t most = std::max(
      kChunkRowMultiple, kChunkLogitBytes / (padded_vocab * 4) / kChunkRowMultiple * kChunkRowMultiple);
  const int64_t chunks = (rows + most - 1) / most;
  return std::min(rows, round_up((rows + chunks - 1) / chunks, kChunkRowMultiple));
}

// A row of a dense row-major buffer whose rows are `ld` elements apart.
void* row_at(const Tensor& t, int64_t row, int64_t ld) {
  return static_cast<char*>(t.raw_data()) + static_cast<size_t>(row * ld) * dtype_size(t.dtype());
}

// c = op(a) op(b) + beta c on one device, every operand with its own leading dimension (cpu::gemm's
// contract): a and b of `in` (f32, f64 or bf16), c f32 (f64 for f64), or bf16 for bf16 operands on CUDA
// (c_type; the f32 sum rounded once by the GEMM, beta 0).
void gemm(const Device& device, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a,
          int64_t lda, const void* b, int64_t ldb, DType in, double beta, void* c, int64_t ldc,
          DType c_type = DType::f32) {
  if (device.is_cuda()) {
    TT_CUDA_ONLY(cuda::gemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, 0, b, ldb, 0, in,
                            static_cast<float>(beta), c, c_type, ldc, 0, 1,
                            static_cast<cudaStream_t>(compute_stream(device.index))));
  } else if (in == DType::bf16) {
    cpu::gemm_bf16(trans_a, trans_b, m, n, k, 1.0f, static_cast<const bf16*>(a), lda, 0,
                   static_cast<const bf16*>(b), ldb, 0, static_cast<float>(beta), static_cast<float*>(c), ldc,
                   0, 1);
  } else {
    detail::dispatch_float(in, "linear_cross_entropy", [&](auto t) {
      using T = decltype(t);
      cpu::gemm<T>(trans_a, trans_b, m, n, k, T(1), static_cast<const T*>(a), lda, 0,
                   static_cast<const T*>(b), ldb, 0, static_cast<T>(beta), static_cast<T*>(c), ldc, 0, 1);
    });
  }
}

// t *= grad (a {1} tensor on t's device), skipped when grad is exactly 1; on CUDA the check is made on the
// device, so the host never waits for the value.
void scale_by(Tensor& t, const Tensor& grad) {
  if (!t.defined()) return;
  if (t.device().is_cuda()) {
    const Tensor factor = grad.dtype() == DType::f32 ? detail::dense(grad) : cast(grad, DType::f32);
    TT_CUDA_ONLY(
        cuda::scale_by_device_factor(t.data<float>(), t.numel(), factor.data<float>(), detail::stream_of(t)));
  } else {
    const double s = grad.item();
    if (s != 1.0) scale_(t, s);
  }
}

// The gradients were made by the forward pass for an incoming gradient of 1; backward only scales them.
struct LinearCrossEntropyNode : Node {
  Tensor dx, dw;
  const char* name() const override { return "LinearCrossEntropy"; }
  std::vector<Tensor> apply(const Tensor& grad) override {
    TT_ASSERT(grad.numel() == 1,
              "linear_cross_entropy: the loss's gradient must be a scalar, got " + grad.describe());
    scale_by(dx, grad);
    scale_by(dw, grad);
    return {dx, dw};
  }
  void release_saved() override { dx = dw = Tensor(); }
};

}  // namespace

Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& targets_in, DType compute,
                            int64_t chunk_rows) {
  TT_CHECK(weight.dim() == 2, "linear_cross_entropy: weight must be 2-D, got " + weight.describe());
  TT_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "linear_cross_entropy: input features of " +
                                                             x.describe() + " do not match weight " +
                                                             weight.describe());
  detail::require_same_device(x, weight, "linear_cross_entropy");
  detail::require_same_device(x, targets_in, "linear_cross_entropy");
  TT_CHECK(compute == weight.dtype() || compute == DType::bf16,
           std::string("linear_cross_entropy: computes in the weight's dtype or in bf16, not ") +
               dtype_name(compute));
  const int64_t vocab = weight.size(0), in = weight.size(1), rows = x.numel() / std::max<int64_t>(1, in);
  TT_CHECK(rows > 0 && vocab > 0,
           "linear_cross_entropy: no rows or no classes in " + x.describe() + " and " + weight.describe());
  TT_CHECK(targets_in.dtype() == DType::i32 && targets_in.numel() == rows,
           "linear_cross_entropy: targets must be i32 with one entry per row, got " + targets_in.describe());
  const Device device = x.device();
  TT_CHECK(!device.is_cuda() || compute == DType::f32 || compute == DType::bf16,
           std::string("linear_cross_entropy on CUDA computes in f32 or bf16, not ") + dtype_name(compute));
  const Tensor targets = detail::dense(targets_in);
  if (!device.is_cuda()) {
    const int32_t* tg = targets.data<int32_t>();
    for (int64_t i = 0; i < rows; ++i) {
      TT_CHECK(tg[i] >= 0 && tg[i] < vocab, "linear_cross_entropy: target id " + std::to_string(tg[i]) +
                                                " out of range for vocab " + std::to_string(vocab));
    }
  }
  const bool want_dx = needs_grad({&x}), want_dw = needs_grad({&weight});
  Tensor x2, w;
  {
    // The operands in the compute dtype, as ops::linear makes them (a weight's bf16 mirror saves the cast).
    NoGradGuard no_grad;
    x2 = reshape(detail::dense(x.dtype() == compute ? x : cast(x, compute)), {rows, in});
    w = detail::dense(detail::in_dtype(weight, compute));
  }
  // Losses and the operands' gradients in the product's dtype: f32 (f64 for f64). The logits and their
  // gradient in the compute dtype: the gradient as the gradient GEMMs read it, the logits as autocast's
  // matmul returns them (bf16 in a bf16 model; the loss kernels compute in f32 from them).
  const DType wide = detail::wide_dtype(compute);
  const int64_t ld = round_up(vocab, kVocabAlignment);
  if (ld != vocab) {
    // 77 MB of bf16 at GPT-2 small: a copy of well under a millisecond, against GEMMs of milliseconds.
    Tensor padded = Tensor::empty({ld, in}, compute, device);
    padded.narrow_view(0, 0, vocab).copy_(w);
    padded.narrow_view(0, vocab, ld - vocab).zero_();
    w = padded;
  }
  const int64_t chunk = rows_per_chunk(chunk_rows, rows, ld);
  const bool want_grad = want_dx || want_dw;
  // The gradient overwrites the logits it is made from (the kernels read a row before writing it).
  const Tensor logits = Tensor::empty({chunk, ld}, compute, device);
  // The CPU's bf16 product in f32 before it is rounded (cuBLASLt rounds it in the GEMM's epilogue).
  const Tensor product =
      compute == wide || device.is_cuda() ? Tensor() : Tensor::empty({chunk, ld}, wide, device);
  const Tensor losses = Tensor::empty({rows}, wide, device);
  Tensor dx = want_dx ? Tensor::empty({rows, in}, wide, device) : Tensor();
  Tensor dw = want_dw ? Tensor::empty({ld, in}, wide, device) : Tensor();  // padding rows: zeros
  const double inv_rows = 1.0 / static_cast<double>(rows);
  for (int64_t start = 0; start < rows; start += chunk) {
    const int64_t n = std::min(chunk, rows - start);
    const void* x_rows = row_at(x2, start, in);
    // logits = x_c W^T over the padded weight, then each row's loss and (in place) its gradient.
    const int32_t* tg = targets.data<int32_t>() + start;
    void* dlogits = want_grad ? logits.raw_data() : nullptr;
    if (device.is_cuda()) {
      gemm(device, false, true, n, ld, in, x_rows, in, w.raw_data(), in, compute, 0.0, logits.raw_data(), ld,
           compute);
      TT_CUDA_ONLY(cuda::cross_entropy_rows(logits.raw_data(), compute, ld, tg, losses.data<float>() + start,
                                            dlogits, compute, inv_rows, n, vocab, detail::stream_of(logits)));
    } else if (compute == DType::bf16) {
      // The f32 product rounded once to bf16, as cuBLASLt's epilogue rounds it.
      gemm(device, false, true, n, ld, in, x_rows, in, w.raw_data(), in, compute, 0.0, product.raw_data(),
           ld);
      cpu::cast(product.raw_data(), wide, logits.raw_data(), compute, n * ld);
      cpu::cross_entropy_rows_bf16(logits.data<bf16>(), ld, tg, losses.data<float>() + start,
                                   static_cast<bf16*>(dlogits), inv_rows, n, vocab);
    } else {
      gemm(device, false, true, n, ld, in, x_rows, in, w.raw_data(), in, compute, 0.0, logits.raw_data(), ld);
      detail::dispatch_float(wide, "linear_cross_entropy", [&](auto t) {
        using T = decltype(t);
        cpu::cross_entropy_rows(logits.data<T>(), ld, tg, losses.data<T>() + start, static_cast<T*>(dlogits),
                                inv_rows, n, vocab);
      });
    }
    if (!want_grad) continue;
    // dX_c = dlogits_c W; dW (+)= dlogits_c^T x_c, accumulated over the chunks in the wide dtype. The padding
    // adds zeros to dX_c and gives dW zero rows.
    if (want_dx) {
      gemm(device, false, false, n, in, ld, dlogits, ld, w.raw_data(), in, compute, 0.0,
           row_at(dx, start, in), in);
    }
    if (want_dw) {
      gemm(device, true, false, ld, in, n, dlogits, ld, x_rows, in, compute, start == 0 ? 0.0 : 1.0,
           dw.raw_data(), in);
    }
  }
  Tensor out = Tensor::empty({1}, wide, device);
  if (device.is_cuda()) {
    TT_CUDA_ONLY({
      cudaStream_t stream = detail::stream_of(losses);
      cuda::sum(losses.data<float>(), rows, false, out.data<float>(), stream);
      cuda::scale(out.data<float>(), out.data<float>(), 1, inv_rows, stream);
    });
  } else {
    detail::dispatch_float(wide, "linear_cross_entropy", [&](auto t) {
      using T = decltype(t);
      out.data<T>()[0] = static_cast<T>(cpu::sum(losses.data<T>(), rows) / static_cast<double>(rows));
    });
  }
  if (want_grad) {
    auto node = std::make_shared<LinearCrossEntropyNode>();
    if (want_dx) {
      // x's gradient in x's own wide dtype, with x's shape (as ops::linear returns it).
      const DType dx_dtype = detail::wide_dtype(x.dtype());
      node->dx = reshape(dx.dtype() == dx_dtype ? dx : cast(dx, dx_dtype), x.shape());
    }
    if (want_dw) node->dw = dw.narrow_view(0, 0, vocab);
    attach_node(out, node, {&x, &weight});
  }
  return out;
}

}  // namespace tt::ops
