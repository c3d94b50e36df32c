#include "apps/lib/data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>
#include <string_view>
#include <system_error>
#include <thread>

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace tt::app {

namespace fs = std::filesystem;

TokenFile::TokenFile(const std::string& path, int64_t vocab_size) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error("token file '" + path + "' does not exist or cannot be opened");
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    ::close(fd);
    throw Error("cannot stat token file '" + path + "'");
  }
  bytes_ = static_cast<size_t>(info.st_size);
  if (bytes_ == 0) {
    ::close(fd);
    throw Error("token file '" + path + "' is empty");
  }
  void* mapped = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapped == MAP_FAILED) throw Error("cannot memory-map token file '" + path + "'");
  mapping_ = mapped;
  try {
    read_layout();
    check_ids(vocab_size);
  } catch (...) {
    ::munmap(mapping_, bytes_);  // the destructor does not run for a constructor that throws
    throw;
  }
}

void TokenFile::read_layout() {
  const auto* bytes = static_cast<const unsigned char*>(mapping_);
  int32_t magic = 0;
  if (bytes_ >= sizeof(magic)) std::memcpy(&magic, bytes, sizeof(magic));
  // llm.c's LLaMA-3 files: same header, uint32 tokens.
  constexpr int32_t kLlmcUint32Magic = 20240801;
  TT_CHECK(magic != kLlmcUint32Magic, "token file '" + path_ + "' is an llm.c file of uint32 tokens (magic " +
                                          std::to_string(kLlmcUint32Magic) +
                                          "); only uint16 token files are supported");
  if (magic != kLlmcMagic) {
    // A raw file would need 55432, 308 as its first two tokens to be taken for one of llm.c's.
    TT_CHECK(bytes_ % 2 == 0,
             "token file '" + path_ + "' has an odd number of bytes: not a uint16 token file");
    data_ = reinterpret_cast<const uint16_t*>(bytes);
    tokens_ = static_cast<int64_t>(bytes_ / 2);
    return;
  }
  const std::string what =
      "token file '" + path_ + "' (llm.c format, magic " + std::to_string(kLlmcMagic) + ")";
  const int64_t actual = static_cast<int64_t>(bytes_);
  TT_CHECK(actual >= kLlmcHeaderBytes, what + " is truncated: " + std::to_string(actual) +
                                           " bytes, shorter than its " + std::to_string(kLlmcHeaderBytes) +
                                           "-byte header");
  int32_t header[3];
  std::memcpy(header, bytes, sizeof(header));
  TT_CHECK(header[1] == kLlmcVersion, what + " has header version " + std::to_string(header[1]) +
                                          "; only version " + std::to_string(kLlmcVersion) +
                                          " (uint16 tokens) is supported");
  const int64_t count = header[2];
  TT_CHECK(count > 0, what + " announces " + std::to_string(count) + " tokens in its header");
  const int64_t expected = kLlmcHeaderBytes + count * 2;
  TT_CHECK(actual >= expected, what + " is truncated: its header announces " + std::to_string(count) +
                                   " tokens (" + std::to_string(expected) + " bytes), the file has " +
                                   std::to_string(actual) + " bytes");
  TT_CHECK(actual == expected, what + " has " + std::to_string(actual - expected) + " bytes after the " +
                                   std::to_string(count) + " tokens its header announces");
  header_bytes_ = kLlmcHeaderBytes;
  data_ = reinterpret_cast<const uint16_t*>(bytes + kLlmcHeaderBytes);
  tokens_ = count;
}

void TokenFile::check_ids(int64_t vocab_size) const {
  for (int64_t i = 0; i < tokens_; ++i) {
    if (data_[i] >= vocab_size) {
      throw Error("token file '" + path_ + "': token " + std::to_string(i) + " has id " +
                  std::to_string(data_[i]) + ", not below the vocabulary size " + std::to_string(vocab_size));
    }
  }
}

TokenFile::~TokenFile() {
  if (mapping_) ::munmap(mapping_, bytes_);
}

Sampling parse_sampling(const std::string& text) {
  if (text == "random") return Sampling::random;
  if (text == "sequential") return Sampling::sequential;
  throw Error("unknown sampling '" + text + "' (expected random or sequential)");
}

void check_context_fits(const TokenFile& file, int64_t context) {
  if (file.size() < tokens_for_context(context)) {
    throw Error("context length " + std::to_string(context) + " needs at least " +
                std::to_string(tokens_for_context(context)) + " tokens, but '" + file.path() + "' has " +
                std::to_string(file.size()));
  }
}

