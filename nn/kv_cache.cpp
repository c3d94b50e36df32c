// The cached inference path of the Transformer LM: the same math as TransformerLM::forward with naive
// attention, for new tokens only, their queries attending to the keys and values kept in a KVCache.
#include "nn/kv_cache.h"

#include <algorithm>

#include "core/autograd.h"
#include "core/ops.h"

namespace tt::nn {

namespace {

DType attention_dtype(const ModelConfig& config) {
  return config.precision == Precision::bf16 ? DType::bf16 : DType::f32;
}

// ops::rope applied to a probe of (1, 0) pairs yields (cos, sin) of every pair's angle at every position,
// rounded as the kernel of this device rounds them; the matrices built from them rotate exactly as it does.
Tensor rotation_matrices(int64_t capacity, int64_t d_head, double theta, Device device) {
  std::vector<float> probe(static_cast<size_t>(capacity * d_head), 0.0f);
  for (size_t i = 0; i < probe.size(); i += 2) probe[i] = 1.0f;
  const std::vector<float> cos_sin =
      ops::rope(Tensor::from_floats(probe, {1, capacity, d_head}, device), d_head, theta).to_floats();
  std::vector<float> matrices(static_cast<size_t>(capacity * d_head * d_head), 0.0f);
  for (int64_t t = 0; t < capacity; ++t) {
    float* r = matrices.data() + t * d_head * d_head;
    for (int64_t i = 0; i < d_head; i += 2) {
      const float c = cos_sin[static_cast<size_t>(t * d_head + i)];
      const float s = cos_sin[static_cast<size_t>(t * d_head + i + 1)];
      // (y0, y1) = (x0 c - x1 s, x0 s + x1 c), as in the kernel.
      r[i * d_head + i] = c;
      r[i * d_head + i + 1] = -s;
      r[(i + 1) * d_head + i] = s;
      r[(i + 1) * d_head + i + 1] = c;
    }
  }
  return Tensor::from_floats(matrices, {capacity, d_head * d_head}, device);
}

// RoPE on x (n, new, heads*d_head) with row i's tokens at positions starts[i] onwards, in x's dtype
// (rotated in f32).
Tensor rope_from(const Tensor& x, const std::vector<int64_t>& starts, const KVCache& cache, int64_t d_head,
                 double theta) {
  const bool from_zero = std::all_of(starts.begin(), starts.end(), [](int64_t s) { return s == 0; });
  if (from_zero) return ops::rope(x, d_head, theta);  // the full forward's own op
  const int64_t n = x.size(0), count = x.size(1), dim = x.size(2);
  std::vector<int32_t> positions;
  positions.reserve(static_cast<size_t>(n * count));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t t = 0; t < count; ++t) positions.push_back(static_cast<int32_t>(starts[i] + t));
  const int64_t tokens = n * count;
  const Tensor matrices =
      ops::reshape(ops::embedding(cache.rotations(), Tensor::from_ints(positions, {tokens}, x.device())),
                   {tokens, d_head, d_head});
  // Per token: (heads, d_head) x R_t^T; a product with one non-zero term pair per output, so as exact as
  // the kernel's two products and one sum.
  const Tensor heads = ops::reshape(ops::cast(x, DType::f32), {tokens, dim / d_head, d_head});
  const Tensor rotated = ops::matmul(heads, matrices, false, true);
  return ops::cast(ops::reshape(rotated, x.shape()), x.dtype());
}

}  // namespace

KVCache::KVCache(const ModelConfig& config, int64_t rows, Device device)
    : capacity_(config.context_length), device_(device), lengths_(static_cast<size_t>(rows), 0) {
  config.validate();
  TT_CHECK(rows > 0, "KVCache: rows must be positive, got " + std::to_string(rows));
  const DType dtype = attention_dtype(config);
  for (int64_t l = 0; l < config.num_layers; ++l) {
    keys_.push_back(Tensor::empty({rows, capacity_, config.d_model}, dtype, device));
    values_.push_back(Tensor::empty({rows, capacity_, config.d_model}, dtype, device));
  }
  NoGradGuard no_grad;
  rotations_ = rotation_matrices(capacity_, config.d_head(), config.rope_theta, device);
}

int64_t KVCache::length(int64_t row) const {
  TT_ASSERT(row >= 0 && row < rows(), "KVCache: row " + std::to_string(row) + " out of range");
  return lengths_[static_cast<size_t>(row)];
}

void KVCache::reset(int64_t row) {
  length(row);
  lengths_[static_cast<size_t>(row)] = 0;
}

void KVCache::advance(int64_t row, int64_t count) {
  TT_ASSERT(length(row) + count <= capacity_, "KVCache: row " + std::to_string(row) + " overflows");
  lengths_[static_cast<size_t>(row)] += count;
}

