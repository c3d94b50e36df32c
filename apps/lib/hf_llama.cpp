#include "apps/lib/hf_llama.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "apps/lib/data.h"
#include "apps/lib/safetensors.h"
#include "base/error.h"

namespace tt::app {

namespace fs = std::filesystem;

std::string llama_name(const std::string& ours) {
  static const std::map<std::string, std::string> top = {
      {"token_embeddings.weight", "model.embed_tokens.weight"},
      {"ln_final.weight", "model.norm.weight"},
      {"lm_head.weight", "lm_head.weight"}};
  static const std::map<std::string, std::string> layer = {
      {"attn.q_proj.weight", "self_attn.q_proj.weight"},
      {"attn.k_proj.weight", "self_attn.k_proj.weight"},
      {"attn.v_proj.weight", "self_attn.v_proj.weight"},
      {"attn.output_proj.weight", "self_attn.o_proj.weight"},
      {"ln1.weight", "input_layernorm.weight"},
      {"ln2.weight", "post_attention_layernorm.weight"},
      {"ffn.w1.weight", "mlp.gate_proj.weight"},
      {"ffn.w2.weight", "mlp.down_proj.weight"},
      {"ffn.w3.weight", "mlp.up_proj.weight"}};
  if (const auto found = top.find(ours); found != top.end()) return found->second;
  const std::string prefix = "layers.";
  const size_t dot = ours.find('.', prefix.size());
  if (ours.rfind(prefix, 0) == 0 && dot != std::string::npos && dot > prefix.size()) {
    const std::string index = ours.substr(prefix.size(), dot - prefix.size());
    const auto found = layer.find(ours.substr(dot + 1));
    if (index.find_first_not_of("0123456789") == std::string::npos && found != layer.end())
      return "model.layers." + index + "." + found->second;
  }
  throw_internal_error("parameter " + ours + " has no Llama name", __FILE__, __LINE__);
}

bool rope_rows(const std::string& ours) {
  auto ends_with = [&](const std::string& tail) {
    return ours.size() >= tail.size() && ours.compare(ours.size() - tail.size(), tail.size(), tail) == 0;
  };
  return ends_with(".attn.q_proj.weight") || ends_with(".attn.k_proj.weight");
}

namespace {
// Row `r` of the result is row source_row(r) of the input.
template <class SourceRow>
std::vector<float> reorder_rows(const std::vector<float>& weight, int64_t rows, int64_t cols, int64_t d_head,
                                SourceRow source_row) {
  TT_ASSERT(d_head > 0 && d_head % 2 == 0 && rows % d_head == 0 &&
                static_cast<int64_t>(weight.size()) == rows * cols,
            "cannot reorder a " + std::to_string(rows) + " x " + std::to_string(cols) +
                " matrix by heads of " + std::to_string(d_head));
  std::vector<float> out(weight.size());
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t head = r / d_head * d_head;
    const int64_t from = head + source_row(r - head, d_head / 2);
    std::copy_n(weight.begin() + from * cols, cols, out.begin() + r * cols);
  }
  return out;
}
}  // namespace

std::vector<float> rows_to_halves(const std::vector<float>& weight, int64_t rows, int64_t cols,
                                  int64_t d_head) {
  // First half: the even rows; second half: the odd rows.
  return reorder_rows(weight, rows, cols, d_head,
                      [](int64_t i, int64_t half) { return i < half ? 2 * i : 2 * (i - half) + 1; });
}

std::vector<float> rows_to_pairs(const std::vector<float>& weight, int64_t rows, int64_t cols,
                                 int64_t d_head) {
  return reorder_rows(weight, rows, cols, d_head,
                      [](int64_t i, int64_t half) { return i % 2 == 0 ? i / 2 : half + i / 2; });
}

