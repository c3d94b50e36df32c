// Token data: flat little-endian uint16 files (numpy.memmap-compatible) or llm.c's token files (a header of
// 256 int32, then uint16 tokens), memory-mapped, and the two ways of drawing batches: random windows (as the
// CS336 handout's get_batch: B starts in [0, len - T)) from a counter-based RNG whose (seed, counter) is
// saved in checkpoints, and sequential windows (draw d, one per micro-batch from 1, takes windows
// ((d-1)*ranks + rank)*B onwards, window i = tokens [i*T, i*T+T], wrapping around). Also the dataset's
// meta.json (apps/lib/prepare.h turns text into token files; apps/lib/tokenizer.h has the tokenizers).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/rng.h"

namespace tt::app {

// llm.c's token files (dev/data/data_common.py, GPT-2 tokens): 256 little-endian int32 of header (magic,
// version, token count, then zeros), then the tokens as uint16.
constexpr int32_t kLlmcMagic = 20240520;
constexpr int32_t kLlmcVersion = 1;
constexpr int64_t kLlmcHeaderBytes = 256 * 4;

class TokenFile {
 public:
  // Maps `path` and checks it: present, non-empty, whole uint16 tokens, every id < vocab_size. A file that
  // starts with llm.c's magic is read past its header, which must be version 1 and announce exactly the
  // tokens that follow; any other file is raw uint16 tokens.
  TokenFile(const std::string& path, int64_t vocab_size);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  int64_t size() const { return tokens_; }
  const uint16_t* data() const { return data_; }
  const std::string& path() const { return path_; }
  // 0 for raw token files, kLlmcHeaderBytes for llm.c's.
  int64_t header_bytes() const { return header_bytes_; }

 private:
  void read_layout();
  void check_ids(int64_t vocab_size) const;

  std::string path_;
  void* mapping_ = nullptr;
  size_t bytes_ = 0;
  int64_t header_bytes_ = 0;
  const uint16_t* data_ = nullptr;
  int64_t tokens_ = 0;
};

// train's --ctx unless given.
constexpr int64_t kDefaultContext = 128;
// Tokens a file needs for one window of `context` tokens and its target.
constexpr int64_t tokens_for_context(int64_t context) {
  return context + 2;
}
// Throws tt::Error unless `file` holds tokens_for_context(context).
void check_context_fits(const TokenFile& file, int64_t context);

enum class Sampling { random, sequential };
Sampling parse_sampling(const std::string& text);

struct Batch {
  std::vector<int32_t> inputs, targets;  // batch * context each, row-major
};

class BatchSampler {
 public:
  // With several data-parallel ranks, sequential windows are interleaved: draw d (1-based) of rank r takes
  // windows ((d-1)*world + r)*batch ...; random draws come from a stream seeded per rank.
  BatchSampler(const TokenFile& file, int64_t batch, int64_t context, Sampling sampling, uint64_t seed,
               int rank = 0, int world = 1);
  // The batch of draw `step` (1-based). Random sampling draws from the RNG stream (the step only matters
  // for sequential windows).
  Batch next(int64_t step);
  CounterRng& rng() { return rng_; }

 private:
  const TokenFile& file_;
  int64_t batch_, context_;
  int rank_, world_;
  Sampling sampling_;
  CounterRng rng_;
};

// A sampler's batches drawn on a thread of its own, up to `depth` draws ahead of the training loop: reading
// the token file (a memory-mapped file larger than memory pages in from disk) overlaps the GPU's work instead
// of delaying the next step. The batches, and the RNG's position after each, are exactly the sampler's.
class BatchLoader {
 public:
  // Draws first_draw .. last_draw from `sampler`, which nothing else may use while the loader exists.
  BatchLoader(BatchSampler& sampler, int64_t first_draw, int64_t last_draw, int depth = 2);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // Draw `draw`, which must be the next one in order. Rethrows what drawing threw.
  Batch next(int64_t draw);
  // The sampler's RNG counter right after the last draw next() returned (what a checkpoint records).
  uint64_t consumed_rng_counter() const { return consumed_counter_; }

 private:
  struct Drawn {
    int64_t draw = 0;
    Batch batch;
    uint64_t counter = 0;
  };
  void run();
  Drawn draw_one();

