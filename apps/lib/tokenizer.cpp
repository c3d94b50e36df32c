#include "apps/lib/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "apps/lib/data.h"
#include "base/error.h"

namespace tt::app {

namespace fs = std::filesystem;

namespace {

constexpr const char* kEndOfTextMarker = "\n<|endoftext|>\n";

// SentencePiece's statuses ("Internal: ./src/file.cc(232) [condition] what happened", possibly over several
// lines) as one line that says what happened, or `fallback` when they name only the failed condition.
std::string one_line(std::string text, const std::string& fallback) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  const size_t code_end = text.find(": ");
  if (code_end != std::string::npos && code_end < 24) text = text.substr(code_end + 2);  // "Internal: "
  const size_t source = text.find(".cc(");
  if (source != std::string::npos) {
    const size_t condition_end = text.find("] ", source);
    if (condition_end == std::string::npos) return fallback;
    text = text.substr(condition_end + 2);
  }
  // Our flag, not the trainer's.
  const std::string advice =
      "Increase vocab_size or decrease character_coverage with --character_coverage option.";
  const size_t at = text.find(advice);
  if (at != std::string::npos) text.replace(at, advice.size(), "Increase --vocab.");
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text.empty() ? fallback : text;
}

class ByteTokenizer final : public Tokenizer {
 public:
  std::string name() const override { return "bytes"; }
  int64_t vocab_size() const override { return kByteVocab; }
  int32_t end_of_text() const override { return kEndOfText; }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size());
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }

 protected:
  std::string decode_span(const std::vector<int32_t>& ids) const override {
    std::string text;
    text.reserve(ids.size());
    for (int32_t id : ids) text += static_cast<char>(id);
    return text;
  }
};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // `what` names the model in messages (its file, or "the trained model").
  SentencePieceTokenizer(std::string bytes, const std::string& what) : bytes_(std::move(bytes)) {
    const auto status = processor_.LoadFromSerializedProto(bytes_);
    TT_CHECK(status.ok(), what + " is not a valid SentencePiece model (" +
                              one_line(status.ToString(), "it does not parse") + ")");
    vocab_ = processor_.GetPieceSize();
    TT_CHECK(vocab_ > 0 && vocab_ <= 65536,
             what + " has " + std::to_string(vocab_) + " pieces; token files hold ids below 65536");
    TT_CHECK(processor_.eos_id() >= 0 && processor_.eos_id() < vocab_,
             what + " has no end-of-text piece (eos </s>), which separates documents");
    checksum_ = fnv1a64_hex(bytes_);
  }
  std::string name() const override { return "sentencepiece"; }
  int64_t vocab_size() const override { return vocab_; }
  int32_t end_of_text() const override { return processor_.eos_id(); }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int> ids;
    const auto status = processor_.Encode(text, &ids);
    TT_CHECK(status.ok(), "SentencePiece could not encode text: " + one_line(status.ToString(), "failed"));
    return {ids.begin(), ids.end()};
  }
  std::string checksum() const override { return checksum_; }
  const std::string& model_bytes() const override { return bytes_; }

 protected:
  std::string decode_span(const std::vector<int32_t>& ids) const override {
    const std::vector<int> known(ids.begin(), ids.end());
    std::string text;
    const auto status = processor_.Decode(known, &text);
    TT_CHECK(status.ok(), "SentencePiece could not decode ids: " + one_line(status.ToString(), "failed"));
    return text;
  }

 private:
  sentencepiece::SentencePieceProcessor processor_;
  std::string bytes_, checksum_;
  int64_t vocab_ = 0;
};