std::string llama_config_json(const nn::ModelConfig& config, const std::string& torch_dtype,
                              const SpecialTokens& tokens) {
  nlohmann::ordered_json json;
  json["architectures"] = {"LlamaForCausalLM"};
  json["model_type"] = "llama";
  json["hidden_size"] = config.d_model;
  json["intermediate_size"] = config.d_ff;
  json["num_hidden_layers"] = config.num_layers;
  json["num_attention_heads"] = config.num_heads;
  json["num_key_value_heads"] = config.num_heads;
  json["head_dim"] = config.d_head();
  json["max_position_embeddings"] = config.context_length;
  json["rope_theta"] = config.rope_theta;
  json["rope_scaling"] = nullptr;
  json["rms_norm_eps"] = config.norm_eps;
  json["vocab_size"] = config.vocab_size;
  json["hidden_act"] = "silu";
  json["attention_bias"] = false;
  json["mlp_bias"] = false;
  json["attention_dropout"] = 0.0;
  json["pretraining_tp"] = 1;
  json["tie_word_embeddings"] = false;
  json["use_cache"] = true;
  json["torch_dtype"] = torch_dtype;
  // null, not left out: transformers' LlamaConfig would otherwise take 1 and 2, ids of ordinary tokens here.
  json["bos_token_id"] =
      tokens.bos >= 0 ? nlohmann::ordered_json(tokens.bos) : nlohmann::ordered_json(nullptr);
  json["eos_token_id"] =
      tokens.eos >= 0 ? nlohmann::ordered_json(tokens.eos) : nlohmann::ordered_json(nullptr);
  return json.dump(2) + "\n";
}

namespace {

// Whether `v` is an integer in [low, high] (JSON's 2.0 is not an integer).
bool integer_in(const nlohmann::json& v, int64_t low, int64_t high) {
  if (!v.is_number_integer()) return false;
  if (v.is_number_unsigned())
    return v.get<uint64_t>() <= static_cast<uint64_t>(high) && v.get<int64_t>() >= low;
  return v.get<int64_t>() >= low && v.get<int64_t>() <= high;
}

nlohmann::json read_json_object(const std::string& path) {
  TT_CHECK(fs::is_regular_file(path), path + " does not exist");
  std::ifstream in(path);
  TT_CHECK(in, path + ": cannot be read");
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(path + ": not valid JSON (" + json_error_message(e) + ")");
  }
  TT_CHECK(json.is_object(), path + ": expected a JSON object, got " + std::string(json.type_name()));
  return json;
}

// Field readers for config.json: each refusal names the file and the field.
class ConfigFields {
 public:
  ConfigFields(const nlohmann::json& json, std::string path) : json_(json), path_(std::move(path)) {}
  Error error(const std::string& what) const { return Error(path_ + ": " + what); }
  const std::string& path() const { return path_; }
  bool has(const char* field) const { return json_.contains(field) && !json_.at(field).is_null(); }

  int64_t positive(const char* field) const {
    if (!json_.contains(field)) throw error(std::string(field) + " is missing");
    const nlohmann::json& v = json_.at(field);
    if (!integer_in(v, 1, INT64_MAX))
      throw error(std::string(field) + " must be a positive integer, got " + v.dump());
    return v.get<int64_t>();
  }
  double positive_number(const char* field) const {
    if (!json_.contains(field)) throw error(std::string(field) + " is missing");
    const nlohmann::json& v = json_.at(field);
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0)
      throw error(std::string(field) + " must be a positive number, got " + v.dump());
    return v.get<double>();
  }
  bool flag(const char* field) const {
    if (!has(field)) return false;
    const nlohmann::json& v = json_.at(field);
    if (!v.is_boolean()) throw error(std::string(field) + " must be true or false, got " + v.dump());
    return v.get<bool>();
  }
  std::string text(const char* field) const {
    const nlohmann::json& v = json_.at(field);
    if (!v.is_string()) throw error(std::string(field) + " must be a string, got " + v.dump());
    return v.get<std::string>();
  }

 private:
  const nlohmann::json& json_;
  std::string path_;
};

