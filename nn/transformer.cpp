#include "nn/transformer.h"

#include <cmath>

#include "core/ops.h"
#include "core/profile.h"
#include "core/recompute.h"

namespace tt::nn {

Precision parse_precision(const std::string& text) {
  if (text == "f32") return Precision::f32;
  if (text == "bf16") return Precision::bf16;
  throw Error("unknown precision '" + text + "' (expected f32 or bf16)");
}

AttentionKind parse_attention(const std::string& text) {
  if (text == "naive") return AttentionKind::naive;
  if (text == "flash") return AttentionKind::flash;
  throw Error("unknown attention '" + text + "' (expected naive or flash)");
}

Recompute parse_recompute(const std::string& text) {
  if (text == "none") return Recompute::none;
  if (text == "selective") return Recompute::selective;
  if (text == "block") return Recompute::block;
  throw Error("unknown recompute '" + text + "' (expected none, selective or block)");
}

const char* precision_name(Precision p) {
  return p == Precision::f32 ? "f32" : "bf16";
}
const char* attention_name(AttentionKind a) {
  return a == AttentionKind::naive ? "naive" : "flash";
}
const char* recompute_name(Recompute r) {
  return r == Recompute::none ? "none" : r == Recompute::selective ? "selective" : "block";
}

int64_t ModelConfig::parameter_count() const {
  const int64_t d = d_model;
  return 2 * vocab_size * d + num_layers * (4 * d * d + 3 * d * d_ff + 2 * d) + d;
}

double ModelConfig::training_flops_per_sequence(int64_t context) const {
  const double d = static_cast<double>(d_model), t = static_cast<double>(context);
  // Matmul FLOPs per token (forward): 2 * (matmul parameters); embeddings are gathers, not matmuls.
  const double matmul_params =
      static_cast<double>(num_layers) * (4 * d * d + 3 * d * d_ff) + static_cast<double>(vocab_size) * d;
  // Attention scores and PV: 2 * 2 * T * d per token per layer (full, not causal-halved, as in PaLM's MFU).
  const double attention = static_cast<double>(num_layers) * 4.0 * t * d;
  return 3.0 * t * (2.0 * matmul_params + attention);
}

Recompute ModelConfig::block_recompute(int64_t block) const {
  if (recompute_blocks == 0 || block < recompute_blocks) return recompute;
  return recompute == Recompute::block ? Recompute::selective : Recompute::none;
}

void ModelConfig::validate() const {
  auto positive = [](int64_t v, const char* name) {
    TT_CHECK(v > 0, std::string("model config: ") + name + " must be positive, got " + std::to_string(v));
  };
  positive(vocab_size, "vocab_size");
  positive(context_length, "context_length");
  positive(d_model, "d_model");
  positive(num_layers, "num_layers");
  positive(num_heads, "num_heads");
  positive(d_ff, "d_ff");
  TT_CHECK(d_model % num_heads == 0, "model config: d_model " + std::to_string(d_model) +
                                         " is not divisible by num_heads " + std::to_string(num_heads));
  TT_CHECK(d_head() % 2 == 0, "model config: d_head must be even for RoPE, got " + std::to_string(d_head()));
  TT_CHECK(loss_chunk_rows >= 0,
           "model config: loss_chunk_rows must not be negative, got " + std::to_string(loss_chunk_rows));
  TT_CHECK(recompute_blocks >= 0 && recompute_blocks <= num_layers,
           "--recompute-blocks must be between 0 (all) and the number of layers (" +
               std::to_string(num_layers) + "), got " + std::to_string(recompute_blocks));
  TT_CHECK(
      recompute_blocks == 0 || recompute != Recompute::none,
      "--recompute-blocks " + std::to_string(recompute_blocks) + " needs --recompute selective or block");
}

ModelConfig preset(const std::string& name) {
  ModelConfig c;
  auto set = [&](int64_t d, int64_t dff, int64_t layers, int64_t heads) {
    c.d_model = d;
    c.d_ff = dff;
    c.num_layers = layers;
    c.num_heads = heads;
  };
  if (name == "tiny")
    set(64, 192, 2, 4);
  else if (name == "small")
    set(768, 3072, 12, 12);
  else if (name == "medium")
    set(1024, 4096, 24, 16);
  else if (name == "large")
    set(1280, 5120, 36, 20);
  else if (name == "xl")
    set(1600, 6400, 48, 25);
  else if (name == "2.7b")
    set(2560, 10240, 32, 32);
  else if (name == "7b")  // LLaMA-7B's shape
    set(4096, 11008, 32, 32);
  else
    throw Error("unknown preset '" + name + "' (expected tiny, small, medium, large, xl, 2.7b or 7b)");
  return c;
}

std::vector<std::string> preset_names() {
  return {"tiny", "small", "medium", "large", "xl", "2.7b", "7b"};
}

namespace {
Init linear_init(int64_t in, int64_t out) {
  return {Init::Kind::truncated_normal, std::sqrt(2.0 / static_cast<double>(in + out))};
}
}  // namespace

Linear::Linear(int64_t in_features, int64_t out_features, bool sole_consumer)
    : weight_(register_parameter("weight", {out_features, in_features},
                                 linear_init(in_features, out_features),
                                 /*matmul_weight=*/true)),
      sole_consumer_(sole_consumer) {}

Tensor Linear::forward(const Tensor& x, Precision precision, bool narrow_output) const {
  if (precision == Precision::bf16) {
    // Mixed precision: bf16 operands, f32 accumulation; the f32 weight stays the master copy (its gradient
    // is accumulated in f32 straight into the flat gradient buffer).
    return ops::linear(x, weight_, DType::bf16, narrow_output ? DType::bf16 : DType::f32, sole_consumer_);
  }
  return ops::linear(x, weight_);
}

Tensor Linear::forward_add(const Tensor& x, const Tensor& residual, Precision precision,
                           const Tensor& sum_into) const {
  return ops::linear_residual(residual, x, weight_,
                              precision == Precision::bf16 ? DType::bf16 : weight_.dtype(), sole_consumer_,
                              sum_into);
}

Embedding::Embedding(int64_t vocab_size, int64_t dim)
    : weight_(register_parameter("weight", {vocab_size, dim}, {Init::Kind::truncated_normal, 1.0})) {}

Tensor Embedding::forward(const Tensor& ids) const {
  return ops::embedding(weight_, ids);
}

RMSNorm::RMSNorm(int64_t dim, double eps) : weight_(register_parameter("weight", {dim}, {})), eps_(eps) {}

Tensor RMSNorm::forward(const Tensor& x, Precision precision, Tensor* input_copy) const {
  return ops::rms_norm(x, weight_, eps_, precision == Precision::bf16 ? DType::bf16 : x.dtype(), input_copy);
}

CausalSelfAttention::CausalSelfAttention(const ModelConfig& config)
    : config_(config),
      q_proj_(register_module("q_proj", std::make_unique<Linear>(config.d_model, config.d_model))),
      k_proj_(register_module("k_proj", std::make_unique<Linear>(config.d_model, config.d_model))),
      v_proj_(register_module("v_proj", std::make_unique<Linear>(config.d_model, config.d_model))),
      // The heads' merged output feeds nothing but output_proj.
      output_proj_(
          register_module("output_proj", std::make_unique<Linear>(config.d_model, config.d_model, true))) {}

Tensor CausalSelfAttention::forward(const Tensor& x, const Tensor& residual, const Tensor& sum_into) const {
  const NvtxRange range("attention");
  const int64_t batch = x.size(0), seq = x.size(1), heads = config_.num_heads, d_head = config_.d_head();
  const Precision precision = config_.precision;
  // In bf16 the three projections come out of their matmuls in bf16, as under PyTorch's autocast; Q and K
  // are then rotated in f32 and rounded again (the reference model's rounding), and the rotation hands the
  // projections bf16 gradients (which they round to bf16 anyway).
  const bool bf16 = precision == Precision::bf16;
  Tensor merged;
  if (config_.attention == AttentionKind::flash) {
    // The same as the naive branch's ops with flash attention, as one op: the three projections are one
    // matmul each way (ops::attention_qkv).
    const NvtxRange core("flash_attention");
    merged =
        ops::attention_qkv(x, q_proj_.weight(), k_proj_.weight(), v_proj_.weight(), heads, config_.rope_theta,
                           bf16 ? DType::bf16 : q_proj_.weight().dtype(), config_.deterministic,
                           /*narrow_x_grad=*/bf16);  // x (the norm's output) feeds only this op
  } else {
    const Tensor q = ops::rope(q_proj_.forward(x, precision, bf16), d_head, config_.rope_theta);
    const Tensor k = ops::rope(k_proj_.forward(x, precision, bf16), d_head, config_.rope_theta);
    const Tensor v = v_proj_.forward(x, precision, true);
    // (batch, seq, heads*d_head) seen as (batch, heads, seq, d_head) without copying.
    auto split_heads = [&](const Tensor& t) {
      return ops::transpose(ops::reshape(t, {batch, seq, heads, d_head}), 1, 2);
    };
    Tensor o;
    {
      const NvtxRange core("naive_attention");
      o = ops::naive_attention(split_heads(q), split_heads(k), split_heads(v), true);
    }
    merged = ops::reshape(ops::contiguous(ops::transpose(o, 1, 2)), {batch, seq, heads * d_head});
  }
  return residual.defined() ? output_proj_.forward_add(merged, residual, precision, sum_into)
                            : output_proj_.forward(merged, precision);
}

// w3 is registered right after w1 so that the two lie side by side in the flat parameters: the gate's two
// projections are then one matmul over a view of both (ops::swiglu_projection), with no copy.
SwiGLU::SwiGLU(int64_t d_model, int64_t d_ff)
    : w1_(register_module("w1", std::make_unique<Linear>(d_model, d_ff))),
      w3_(register_module("w3", std::make_unique<Linear>(d_model, d_ff))),
      w2_(register_module("w2", std::make_unique<Linear>(d_ff, d_model, true))) {}  // the gate feeds only w2

Tensor SwiGLU::forward(const Tensor& x, Precision precision, const Tensor& residual,
                       const Tensor& sum_into) const {
  const NvtxRange range("ffn");
  // In bf16 the gate runs on bf16 matmul outputs and hands w2 a bf16 input: no casts of d_ff-wide tensors.
  // x (the norm's bf16 output) feeds only this op, so its gradient comes back in bf16, as under autocast.
  const bool bf16 = precision == Precision::bf16;
  const Tensor gate = ops::swiglu_projection(
      x, w1_.weight(), w3_.weight(), bf16 ? DType::bf16 : w1_.weight().dtype(), /*narrow_x_grad=*/bf16);
  return residual.defined() ? w2_.forward_add(gate, residual, precision, sum_into)
                            : w2_.forward(gate, precision);
}

TransformerBlock::TransformerBlock(const ModelConfig& config)
    : config_(config),
      attn_(register_module("attn", std::make_unique<CausalSelfAttention>(config))),
      ln1_(register_module("ln1", std::make_unique<RMSNorm>(config.d_model, config.norm_eps))),
      ln2_(register_module("ln2", std::make_unique<RMSNorm>(config.d_model, config.norm_eps))),
      ffn_(register_module("ffn", std::make_unique<SwiGLU>(config.d_model, config.d_ff))) {
  for (const NamedParameter& p : named_parameters()) parameter_tensors_.push_back(p.tensor);
}

Tensor TransformerBlock::forward(const Tensor& x) const {
  // x + attention(ln1(x)), then h + ffn(ln2(h)): each residual addition happens in the epilogue of the
  // sublayer's last matmul, which adds into a copy of the residual that the norm wrote as it read it. A
  // cuBLASLt GEMM adding into its own output is faster than one reading a separate addend: at 2.7b on an
  // H100 the two matmuls took 7 us less each, for 3 us more in each norm.
  // In a selective recomputation's second run those matmuls take their kept results: no copies.
  const bool copies = !replaying_kept_results();
  Tensor x_copy, h_copy;
  const Tensor h = attn_.forward(ln1_.forward(x, config_.precision, copies ? &x_copy : nullptr), x, x_copy);
  return ffn_.forward(ln2_.forward(h, config_.precision, copies ? &h_copy : nullptr), config_.precision, h,
                      h_copy);
}

TransformerLM::TransformerLM(const ModelConfig& config) : config_(config) {
  config_.validate();
  token_embeddings_ =
      &register_module("token_embeddings", std::make_unique<Embedding>(config.vocab_size, config.d_model));
  auto& layers = register_module("layers", std::make_unique<ModuleList>());
  for (int64_t i = 0; i < config.num_layers; ++i) {
    layers_.push_back(&layers.append(std::make_unique<TransformerBlock>(config)));
  }
  ln_final_ = &register_module("ln_final", std::make_unique<RMSNorm>(config.d_model, config.norm_eps));
  lm_head_ = &register_module("lm_head", std::make_unique<Linear>(config.d_model, config.vocab_size));
}

std::vector<size_t> TransformerLM::unit_first_parameters() {
  // Parameters are registered embedding, blocks, final norm, head: one unit per registered child, the
  // blocks split out of their ModuleList.
  const std::vector<NamedParameter> all = named_parameters();
  std::vector<size_t> first{0};
  for (size_t i = 1; i < all.size(); ++i) {
    if (all[i].name.rfind("layers.", 0) != 0 && all[i - 1].name.rfind("layers.", 0) != 0) continue;
    const auto block = [](const std::string& name) { return name.substr(0, name.find('.', 7)); };
    if (block(all[i].name) != block(all[i - 1].name)) first.push_back(i);
  }
  TT_ASSERT(first.size() == static_cast<size_t>(config_.num_layers) + 2,
            "TransformerLM parameter units do not match its layers");
  return first;
}

Tensor TransformerLM::blocks_output(const Tensor& ids) const {
  TT_CHECK(ids.dim() == 2, "model input must be (batch, seq) token ids, got " + ids.describe());
  TT_CHECK(ids.size(1) <= config_.context_length, "sequence length " + std::to_string(ids.size(1)) +
                                                      " exceeds the context length " +
                                                      std::to_string(config_.context_length));
  Tensor x = run_unit(
      units_, 0, [this](const Tensor& in) { return token_embeddings_->forward(in); }, ids);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const std::string name = "layer " + std::to_string(i);
    const NvtxRange range(name.c_str());
    const TransformerBlock* block = layers_[i];
    const Recompute how = config_.block_recompute(static_cast<int64_t>(i));
    x = run_unit(
        units_, static_cast<int>(i) + 1,
        [block, how](const Tensor& in) {
          // Backward runs the block again from its input (no dropout or other randomness in the model, so
          // the second run computes the same values).
          if (how == Recompute::none) return block->forward(in);
          return recompute([block](const Tensor& v) { return block->forward(v); }, in,
                           block->parameter_tensors(),
                           how == Recompute::block ? RecomputeKeep::nothing : RecomputeKeep::matmuls);
        },
        x);
  }
  return x;
}

Tensor TransformerLM::forward(const Tensor& ids) const {
  const Tensor x = blocks_output(ids);
  const NvtxRange range("lm_head");
  return run_unit(
      units_, static_cast<int>(layers_.size()) + 1,
      [this](const Tensor& in) {
        return lm_head_->forward(ln_final_->forward(in, config_.precision), config_.precision);
      },
      x);
}

Tensor TransformerLM::loss(const Tensor& ids, const Tensor& targets) const {
  const Tensor x = blocks_output(ids);
  const NvtxRange range("lm_head");
  return run_unit(
      units_, static_cast<int>(layers_.size()) + 1,
      [this, &targets](const Tensor& in) {
        const Tensor h = ln_final_->forward(in, config_.precision);
        const int64_t rows = h.size(0) * h.size(1);
        const Tensor& weight = lm_head_->weight();
        return ops::linear_cross_entropy(
            ops::reshape(h, {rows, config_.d_model}), weight, ops::reshape(targets, {rows}),
            config_.precision == Precision::bf16 ? DType::bf16 : weight.dtype(), config_.loss_chunk_rows);
      },
      x);
}

}  // namespace tt::nn