// The lines of documents, each with its "\n", as the trainer's sentences; lines longer than it takes are cut
// at character boundaries (the trainer skips longer ones).
class LineIterator final : public sentencepiece::SentenceIterator {
 public:
  static constexpr size_t kMaxLineBytes = 4096;
  explicit LineIterator(const std::vector<std::string_view>& texts) : texts_(texts) { advance(); }
  bool done() const override { return done_; }
  void Next() override { advance(); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void advance() {
    while (text_ < texts_.size() && at_ >= texts_[text_].size()) {
      ++text_;
      at_ = 0;
    }
    if (text_ == texts_.size()) {
      done_ = true;
      return;
    }
    const std::string_view text = texts_[text_];
    size_t end = text.find('\n', at_);
    end = end == std::string_view::npos ? text.size() : end + 1;
    if (end - at_ > kMaxLineBytes) {
      end = at_ + kMaxLineBytes;
      while (end > at_ + 1 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
    }
    line_.assign(text.substr(at_, end - at_));
    at_ = end;
  }
  const std::vector<std::string_view>& texts_;
  size_t text_ = 0, at_ = 0;
  std::string line_;
  bool done_ = false;
};

// How many bytes at the end of `text` may still change: a U+FFFD that SentencePiece writes for bytes that
// do not (yet) form a character, or the start of a UTF-8 sequence whose continuation bytes have not come.
size_t unsettled_tail(const std::string& text) {
  static const std::string kReplacement = "\xEF\xBF\xBD";
  size_t end = text.size();
  while (end >= kReplacement.size() &&
         text.compare(end - kReplacement.size(), kReplacement.size(), kReplacement) == 0)
    end -= kReplacement.size();
  for (size_t back = 1; back <= 3 && back <= end; ++back) {
    const unsigned char c = static_cast<unsigned char>(text[end - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back for its lead
    const size_t needed = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    if (needed > back) end -= back;
    break;
  }
  return text.size() - end;
}

std::string read_file_bytes(const std::string& path, const std::string& what) {
  TT_CHECK(fs::exists(path), what + " '" + path + "' does not exist");
  TT_CHECK(!fs::is_directory(path), what + " '" + path + "' is a folder, not a file");
  std::ifstream in(path, std::ios::binary);
  TT_CHECK(in, what + " '" + path + "' cannot be read");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TT_CHECK(!in.bad(), what + " '" + path + "' cannot be read");
  TT_CHECK(!bytes.empty(), what + " '" + path + "' is empty");
  return bytes;
}

}  // namespace

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  std::vector<int32_t> span;
  for (int32_t id : ids) {
    if (id == end_of_text()) {
      text += decode_span(span) + kEndOfTextMarker;
      span.clear();
    } else if (id >= 0 && id < vocab_size()) {
      span.push_back(id);
    }
  }
  return text + decode_span(span);
}

const std::string& Tokenizer::model_bytes() const {
  static const std::string none;
  return none;
}

std::unique_ptr<Tokenizer> byte_tokenizer() {
  return std::make_unique<ByteTokenizer>();
}

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path) {
  const std::string what = "tokenizer.model '" + path + "'";
  return std::make_unique<SentencePieceTokenizer>(read_file_bytes(path, "tokenizer.model"), what);
}

std::unique_ptr<Tokenizer> train_sentencepiece(const std::vector<std::string_view>& texts, int64_t vocab_size,
                                               int threads_asked) {
  TT_CHECK(vocab_size >= 260 && vocab_size <= 65536,
           "--vocab " + std::to_string(vocab_size) +
               " is out of range for SentencePiece: 260..65536 (256 byte pieces, <unk>, <s>, </s> and at "
               "least one more; ids are uint16)");
  const unsigned threads = threads_asked > 0 ? static_cast<unsigned>(threads_asked)
                                             : std::max(1u, std::thread::hardware_concurrency());
  const std::unordered_map<std::string, std::string> options = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"byte_fallback", "true"},  // any byte encodes: no <unk> in the token stream
      // Text kept exactly, so decoding gives back what was encoded.
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"split_digits", "true"},
      {"character_coverage", "0.9995"},  // rare characters become bytes
      {"max_sentence_length", std::to_string(LineIterator::kMaxLineBytes)},
      {"input_sentence_size", "2000000"},  // a sample of lines from large inputs
      {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(threads)},
      {"minloglevel", "2"},  // errors only: a failure comes back in the status, as one line
  };
  sentencepiece::SetRandomGeneratorSeed(20240520);  // the same sample of lines every time
  LineIterator lines(texts);
  TT_CHECK(!lines.done(), "no text to train a SentencePiece model on");
  std::string model;
  const auto status = sentencepiece::SentencePieceTrainer::Train(options, &lines, &model);
  if (!status.ok()) {
    std::string why = one_line(status.ToString(), "no reason given");
    // The text has fewer distinct pieces than asked for: say which knob to turn.
    if (why.find("Vocabulary size too high") != std::string::npos) {
      if (why.back() == '.') why.pop_back();
      why += "; lower --vocab, or give it more text";
    }
    // Every character the text keeps needs an id of its own: SentencePiece says how many ("300 vs 303").
    const size_t versus = why.find(" vs ");
    if (why.find("smaller than required_chars") != std::string::npos && versus != std::string::npos) {
      const std::string needed = std::to_string(std::atoll(why.c_str() + versus + 4));
      throw Error("--vocab " + std::to_string(vocab_size) + " is too small for this text: its characters " +
                  "and the special pieces need " + needed + " ids; pass --vocab " + needed + " or more");
    }
    throw Error("SentencePiece training failed: " + why);
  }
  return std::make_unique<SentencePieceTokenizer>(std::move(model), "the trained SentencePiece model");
}