// RoPE's base: rope_theta, or inside rope_parameters (transformers 5) or rope_scaling (its older name), whose
// rope_type must be plain RoPE; Llama's 10000 when none names it.
double read_rope_theta(const nlohmann::json& json, const ConfigFields& f) {
  double theta = f.has("rope_theta") ? f.positive_number("rope_theta") : 0;
  for (const char* field : {"rope_parameters", "rope_scaling"}) {
    if (!f.has(field)) continue;
    const nlohmann::json& rope = json.at(field);
    if (!rope.is_object()) throw f.error(std::string(field) + " must be an object, got " + rope.dump());
    const char* type_key = rope.contains("rope_type") ? "rope_type" : "type";
    const nlohmann::json type = rope.contains(type_key) ? rope.at(type_key) : nlohmann::json("default");
    if (type != "default") {
      throw f.error(std::string(field) + " has " + type_key + " " + type.dump() +
                    ": scaled RoPE cannot be represented by this model");
    }
    if (!rope.contains("rope_theta")) continue;
    const ConfigFields inner(rope, f.path() + ": " + field);
    const double value = inner.positive_number("rope_theta");
    if (theta > 0 && value != theta) {
      throw f.error(std::string(field) + ".rope_theta " + rope.at("rope_theta").dump() +
                    " differs from rope_theta " + json.at("rope_theta").dump());
    }
    theta = value;
  }
  return theta > 0 ? theta : 10000.0;
}

}  // namespace

nn::ModelConfig read_llama_config(const std::string& path) {
  const nlohmann::json json = read_json_object(path);
  const ConfigFields f(json, path);
  if (f.has("model_type") && f.text("model_type") != "llama")
    throw f.error("model_type is '" + f.text("model_type") + "', expected llama");
  nn::ModelConfig c;
  c.d_model = f.positive("hidden_size");
  c.d_ff = f.positive("intermediate_size");
  c.num_layers = f.positive("num_hidden_layers");
  c.num_heads = f.positive("num_attention_heads");
  c.vocab_size = f.positive("vocab_size");
  c.context_length = f.positive("max_position_embeddings");
  c.norm_eps = f.positive_number("rms_norm_eps");
  // Llama's defaults where a field may be left out.
  c.rope_theta = read_rope_theta(json, f);
  const std::string cannot = " cannot be represented by this model";
  // Another class's weights under model_type llama would be read as a causal LM's.
  if (json.contains("architectures") && json.at("architectures").is_array() &&
      !json.at("architectures").empty()) {
    const nlohmann::json& classes = json.at("architectures");
    if (std::find(classes.begin(), classes.end(), "LlamaForCausalLM") == classes.end())
      throw f.error("architectures is " + classes.dump() + ": only LlamaForCausalLM is read");
  }
  TT_CHECK(c.d_model % c.num_heads == 0, path + ": hidden_size " + std::to_string(c.d_model) +
                                             " is not divisible by num_attention_heads " +
                                             std::to_string(c.num_heads));
  if (f.has("num_key_value_heads") && f.positive("num_key_value_heads") != c.num_heads) {
    throw f.error("num_key_value_heads " + std::to_string(f.positive("num_key_value_heads")) +
                  " differs from num_attention_heads " + std::to_string(c.num_heads) +
                  ": grouped-query attention" + cannot);
  }
  if (f.flag("tie_word_embeddings"))
    throw f.error("tie_word_embeddings is true: tied input and output embeddings" + cannot);
  if (f.has("hidden_act") && f.text("hidden_act") != "silu")
    throw f.error("hidden_act is '" + f.text("hidden_act") + "': only silu (SwiGLU) can be represented");
  if (f.flag("attention_bias")) throw f.error("attention_bias is true: biases" + cannot);
  if (f.flag("mlp_bias")) throw f.error("mlp_bias is true: biases" + cannot);
  if (f.has("partial_rotary_factor") && f.positive_number("partial_rotary_factor") != 1.0) {
    throw f.error("partial_rotary_factor is " + json.at("partial_rotary_factor").dump() +
                  ": RoPE on part of each head" + cannot);
  }
  if (f.has("head_dim") && f.positive("head_dim") != c.d_head()) {
    throw f.error("head_dim " + std::to_string(f.positive("head_dim")) +
                  " is not hidden_size / num_attention_heads (" + std::to_string(c.d_head()) +
                  "): heads of another width" + cannot);
  }
  try {
    c.validate();
  } catch (const Error& e) {
    throw f.error(e.what());
  }
  return c;
}

