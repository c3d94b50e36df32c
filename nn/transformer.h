// The CS336 "basics" Transformer LM (apps/python/model_baseline.py is it in PyTorch): pre-norm blocks of
// causal multi-head attention with interleaved RoPE and a SwiGLU feed-forward, RMSNorm everywhere, separate
// embedding and LM head.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/ops.h"
#include "nn/module.h"
#include "nn/parameter_units.h"

namespace tt::nn {

class KVCache;

enum class Precision { f32, bf16 };
enum class AttentionKind { naive, flash };
// What the training forward keeps for backward (core/recompute.h): every op's saved tensors (none); each
// block's input and the results of its matmuls and attention, its norms and SwiGLU gate run again in
// backward (selective: about a quarter less activation memory for a few percent more time); or only each
// block's input, the whole block run again in backward (block).
enum class Recompute { none, selective, block };

Precision parse_precision(const std::string& text);
AttentionKind parse_attention(const std::string& text);
Recompute parse_recompute(const std::string& text);
const char* precision_name(Precision p);
const char* attention_name(AttentionKind a);
const char* recompute_name(Recompute r);

struct ModelConfig {
  int64_t vocab_size = 10000;
  int64_t context_length = 256;
  int64_t d_model = 768;
  int64_t num_layers = 12;
  int64_t num_heads = 12;
  int64_t d_ff = 3072;
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  Precision precision = Precision::f32;
  AttentionKind attention = AttentionKind::naive;
  bool deterministic = false;  // bit-identical runs on CUDA (exact resume); slower attention backward
  // Activation recomputation per Transformer block (less memory, more forward work); the same losses and
  // gradients, bit for bit. Changes nothing without grad mode.
  Recompute recompute = Recompute::none;
  // The number of blocks, from the first, that `recompute` applies to (0: all). The others keep everything,
  // except with block, where they are recomputed selectively: selective saves more memory per extra
  // millisecond than whole blocks do, so a run short of memory takes it first.
  int64_t recompute_blocks = 0;
  // Rows per chunk of the fused classifier + loss in loss() (ops::linear_cross_entropy; 0: automatic, about
  // 1 GiB of f32 logits). Tests set it to make several chunks of a small batch.
  int64_t loss_chunk_rows = 0;

  int64_t d_head() const { return d_model / num_heads; }
  // 2*V*d + L*(4*d^2 + 3*d*d_ff + 2*d) + d
  int64_t parameter_count() const;
  // Forward+backward FLOPs for one sequence of `context` tokens (6 * params-in-matmuls + attention).
  double training_flops_per_sequence(int64_t context) const;
  void validate() const;                           // throws tt::Error naming the inconsistent field
  Recompute block_recompute(int64_t block) const;  // how block `block` (0-based) recomputes
};

// tiny (tests), small, medium, large, xl, 2.7b, 7b (LLaMA-7B's shape). vocab_size and context_length keep
// their defaults (10000, 256) unless the caller changes them.
ModelConfig preset(const std::string& name);
std::vector<std::string> preset_names();

class Linear : public Module {
 public:
  // sole_consumer: the layer is the only consumer of its input (a sublayer's inner activation), so in bf16
  // the input's gradient is returned in bf16 (ops::linear's narrow_x_grad), as its producer takes it.
  Linear(int64_t in_features, int64_t out_features, bool sole_consumer = false);
  // bf16: bf16 operands, f32 accumulation, f32 output (bf16 with narrow_output, for a bf16 consumer).
  Tensor forward(const Tensor& x, Precision precision, bool narrow_output = false) const;
  // residual + forward(x), the residual (f32, the output's shape) added in the matmul's epilogue; made in
  // sum_into when given (a copy of the residual outside autograd, from RMSNorm::forward;
  // ops::linear_residual).
  Tensor forward_add(const Tensor& x, const Tensor& residual, Precision precision,
                     const Tensor& sum_into = Tensor()) const;
  Tensor& weight() { return weight_; }
  const Tensor& weight() const { return weight_; }

 private:
  Tensor& weight_;
  bool sole_consumer_;
};

class Embedding : public Module {
 public:
  Embedding(int64_t vocab_size, int64_t dim);
  Tensor forward(const Tensor& ids) const;

 private:
  Tensor& weight_;
};

// Holds numbered children ("layers.0", "layers.1", ...).
class ModuleList : public Module {
 public:
  template <class M>
  M& append(std::unique_ptr<M> module) {
    return register_module(std::to_string(size_++), std::move(module));
  }

 private:
  int64_t size_ = 0;
};

class RMSNorm : public Module {
 public:
  RMSNorm(int64_t dim, double eps);
  // bf16: the normalised output is rounded to bf16 in the norm (its consumers are bf16 matmuls).
  // input_copy (optional): also a copy of x, for the residual addition over x to be made in (ops::rms_norm).
  Tensor forward(const Tensor& x, Precision precision = Precision::f32, Tensor* input_copy = nullptr) const;