std::string fnv1a64_hex(std::string_view bytes) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

std::unique_ptr<Tokenizer> load_data_tokenizer(const std::string& data_dir) {
  const std::optional<DataMeta> meta = read_meta(data_dir);
  TT_CHECK(meta.has_value(), "no tokenizer: data folder '" + data_dir + "' has no meta.json");
  const std::string meta_path = data_dir + "/meta.json";
  if (meta->tokenizer == "bytes") return byte_tokenizer();
  TT_CHECK(meta->tokenizer == "sentencepiece", meta_path + ": tokenizer '" + meta->tokenizer +
                                                   "' cannot be loaded here (bytes and sentencepiece can)");
  const std::string path = data_dir + "/tokenizer.model";
  TT_CHECK(fs::exists(path),
           "no tokenizer: " + meta_path + " names sentencepiece, but " + path + " is missing");
  std::unique_ptr<Tokenizer> tokenizer = load_sentencepiece(path);
  TT_CHECK(meta->tokenizer_checksum.empty() || meta->tokenizer_checksum == tokenizer->checksum(),
           path + " does not match " + meta_path + " (checksum " + tokenizer->checksum() + ", recorded " +
               meta->tokenizer_checksum + "): replaced or cut short");
  TT_CHECK(tokenizer->vocab_size() == meta->vocab_size,
           path + " has " + std::to_string(tokenizer->vocab_size()) + " pieces, " + meta_path +
               " says vocab_size " + std::to_string(meta->vocab_size));
  TT_CHECK(meta->end_of_text < 0 || meta->end_of_text == tokenizer->end_of_text(),
           path + " ends documents with id " + std::to_string(tokenizer->end_of_text()) + ", " + meta_path +
               " says end_of_text " + std::to_string(meta->end_of_text));
  return tokenizer;
}

TextStream::TextStream(const Tokenizer& tokenizer, std::vector<int32_t> context)
    : tokenizer_(tokenizer),
      ids_(std::move(context)),
      shown_(tokenizer.decode(ids_)),
      settled_(ids_.size()),
      settled_chars_(shown_.size()) {}

std::string TextStream::push(int32_t id) {
  ids_.push_back(id);
  return release(false);
}

std::string TextStream::finish() {
  return release(true);
}

std::string TextStream::decoded() const {
  // Decoding every id again for each token costs a long generation time quadratic in its length. The ids
  // after the settled ones are decoded behind a few settled ones (a SentencePiece decode drops the space
  // before its first word, which then falls on the anchor), and the anchor's own text taken off.
  constexpr size_t kAnchorIds = 4;
  const auto settled = ids_.begin() + static_cast<std::ptrdiff_t>(settled_);
  const auto anchor = settled - static_cast<std::ptrdiff_t>(std::min(settled_, kAnchorIds));
  const std::string head = tokenizer_.decode(std::vector<int32_t>(anchor, settled));
  const std::string window = tokenizer_.decode(std::vector<int32_t>(anchor, ids_.end()));
  const bool anchored = window.compare(0, head.size(), head) == 0 && settled_chars_ <= shown_.size();
  if (!anchored) return tokenizer_.decode(ids_);  // a decoder whose text does not just grow: all of it
  return shown_.substr(0, settled_chars_) + window.substr(head.size());
}

std::string TextStream::release(bool all) {
  std::string text = decoded();
  const size_t complete = text.size();
  if (!all) text.resize(text.size() - unsettled_tail(text));
  // Normally the text only grows; should a decoder change earlier text, the part already shown stays.
  size_t common = 0;
  while (common < text.size() && common < shown_.size() && text[common] == shown_[common]) ++common;
  std::string out =
      text.size() <= shown_.size() && common == text.size() ? std::string() : text.substr(common);
  if (!out.empty()) shown_ = std::move(text);
  // Everything the ids decode to is out: the next window starts after them.
  if (shown_.size() == complete && common + out.size() == complete) {
    settled_ = ids_.size();
    settled_chars_ = shown_.size();
  }
  return out;
}

}  // namespace tt::app
