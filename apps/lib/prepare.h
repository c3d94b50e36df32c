// prepare_data's step: text files -> DIR/train.bin and DIR/val.bin (uint16 tokens), DIR/meta.json and, with
// SentencePiece, DIR/tokenizer.model. The text streams through in batches, so memory does not grow with the
// input: about four times options.batch_bytes for encoding, plus at most options.tokenizer_sample_bytes of
// text (and SentencePiece's own copy of it) while a tokenizer is trained. (A document's leading blank lines
// are held until its first other character: they belong to it only if one comes.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tt::app {

struct PrepareOptions {
  std::string tokenizer = "bytes";        // bytes | sentencepiece
  int64_t vocab_size = 0;                 // sentencepiece: the pieces of the BPE model trained on the input
  std::string tokenizer_model;            // sentencepiece: this tokenizer.model instead of training one
  int threads = 0;                        // threads encoding and training a tokenizer (0: every core)
  size_t batch_bytes = size_t{32} << 20;  // text encoded at once; the token files do not depend on it
  // The most text SentencePiece learns from: a larger input gives it lines spread evenly over the training
  // documents, about this many bytes of them (and SentencePiece keeps at most 2,000,000 of those lines).
  size_t tokenizer_sample_bytes = size_t{256} << 20;
};
struct PrepareStats {
  int64_t documents = 0, train_tokens = 0, val_tokens = 0;
  int64_t vocab_size = 0;
  int64_t text_bytes = 0;              // bytes of document text encoded
  double encode_seconds = 0;           // encoding alone (reading, training a tokenizer and writing excluded)
  double tokenizer_seconds = 0;        // training the SentencePiece model
  int64_t tokenizer_sample_bytes = 0;  // the text it learned from
  bool tokenizer_sampled = false;      // that text is a sample of the training documents' lines
  int threads = 1;
  int64_t files = 0;  // files read
  // Entries under the folder skipped: not text (*.dat, *.u8, *.bin, NUL bytes), hidden (.git), earlier
  // datasets, and links to folders or other entries that are not regular files (broken links).
  int64_t skipped_not_text = 0, skipped_hidden = 0, skipped_datasets = 0, skipped_other = 0;
  int64_t separator_lines = 0;          // lines that matched the separator
  bool validation_from_tail = false;    // fewer than ten documents: validation is the last 10-20% of tokens
  bool tail_cut_at_line_break = false;  // that split falls after a line break (else at 90% exactly)
  // Bytes that are not UTF-8 (a Latin-1 file, say): SentencePiece reads text as Unicode and turns each into
  // U+FFFD, so they do not survive its tokens; the byte tokenizer keeps them. Counted for sentencepiece only.
  int64_t invalid_utf8_bytes = 0;
  int64_t invalid_utf8_files = 0;       // the files that hold them
  std::string first_invalid_utf8_file;  // the first of those
};

// Tokenises a text file or every regular file under a folder (sorted; *.dat, *.u8, *.bin and files with NUL
// bytes skipped; a single file with NUL bytes refused) into DIR/train.bin and DIR/val.bin (every tenth
// document goes to validation; each document is followed by the end-of-text id) and DIR/meta.json; with
// SentencePiece also DIR/tokenizer.model, trained on the training documents unless options.tokenizer_model
// names one. Lines equal to `separator` (when non-empty; a \r at the end ignored) split a file into
// documents, as in fortune files ("%"). Encoding runs on options.threads threads; the token files do not
// depend on their number. Every file is written beside the old one and renamed into place only when all
// are complete: a failure (a full disk, a stop signal) leaves the old dataset whole and no temporary files.
PrepareStats prepare_text(const std::string& input, const std::string& out_dir, const std::string& separator,
                          const PrepareOptions& options = {});

}  // namespace tt::app