namespace {

// Windows [i*T, i*T+T] whose targets fit in `file`.
int64_t window_room(const TokenFile& file, int64_t context) {
  return (file.size() - 1) / context;
}

void copy_window(const TokenFile& file, int64_t start, int64_t context, Batch& out, int64_t row) {
  const uint16_t* tokens = file.data() + start;
  for (int64_t t = 0; t < context; ++t) {
    out.inputs[row * context + t] = tokens[t];
    out.targets[row * context + t] = tokens[t + 1];
  }
}

// Windows first_window .. first_window+batch-1 in turn (window i = tokens [i*T, i*T+T]), wrapping around
// past the last window whose target fits: sequential training goes round the file as often as it takes.
Batch windows(const TokenFile& file, int64_t batch, int64_t context, int64_t first_window) {
  check_context_fits(file, context);
  Batch out;
  out.inputs.resize(static_cast<size_t>(batch * context));
  out.targets.resize(out.inputs.size());
  const int64_t count = window_room(file, context);
  for (int64_t b = 0; b < batch; ++b)
    copy_window(file, ((first_window + b) % count) * context, context, out, b);
  return out;
}
}  // namespace

BatchSampler::BatchSampler(const TokenFile& file, int64_t batch, int64_t context, Sampling sampling,
                           uint64_t seed, int rank, int world)
    : file_(file),
      batch_(batch),
      context_(context),
      rank_(rank),
      world_(world),
      sampling_(sampling),
      rng_{seed, 0} {
  check_context_fits(file, context);
}

Batch BatchSampler::next(int64_t step) {
  if (sampling_ == Sampling::sequential) {
    return windows(file_, batch_, context_, ((step - 1) * world_ + rank_) * batch_);
  }
  Batch out;
  out.inputs.resize(static_cast<size_t>(batch_ * context_));
  out.targets.resize(out.inputs.size());
  const uint64_t starts = static_cast<uint64_t>(file_.size() - context_);
  for (int64_t b = 0; b < batch_; ++b) {
    copy_window(file_, static_cast<int64_t>(rng_.next_below(starts)), context_, out, b);
  }
  return out;
}

BatchLoader::BatchLoader(BatchSampler& sampler, int64_t first_draw, int64_t last_draw, int depth)
    : sampler_(sampler),
      last_draw_(last_draw),
      depth_(static_cast<size_t>(std::max(1, depth))),
      next_draw_(first_draw),
      expected_(first_draw),
      consumed_counter_(sampler.rng().counter) {
  try {
    thread_ = std::thread([this] { run(); });
  } catch (const std::system_error&) {
    // No thread (a process limit): next() draws each batch when asked, as without a loader.
  }
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

BatchLoader::Drawn BatchLoader::draw_one() {
  Drawn d;
  d.draw = next_draw_++;
  d.batch = sampler_.next(d.draw);
  d.counter = sampler_.rng().counter;
  return d;
}

void BatchLoader::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (next_draw_ <= last_draw_) {
    changed_.wait(lock, [this] { return stop_ || ready_.size() < depth_; });
    if (stop_) return;
    lock.unlock();
    Drawn d;
    std::exception_ptr error;
    try {
      d = draw_one();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error) {
      error_ = error;
      changed_.notify_all();
      return;
    }
    ready_.push_back(std::move(d));
    changed_.notify_all();
  }
}

Batch BatchLoader::next(int64_t draw) {
  TT_ASSERT(draw == expected_ && draw <= last_draw_, "BatchLoader: draw " + std::to_string(draw) +
                                                         " asked, " + std::to_string(expected_) + " is next");
  ++expected_;
  Drawn d;
  if (!thread_.joinable()) {
    d = draw_one();
  } else {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return !ready_.empty() || error_; });
    if (ready_.empty()) std::rethrow_exception(error_);
    d = std::move(ready_.front());
    ready_.pop_front();
    lock.unlock();
    changed_.notify_all();
  }
  consumed_counter_ = d.counter;
  return std::move(d.batch);
}

Batch eval_batch(const TokenFile& file, int64_t batch, int64_t context, int64_t first_window) {
  check_context_fits(file, context);
  const int64_t room = window_room(file, context);
  TT_ASSERT(batch > 0 && first_window >= 0 && first_window <= room - batch,
            "evaluation windows " + std::to_string(first_window) + ".." +
                std::to_string(first_window + batch - 1) + " of '" + file.path() + "' (room for " +
                std::to_string(room) + " windows of " + std::to_string(context + 1) +
                " tokens) do not fit; check_eval_fits should have refused this at start-up");
  Batch out;
  out.inputs.resize(static_cast<size_t>(batch * context));
  out.targets.resize(out.inputs.size());
  for (int64_t b = 0; b < batch; ++b) copy_window(file, (first_window + b) * context, context, out, b);
  return out;
}

