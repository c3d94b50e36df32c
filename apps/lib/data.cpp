#include "apps/lib/data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
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

#include "apps/lib/tokenizer.h"
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
  int64_t needed = 0;
  const bool overflow = __builtin_mul_overflow(batches, per_batch, &needed);
  throw Error(
      "--eval-batches " + std::to_string(batches) + " x --batch " + std::to_string(batch) +
      (ranks > 1 ? " x " + std::to_string(ranks) + " ranks" : "") + " needs " +
      (overflow ? "more than 2^63" : std::to_string(needed)) + " windows of " + std::to_string(context + 1) +
      " tokens; " + val.path() + " has room for " + std::to_string(room) +
      (room < per_batch ? ", less than one batch: lower --batch or --ctx, or give prepare_data more text"
                        : "; lower --eval-batches or --batch"));
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

namespace {
// The temporary files being written, for a stop signal (Ctrl-C) to remove before the process ends: a signal
// handler may only unlink, so the paths wait in fixed buffers.
constexpr int kMaxPending = 8;
char pending_paths[kMaxPending][4096];
volatile std::sig_atomic_t pending_count = 0;

extern "C" void remove_pending_and_end(int signal) {
  for (int i = 0; i < pending_count; ++i) ::unlink(pending_paths[i]);
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

// A dataset's files are each written to NAME.tmp first; only when all of them are complete are they renamed
// into place, so a failed write (a full disk, say) or a stop signal leaves the old dataset whole and no
// temporary files.
class DatasetWriter {
 public:
  explicit DatasetWriter(std::string dir) : dir_(std::move(dir)) {
    for (int i = 0; i < 3; ++i) {
      previous_[i] = std::signal(kSignals[i], remove_pending_and_end);
      if (previous_[i] == SIG_IGN) std::signal(kSignals[i], SIG_IGN);  // nohup's SIGHUP stays ignored
    }
  }
  ~DatasetWriter() {
    pending_count = 0;
    for (int i = 0; i < 3; ++i) std::signal(kSignals[i], previous_[i]);
    for (const std::string& tmp : pending_) {
      std::error_code ignored;
      fs::remove(tmp, ignored);
    }
  }
  void add(const std::string& name, const char* data, size_t bytes) {
    const std::string path = dir_ + "/" + name, tmp = path + ".tmp";
    TT_CHECK(!fs::is_directory(path), "cannot write '" + path + "': a folder of that name is in the way");
    TT_CHECK(pending_.size() < kMaxPending && tmp.size() < sizeof(pending_paths[0]),
             "cannot write '" + tmp + "': path too long");
    std::snprintf(pending_paths[pending_.size()], sizeof(pending_paths[0]), "%s", tmp.c_str());
    pending_count = static_cast<std::sig_atomic_t>(pending_.size() + 1);  // before the file exists
    std::ofstream out(tmp, std::ios::binary);
    if (!out) throw Error("cannot write '" + tmp + "'");
    pending_.push_back(tmp);  // ours from here on: removed unless committed
    out.write(data, static_cast<std::streamsize>(bytes));
    out.close();
    if (!out) throw Error("write failed for '" + path + "' (disk full?); nothing was replaced");
  }
  // Every file complete: into place.
  void commit() {
    pending_count = 0;
    for (const std::string& tmp : pending_) fs::rename(tmp, tmp.substr(0, tmp.size() - 4));
    pending_.clear();
  }

 private:
  static constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGHUP};
  std::string dir_;
  std::vector<std::string> pending_;
  void (*previous_[3])(int) = {};
};
}  // namespace

