// Our model in Hugging Face's Llama layout (README.md's "From your text to Hugging Face"): parameter names,
// the row order RoPE needs, config.json, and the tokenizer files of SentencePiece data. `export` and `import`
// are built on it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/transformer.h"

namespace tt::app {

// "layers.3.attn.q_proj.weight" -> "model.layers.3.self_attn.q_proj.weight" (ffn.w1, the gated branch of
// w2(silu(w1 x) * w3 x), is mlp.gate_proj; w3 is mlp.up_proj, w2 mlp.down_proj). Throws for a name our model
// does not have.
std::string llama_name(const std::string& ours);

// Whether RoPE rotates the outputs of this parameter's rows (q_proj and k_proj): those rows are reordered
// between the two layouts.
bool rope_rows(const std::string& ours);

// Our RoPE rotates interleaved pairs (x0, x1), (x2, x3), ... of each head, Llama's rotates halves
// (x_i, x_{i + d_head/2}). Putting each head's even rows first, then its odd rows, gives the same attention
// in Llama's layout (queries and keys permuted alike leave their dot products unchanged).
// weight: rows x cols, row-major, rows a multiple of d_head.
std::vector<float> rows_to_halves(const std::vector<float>& weight, int64_t rows, int64_t cols,
                                  int64_t d_head);
std::vector<float> rows_to_pairs(const std::vector<float>& weight, int64_t rows, int64_t cols,
                                 int64_t d_head);

// Special token ids for config.json and the tokenizer; -1 when unknown.
struct SpecialTokens {
  int64_t bos = -1, eos = -1;
};

// config.json (LlamaForCausalLM) for `config`, its weights stored as torch_dtype ("float32" | "bfloat16").
std::string llama_config_json(const nn::ModelConfig& config, const std::string& torch_dtype,
                              const SpecialTokens& tokens);

// config.json read back into our configuration (context_length from max_position_embeddings). One line
// naming the file and the field for malformed JSON, a missing or malformed field, and what our model cannot
// represent: another model_type, grouped-query attention, tied embeddings, biases, an activation other than
// SiLU, RoPE scaling, a head_dim other than hidden_size / num_attention_heads.
nn::ModelConfig read_llama_config(const std::string& path);

// What a data folder says about its tokens (meta.json, tokenizer.model beside it).
struct DataTokens {
  std::string tokenizer;            // meta.json's tokenizer ("" without meta.json)
  SpecialTokens ids;                // meta.json's bos_id and eos_id (end_of_text when there is no eos_id)
  bool has_bos = false;             // meta.json names a bos_id: documents start with it
  std::string sentencepiece_model;  // DIR/tokenizer.model when present
};
DataTokens read_data_tokens(const std::string& data_dir);

// The parts of a SentencePiece model (tokenizer.model, a ModelProto) a Llama tokenizer config needs.
struct SentencePieceModel {
  std::vector<std::string> pieces;
  int64_t unk_id = 0, bos_id = 1, eos_id = 2, pad_id = -1;  // the trainer spec's (SentencePiece's defaults)
  bool add_dummy_prefix = true;                             // the normalizer spec's: a space put in front
};
// Throws naming the file when it is not a SentencePiece model.
SentencePieceModel read_sentencepiece_model(const std::string& path);

// tokenizer_config.json for LlamaTokenizer over that tokenizer.model; special tokens named by their pieces.
std::string llama_tokenizer_config_json(const SentencePieceModel& model, const SpecialTokens& tokens,
                                        bool add_bos, int64_t max_length);

}  // namespace tt::app
