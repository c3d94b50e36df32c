// Inference with a key/value cache: every layer keeps the rotated keys and the values of the tokens a
// sequence has seen, so that each new token goes through the model alone (TransformerLM::forward_cached)
// instead of the whole sequence again.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/ops.h"
#include "core/pinned_upload.h"
#include "nn/transformer.h"

namespace tt::nn {

class KVCache {
 public:
  // Room for `rows` sequences of up to config.context_length tokens each, on `device`, in the dtype the
  // model's attention computes in (bf16 for bf16 models, else f32).
  KVCache(const ModelConfig& config, int64_t rows, Device device);

  int64_t rows() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t capacity() const { return capacity_; }
  Device device() const { return device_; }
  // Tokens held for sequence `row`: the position its next token takes.
  int64_t length(int64_t row) const;
  // Forgets sequence `row` (its room is reused from position 0).
  void reset(int64_t row);

  // Used by the model: layer `layer`'s keys or values, (rows, capacity, d_model), rows [0, length) valid.
  const Tensor& keys(int64_t layer) const { return keys_.at(static_cast<size_t>(layer)); }
  const Tensor& values(int64_t layer) const { return values_.at(static_cast<size_t>(layer)); }
  // Records `count` more tokens for sequence `row` (after every layer has stored them).
  void advance(int64_t row, int64_t count);
  // Where a step's new tokens go: sequences `rows` (distinct), each continuing at its current length. The
  // table is copied to the device on the compute stream (the host does not wait); into `table` when given,
  // a dense i32 (2, rows.size()) on this device (a CUDA graph's input), else into a new tensor.
  ops::CacheEntries entries(const std::vector<int64_t>& rows, Tensor table = Tensor());

 private:
  int64_t capacity_;
  Device device_;
  std::unique_ptr<PinnedUpload> upload_;
  std::vector<Tensor> keys_, values_;
  std::vector<int64_t> lengths_;
};

}  // namespace tt::nn