namespace {

// A NUL byte in the first 8000 (git's test): token files, archives, UTF-16. Text never holds one.
bool looks_binary(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  char head[8000];
  in.read(head, sizeof(head));
  return std::memchr(head, '\0', static_cast<size_t>(in.gcount())) != nullptr;
}

std::vector<fs::path> text_files(const std::string& input, const std::string& out_dir, int64_t& skipped) {
  std::vector<fs::path> files;
  if (fs::is_directory(input)) {
    std::error_code out_error, input_error;
    const fs::path out = fs::weakly_canonical(out_dir, out_error);
    TT_CHECK(out_error || fs::weakly_canonical(input, input_error) != out,
             "--out " + out_dir + " is the input folder: pass another --out");
    for (auto it = fs::recursive_directory_iterator(input); it != fs::recursive_directory_iterator(); ++it) {
      const fs::directory_entry& entry = *it;
      // The output folder inside the input (a dataset prepared again in place) is not input.
      std::error_code entry_error;
      if (entry.is_directory() && !out_error && fs::weakly_canonical(entry.path(), entry_error) == out) {
        it.disable_recursion_pending();
        continue;
      }
      // Not the user's text: hidden files and folders (.git, editor state), and datasets prepared before.
      const bool hidden = entry.path().filename().string().rfind('.', 0) == 0;
      const bool dataset = entry.is_directory() && fs::exists(entry.path() / "meta.json", entry_error) &&
                           fs::exists(entry.path() / "train.bin", entry_error);
      if (hidden || dataset) {
        if (entry.is_directory()) it.disable_recursion_pending();
        ++skipped;
        continue;
      }
      // Links to folders are not followed (a link may loop); they and other non-files are counted.
      if (!entry.is_regular_file()) {
        if (!entry.is_directory() || entry.is_symlink()) ++skipped;  // real folders are walked into
        continue;
      }
      const std::string ext = entry.path().extension().string();
      // Token files (ours: .bin) and other binary data are not text (fortune's .dat indexes, .u8 copies).
      if (ext == ".dat" || ext == ".u8" || ext == ".bin" || looks_binary(entry.path())) {
        ++skipped;
        continue;
      }
      files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
  } else if (fs::is_regular_file(input)) {
    TT_CHECK(!looks_binary(input), "input '" + input + "' is not text (it holds NUL bytes)");
    files.push_back(input);
  } else {
    throw Error("input '" + input + "' " +
                (fs::exists(input) ? "is neither a file nor a folder" : "does not exist"));
  }
  if (files.empty()) throw Error("no text files under '" + input + "'");
  return files;
}

// Every document of the input, in order; documents of nothing but whitespace are dropped. A separator line
// may end in \r (a file with Windows line ends); `separator_lines` counts the lines that matched.
std::vector<std::string> read_documents(const std::vector<fs::path>& files, const std::string& separator,
                                        int64_t& separator_lines) {
  std::vector<std::string> documents;
  auto finish_document = [&](std::string& doc) {
    if (doc.find_first_not_of(" \t\r\n") != std::string::npos) documents.push_back(std::move(doc));
    doc.clear();
  };
  for (const fs::path& file : files) {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw Error("cannot read '" + file.string() + "'");
    std::string line, doc;
    while (std::getline(in, line)) {
      const bool crlf = !line.empty() && line.back() == '\r';
      if (!separator.empty() &&
          (line == separator || (crlf && std::string_view(line).substr(0, line.size() - 1) == separator))) {
        ++separator_lines;
        finish_document(doc);
      } else {
        doc += line;
        doc += '\n';
      }
    }
    finish_document(doc);
  }
  return documents;
}

bool is_validation(int64_t document) {
  return document % 10 == 9;
}

// A run of text the encoder takes at once: documents whole, long ones in pieces cut after a line break (about
// kPieceBytes each; a piece is encoded on its own, so tokens never span a cut), grouped into units of about
// kUnitBytes that the threads take one at a time.
struct Segment {
  int64_t document;
  size_t begin, end;
  bool last;  // ends its document: the end-of-text id follows
};
constexpr size_t kPieceBytes = size_t{1} << 20, kUnitBytes = size_t{1} << 16;

std::vector<std::vector<Segment>> encoding_units(const std::vector<std::string>& documents) {
  std::vector<std::vector<Segment>> units(1);
  size_t unit_bytes = 0;
  for (size_t d = 0; d < documents.size(); ++d) {
    const std::string& text = documents[d];
    for (size_t begin = 0; begin < text.size();) {
      size_t end = text.size();
      if (end - begin > kPieceBytes) {
        const size_t newline = text.rfind('\n', begin + kPieceBytes);
        end = newline != std::string::npos && newline > begin ? newline + 1 : begin + kPieceBytes;
        while (end > begin + 1 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
      }
      if (unit_bytes >= kUnitBytes) {
        units.emplace_back();
        unit_bytes = 0;
      }
      units.back().push_back({static_cast<int64_t>(d), begin, end, end == text.size()});
      unit_bytes += end - begin;
      begin = end;
    }
  }
  return units;
}

// Tokens of every document (each followed by the end-of-text id), split into training and validation
// documents; the same for any number of threads. `report`: a line on stderr every 10 s while it runs.
void encode_documents(const std::vector<std::string>& documents, const Tokenizer& tokenizer, int threads,
                      std::vector<uint16_t>& train, std::vector<uint16_t>& val, bool report) {
  const std::vector<std::vector<Segment>> units = encoding_units(documents);
  std::atomic<size_t> units_done{0};
  std::mutex report_mutex;
  std::condition_variable finished_cv;
  bool finished = false;
  std::thread reporter;
  if (report) {
    reporter = std::thread([&] {
      const auto start = std::chrono::steady_clock::now();
      std::unique_lock<std::mutex> lock(report_mutex);
      while (!finished_cv.wait_for(lock, std::chrono::seconds(10), [&] { return finished; })) {
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::fprintf(stderr, "  encoded %.0f%% in %.0f s\n",
                     100.0 * static_cast<double>(units_done) / static_cast<double>(units.size()), seconds);
      }
    });
  }
  struct Output {
    std::vector<uint16_t> train, val;
  };
  std::vector<Output> outputs(units.size());
  std::atomic<size_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto work = [&] {
    try {
      for (size_t u = next++; u < units.size(); u = next++) {
        for (const Segment& s : units[u]) {
          std::vector<uint16_t>& dst = is_validation(s.document) ? outputs[u].val : outputs[u].train;
          const std::string_view text(documents[static_cast<size_t>(s.document)]);
          for (int32_t id : tokenizer.encode(text.substr(s.begin, s.end - s.begin)))
            dst.push_back(static_cast<uint16_t>(id));
          if (s.last) dst.push_back(static_cast<uint16_t>(tokenizer.end_of_text()));
        }
        ++units_done;
      }
    } catch (...) {
      const std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
      next = units.size();
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (reporter.joinable()) {
    {
      const std::lock_guard<std::mutex> lock(report_mutex);
      finished = true;
    }
    finished_cv.notify_one();
    reporter.join();
  }
  if (failure) std::rethrow_exception(failure);
  for (Output& o : outputs) {
    train.insert(train.end(), o.train.begin(), o.train.end());
    val.insert(val.end(), o.val.begin(), o.val.end());
  }
}

std::unique_ptr<Tokenizer> make_tokenizer(const PrepareOptions& options,
                                          const std::vector<std::string>& documents, PrepareStats& stats) {
  if (options.tokenizer == "bytes") {
    TT_CHECK(
        options.vocab_size == 0 && options.tokenizer_model.empty(),
        "--vocab and --tokenizer-model are for --tokenizer sentencepiece (the byte tokenizer has 257 ids)");
    return byte_tokenizer();
  }
  TT_CHECK(options.tokenizer == "sentencepiece",
           "unknown tokenizer '" + options.tokenizer + "' (expected bytes or sentencepiece)");
  if (!options.tokenizer_model.empty()) {
    TT_CHECK(options.vocab_size == 0, "--vocab trains a new tokenizer; --tokenizer-model " +
                                          options.tokenizer_model + " brings its own vocabulary");
    return load_sentencepiece(options.tokenizer_model);
  }
  TT_CHECK(options.vocab_size > 0, "--tokenizer sentencepiece needs --vocab N (or --tokenizer-model FILE)");
  // The tokenizer learns from the training documents only (all of them when there are fewer than ten).
  std::vector<std::string_view> texts;
  for (size_t d = 0; d < documents.size(); ++d)
    if (documents.size() < 10 || !is_validation(static_cast<int64_t>(d))) texts.emplace_back(documents[d]);
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<Tokenizer> tokenizer = train_sentencepiece(texts, options.vocab_size, options.threads);
  stats.tokenizer_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return tokenizer;
}

}  // namespace

namespace {
// The bytes of `text` outside well-formed UTF-8 sequences (RFC 3629: no overlongs, surrogates or values
// above U+10FFFF).
int64_t invalid_utf8_bytes(std::string_view text) {
  int64_t invalid = 0;
  size_t i = 0;
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  while (i < text.size()) {
    const unsigned char c = byte(i);
    size_t length = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = length > 0 && i + length <= text.size();
    for (size_t k = 1; ok && k < length; ++k) ok = (byte(i + k) & 0xC0) == 0x80;
    if (ok && length == 2) ok = c >= 0xC2;
    if (ok && length == 3) ok = !(c == 0xE0 && byte(i + 1) < 0xA0) && !(c == 0xED && byte(i + 1) >= 0xA0);
    if (ok && length == 4)
      ok = c <= 0xF4 && !(c == 0xF0 && byte(i + 1) < 0x90) && !(c == 0xF4 && byte(i + 1) >= 0x90);
    if (ok) {
      i += length;
    } else {
      ++invalid;
      ++i;
    }
  }
  return invalid;
}
}  // namespace

namespace {
constexpr uintmax_t kReportBytes = uintmax_t{32} << 20;  // inputs from this size on say what they are doing

std::string megabytes(double bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MB", bytes / 1e6);
  return text;
}

// --out made and tried before any work, so that a folder that cannot be written is found now rather than
// after an hour of encoding; temporary files of an earlier write that was killed are removed.
void prepare_out_folder(const std::string& out_dir) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  TT_CHECK(!ec && fs::is_directory(out_dir), "cannot create --out " + out_dir + ": " +
                                                 (ec ? ec.message() : std::string("a file is in the way")));
  const std::string probe = out_dir + "/.prepare_data.probe";
  {
    std::ofstream out(probe, std::ios::binary);
    TT_CHECK(out && out.write("x", 1) && out.flush(),
             "cannot write in --out " + out_dir + ": " + std::string(std::strerror(errno)));
  }
  fs::remove(probe, ec);
  for (const char* name : {"train.bin.tmp", "val.bin.tmp", "meta.json.tmp", "tokenizer.model.tmp"}) {
    const std::string leftover = out_dir + "/" + name;
    if (fs::is_regular_file(leftover, ec)) {
      std::printf("removing %s, left by an interrupted prepare_data\n", leftover.c_str());
      fs::remove(leftover, ec);
    }
  }
}
}  // namespace

PrepareStats prepare_text(const std::string& input, const std::string& out_dir, const std::string& separator,
                          const PrepareOptions& options) {
  PrepareStats stats;
  const std::vector<fs::path> files = text_files(input, out_dir, stats.skipped_files);
  stats.files = static_cast<int64_t>(files.size());
  uintmax_t input_bytes = 0;
  for (const fs::path& file : files) {
    std::error_code ec;
    const uintmax_t size = fs::file_size(file, ec);
    if (!ec) input_bytes += size;
  }
  const bool report = input_bytes >= kReportBytes;
  const bool created = !fs::exists(out_dir);
  prepare_out_folder(out_dir);
  try {
    if (report)
      std::fprintf(stderr, "reading %lld file%s (%s)...\n", static_cast<long long>(files.size()),
                   files.size() == 1 ? "" : "s", megabytes(static_cast<double>(input_bytes)).c_str());
    const std::vector<std::string> documents = read_documents(files, separator, stats.separator_lines);
    TT_CHECK(!documents.empty(), "input '" + input + "' has too little text to split");
    if (report && options.tokenizer == "sentencepiece" && options.tokenizer_model.empty())
      std::fprintf(stderr, "training a SentencePiece model of %lld pieces...\n",
                   static_cast<long long>(options.vocab_size));
    const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(options, documents, stats);
    stats.documents = static_cast<int64_t>(documents.size());
    stats.vocab_size = tokenizer->vocab_size();
    for (const std::string& d : documents) {
      stats.text_bytes += static_cast<int64_t>(d.size());
      if (options.tokenizer == "sentencepiece") stats.invalid_utf8_bytes += invalid_utf8_bytes(d);
    }
    stats.threads = options.threads > 0 ? options.threads
                                        : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    std::vector<uint16_t> train, val;
    if (report)
      std::fprintf(stderr, "encoding %s on %d thread%s...\n",
                   megabytes(static_cast<double>(stats.text_bytes)).c_str(), stats.threads,
                   stats.threads == 1 ? "" : "s");
    const auto start = std::chrono::steady_clock::now();
    encode_documents(documents, *tokenizer, stats.threads, train, val, report);
    stats.encode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (val.empty() && !train.empty()) {
      // Fewer than ten documents (a single file, say): the last 10 to 20% of the tokens is the validation
      // split instead, cut after the last line break before 90% if there is one past 80% (else at 90%
      // exactly: one long line must not send nearly everything to validation).
      std::vector<char> ends_line(static_cast<size_t>(tokenizer->vocab_size()), 0);
      for (int32_t id = 0; id < tokenizer->vocab_size(); ++id) {
        const std::string piece = tokenizer->decode({id});
        ends_line[static_cast<size_t>(id)] = !piece.empty() && piece.back() == '\n';
      }
      const size_t fallback = train.size() - std::max<size_t>(1, train.size() / 10);
      const size_t earliest = train.size() - train.size() / 5;
      size_t cut = fallback;
      while (cut > earliest && cut > 0 && !ends_line[train[cut - 1]]) --cut;
      stats.tail_cut_at_line_break = cut > 0 && ends_line[train[cut - 1]];
      if (!stats.tail_cut_at_line_break) cut = fallback;
      val.assign(train.begin() + static_cast<std::ptrdiff_t>(cut), train.end());
      train.resize(cut);
      stats.validation_from_tail = true;
    }
    if (train.empty() || val.empty()) throw Error("input '" + input + "' has too little text to split");
    const std::string& model = tokenizer->model_bytes();
    // Room for the new files beside the old ones (replaced only once all are written).
    const double needed = static_cast<double>((train.size() + val.size()) * 2 + model.size()) + 65536.0;
    std::error_code space_error;
    const fs::space_info space = fs::space(out_dir, space_error);
    TT_CHECK(space_error || static_cast<double>(space.available) >= needed,
             "the dataset needs " + megabytes(needed) + " in --out " + out_dir + ", whose file system has " +
                 megabytes(static_cast<double>(space.available)) + " free; nothing was written");
    if (report) std::fprintf(stderr, "writing %s...\n", megabytes(needed).c_str());
    DatasetWriter writer(out_dir);
    writer.add("train.bin", reinterpret_cast<const char*>(train.data()), train.size() * 2);
    writer.add("val.bin", reinterpret_cast<const char*>(val.data()), val.size() * 2);
    if (!model.empty()) writer.add("tokenizer.model", model.data(), model.size());
    const DataMeta meta{tokenizer->name(), tokenizer->vocab_size(), tokenizer->end_of_text(),
                        tokenizer->checksum()};
    const std::string meta_text = meta_json(meta, {{"documents", stats.documents},
                                                   {"train_tokens", static_cast<int64_t>(train.size())},
                                                   {"val_tokens", static_cast<int64_t>(val.size())}});
    writer.add("meta.json", meta_text.data(), meta_text.size());
    writer.commit();
    // A tokenizer.model left by an earlier SentencePiece dataset would contradict the new meta.json.
    if (model.empty()) fs::remove(out_dir + "/tokenizer.model");
    stats.train_tokens = static_cast<int64_t>(train.size());
    stats.val_tokens = static_cast<int64_t>(val.size());
    return stats;
  } catch (...) {
    // A failed run (too little text, a full disk) leaves no empty folder that it made.
    std::error_code ec;
    if (created && fs::is_empty(out_dir, ec)) fs::remove(out_dir, ec);
    throw;
  }
}

}  // namespace tt::app