 private:
  Tensor& weight_;
  double eps_;
};

class CausalSelfAttention : public Module {
 public:
  explicit CausalSelfAttention(const ModelConfig& config);
  // x: the normalised input (f32, or bf16 in bf16 mode) (batch, seq, d_model) -> f32. With a residual
  // (f32, x's shape), returns residual + attention(x), the addition done by the output projection, in
  // sum_into when given (Linear::forward_add).
  Tensor forward(const Tensor& x, const Tensor& residual = Tensor(), const Tensor& sum_into = Tensor()) const;
  // Inference (nn/kv_cache.cpp): residual + attention(x) for x (n, new, d_model) continuing the cache at
  // `entries`, their keys and values stored in layer `layer` of the cache. The naive branch's math.
  Tensor forward_cached(const Tensor& x, const Tensor& residual, KVCache& cache, int64_t layer,
                        const ops::CacheEntries& entries) const;

 private:
  const ModelConfig config_;
  Linear &q_proj_, &k_proj_, &v_proj_, &output_proj_;
};

class SwiGLU : public Module {
 public:
  SwiGLU(int64_t d_model, int64_t d_ff);
  // With a residual: residual + ffn(x), the addition done by w2, in sum_into when given.
  Tensor forward(const Tensor& x, Precision precision, const Tensor& residual = Tensor(),
                 const Tensor& sum_into = Tensor()) const;

 private:
  Linear &w1_, &w3_, &w2_;  // in this order: w1 and w3 lie side by side (transformer.cpp)
};

class TransformerBlock : public Module {
 public:
  explicit TransformerBlock(const ModelConfig& config);
  Tensor forward(const Tensor& x) const;
  Tensor forward_cached(const Tensor& x, KVCache& cache, int64_t layer,
                        const ops::CacheEntries& entries) const;
  // The block's parameters (for recompute(), which needs to know whether any requires grad).
  const std::vector<const Tensor*>& parameter_tensors() const { return parameter_tensors_; }

 private:
  const ModelConfig config_;
  std::vector<const Tensor*> parameter_tensors_;
  CausalSelfAttention& attn_;
  RMSNorm &ln1_, &ln2_;
  SwiGLU& ffn_;
};

class TransformerLM : public Module {
 public:
  explicit TransformerLM(const ModelConfig& config);
  // token ids i32 (batch, seq) -> logits f32 (batch, seq, vocab)
  Tensor forward(const Tensor& ids) const;
  // Mean cross-entropy of next-token prediction: targets i32 (batch, seq). The classifier and the loss are
  // one op (ops::linear_cross_entropy), so the logits of the whole batch are never held; the value and
  // gradients are those of cross_entropy over forward()'s logits (in a bf16 model, those logits rounded to
  // bf16 first, as PyTorch's autocast computes them).
  Tensor loss(const Tensor& ids, const Tensor& targets) const;
  // Inference with a key/value cache (nn/kv_cache.h), without autograd: ids i32 (n, new) continue cache rows
  // `rows` (distinct), row i's tokens taking positions cache.length(rows[i]) onwards; their keys and values
  // join the cache. Returns the logits f32 (n, vocab) of each row's last new token. Agrees with forward()'s
  // logits at that position up to rounding.
  Tensor forward_cached(const Tensor& ids, KVCache& cache, const std::vector<int64_t>& rows) const;
  // forward_cached's work on the device, for entries the caller made (KVCache::entries) and without
  // advancing the cache: for one new token per row it reads the entries only through their table, so a
  // CUDA graph of it replays for other positions (app::generate_tokens' decoding steps).
  Tensor forward_entries(const Tensor& ids, KVCache& cache, const ops::CacheEntries& entries) const;
  const ModelConfig& config() const { return config_; }
  ModelConfig& mutable_config() { return config_; }

  // Parameter units (nn/parameter_units.h; ZeRO-2/3, the overlapped update): unit 0 is the token embedding,
  // unit i + 1 block i, the last unit the final norm and the LM head. The index of each unit's first
  // parameter in named_parameters() order; units cover the parameters contiguously. forward() and loss() run
  // each unit through `units` (nullptr: none); forward_cached does not (it needs every parameter present).
  std::vector<size_t> unit_first_parameters();
  void set_parameter_units(ParameterUnits* units) { units_ = units; }

 private:
  // The last block's output (batch, seq, d_model): what the final norm reads.
  Tensor blocks_output(const Tensor& ids) const;

  ModelConfig config_;
  Embedding* token_embeddings_ = nullptr;
  std::vector<TransformerBlock*> layers_;
  RMSNorm* ln_final_ = nullptr;
  Linear* lm_head_ = nullptr;
  ParameterUnits* units_ = nullptr;
};

}  // namespace tt::nn
