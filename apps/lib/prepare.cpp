#include "apps/lib/prepare.h"

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
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "apps/lib/data.h"
#include "apps/lib/tokenizer.h"
#include "base/error.h"

namespace tt::app {

namespace fs = std::filesystem;

namespace {
// What a stop signal (Ctrl-C) removes before the process ends: the temporary files being written, and --out
// if this run made it (rmdir, so only while it is empty). A signal handler may only unlink and rmdir, so the
// paths wait in fixed buffers.
constexpr int kMaxPending = 8;
char pending_paths[kMaxPending][4096];
volatile std::sig_atomic_t pending_count = 0;
char created_folder_path[4096];
volatile std::sig_atomic_t folder_pending = 0;

constexpr int kStopSignals[3] = {SIGINT, SIGTERM, SIGHUP};
// Set while DatasetWriter::commit renames: a stop then waits for the renames (deferred_signal).
volatile std::sig_atomic_t committing = 0;
volatile std::sig_atomic_t deferred_signal = 0;

extern "C" void remove_pending_and_end(int signal) {
  if (committing) {
    deferred_signal = signal;
    return;
  }
  for (int i = 0; i < pending_count; ++i) ::unlink(pending_paths[i]);
  if (folder_pending) ::rmdir(created_folder_path);
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

// Installs that clean-up for SIGINT, SIGTERM and SIGHUP while prepare_text runs, from before --out is made.
class StopCleanup {
 public:
  explicit StopCleanup(const std::string& out_dir) : created_(!fs::exists(out_dir)) {
    if (created_ && out_dir.size() < sizeof(created_folder_path)) {
      std::snprintf(created_folder_path, sizeof(created_folder_path), "%s", out_dir.c_str());
      folder_pending = 1;
    }
    for (int i = 0; i < 3; ++i) {
      previous_[i] = std::signal(kStopSignals[i], remove_pending_and_end);
      if (previous_[i] == SIG_IGN) std::signal(kStopSignals[i], SIG_IGN);  // nohup's SIGHUP stays ignored
    }
  }
  ~StopCleanup() {
    folder_pending = 0;
    for (int i = 0; i < 3; ++i) std::signal(kStopSignals[i], previous_[i]);
  }
  StopCleanup(const StopCleanup&) = delete;
  StopCleanup& operator=(const StopCleanup&) = delete;
  // Whether --out did not exist before (made by prepare_out_folder).
  bool created_folder() const { return created_; }

 private:
  const bool created_;
  void (*previous_[3])(int) = {};
};

// A dataset's files are each written to NAME.tmp first; only when all of them are complete are they renamed
// into place, so a failed write (a full disk, say) or a stop signal (with StopCleanup) leaves the old
// dataset whole and no temporary files.
class DatasetWriter {
 public:
  explicit DatasetWriter(std::string dir) : dir_(std::move(dir)) {}
  ~DatasetWriter() {
    pending_count = 0;
    for (File& f : files_) {
      f.out.reset();
      std::error_code ignored;
      fs::remove(f.tmp, ignored);
    }
  }
  // Starts NAME.tmp, ours from here on: removed unless committed.
  void open(const std::string& name) {
    const std::string path = dir_ + "/" + name, tmp = path + ".tmp";
    TT_CHECK(!fs::is_directory(path), "cannot write '" + path + "': a folder of that name is in the way");
    TT_CHECK(files_.size() < kMaxPending && tmp.size() < sizeof(pending_paths[0]),
             "cannot write '" + tmp + "': path too long");
    std::snprintf(pending_paths[files_.size()], sizeof(pending_paths[0]), "%s", tmp.c_str());
    pending_count = static_cast<std::sig_atomic_t>(files_.size() + 1);  // before the file exists
    auto out = std::make_unique<std::ofstream>(tmp, std::ios::binary);
    if (!*out) throw Error("cannot write '" + tmp + "'");
    files_.push_back({name, path, tmp, std::move(out)});
  }
  void write(const std::string& name, const char* data, size_t bytes) {
    File& f = file(name);
    f.out->write(data, static_cast<std::streamsize>(bytes));
    if (!*f.out) throw Error(write_failed(f));
  }
  // NAME.tmp complete (flushed), for reading back before the commit.
  const std::string& close(const std::string& name) {
    File& f = file(name);
    f.out->close();
    if (!*f.out) throw Error(write_failed(f));
    return f.tmp;
  }
  void add(const std::string& name, const char* data, size_t bytes) {
    open(name);
    write(name, data, bytes);
    close(name);
  }
  // Every file complete: into place.
  void commit() {
    for (File& f : files_)
      if (f.out->is_open()) close(f.name);
    // The renames as one step: a stop signal that comes during them (to any thread) waits until they are
    // all done, so that the folder never holds part of the new dataset beside part of the old one.
    committing = 1;
    std::error_code failed;
    for (File& f : files_)
      if (!failed) fs::rename(f.tmp, f.path, failed);
    pending_count = 0;
    committing = 0;
    if (deferred_signal != 0) remove_pending_and_end(deferred_signal);
    if (failed) throw Error("cannot move the new dataset into " + dir_ + ": " + failed.message());
    files_.clear();
  }

 private:
  struct File {
    std::string name, path, tmp;
    std::unique_ptr<std::ofstream> out;
  };
  File& file(const std::string& name) {
    for (File& f : files_)
      if (f.name == name) return f;
    throw Error("internal: " + name + " was not opened");
  }
  static std::string write_failed(const File& f) {
    return "write failed for '" + f.path + "' (disk full?); nothing was replaced";
  }
  std::string dir_;
  std::vector<File> files_;
};

// A NUL byte in the first 8000 (git's test): token files, archives, UTF-16. Text never holds one.
bool looks_binary(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  char head[8000];
  in.read(head, sizeof(head));
  return std::memchr(head, '\0', static_cast<size_t>(in.gcount())) != nullptr;
}

std::vector<fs::path> text_files(const std::string& input, const std::string& out_dir, PrepareStats& stats) {
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
        ++(hidden ? stats.skipped_hidden : stats.skipped_datasets);
        continue;
      }
      // Links to folders are not followed (a link may loop); they and other non-files are counted.
      if (!entry.is_regular_file()) {
        if (!entry.is_directory() || entry.is_symlink())
          ++stats.skipped_other;  // real folders are walked into
        continue;
      }
      const std::string ext = entry.path().extension().string();
      // Token files (ours: .bin) and other binary data are not text (fortune's .dat indexes, .u8 copies).
      if (ext == ".dat" || ext == ".u8" || ext == ".bin" || looks_binary(entry.path())) {
        ++stats.skipped_not_text;
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

bool is_validation(int64_t document) {
  return document % 10 == 9;
}

// A run of one document's text that the encoder takes at once: a document whole, or a long one in pieces
// cut after a line break (about kPieceBytes each; a piece is encoded on its own, so tokens never span a cut).
struct Piece {
  int64_t document;
  size_t file;  // its file's place in the list
  std::string text;
  bool last;  // ends its document: the end-of-text id follows
};
constexpr size_t kPieceBytes = size_t{1} << 20;
constexpr size_t kReadBytes = size_t{1} << 20;  // read from a file at once
// What a piece holds beside its text, counted against a batch's bytes: a batch of many tiny documents
// holds fewer of them.
constexpr size_t kPieceOverhead = sizeof(Piece) + 32;

// The input's documents in order, as pieces, read a block at a time: what it holds is the current
// document's text not yet handed out (at most about a piece), never a whole file. Documents of nothing but
// whitespace are dropped. Every line ends in \n (one is added at a file's end without it); a line equal to
// the separator, or to it and a \r (a file with Windows line ends), ends a document and is not text.
class DocumentStream {
 public:
  // `block_bytes`: how much of a file is read at once.
  DocumentStream(const std::vector<fs::path>& files, std::string separator, size_t block_bytes)
      : files_(files), separator_(std::move(separator)), block_(std::max<size_t>(block_bytes, 1)) {}
  // Appends pieces to `out` until they hold `bytes` more (their text and kPieceOverhead each), or the
  // input ends; false once nothing is left.
  bool read(size_t bytes, std::vector<Piece>& out) {
    const size_t before = out.size();
    out_ = &out;
    out_bytes_ = 0;
    while (out_bytes_ < bytes && file_ < files_.size()) read_block();
    out_ = nullptr;
    return out.size() > before;
  }
  int64_t documents() const { return documents_; }
  int64_t separator_lines() const { return separator_lines_; }
  // Bytes of the files read so far, separators included (a progress thread reads it too).
  uintmax_t bytes_read() const { return bytes_read_; }

 private:
  void read_block() {
    if (!in_.is_open()) {
      in_.open(files_[file_], std::ios::binary);
      if (!in_) throw Error("cannot read '" + files_[file_].string() + "'");
    }
    in_.read(block_.data(), static_cast<std::streamsize>(block_.size()));
    if (in_.bad()) throw Error("cannot read '" + files_[file_].string() + "'");
    const size_t got = static_cast<size_t>(in_.gcount());
    bytes_read_ += got;
    for (const char *at = block_.data(), *end = at + got; at < end;) {
      const char* newline = static_cast<const char*>(std::memchr(at, '\n', static_cast<size_t>(end - at)));
      const char* stop = newline != nullptr ? newline + 1 : end;
      doc_.append(at, stop);
      line_bytes_ += static_cast<size_t>(stop - at);
      at = stop;
      if (newline != nullptr) end_line();
    }
    if (!in_.eof()) {
      hand_out(false);
      return;
    }
    if (line_bytes_ > 0) {  // the last line has no \n
      doc_ += '\n';
      ++line_bytes_;
      end_line();
    }
    finish_document();
    in_.close();
    in_.clear();
    ++file_;
  }
  // The last line_bytes_ of doc_ are a complete line, its \n included.
  void end_line() {
    if (could_be_separator()) {
      std::string_view line = std::string_view(doc_).substr(doc_.size() - line_bytes_, line_bytes_ - 1);
      if (line.size() == separator_.size() + 1 && line.back() == '\r') line.remove_suffix(1);
      if (line == separator_) {
        ++separator_lines_;
        doc_.resize(doc_.size() - line_bytes_);
        finish_document();
        return;
      }
    }
    line_bytes_ = 0;
  }
  // Whether the current line (complete or not) is short enough to be the separator, with a \r and a \n.
  bool could_be_separator() const { return !separator_.empty() && line_bytes_ <= separator_.size() + 2; }
  void finish_document() {
    line_bytes_ = 0;
    hand_out(true);
    doc_.clear();
    begin_ = scanned_ = 0;
    index_ = -1;
  }
  // Hands out the pieces of doc_ that cannot change any more: those whose cut (which reads up to a byte
  // past kPieceBytes) lies within the settled text, all of it once the document has ended. The cuts are the
  // ones a whole document would get, however the text came in blocks.
  void hand_out(bool ended) {
    // An unfinished line no longer than the separator and a \r may still turn out to be one.
    const size_t settled = ended || !could_be_separator() ? doc_.size() : doc_.size() - line_bytes_;
    if (index_ < 0) {
      for (; scanned_ < settled && index_ < 0; ++scanned_)
        if (!is_space(doc_[scanned_])) index_ = documents_++;
      if (index_ < 0) return;
    }
    while (settled - begin_ > kPieceBytes + (ended ? 0 : 1)) {
      const size_t newline = doc_.rfind('\n', begin_ + kPieceBytes);
      size_t end = newline != std::string::npos && newline > begin_ ? newline + 1 : begin_ + kPieceBytes;
      while (end > begin_ + 1 && (static_cast<unsigned char>(doc_[end]) & 0xC0) == 0x80) --end;
      emit(end, ended && end == doc_.size());
    }
    if (ended && begin_ < doc_.size()) emit(doc_.size(), true);
    if (!ended && begin_ >= kPieceBytes) {  // drop what was handed out
      doc_.erase(0, begin_);
      begin_ = 0;
    }
  }
  static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }
  void emit(size_t end, bool last) {
    out_->push_back({index_, file_, doc_.substr(begin_, end - begin_), last});
    out_bytes_ += end - begin_ + kPieceOverhead;
    begin_ = end;
  }

  const std::vector<fs::path>& files_;
  const std::string separator_;
  std::vector<char> block_;
  size_t file_ = 0;
  std::ifstream in_;
  // The current document from its first byte not yet handed out (begin_); line_bytes_: its unfinished
  // line's length; scanned_: how far it was searched for text other than whitespace.
  std::string doc_;
  size_t begin_ = 0, line_bytes_ = 0, scanned_ = 0;
  int64_t index_ = -1;  // the document's number, once it holds text other than whitespace
  int64_t documents_ = 0, separator_lines_ = 0;
  std::atomic<uintmax_t> bytes_read_{0};
  std::vector<Piece>* out_ = nullptr;
  size_t out_bytes_ = 0;
};

// A line on stderr every 10 s, from `line` (given the seconds since the start), while it lives; nothing
// when `on` is false.
class Progress {
 public:
  Progress(bool on, std::function<std::string(double)> line) : line_(std::move(line)) {
    if (!on) return;
    thread_ = std::thread([this] {
      const auto start = std::chrono::steady_clock::now();
      std::unique_lock<std::mutex> lock(mutex_);
      while (!done_cv_.wait_for(lock, std::chrono::seconds(10), [this] { return done_; })) {
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::fprintf(stderr, "  %s\n", line_(seconds).c_str());
      }
    });
  }
  ~Progress() {
    if (!thread_.joinable()) return;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_one();
    thread_.join();
  }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

 private:
  std::function<std::string(double)> line_;
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;
};

std::string percent_line(const char* what, uintmax_t done, uintmax_t total, double seconds) {
  char text[96];
  std::snprintf(text, sizeof(text), "%s %.0f%% in %.0f s", what,
                100.0 * static_cast<double>(done) / static_cast<double>(std::max<uintmax_t>(total, 1)),
                seconds);
  return text;
}

// Tokens of a run of about 64 KB of pieces (each document followed by the end-of-text id), split into
// training and validation documents.
struct EncodedUnit {
  std::vector<uint16_t> train, val;
};

// A batch of pieces encoded in units, which the threads take one at a time; the same for any number of
// threads. `done`: text bytes encoded so far, for progress.
std::vector<EncodedUnit> encode_pieces(const std::vector<Piece>& pieces, const Tokenizer& tokenizer,
                                       int threads, std::atomic<uintmax_t>& done) {
  constexpr size_t kUnitBytes = size_t{1} << 16;
  std::vector<std::pair<size_t, size_t>> units;  // [first, end) pieces
  for (size_t p = 0, bytes = kUnitBytes; p < pieces.size(); ++p) {
    if (bytes >= kUnitBytes) {
      units.emplace_back(p, p);
      bytes = 0;
    }
    units.back().second = p + 1;
    bytes += pieces[p].text.size();
  }
  std::vector<EncodedUnit> outputs(units.size());
  std::atomic<size_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto work = [&] {
    try {
      for (size_t u = next++; u < units.size(); u = next++) {
        for (size_t p = units[u].first; p < units[u].second; ++p) {
          const Piece& piece = pieces[p];
          std::vector<uint16_t>& dst = is_validation(piece.document) ? outputs[u].val : outputs[u].train;
          for (int32_t id : tokenizer.encode(piece.text)) dst.push_back(static_cast<uint16_t>(id));
          if (piece.last) dst.push_back(static_cast<uint16_t>(tokenizer.end_of_text()));
          done += piece.text.size();
        }
      }
    } catch (...) {
      const std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
      next = units.size();
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads && static_cast<size_t>(t) < units.size(); ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
  return outputs;
}

// What SentencePiece learns from: the lines of the training documents (of all of them when there are
// fewer than ten), every line while the input is at most `budget` bytes, else lines spread evenly over it,
// about that many bytes. Each string holds whole lines: a whole document when nothing is left out (the
// trainer cuts long lines at character boundaries, so a line cut between pieces would be cut elsewhere).
std::vector<std::string> tokenizer_sample(const std::vector<fs::path>& files, const std::string& separator,
                                          uintmax_t input_bytes, size_t budget, bool report,
                                          int64_t& documents) {
  const double keep =
      std::min(1.0, static_cast<double>(budget) / static_cast<double>(std::max<uintmax_t>(input_bytes, 1)));
  double allowance = 0;  // bytes the sample may still take: a line is kept once it fits
  std::vector<std::pair<int64_t, std::string>> chunks;  // document, kept lines
  std::string line;                                     // a line that goes on in the next piece
  DocumentStream stream(files, separator, kReadBytes);
  Progress progress(report, [&](double seconds) {
    return percent_line("read", stream.bytes_read(), input_bytes, seconds);
  });
  std::vector<Piece> pieces;
  while (stream.read(kReadBytes, pieces)) {
    for (Piece& piece : pieces) {
      if (keep >= 1.0) {
        if (!chunks.empty() && chunks.back().first == piece.document)
          chunks.back().second += piece.text;
        else
          chunks.emplace_back(piece.document, std::move(piece.text));
        continue;
      }
      std::string kept;
      for (size_t at = 0; at < piece.text.size();) {
        const size_t newline = piece.text.find('\n', at);
        const size_t end = newline == std::string::npos ? piece.text.size() : newline + 1;
        line.append(piece.text, at, end - at);
        at = end;
        // The line goes on in the next piece: joined, up to a few pieces (a file of one line must not fill
        // memory; the trainer cuts such lines anyway).
        if (newline == std::string::npos && !piece.last && line.size() < 4 * kPieceBytes) break;
        const double length = static_cast<double>(line.size());
        allowance += keep * length;
        if (allowance >= length) {
          kept += line;
          allowance -= length;
        }
        line.clear();
      }
      if (!kept.empty()) chunks.emplace_back(piece.document, std::move(kept));
    }
    pieces.clear();
  }
  documents = stream.documents();
  std::vector<std::string> sample;
  for (auto& [document, text] : chunks)
    if (documents < 10 || !is_validation(document)) sample.push_back(std::move(text));
  return sample;
}

std::unique_ptr<Tokenizer> make_tokenizer(const PrepareOptions& options, const std::string& input,
                                          const std::vector<fs::path>& files, const std::string& separator,
                                          uintmax_t input_bytes, bool report, PrepareStats& stats) {
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
  if (report)
    std::fprintf(stderr, "reading the text for SentencePiece to learn from%s...\n",
                 input_bytes > options.tokenizer_sample_bytes ? " (a sample of its lines)" : "");
  int64_t documents = 0;
  const std::vector<std::string> sample =
      tokenizer_sample(files, separator, input_bytes, options.tokenizer_sample_bytes, report, documents);
  TT_CHECK(documents > 0, "input '" + input + "' has too little text to split");
  std::vector<std::string_view> texts(sample.begin(), sample.end());
  for (const std::string& text : sample) stats.tokenizer_sample_bytes += static_cast<int64_t>(text.size());
  stats.tokenizer_sampled = input_bytes > options.tokenizer_sample_bytes;
  if (report)
    std::fprintf(stderr, "training a SentencePiece model of %lld pieces on %.1f MB...\n",
                 static_cast<long long>(options.vocab_size),
                 static_cast<double>(stats.tokenizer_sample_bytes) / 1e6);
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<Tokenizer> tokenizer = train_sentencepiece(texts, options.vocab_size, options.threads);
  stats.tokenizer_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return tokenizer;
}

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

// Room in --out for the whole dataset, judged from the first batch (tokens per byte of input) before
// anything is written; the new files go beside the old ones, which are replaced only at the end.
void check_room(const std::string& out_dir, double tokens_per_input_byte, uintmax_t input_bytes,
                size_t model_bytes, bool tail_split) {
  // A validation split cut from the tail is copied before train.bin is shortened: 20% more for a while.
  const double needed =
      tokens_per_input_byte * static_cast<double>(input_bytes) * 2.0 * (tail_split ? 1.2 : 1.0) +
      static_cast<double>(model_bytes) + 65536.0;
  std::error_code space_error;
  const fs::space_info space = fs::space(out_dir, space_error);
  TT_CHECK(space_error || static_cast<double>(space.available) >= needed,
           "the dataset needs about " + megabytes(needed) + " in --out " + out_dir +
               ", whose file system has " + megabytes(static_cast<double>(space.available)) +
               " free; nothing was written");
}

// Fewer than ten documents: the last 10 to 20% of train.bin's `train_tokens` tokens become val.bin, cut
// after the last line break before 90% if there is one past 80% (else at 90% exactly: one long line must not
// send nearly everything to validation). Read back from the written file in blocks. Returns the cut.
int64_t split_tail(DatasetWriter& writer, const Tokenizer& tokenizer, int64_t train_tokens,
                   bool& cut_at_line_break) {
  std::vector<char> ends_line(static_cast<size_t>(tokenizer.vocab_size()), 0);
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    const std::string piece = tokenizer.decode({id});
    ends_line[static_cast<size_t>(id)] = !piece.empty() && piece.back() == '\n';
  }
  const std::string train_path = writer.close("train.bin");
  std::ifstream in(train_path, std::ios::binary);
  TT_CHECK(static_cast<bool>(in), "cannot read back '" + train_path + "'");
  constexpr int64_t kBlock = int64_t{1} << 20;
  std::vector<uint16_t> block(static_cast<size_t>(kBlock));
  const auto read_tokens = [&](int64_t first, int64_t count) {
    in.seekg(first * 2);
    in.read(reinterpret_cast<char*>(block.data()), count * 2);
    TT_CHECK(in.gcount() == count * 2, "cannot read back '" + train_path + "'");
  };
  const int64_t fallback = train_tokens - std::max<int64_t>(1, train_tokens / 10);
  const int64_t earliest = train_tokens - train_tokens / 5;
  // The latest cut in [earliest, fallback] (cuts above 0) whose token before ends a line: blocks from the
  // end backwards.
  int64_t cut = fallback;
  cut_at_line_break = false;
  // The tokens before those cuts; fallback alone when it is below earliest (a few tokens).
  const int64_t lowest = std::max<int64_t>(0, std::min(fallback, std::max<int64_t>(earliest, 1)) - 1);
  for (int64_t high = fallback; high > lowest && !cut_at_line_break;) {
    const int64_t low = std::max(lowest, high - kBlock);
    read_tokens(low, high - low);  // tokens low .. high-1
    for (int64_t t = high - 1; t >= low; --t) {
      if (ends_line[block[static_cast<size_t>(t - low)]]) {
        cut = t + 1;
        cut_at_line_break = true;
        break;
      }
    }
    high = low;
  }
  if (!cut_at_line_break) cut = fallback;
  for (int64_t first = cut; first < train_tokens; first += kBlock) {
    const int64_t count = std::min(kBlock, train_tokens - first);
    read_tokens(first, count);
    writer.write("val.bin", reinterpret_cast<const char*>(block.data()), static_cast<size_t>(count) * 2);
  }
  in.close();
  fs::resize_file(train_path, static_cast<uintmax_t>(cut) * 2);
  return cut;
}
}  // namespace

PrepareStats prepare_text(const std::string& input, const std::string& out_dir, const std::string& separator,
                          const PrepareOptions& options) {
  PrepareStats stats;
  const std::vector<fs::path> files = text_files(input, out_dir, stats);
  stats.files = static_cast<int64_t>(files.size());
  uintmax_t input_bytes = 0;
  for (const fs::path& file : files) {
    std::error_code ec;
    const uintmax_t size = fs::file_size(file, ec);
    if (!ec) input_bytes += size;
  }
  const bool report = input_bytes >= kReportBytes;
  const StopCleanup stop_cleanup(out_dir);
  prepare_out_folder(out_dir);
  try {
    if (report)
      std::fprintf(stderr, "preparing %lld file%s (%s)...\n", static_cast<long long>(files.size()),
                   files.size() == 1 ? "" : "s", megabytes(static_cast<double>(input_bytes)).c_str());
    const std::unique_ptr<Tokenizer> tokenizer =
        make_tokenizer(options, input, files, separator, input_bytes, report, stats);
    stats.vocab_size = tokenizer->vocab_size();
    stats.threads = options.threads > 0 ? options.threads
                                        : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const std::string& model = tokenizer->model_bytes();
    if (report)
      std::fprintf(stderr, "encoding on %d thread%s...\n", stats.threads, stats.threads == 1 ? "" : "s");
    DatasetWriter writer(out_dir);
    writer.open("train.bin");
    writer.open("val.bin");
    const size_t batch_bytes = std::max<size_t>(options.batch_bytes, 1);
    DocumentStream stream(files, separator, std::min(batch_bytes, kReadBytes));
    std::atomic<uintmax_t> encoded{0};
    Progress progress(report,
                      [&](double seconds) { return percent_line("encoded", encoded, input_bytes, seconds); });
    std::vector<Piece> pieces;
    size_t last_invalid_file = files.size();
    while (stream.read(batch_bytes, pieces)) {
      for (const Piece& piece : pieces) {
        stats.text_bytes += static_cast<int64_t>(piece.text.size());
        const int64_t invalid = options.tokenizer == "sentencepiece" ? invalid_utf8_bytes(piece.text) : 0;
        if (invalid > 0 && piece.file != last_invalid_file) {
          if (stats.invalid_utf8_files++ == 0) stats.first_invalid_utf8_file = files[piece.file].string();
          last_invalid_file = piece.file;
        }
        stats.invalid_utf8_bytes += invalid;
      }
      const auto start = std::chrono::steady_clock::now();
      const std::vector<EncodedUnit> units = encode_pieces(pieces, *tokenizer, stats.threads, encoded);
      stats.encode_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      pieces.clear();
      if (stats.train_tokens + stats.val_tokens == 0) {
        size_t tokens = 0;
        for (const EncodedUnit& unit : units) tokens += unit.train.size() + unit.val.size();
        check_room(out_dir, static_cast<double>(tokens) / static_cast<double>(stream.bytes_read()),
                   input_bytes, model.size(), /*tail_split=*/stream.documents() < 10);
      }
      for (const EncodedUnit& unit : units) {
        writer.write("train.bin", reinterpret_cast<const char*>(unit.train.data()), unit.train.size() * 2);
        writer.write("val.bin", reinterpret_cast<const char*>(unit.val.data()), unit.val.size() * 2);
        stats.train_tokens += static_cast<int64_t>(unit.train.size());
        stats.val_tokens += static_cast<int64_t>(unit.val.size());
      }
    }
    stats.documents = stream.documents();
    stats.separator_lines = stream.separator_lines();
    TT_CHECK(stats.documents > 0, "input '" + input + "' has too little text to split");
    if (stats.val_tokens == 0 && stats.train_tokens > 0) {
      if (report) std::fprintf(stderr, "moving the last tokens to val.bin...\n");
      const int64_t cut = split_tail(writer, *tokenizer, stats.train_tokens, stats.tail_cut_at_line_break);
      stats.val_tokens = stats.train_tokens - cut;
      stats.train_tokens = cut;
      stats.validation_from_tail = true;
    }
    if (stats.train_tokens == 0 || stats.val_tokens == 0)
      throw Error("input '" + input + "' has too little text to split");
    if (!model.empty()) writer.add("tokenizer.model", model.data(), model.size());
    const DataMeta meta{tokenizer->name(), tokenizer->vocab_size(), tokenizer->end_of_text(),
                        tokenizer->checksum()};
    const std::string meta_text = meta_json(meta, {{"documents", stats.documents},
                                                   {"train_tokens", stats.train_tokens},
                                                   {"val_tokens", stats.val_tokens}});
    writer.add("meta.json", meta_text.data(), meta_text.size());
    writer.commit();
    // A tokenizer.model left by an earlier SentencePiece dataset would contradict the new meta.json.
    if (model.empty()) fs::remove(out_dir + "/tokenizer.model");
    return stats;
  } catch (...) {
    // A failed run (too little text, a full disk) leaves no empty folder that it made.
    std::error_code ec;
    if (stop_cleanup.created_folder() && fs::is_empty(out_dir, ec)) fs::remove(out_dir, ec);
    throw;
  }
}

}  // namespace tt::app
