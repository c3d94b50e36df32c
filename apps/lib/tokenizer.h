// Tokenizers: the byte-level one (ids 0..255 are bytes, 256 ends a document) and SentencePiece BPE models
// with byte fallback (libsentencepiece), trained by prepare_data and kept as tokenizer.model beside the
// token files. Also what turns generated ids into text as they come.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tt::app {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string name() const = 0;  // as in meta.json: bytes, sentencepiece
  virtual int64_t vocab_size() const = 0;
  virtual int32_t end_of_text() const = 0;
  // Never yields end_of_text(): documents are separated by the caller.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The text of `ids`; end_of_text() shows as "\n<|endoftext|>\n", ids outside the vocabulary as nothing.
  std::string decode(const std::vector<int32_t>& ids) const;
  // FNV-1a 64 of tokenizer.model's bytes as 16 hex digits ("" for the byte tokenizer): meta.json records it,
  // so a tokenizer.model that was replaced or cut short is refused.
  virtual std::string checksum() const { return ""; }
  // The model file's bytes ("" for the byte tokenizer), written beside the token files.
  virtual const std::string& model_bytes() const;

 protected:
  // The text of ids that hold no end_of_text().
  virtual std::string decode_span(const std::vector<int32_t>& ids) const = 0;
};

std::unique_ptr<Tokenizer> byte_tokenizer();
// A SentencePiece model file (tokenizer.model). A missing, unreadable or malformed file, one that is not a
// SentencePiece model, or one with more than 65536 pieces or no end-of-text (eos) piece throws tt::Error,
// one line naming the file.
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path);

// Trains a BPE model with byte fallback on `lines` (each a line of text with its "\n"; every byte of any
// text is encodable afterwards): `vocab_size` pieces, the 256 byte pieces and <unk>, <s>, </s> included,
// </s> being the end-of-text id. Text is kept as it is (no normalisation, spaces kept), so decode(encode(x))
// == x. Deterministic for the same input. SentencePiece's own message on failure (a vocabulary too small
// for the bytes or too large for the text), as one line. `threads` 0: every core.
std::unique_ptr<Tokenizer> train_sentencepiece(const std::vector<std::string_view>& lines, int64_t vocab_size,
                                               int threads = 0);

// FNV-1a 64 of `bytes` as 16 hex digits.
std::string fnv1a64_hex(std::string_view bytes);

// The tokenizer of a prepared data folder (DIR/meta.json; for sentencepiece DIR/tokenizer.model, checked
// against meta.json's vocab_size, end_of_text and checksum). One line naming the file when meta.json or
// tokenizer.model is missing or does not match, or the tokenizer is one this build cannot load (gpt2).
std::unique_ptr<Tokenizer> load_data_tokenizer(const std::string& data_dir);

// Generated ids to text as they come. Releases only text that later tokens cannot change: a character whose
// UTF-8 bytes are split across byte tokens waits until it is complete.
class TextStream {
 public:
  // `context`: the ids already shown (the prompt), whose text is not released again.
  TextStream(const Tokenizer& tokenizer, std::vector<int32_t> context);
  // The text that `id` completes ("" when it waits for more).
  std::string push(int32_t id);
  // Whatever is still held back.
  std::string finish();

 private:
  std::string release(bool all);
  std::string decoded() const;  // the text of every id so far
  const Tokenizer& tokenizer_;
  std::vector<int32_t> ids_;
  std::string shown_;  // the decoded text released so far, the context's included
  // The first settled_ ids decode to shown_'s first settled_chars_ characters, all released: only the ids
  // after them (behind a few as an anchor) are decoded again for each new token.
  size_t settled_ = 0, settled_chars_ = 0;
};

}  // namespace tt::app
