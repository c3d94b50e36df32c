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

}  // namespace

KVCache::KVCache(const ModelConfig& config, int64_t rows, Device device)
    : capacity_(config.context_length),
      device_(device),
      upload_(std::make_unique<PinnedUpload>(device)),
      lengths_(static_cast<size_t>(rows), 0) {
  config.validate();
  TT_CHECK(rows > 0 && rows <= INT32_MAX, "KVCache: rows must be in 1..2^31-1, got " + std::to_string(rows));
  // Positions are i32 on the device and f32 in RoPE's angles, which hold whole numbers up to 2^24 exactly.
  TT_CHECK(capacity_ <= (int64_t{1} << 24), "KVCache: a context of " + std::to_string(capacity_) +
                                                " positions is more than the 2^24 the cache takes");
  const DType dtype = attention_dtype(config);
  for (int64_t l = 0; l < config.num_layers; ++l) {
    keys_.push_back(Tensor::empty({rows, capacity_, config.d_model}, dtype, device));
    values_.push_back(Tensor::empty({rows, capacity_, config.d_model}, dtype, device));
  }
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
                                           int64_t layer, const ops::CacheEntries& entries) const {
  const int64_t n = x.size(0), count = x.size(1), heads = config_.num_heads, d_head = config_.d_head();
  const Precision precision = config_.precision;
  const bool bf16 = precision == Precision::bf16;
  // Whole prompts (every entry from position 0) take forward()'s own ops; other steps read each entry's
  // first position from the entries' table, so a CUDA graph of the step replays for any position.
  const bool whole_prompts = count > 1 && std::all_of(entries.starts.begin(), entries.starts.end(),
                                                      [](int64_t s) { return s == 0; });
  // As the naive branch of forward(): bf16 projections in a bf16 model, q and k rotated in f32.
  const Tensor q_raw = q_proj_.forward(x, precision, bf16), k_raw = k_proj_.forward(x, precision, bf16);
  const Tensor v = v_proj_.forward(x, precision, true);
  TT_ASSERT(k_raw.dtype() == cache.keys(layer).dtype(),
            "KVCache: the cache holds " + std::string(dtype_name(cache.keys(layer).dtype())) +
                " keys, the model computes " + dtype_name(k_raw.dtype()));
  // The whole batch at once: one cache write and one attention launch, whatever n (rows ragged).
  Tensor keys = cache.keys(layer), values = cache.values(layer);
  Tensor merged;
  if (whole_prompts) {
    const Tensor q = ops::rope(q_raw, d_head, config_.rope_theta);
    const Tensor k = ops::rope(k_raw, d_head, config_.rope_theta);
    ops::cache_append(keys, entries, k);
    ops::cache_append(values, entries, v);
    // Square causal attention as matmuls. The cache kernel would read each row's keys once per query,
    // quadratic in the prompt's length.
    auto by_head = [&](const Tensor& t) {
      return ops::reshape(t, {n, count, heads, d_head}).transpose_view(1, 2);
    };
    const Tensor o = ops::naive_attention(by_head(q), by_head(k), by_head(v), true);
    merged = ops::reshape(ops::contiguous(o.transpose_view(1, 2)), {n, count, heads * d_head});
  } else {
    const Tensor q = ops::rope_into_cache(q_raw, k_raw, v, keys, values, entries, d_head, config_.rope_theta);
    merged = ops::cached_attention(ops::reshape(q, {n, count, heads, d_head}), keys, values, entries);
  }
  return output_proj_.forward_add(merged, residual, precision);
}

Tensor TransformerBlock::forward_cached(const Tensor& x, KVCache& cache, int64_t layer,
                                        const ops::CacheEntries& entries) const {
  const Tensor h = attn_.forward_cached(ln1_.forward(x, config_.precision), x, cache, layer, entries);
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
  TT_CHECK(entries.table.defined() && entries.table.dtype() == DType::i32 && entries.table.dim() == 2 &&
               entries.table.size(0) == 2 && entries.table.size(1) == ids.size(0) &&
               entries.table.device() == cache.device(),
           "forward_entries: the entries need their i32 (2, " + std::to_string(ids.size(0)) + ") table on " +
               cache.device().str() + " (KVCache::entries makes one)");
  const int64_t count = ids.size(1);
  Tensor x = token_embeddings_->forward(ids);
  for (size_t l = 0; l < layers_.size(); ++l)
    x = layers_[l]->forward_cached(x, cache, static_cast<int64_t>(l), entries);
  // Only the last token's logits: the next token's distribution.
  const Tensor last = ops::contiguous(x.narrow_view(1, count - 1, 1));
  const Tensor h = ln_final_->forward(ops::reshape(last, {x.size(0), config_.d_model}), config_.precision);
  return lm_head_->forward(h, config_.precision);
}

}  // namespace tt::nn
