#include "apps/lib/data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "kernels/common.h"

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
  if (file.size() < context + 2) {
    throw Error("context length " + std::to_string(context) + " needs at least " +
                std::to_string(context + 2) + " tokens, but '" + file.path() + "' has " +
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

Batch eval_batch(const TokenFile& file, int64_t batch, int64_t context, int64_t first_window) {
  check_context_fits(file, context);
  const int64_t room = window_room(file, context);
  TT_CHECK(batch > 0 && first_window >= 0 && first_window <= room - batch,
           "internal: evaluation windows " + std::to_string(first_window) + ".." +
               std::to_string(first_window + batch - 1) + " of '" + file.path() + "' (room for " +
               std::to_string(room) + " windows of " + std::to_string(context + 1) +
               " tokens) do not fit; check_eval_fits should have refused this at start-up");
  Batch out;
  out.inputs.resize(static_cast<size_t>(batch * context));
  out.targets.resize(out.inputs.size());
  for (int64_t b = 0; b < batch; ++b) copy_window(file, (first_window + b) * context, context, out, b);
  return out;
}

void check_eval_fits(const TokenFile& val, int64_t batch, int64_t context, int64_t batches) {
  TT_CHECK(batch > 0 && batches > 0, "--batch and --eval-batches must be positive");
  check_context_fits(val, context);
  const int64_t room = window_room(val, context);
  if (batches <= room / batch) return;  // batches * batch <= room, without overflow
  int64_t needed = 0;
  const bool overflow = __builtin_mul_overflow(batches, batch, &needed);
  throw Error("--eval-batches " + std::to_string(batches) + " x --batch " + std::to_string(batch) +
              " needs " + (overflow ? "more than 2^63" : std::to_string(needed)) + " windows of " +
              std::to_string(context + 1) + " tokens; " + val.path() + " has room for " +
              std::to_string(room) + "; lower --eval-batches or --batch");
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
  return out;
}

std::string meta_json(const DataMeta& meta, const std::vector<std::pair<std::string, int64_t>>& extra) {
  // ordered_json keeps the order written: what the ids mean first, then counts.
  nlohmann::ordered_json json;
  json["tokenizer"] = meta.tokenizer;
  json["vocab_size"] = meta.vocab_size;
  if (meta.end_of_text >= 0) json["end_of_text"] = meta.end_of_text;
  for (const auto& [name, value] : extra) json[name] = value;
  return json.dump(2) + "\n";
}

int64_t read_vocab_size(const std::string& data_dir) {
  const std::optional<DataMeta> meta = read_meta(data_dir);
  return meta ? meta->vocab_size : 0;
}

std::string read_tokenizer(const std::string& data_dir) {
  const std::optional<DataMeta> meta = read_meta(data_dir);
  return meta ? meta->tokenizer : "";
}

namespace {
// A dataset's files are each written to NAME.tmp first; only when all of them are complete are they renamed
// into place, so a failed write (a full disk, say) leaves the old dataset whole and no temporary files.
class DatasetWriter {
 public:
  explicit DatasetWriter(std::string dir) : dir_(std::move(dir)) {}
  ~DatasetWriter() {
    for (const std::string& tmp : pending_) {
      std::error_code ignored;
      fs::remove(tmp, ignored);
    }
  }
  void add(const std::string& name, const char* data, size_t bytes) {
    const std::string path = dir_ + "/" + name, tmp = path + ".tmp";
    TT_CHECK(!fs::is_directory(path), "cannot write '" + path + "': a folder of that name is in the way");
    std::ofstream out(tmp, std::ios::binary);
    if (!out) throw Error("cannot write '" + tmp + "'");
    pending_.push_back(tmp);  // ours from here on: removed unless committed
    out.write(data, static_cast<std::streamsize>(bytes));
    out.close();
    if (!out) throw Error("write failed for '" + path + "' (disk full?); nothing was replaced");
  }
  // Every file complete: into place.
  void commit() {
    for (const std::string& tmp : pending_) fs::rename(tmp, tmp.substr(0, tmp.size() - 4));
    pending_.clear();
  }

 private:
  std::string dir_;
  std::vector<std::string> pending_;
};
}  // namespace

PrepareStats prepare_text(const std::string& input, const std::string& out_dir,
                          const std::string& separator) {
  std::vector<fs::path> files;
  if (fs::is_directory(input)) {
    for (const auto& entry : fs::recursive_directory_iterator(input)) {
      const std::string ext = entry.path().extension().string();
      // Token files (ours: .bin) and other binary data are not text.
      if (entry.is_regular_file() && ext != ".dat" && ext != ".u8" && ext != ".bin")
        files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
  } else if (fs::is_regular_file(input)) {
    files.push_back(input);
  } else {
    throw Error("input '" + input + "' is neither a file nor a folder");
  }
  if (files.empty()) throw Error("no text files under '" + input + "'");
  std::vector<uint16_t> train, val;
  PrepareStats stats;
  auto finish_document = [&](const std::string& doc) {
    if (doc.find_first_not_of(" \t\r\n") == std::string::npos) return;
    std::vector<uint16_t>& dst = (stats.documents % 10 == 9) ? val : train;
    for (unsigned char c : doc) dst.push_back(c);
    dst.push_back(static_cast<uint16_t>(kEndOfText));
    ++stats.documents;
  };
  for (const fs::path& file : files) {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw Error("cannot read '" + file.string() + "'");
    std::string line, doc;
    while (std::getline(in, line)) {
      if (!separator.empty() && line == separator) {
        finish_document(doc);
        doc.clear();
      } else {
        doc += line + "\n";
      }
    }
    finish_document(doc);
  }
  if (val.empty() && !train.empty()) {
    // Fewer than ten documents (a single file, say): the last ~10% of the text, cut at a line break, is
    // the validation split instead.
    size_t cut = train.size() - std::max<size_t>(1, train.size() / 10);
    while (cut > 0 && train[cut - 1] != '\n' && train[cut - 1] != static_cast<uint16_t>(kEndOfText)) --cut;
    if (cut == 0) cut = train.size() - std::max<size_t>(1, train.size() / 10);
    val.assign(train.begin() + static_cast<std::ptrdiff_t>(cut), train.end());
    train.resize(cut);
  }
  if (train.empty() || val.empty()) throw Error("input '" + input + "' has too little text to split");
  fs::create_directories(out_dir);
  DatasetWriter writer(out_dir);
  writer.add("train.bin", reinterpret_cast<const char*>(train.data()), train.size() * 2);
  writer.add("val.bin", reinterpret_cast<const char*>(val.data()), val.size() * 2);
  const std::string meta_text =
      meta_json({"bytes", kByteVocab, kEndOfText}, {{"documents", stats.documents},
                                                    {"train_tokens", static_cast<int64_t>(train.size())},
                                                    {"val_tokens", static_cast<int64_t>(val.size())}});
  writer.add("meta.json", meta_text.data(), meta_text.size());
  writer.commit();
  stats.train_tokens = static_cast<int64_t>(train.size());
  stats.val_tokens = static_cast<int64_t>(val.size());
  return stats;
}

}  // namespace tt::app
