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

// RoPE on x (tokens' rows, new, heads*d_head) in x's dtype (rotated in f32): by each token's matrix of
// `rotations` (tokens, d_head, d_head), or from position 0 by ops::rope when `rotations` is undefined.
Tensor rope_by(const Tensor& x, const Tensor& rotations, int64_t d_head, double theta) {
  if (!rotations.defined()) return ops::rope(x, d_head, theta);  // the full forward's own op
  const int64_t tokens = x.size(0) * x.size(1), dim = x.size(2);
  // Per token: (heads, d_head) x R_t^T; a product with one non-zero term pair per output, so as exact as
  // the kernel's two products and one sum.
  const Tensor heads = ops::reshape(ops::cast(x, DType::f32), {tokens, dim / d_head, d_head});
  const Tensor rotated = ops::matmul(heads, rotations, false, true);
  return ops::cast(ops::reshape(rotated, x.shape()), x.dtype());
}

// The rotation matrix of every new token of `entries` (n entries of `count` tokens), (n * count, d_head,
// d_head); undefined for whole prompts (every entry from position 0), which ops::rope rotates itself. One
// new token per entry takes its position from the entries' table, so a CUDA graph reads it there.
Tensor token_rotations(const KVCache& cache, const ops::CacheEntries& entries, int64_t count,
                       int64_t d_head) {
  const int64_t n = static_cast<int64_t>(entries.rows.size()), tokens = n * count;
  Tensor positions;
  if (count == 1) {
    positions = ops::reshape(entries.table.narrow_view(0, 1, 1), {n});
  } else {
    if (std::all_of(entries.starts.begin(), entries.starts.end(), [](int64_t s) { return s == 0; }))
      return Tensor();
    std::vector<int32_t> at;
    at.reserve(static_cast<size_t>(tokens));
    for (int64_t start : entries.starts)
      for (int64_t t = 0; t < count; ++t) at.push_back(static_cast<int32_t>(start + t));
    positions = Tensor::from_ints(at, {tokens}, cache.device());
  }
  return ops::reshape(ops::embedding(cache.rotations(), positions), {tokens, d_head, d_head});
}

}  // namespace

KVCache::KVCache(const ModelConfig& config, int64_t rows, Device device)
    : capacity_(config.context_length),
      device_(device),
      upload_(std::make_unique<PinnedUpload>(device)),
      lengths_(static_cast<size_t>(rows), 0) {
  config.validate();
  TT_CHECK(rows > 0 && rows <= INT32_MAX, "KVCache: rows must be in 1..2^31-1, got " + std::to_string(rows));
  TT_CHECK(capacity_ < INT32_MAX, "KVCache: a context of " + std::to_string(capacity_) +
                                      " positions is more than the cache's i32 positions hold");
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

ops::CacheEntries KVCache::entries(const std::vector<int64_t>& rows, Tensor table) {
  ops::CacheEntries e;
  e.rows = rows;
  std::vector<int32_t> flat;
  flat.reserve(2 * rows.size());
  for (int64_t row : rows) {
    e.starts.push_back(length(row));  // checks the row
    flat.push_back(static_cast<int32_t>(row));
  }
  for (int64_t start : e.starts) flat.push_back(static_cast<int32_t>(start));
  const int64_t n = static_cast<int64_t>(rows.size());
  if (table.defined()) {
    upload_->ints_into(flat, table);
  } else {
    table = upload_->ints(flat, {2, n});
  }
  e.table = table;
  return e;
}

Tensor CausalSelfAttention::forward_cached(const Tensor& x, const Tensor& residual, KVCache& cache,
                                           int64_t layer, const ops::CacheEntries& entries,
                                           const Tensor& rotations) const {
  const int64_t n = x.size(0), count = x.size(1), heads = config_.num_heads, d_head = config_.d_head();
  const Precision precision = config_.precision;
  const bool bf16 = precision == Precision::bf16;
  // As the naive branch of forward(): bf16 projections in a bf16 model, q and k rotated in f32.
  const Tensor q = rope_by(q_proj_.forward(x, precision, bf16), rotations, d_head, config_.rope_theta);
  const Tensor k = rope_by(k_proj_.forward(x, precision, bf16), rotations, d_head, config_.rope_theta);
  const Tensor v = v_proj_.forward(x, precision, true);
  TT_ASSERT(k.dtype() == cache.keys(layer).dtype(), "KVCache: the cache holds " +
                                                        std::string(dtype_name(cache.keys(layer).dtype())) +
                                                        " keys, the model computes " + dtype_name(k.dtype()));
  // The whole batch at once: one write per cache and one attention launch, whatever n (rows ragged).
  Tensor keys = cache.keys(layer), values = cache.values(layer);
  ops::cache_append(keys, entries, k);
  ops::cache_append(values, entries, v);
  Tensor merged;
  if (!rotations.defined()) {
    // Whole prompts: square causal attention as matmuls. The cache kernel would read each row's keys once
    // per query, quadratic in the prompt's length.
    auto by_head = [&](const Tensor& t) {
      return ops::reshape(t, {n, count, heads, d_head}).transpose_view(1, 2);
    };
    const Tensor o = ops::naive_attention(by_head(q), by_head(k), by_head(v), true);
    merged = ops::reshape(ops::contiguous(o.transpose_view(1, 2)), {n, count, heads * d_head});
  } else {
    merged = ops::cached_attention(ops::reshape(q, {n, count, heads, d_head}), keys, values, entries);
  }
  return output_proj_.forward_add(merged, residual, precision);
}

Tensor TransformerBlock::forward_cached(const Tensor& x, KVCache& cache, int64_t layer,
                                        const ops::CacheEntries& entries, const Tensor& rotations) const {
  const Tensor h =
      attn_.forward_cached(ln1_.forward(x, config_.precision), x, cache, layer, entries, rotations);
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
  const Tensor logits = forward_entries(ids, cache, cache.entries(rows));
  for (int64_t row : rows) cache.advance(row, count);
  return logits;
}

Tensor TransformerLM::forward_entries(const Tensor& ids, KVCache& cache,
                                      const ops::CacheEntries& entries) const {
  NoGradGuard no_grad;
  TT_CHECK(ids.dim() == 2 && ids.size(0) == static_cast<int64_t>(entries.rows.size()) && ids.size(1) > 0,
           "forward_entries: ids must be (entries, new tokens) for " + std::to_string(entries.rows.size()) +
               " entries, got " + ids.describe());
  const int64_t count = ids.size(1);
  const Tensor rotations = token_rotations(cache, entries, count, config_.d_head());
  Tensor x = token_embeddings_->forward(ids);
  for (size_t l = 0; l < layers_.size(); ++l)
    x = layers_[l]->forward_cached(x, cache, static_cast<int64_t>(l), entries, rotations);
  // Only the last token's logits: the next token's distribution.
  const Tensor last = ops::contiguous(x.narrow_view(1, count - 1, 1));
  const Tensor h = ln_final_->forward(ops::reshape(last, {x.size(0), config_.d_model}), config_.precision);
  return lm_head_->forward(h, config_.precision);
}

}  // namespace tt::nn