void check_eval_fits(const TokenFile& val, int64_t batch, int64_t context, int64_t batches, int64_t ranks) {
  TT_CHECK(batch > 0 && batches > 0, "--batch and --eval-batches must be positive");
  check_context_fits(val, context);
  const int64_t room = window_room(val, context);
  const int64_t per_batch = batch * ranks;  // both small: checked flags and a world size
  if (batches <= room / per_batch) return;  // batches * per_batch <= room, without overflow
  const std::string windows = " windows of " + std::to_string(context + 1) + " tokens; " + val.path() +
                              " has room for " + std::to_string(room);
  // Not one batch: fewer --eval-batches cannot help, so the message names the batch alone.
  TT_CHECK(room >= per_batch, "one evaluation batch (--batch " + std::to_string(batch) +
                                  (ranks > 1 ? " x " + std::to_string(ranks) + " ranks" : "") + ") needs " +
                                  std::to_string(per_batch) + windows +
                                  ": lower --batch or --ctx, or give prepare_data more text");
  int64_t needed = 0;
  const bool overflow = __builtin_mul_overflow(batches, per_batch, &needed);
  throw Error("--eval-batches " + std::to_string(batches) + " x --batch " + std::to_string(batch) +
              (ranks > 1 ? " x " + std::to_string(ranks) + " ranks" : "") + " needs " +
              (overflow ? "more than 2^63" : std::to_string(needed)) + windows +
              "; lower --eval-batches or --batch");
}

void check_data_folder_path(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) return;
  const std::filesystem::path file(path);
  const std::string name = file.filename().string();
  if (name == "train.bin" || name == "val.bin" || name == "meta.json") {
    throw Error("--data " + path + " is a file of a data folder: pass --data " +
                (file.parent_path().empty() ? std::string(".") : file.parent_path().string()));
  }
  throw Error("--data " + path + " is a file, not a data folder: make one of it with prepare_data --input " +
              path + " --out FOLDER, then pass --data FOLDER");
}

int64_t eval_batches_to_use(const TokenFile& val, int64_t batch, int64_t context, int64_t asked, bool given,
                            bool announce, int64_t ranks) {
  if (given || batch <= 0) return asked;
  const int64_t room = window_room(val, context) / (batch * ranks);
  if (room == 0 || room >= asked) return asked;  // not even one batch: check_eval_fits says so
  if (announce)
    std::printf("note: evaluating on %lld batch%s, all that %s holds at --batch %lld%s (--eval-batches)\n",
                static_cast<long long>(room), room == 1 ? "" : "es", val.path().c_str(),
                static_cast<long long>(batch),
                ranks > 1 ? (" on each of " + std::to_string(ranks) + " ranks").c_str() : "");
  return room;
}

std::string decode_bytes(const std::vector<int32_t>& ids) {
  std::string text;
  for (int32_t id : ids) {
    if (id == kEndOfText)
      text += "\n<|endoftext|>\n";
    else if (id >= 0 && id < 256)
      text += static_cast<char>(id);
  }
  return text;
}

const std::vector<std::string>& known_tokenizers() {
  // bytes: prepare_data's; sentencepiece: a tokenizer.model beside the data; gpt2: llm.c's data scripts.
  static const std::vector<std::string> names = {"bytes", "sentencepiece", "gpt2"};
  return names;
}

namespace {

// The integer value of `field`, or an error naming the file and the field (JSON's 257.0 is not an integer).
int64_t integer_field(const nlohmann::json& meta, const std::string& file, const char* field, int64_t low,
                      int64_t high, const std::string& range_note) {
  const std::string where = file + ": " + field;
  TT_CHECK(meta.contains(field), where + " is missing");
  const nlohmann::json& value = meta.at(field);
  const std::string range = std::to_string(low) + ".." + std::to_string(high) + range_note;
  TT_CHECK(value.is_number_integer(), where + " must be an integer in " + range + ", got " + value.dump());
  // Unsigned values beyond int64 would wrap in get<int64_t>.
  const bool in_range = value.is_number_unsigned() ? value.get<uint64_t>() <= static_cast<uint64_t>(high)
                                                   : value.get<int64_t>() <= high;
  TT_CHECK(in_range && value.get<int64_t>() >= low, where + " must be in " + range + ", got " + value.dump());
  return value.get<int64_t>();
}

}  // namespace

std::string data_tokenizer_id(const DataMeta& meta) {
  return meta.tokenizer + " " + std::to_string(meta.vocab_size) +
         (meta.tokenizer_checksum.empty() ? "" : " " + meta.tokenizer_checksum);
}

bool same_data_tokenizer(const std::string& a, const std::string& b) {
  std::istringstream in_a(a), in_b(b);
  std::string name_a, name_b, vocab_a, vocab_b, sum_a, sum_b;
  in_a >> name_a >> vocab_a >> sum_a;
  in_b >> name_b >> vocab_b >> sum_b;
  return name_a == name_b && vocab_a == vocab_b && (sum_a.empty() || sum_b.empty() || sum_a == sum_b);
}