  BatchSampler& sampler_;
  const int64_t last_draw_;
  const size_t depth_;
  int64_t next_draw_;  // the next one to draw (the thread's, or next()'s without a thread)
  int64_t expected_;   // the next one next() hands out
  uint64_t consumed_counter_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Drawn> ready_;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // not joinable when none could be started: next() then draws itself
};

// The evaluation windows: windows first_window .. first_window+batch-1 of `file` (window i = tokens
// [i*T, i*T+T]). The same windows every time, on every machine. They never wrap (a repeated window would
// count twice): a window past the end is an internal error, which check_eval_fits rules out at start-up.
Batch eval_batch(const TokenFile& file, int64_t batch, int64_t context, int64_t first_window);
// Throws tt::Error (one line, naming the flags and the file) unless `val` holds `batches` * `batch` *
// `ranks` distinct windows of `context` + 1 tokens (under mpirun each rank evaluates its share).
void check_eval_fits(const TokenFile& val, int64_t batch, int64_t context, int64_t batches,
                     int64_t ranks = 1);
// A --data that names a file (a text not yet prepared, or one of a data folder's files) is refused with what
// to pass instead; anything else is left to the readers.
void check_data_folder_path(const std::string& path);

// The evaluation batches a run takes: `asked` (--eval-batches); when the flag was not given, at most as many
// as `val` holds (a small text's), said in a note on stdout when `announce`. check_eval_fits still applies
// (and check_context_fits, which callers run first).
int64_t eval_batches_to_use(const TokenFile& val, int64_t batch, int64_t context, int64_t asked, bool given,
                            bool announce, int64_t ranks = 1);

// Byte-level tokenizer: ids 0..255 are bytes, 256 ends a document.
constexpr int32_t kEndOfText = 256;
constexpr int64_t kByteVocab = 257;
std::string decode_bytes(const std::vector<int32_t>& ids);

// DIR/meta.json, written by prepare_data beside the token files. Other fields (documents, token counts) may
// be present and are not read.
// Where `train` prepares its built-in corpus when no --data is given (relative to the working folder).
constexpr const char* kBuiltinDataDir = "data/fortunes";

struct DataMeta {
  std::string tokenizer;     // one of known_tokenizers()
  int64_t vocab_size = 0;    // 1 .. 65536: every id fits uint16
  int64_t end_of_text = -1;  // the id that ends a document, below vocab_size; -1 when the file has none
  // sentencepiece: FNV-1a 64 of DIR/tokenizer.model (16 hex digits, field tokenizer_model_fnv1a64); "" when
  // the file has none.
  std::string tokenizer_checksum;
  // The token counts prepare_data wrote (train_tokens, val_tokens); -1 when the file has none.
  int64_t train_tokens = -1, val_tokens = -1;
};
const std::vector<std::string>& known_tokenizers();  // bytes, sentencepiece, gpt2
// What checkpoints record of their data's tokenizer: "NAME VOCAB_SIZE[ CHECKSUM]", e.g. "bytes 257".
std::string data_tokenizer_id(const DataMeta& meta);
// Whether two such ids name the same tokenizer: name and size equal, and the checksums where both have one
// (data prepared before meta.json recorded it has none).
bool same_data_tokenizer(const std::string& a, const std::string& b);
// DIR/meta.json checked field by field, or nullopt when the file does not exist. Malformed JSON, a missing
// or out-of-range vocab_size, an unknown tokenizer or a bad end_of_text throw tt::Error naming the file and
// the field.
std::optional<DataMeta> read_meta(const std::string& data_dir);
// meta.json's text: `meta` (snake_case names), then the `extra` integer fields (token counts, say).
std::string meta_json(const DataMeta& meta, const std::vector<std::pair<std::string, int64_t>>& extra = {});
// read_meta's vocab_size and tokenizer; 0 / "" when DIR/meta.json does not exist (then the vocabulary must
// come from --vocab).
int64_t read_vocab_size(const std::string& data_dir);
// Throws when `file` (DIR/train.bin or DIR/val.bin) holds another number of tokens than DIR/meta.json
// records for it: a truncated copy, or a file replaced after the data was prepared.
void check_token_count(const std::string& data_dir, const TokenFile& file);
std::string read_tokenizer(const std::string& data_dir);

}  // namespace tt::app