Tensor CausalSelfAttention::forward_cached(const Tensor& x, const Tensor& residual, KVCache& cache,
                                           int64_t layer, const std::vector<int64_t>& rows) const {
  const int64_t n = x.size(0), count = x.size(1), heads = config_.num_heads, d_head = config_.d_head();
  const Precision precision = config_.precision;
  const bool bf16 = precision == Precision::bf16;
  std::vector<int64_t> starts;
  for (int64_t row : rows) starts.push_back(cache.length(row));
  // As the naive branch of forward(): bf16 projections in a bf16 model, q and k rotated in f32.
  const Tensor q = rope_from(q_proj_.forward(x, precision, bf16), starts, cache, d_head, config_.rope_theta);
  const Tensor k = rope_from(k_proj_.forward(x, precision, bf16), starts, cache, d_head, config_.rope_theta);
  const Tensor v = v_proj_.forward(x, precision, true);
  TT_ASSERT(k.dtype() == cache.keys(layer).dtype(), "KVCache: the cache holds " +
                                                        std::string(dtype_name(cache.keys(layer).dtype())) +
                                                        " keys, the model computes " + dtype_name(k.dtype()));
  // The whole batch at once: one write per cache and one attention launch, whatever n (rows ragged).
  Tensor keys = cache.keys(layer), values = cache.values(layer);
  ops::cache_append(keys, rows, starts, k);
  ops::cache_append(values, rows, starts, v);
  const bool prompts_only =
      count > 1 && std::all_of(starts.begin(), starts.end(), [](int64_t s) { return s == 0; });
  Tensor merged;
  if (prompts_only) {
    // Whole prompts: square causal attention as matmuls. The cache kernel would read each row's keys once
    // per query, quadratic in the prompt's length.
    auto by_head = [&](const Tensor& t) {
      return ops::reshape(t, {n, count, heads, d_head}).transpose_view(1, 2);
    };
    const Tensor o = ops::naive_attention(by_head(q), by_head(k), by_head(v), true);
    merged = ops::reshape(ops::contiguous(o.transpose_view(1, 2)), {n, count, heads * d_head});
  } else {
    merged = ops::cached_attention(ops::reshape(q, {n, count, heads, d_head}), keys, values, rows, starts);
  }
  return output_proj_.forward_add(merged, residual, precision);
}

Tensor TransformerBlock::forward_cached(const Tensor& x, KVCache& cache, int64_t layer,
                                        const std::vector<int64_t>& rows) const {
  const Tensor h = attn_.forward_cached(ln1_.forward(x, config_.precision), x, cache, layer, rows);
  return ffn_.forward(ln2_.forward(h, config_.precision), config_.precision, h);
}

Tensor TransformerLM::forward_cached(const Tensor& ids, KVCache& cache,
                                     const std::vector<int64_t>& rows) const {
  NoGradGuard no_grad;
  TT_CHECK(ids.dim() == 2 && ids.size(0) == static_cast<int64_t>(rows.size()) && ids.size(1) > 0,
           "forward_cached: ids must be (rows, new tokens) for " + std::to_string(rows.size()) +
               " cache rows, got " + ids.describe());
  TT_CHECK(cache.capacity() <= config_.context_length,
           "forward_cached: the cache holds " + std::to_string(cache.capacity()) +
               " positions, more than the context length " + std::to_string(config_.context_length));
  const int64_t count = ids.size(1);
  for (size_t i = 0; i < rows.size(); ++i) {
    TT_ASSERT(std::count(rows.begin(), rows.end(), rows[i]) == 1,
              "forward_cached: cache row " + std::to_string(rows[i]) + " is given twice");
    TT_CHECK(cache.length(rows[i]) + count <= cache.capacity(),
             "forward_cached: cache row " + std::to_string(rows[i]) + " holds " +
                 std::to_string(cache.length(rows[i])) + " tokens; " + std::to_string(count) +
                 " more exceed the context length " + std::to_string(cache.capacity()));
  }
  Tensor x = token_embeddings_->forward(ids);
  for (size_t l = 0; l < layers_.size(); ++l)
    x = layers_[l]->forward_cached(x, cache, static_cast<int64_t>(l), rows);
  for (int64_t row : rows) cache.advance(row, count);
  // Only the last token's logits: the next token's distribution.
  const Tensor last = ops::contiguous(x.narrow_view(1, count - 1, 1));
  const Tensor h = ln_final_->forward(ops::reshape(last, {x.size(0), config_.d_model}), config_.precision);
  return lm_head_->forward(h, config_.precision);
}

}  // namespace tt::nn