std::optional<DataMeta> read_meta(const std::string& data_dir) {
  const std::string path = data_dir + "/meta.json";
  if (!fs::exists(path)) return std::nullopt;
  TT_CHECK(!fs::is_directory(path), path + ": is a folder, not a file");
  std::ifstream in(path);
  TT_CHECK(in, path + ": cannot be read");
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    // e.what() starts with "[json.exception.parse_error.101] ", which says nothing to a user.
    const std::string what = e.what();
    const size_t bracket = what.find("] ");
    throw Error(path + ": not valid JSON (" +
                (bracket == std::string::npos ? what : what.substr(bracket + 2)) + ")");
  }
  TT_CHECK(meta.is_object(), path + ": expected a JSON object with tokenizer and vocab_size, got " +
                                 std::string(meta.type_name()));
  DataMeta out;
  out.vocab_size = integer_field(meta, path, "vocab_size", 1, 65536, " (ids are uint16)");
  TT_CHECK(meta.contains("tokenizer"), path + ": tokenizer is missing");
  const nlohmann::json& tokenizer = meta.at("tokenizer");
  std::string known;
  for (const std::string& name : known_tokenizers()) known += (known.empty() ? "" : ", ") + name;
  TT_CHECK(tokenizer.is_string(),
           path + ": tokenizer must be a string (" + known + "), got " + tokenizer.dump());
  out.tokenizer = tokenizer.get<std::string>();
  const auto& names = known_tokenizers();
  TT_CHECK(std::find(names.begin(), names.end(), out.tokenizer) != names.end(),
           path + ": tokenizer '" + out.tokenizer + "' is unknown (expected one of " + known + ")");
  // The byte-level tokenizer is fixed: 256 bytes and the end-of-text id.
  TT_CHECK(out.tokenizer != "bytes" || out.vocab_size == kByteVocab,
           path + ": vocab_size " + std::to_string(out.vocab_size) + " does not match tokenizer bytes (" +
               std::to_string(kByteVocab) + ")");
  if (meta.contains("end_of_text"))
    out.end_of_text = integer_field(meta, path, "end_of_text", 0, out.vocab_size - 1, " (below vocab_size)");
  if (meta.contains("tokenizer_model_fnv1a64")) {
    const nlohmann::json& checksum = meta.at("tokenizer_model_fnv1a64");
    const bool hex16 = checksum.is_string() && checksum.get<std::string>().size() == 16 &&
                       checksum.get<std::string>().find_first_not_of("0123456789abcdef") == std::string::npos;
    TT_CHECK(hex16,
             path + ": tokenizer_model_fnv1a64 must be 16 lowercase hex digits, got " + checksum.dump());
    out.tokenizer_checksum = checksum.get<std::string>();
  }
  for (const auto& [field, count] :
       {std::pair{"train_tokens", &out.train_tokens}, {"val_tokens", &out.val_tokens}})
    if (meta.contains(field))
      *count = integer_field(meta, path, field, 0, std::numeric_limits<int64_t>::max(), "");
  return out;
}

std::string meta_json(const DataMeta& meta, const std::vector<std::pair<std::string, int64_t>>& extra) {
  // ordered_json keeps the order written: what the ids mean first, then counts.
  nlohmann::ordered_json json;
  json["tokenizer"] = meta.tokenizer;
  json["vocab_size"] = meta.vocab_size;
  if (meta.end_of_text >= 0) json["end_of_text"] = meta.end_of_text;
  if (!meta.tokenizer_checksum.empty()) json["tokenizer_model_fnv1a64"] = meta.tokenizer_checksum;
  for (const auto& [name, value] : extra) json[name] = value;
  return json.dump(2) + "\n";
}

int64_t read_vocab_size(const std::string& data_dir) {
  const std::optional<DataMeta> meta = read_meta(data_dir);
  return meta ? meta->vocab_size : 0;
}

void check_token_count(const std::string& data_dir, const TokenFile& file) {
  const std::optional<DataMeta> meta = read_meta(data_dir);
  if (!meta) return;
  const bool train = fs::path(file.path()).filename() == "train.bin";
  const int64_t recorded = train ? meta->train_tokens : meta->val_tokens;
  TT_CHECK(recorded < 0 || recorded == file.size(),
           file.path() + " holds " + std::to_string(file.size()) + " tokens, but " + data_dir +
               "/meta.json records " + std::to_string(recorded) +
               ": the file is cut short or was replaced since prepare_data wrote it; prepare the data again");
}

std::string read_tokenizer(const std::string& data_dir) {
  const std::optional<DataMeta> meta = read_meta(data_dir);
  return meta ? meta->tokenizer : "";
}

}  // namespace tt::app