DataTokens read_data_tokens(const std::string& data_dir) {
  DataTokens out;
  if (data_dir.empty() || !fs::is_directory(data_dir)) return out;
  if (fs::is_regular_file(data_dir + "/tokenizer.model"))
    out.sentencepiece_model = data_dir + "/tokenizer.model";
  const std::optional<DataMeta> meta = read_meta(data_dir);
  if (!meta) return out;
  out.tokenizer = meta->tokenizer;
  out.ids.eos = meta->end_of_text;
  // bos_id and eos_id are not read_meta's: read them here, checked the same way.
  const std::string path = data_dir + "/meta.json";
  const nlohmann::json json = read_json_object(path);
  auto id = [&](const char* field) -> int64_t {
    if (!json.contains(field)) return -1;
    const nlohmann::json& v = json.at(field);
    TT_CHECK(integer_in(v, 0, meta->vocab_size - 1), path + ": " + field + " must be an integer in 0.." +
                                                         std::to_string(meta->vocab_size - 1) +
                                                         " (below vocab_size), got " + v.dump());
    return v.get<int64_t>();
  };
  out.ids.bos = id("bos_id");
  out.has_bos = out.ids.bos >= 0;
  if (const int64_t eos = id("eos_id"); eos >= 0) out.ids.eos = eos;
  // prepare_data records the tokenizer.model its ids came from: a replaced one must not be exported.
  const char* checksum_field = "tokenizer_model_fnv1a64";
  if (json.contains(checksum_field) && !out.sentencepiece_model.empty()) {
    std::ifstream in(out.sentencepiece_model, std::ios::binary);
    TT_CHECK(in, out.sentencepiece_model + ": cannot be read");
    uint64_t hash = 0xcbf29ce484222325ULL;  // FNV-1a 64
    for (std::istreambuf_iterator<char> it(in), end; it != end; ++it) {
      hash ^= static_cast<unsigned char>(*it);
      hash *= 0x100000001b3ULL;
    }
    char text[17];
    std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(hash));
    const nlohmann::json& recorded = json.at(checksum_field);
    TT_CHECK(recorded.is_string() && recorded.get<std::string>() == text,
             out.sentencepiece_model + " is not the tokenizer the data was made with (FNV-1a 64 " + text +
                 ", meta.json's " + checksum_field + " " + recorded.dump() + ")");
  }
  return out;
}

namespace {

// Protocol-buffer wire format, as much as a ModelProto needs: varints and length-delimited fields.
class ProtoReader {
 public:
  ProtoReader(const std::string& bytes, size_t begin, size_t end, const std::string& path)
      : bytes_(bytes), pos_(begin), end_(end), path_(path) {}
  bool done() const { return pos_ >= end_; }
  Error error(const std::string& what) const {
    return Error(path_ + " is not a SentencePiece model (" + what + " at byte " + std::to_string(pos_) + ")");
  }
  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= end_) throw error("truncated varint");
      const auto byte = static_cast<unsigned char>(bytes_[pos_++]);
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return value;
    }
    throw error("varint too long");
  }
  // A field's key: (number, wire type).
  std::pair<uint64_t, int> key() {
    const uint64_t k = varint();
    return {k >> 3, static_cast<int>(k & 7)};
  }
  // A length-delimited field's [begin, end).
  std::pair<size_t, size_t> span() {
    const uint64_t length = varint();
    if (length > end_ - pos_) throw error("a field runs past the end");
    const size_t begin = pos_;
    pos_ += length;
    return {begin, pos_};
  }
  void skip(int wire_type) {
    if (wire_type == 0) {
      varint();
    } else if (wire_type == 1 || wire_type == 5) {
      const size_t size = wire_type == 1 ? 8 : 4;
      if (size > end_ - pos_) throw error("a field runs past the end");
      pos_ += size;
    } else if (wire_type == 2) {
      span();
    } else {
      throw error("wire type " + std::to_string(wire_type));
    }
  }

 private:
  const std::string& bytes_;
  size_t pos_, end_;
  const std::string& path_;
};

}  // namespace

SentencePieceModel read_sentencepiece_model(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TT_CHECK(in, path + ": cannot be read");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  SentencePieceModel model;
  ProtoReader top(bytes, 0, bytes.size(), path);
  while (!top.done()) {
    const auto [field, wire] = top.key();
    if (field == 1 && wire == 2) {  // repeated SentencePiece pieces: {string piece = 1; ...}
      const auto [begin, end] = top.span();
      ProtoReader piece(bytes, begin, end, path);
      std::string text;
      while (!piece.done()) {
        const auto [f, w] = piece.key();
        if (f == 1 && w == 2) {
          const auto [b, e] = piece.span();
          text = bytes.substr(b, e - b);
        } else {
          piece.skip(w);
        }
      }
      model.pieces.push_back(text);
    } else if (field == 2 && wire == 2) {  // TrainerSpec: unk_id = 40, bos_id = 41, eos_id = 42, pad_id = 43
      const auto [begin, end] = top.span();
      ProtoReader spec(bytes, begin, end, path);
      while (!spec.done()) {
        const auto [f, w] = spec.key();
        if (f >= 40 && f <= 43 && w == 0) {
          // int32: negative values are sign-extended to 64 bits.
          const auto value = static_cast<int64_t>(static_cast<int32_t>(spec.varint()));
          (f == 40 ? model.unk_id : f == 41 ? model.bos_id : f == 42 ? model.eos_id : model.pad_id) = value;
        } else {
          spec.skip(w);
        }
      }
    } else if (field == 3 && wire == 2) {  // NormalizerSpec: add_dummy_prefix = 3
      const auto [begin, end] = top.span();
      ProtoReader spec(bytes, begin, end, path);
      while (!spec.done()) {
        const auto [f, w] = spec.key();
        if (f == 3 && w == 0)
          model.add_dummy_prefix = spec.varint() != 0;
        else
          spec.skip(w);
      }
    } else {
      top.skip(wire);
    }
  }
  TT_CHECK(!model.pieces.empty(), path + " is not a SentencePiece model (no pieces)");
  return model;
}

std::string llama_tokenizer_config_json(const SentencePieceModel& model, const SpecialTokens& tokens,
                                        bool add_bos, int64_t max_length) {
  auto piece = [&](int64_t id) -> nlohmann::ordered_json {
    if (id < 0 || id >= static_cast<int64_t>(model.pieces.size())) return nullptr;
    return model.pieces[static_cast<size_t>(id)];
  };
  nlohmann::ordered_json json;
  json["tokenizer_class"] = "LlamaTokenizer";
  json["add_bos_token"] = add_bos;
  json["add_eos_token"] = false;
  json["bos_token"] = piece(tokens.bos);
  json["eos_token"] = piece(tokens.eos);
  json["unk_token"] = piece(model.unk_id);
  json["pad_token"] = piece(model.pad_id);
  json["model_max_length"] = max_length;
  // The SentencePiece model's own encoding of the text (legacy), and for the fast tokenizer converted from
  // it, the model's own choice of a space in front.
  json["legacy"] = true;
  json["add_prefix_space"] = model.add_dummy_prefix;
  json["clean_up_tokenization_spaces"] = false;
  json["sp_model_kwargs"] = nlohmann::ordered_json::object();
  return json.dump(2) + "\n";
}

}  // namespace tt::app
