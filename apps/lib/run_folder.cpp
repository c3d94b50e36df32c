#include "apps/lib/run_folder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include "apps/lib/checkpoint.h"
#include "apps/lib/report.h"
#include "base/error.h"
#include "core/io/h5.h"

namespace tt::app {

namespace fs = std::filesystem;

namespace {

// The step of a metrics line ({"step": N, ...}); lines without one are an error (the file is ours).
int64_t metrics_line_step(const std::string& path, const std::string& line) {
  const size_t at = line.find("\"step\": ");
  try {
    if (at != std::string::npos) return std::stoll(line.substr(at + 8));
  } catch (const std::exception&) {
  }
  throw Error("cannot read the step of a line of " + path + ": '" + line.substr(0, 60) + "'");
}

std::string errno_text() {
  return std::strerror(errno);
}

}  // namespace

std::optional<int64_t> checkpoint_step_of(const std::string& file_name) {
  static const std::regex pattern("step_([0-9]{1,18})\\.h5");
  std::smatch match;
  if (!std::regex_match(file_name, match, pattern)) return std::nullopt;
  return std::stoll(match[1]);
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return found;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (const auto step = checkpoint_step_of(entry.path().filename().string()))
      found.emplace_back(*step, entry.path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

namespace {
// The newest checkpoint of one listing that verifies, still locked from its check; none (an empty path) when
// none does. `pruned` (when not null): set, with none returned, when a listed file is gone by the time it is
// checked. Without `pass_over_damaged` a newest one that does not verify is an error, not passed over.
LockedCheckpoint newest_listed_checkpoint(const std::string& dir, bool weights_only, bool* pruned,
                                          bool pass_over_damaged) {
  const auto found = list_checkpoints(dir);
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    auto lock = std::make_unique<CheckpointReadLock>(it->second);  // not pruned while it is checked
    if (!lock->held() && pruned != nullptr) {
      *pruned = true;
      return {};
    }
    try {
      // Reading all of a large one takes minutes (the load reads it again): say so first.
      std::error_code size_error;
      const auto bytes = fs::file_size(it->second, size_error);
      if (!size_error && bytes >= (uint64_t{1} << 30)) {
        std::printf("checking %s (%s)...\n", it->second.c_str(),
                    format_bytes(static_cast<double>(bytes)).c_str());
        std::fflush(stdout);
      }
      // A file renamed by hand would be taken for newer than it is again and again.
      const int64_t held = verify_checkpoint(it->second, weights_only);
      if (held == it->first) return {it->second, std::move(lock)};
      const std::string why = "it holds step " + std::to_string(held) + ", not " + std::to_string(it->first);
      TT_CHECK(pass_over_damaged,
               "the newest checkpoint, " + it->second + ", is not what its name says: " + why);
      std::fprintf(stderr, "note: skipping %s: %s\n", it->second.c_str(), why.c_str());
    } catch (const Error& e) {
      if (!pass_over_damaged) throw;
      std::fprintf(stderr, "note: skipping %s: %s\n", it->second.c_str(), e.what());
    }
  }
  return {};
}

LockedCheckpoint newest_locked_checkpoint(const std::string& dir, bool weights_only, bool pass_over_damaged) {
  // A run writing `dir` may prune a checkpoint between the listing and its check: then the listing is made
  // again (a few times: a run that prunes at every step cannot hold it back for ever).
  for (int listing = 1;; ++listing) {
    bool pruned = false;
    LockedCheckpoint newest =
        newest_listed_checkpoint(dir, weights_only, listing < 5 ? &pruned : nullptr, pass_over_damaged);
    if (!pruned) return newest;
  }
}
}  // namespace

std::string newest_loadable_checkpoint(const std::string& dir, bool weights_only) {
  return newest_locked_checkpoint(dir, weights_only, /*pass_over_damaged=*/true).path;
}

namespace {
// Where a folder given for a run keeps its checkpoints: its checkpoints/, or the folder itself.
std::string folder_checkpoints_dir(const std::string& folder) {
  std::error_code ec;
  return fs::is_directory(folder + "/checkpoints", ec) ? folder + "/checkpoints" : folder;
}
}  // namespace

std::string resume_checkpoints_dir(const std::string& resume, const std::string& out) {
  std::error_code ec;
  if (resume == "latest") return out + "/checkpoints";
  if (resume.empty() || !fs::is_directory(resume, ec)) return "";
  return folder_checkpoints_dir(resume);
}

LockedCheckpoint resolve_resume(const std::string& resume, const std::string& out, bool weights_only) {
  if (resume.empty()) return {};
  const std::string dir = resume_checkpoints_dir(resume, out);
  if (dir.empty()) {  // a file (read when loaded)
    TT_CHECK(fs::exists(resume), "--resume " + resume + " does not exist");
    return {resume, nullptr};
  }
  LockedCheckpoint newest = newest_locked_checkpoint(dir, weights_only, /*pass_over_damaged=*/true);
  TT_CHECK(!newest.path.empty() || resume == "latest",
           "--resume " + resume + ": no loadable checkpoint in " + dir);
  return newest;
}

LockedCheckpoint lock_newest_checkpoint(const std::string& given, const std::string& flag) {
  // A Hugging Face folder, or its weights file, is what `import` reads, not a checkpoint: a folder with
  // config.json and safetensors weights but no checkpoints, or a .safetensors file that is not HDF5.
  const fs::path hf_folder = fs::is_directory(given) ? fs::path(given) : fs::path(given).parent_path();
  const bool hf_weights = fs::is_directory(given)
                              ? !fs::is_directory(hf_folder / "checkpoints") &&
                                    fs::exists(hf_folder / "config.json") &&
                                    (fs::exists(hf_folder / "model.safetensors") ||
                                     fs::exists(hf_folder / "model.safetensors.index.json"))
                              : fs::path(given).extension() == ".safetensors" && fs::is_regular_file(given) &&
                                    !io::has_hdf5_signature(given);
  TT_CHECK(!hf_weights, flag + " " + given +
                            " is a Hugging Face model; make a checkpoint of it first: import --from " +
                            (hf_folder.empty() ? std::string(".") : hf_folder.string()) + " --out MODEL.h5");
  if (!fs::is_directory(given)) {
    TT_CHECK(fs::exists(given), flag + " " + given + " does not exist");
    return {given, std::make_unique<CheckpointReadLock>(given)};
  }
  const std::string dir = folder_checkpoints_dir(given);
  // What a run folder stands for is its newest checkpoint: an older one in its place (its first, untrained,
  // say) would be used or exported without anyone noticing, so a damaged newest one is an error.
  LockedCheckpoint newest;
  try {
    newest = newest_locked_checkpoint(dir, /*weights_only=*/true, /*pass_over_damaged=*/false);
  } catch (const Error& e) {
    throw Error(flag + " " + given + ": " + e.what() + "; to use an older checkpoint, name its file");
  }
  TT_CHECK(!newest.path.empty(), flag + " " + given + ": no checkpoint in " + dir +
                                     " loads (a run folder's checkpoints are step_N.h5)");
  std::fprintf(stderr, "checkpoint %s\n", newest.path.c_str());
  return newest;
}

void read_newest_checkpoint(const std::string& given, const std::function<void(const std::string&)>& read,
                            const std::string& flag) {
  const LockedCheckpoint chosen = lock_newest_checkpoint(given, flag);
  read(chosen.path);
}

RunFolder::RunFolder(const std::string& out) : out_(out) {
  std::error_code ec;
  created_out_ = !fs::exists(out_, ec);
  fs::create_directories(out_, ec);
  TT_CHECK(!ec, "cannot create the run folder " + out_ + ": " + ec.message());
  const std::string lock_path = out_ + "/.lock";
  lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  TT_CHECK(lock_fd_ >= 0, "cannot create the lock file " + lock_path + ": " + errno_text());
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    char holder[64] = {0};
    const ssize_t n = ::pread(lock_fd_, holder, sizeof(holder) - 1, 0);
    ::close(lock_fd_);
    lock_fd_ = -1;
    std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "";
    who.erase(std::remove(who.begin(), who.end(), '\n'), who.end());
    throw Error(out_ + " is in use by another training run" + (who.empty() ? "" : " (" + who + ")") +
                "; wait for it to end, or pick another --out");
  }
  // Who holds it, for the message a second run prints.
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  const std::string holder = "pid " + std::to_string(::getpid()) + " on " + host + "\n";
  if (::ftruncate(lock_fd_, 0) == 0) write_all(lock_fd_, holder);

  created_checkpoints_ = !fs::exists(checkpoints_dir(), ec);
  fs::create_directories(checkpoints_dir(), ec);
  TT_CHECK(!ec, "cannot create " + checkpoints_dir() + ": " + ec.message());
  // Only a process holding the lock writes here, so a temporary file of train's own outputs is a crashed
  // write's leftover. Other .tmp files are not ours (--out may be a folder the user keeps files in).
  const auto own_leftover = [](const fs::path& path, bool in_checkpoints) {
    const std::string name = path.filename().string();
    if (!in_checkpoints)
      return name == "metrics.jsonl.tmp" || name == "loss.svg.tmp" || name == "sample.txt.tmp";
    return std::regex_match(name, std::regex("step_[0-9]{1,18}\\.h5\\.tmp"));
  };
  for (const std::string& dir : {out_, checkpoints_dir()}) {
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.is_regular_file() && own_leftover(entry.path(), dir != out_)) {
        std::printf("removing %s, left by an interrupted write\n", entry.path().c_str());
        fs::remove(entry.path(), ec);
      }
    }
  }
}

RunFolder::~RunFolder() {
  std::error_code ec;
  // A run that wrote no checkpoint (refused, failed early, or --ckpt-every -1) leaves no empty folder.
  if (created_checkpoints_ && fs::is_empty(checkpoints_dir(), ec)) fs::remove(checkpoints_dir(), ec);
  if (lock_fd_ >= 0) {
    if (!committed_ && created_out_) {
      fs::remove(out_ + "/.lock", ec);
      if (fs::is_empty(out_, ec)) fs::remove(out_, ec);
    }
    ::close(lock_fd_);  // releases the flock
  }
}

std::string checkpoint_file(const std::string& out, int64_t step) {
  return out + "/checkpoints/step_" + std::to_string(step) + ".h5";
}

std::string RunFolder::checkpoint_path(int64_t step) const {
  return checkpoint_file(out_, step);
}

void RunFolder::discard_new_run() {
  if (kept_step_ >= 0 || !committed_) return;
  std::error_code ec;
  fs::remove(checkpoint_path(0), ec);
  fs::remove(metrics_path(), ec);
  committed_ = false;
}

bool RunFolder::has_metrics_lines() const {
  std::ifstream in(metrics_path());
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) return true;
  }
  return false;
}

bool RunFolder::holds_only_start_point() const {
  const auto found = list_checkpoints(checkpoints_dir());
  return found.size() == 1 && found[0].first == 0;
}

bool RunFolder::holds_trained_run() const {
  const auto found = list_checkpoints(checkpoints_dir());
  if (found.empty()) return false;
  if (found.size() > 1 || found[0].first != 0 || has_metrics_lines()) return true;
  try {
    const std::string args = read_checkpoint_args(found[0].second);
    return args.empty() || !recorded_flag(args, "init-from").empty();
  } catch (const std::exception&) {
    return false;  // a start point that does not load holds nothing to keep
  }
}

void RunFolder::start(int64_t kept_step, const std::string& keep_file) {
  kept_step_ = kept_step;
  replaces_another_run_ = false;
  kept_metrics_.clear();
  replaced_checkpoints_.clear();
  std::error_code ec;
  for (const auto& [step, path] : list_checkpoints(checkpoints_dir())) {
    if (step <= kept_step) continue;
    if (!keep_file.empty() && fs::equivalent(path, keep_file, ec)) continue;
    replaced_checkpoints_.push_back(path);
    // A start point alone (step 0, a run that ended in its first step) is overwritten by this run's own.
    replaces_another_run_ = replaces_another_run_ || (kept_step < 0 && step > 0);
  }
  if (kept_step < 0) {
    replaces_another_run_ = replaces_another_run_ || has_metrics_lines();
    return;
  }
  std::ifstream in(metrics_path());
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    // A torn last line (a crash mid-write) is dropped: its step was not checkpointed anyway.
    if (line.back() != '}') continue;
    if (metrics_line_step(metrics_path(), line) <= kept_step) kept_metrics_.push_back(line);
  }
}

void RunFolder::append_metrics(const std::string& line) {
  if (!committed_) {
    pending_metrics_.push_back(line);
    return;
  }
  const std::string path = metrics_path();
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  TT_CHECK(fd >= 0, "cannot write " + path + ": " + errno_text());
  const off_t size_before = ::lseek(fd, 0, SEEK_END);
  if (!write_all(fd, line + "\n")) {
    const std::string why = errno_text();
    // No torn line: the file ends at the last complete one.
    if (size_before >= 0 && ::ftruncate(fd, size_before) != 0) {
    }
    ::close(fd);
    throw Error("cannot write " + path + " (disk full?): " + why);
  }
  ::close(fd);
}

namespace {
// Removes a checkpoint unless a reader holds a CheckpointReadLock on it (then it waits for a later commit,
// and the function returns false): the exclusive lock is taken without waiting. Where the file system has
// no such locks, or the file cannot be opened for writing (NFS grants exclusive locks to writers only), it
// is removed as before.
bool remove_unless_read(const std::string& path) {
  std::error_code ec;
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd >= 0) {
    const bool being_read = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    if (!being_read) fs::remove(path, ec);
    ::close(fd);
    return !being_read;
  }
  fs::remove(path, ec);
  return true;
}
}  // namespace

std::vector<std::string> RunFolder::commit(int64_t step, int64_t keep) {
  std::vector<std::string> kept_for_readers;
  if (!committed_) {
    std::string text;
    for (const std::string& l : kept_metrics_) text += l + "\n";
    for (const std::string& l : pending_metrics_) text += l + "\n";
    write_file_atomically(metrics_path(), text);
    pending_metrics_.clear();
    const std::string newest = step >= 0 ? checkpoint_path(step) : "";
    for (const std::string& path : replaced_checkpoints_) {
      if (path != newest && !remove_unless_read(path)) kept_for_readers.push_back(path);
    }
    replaced_checkpoints_.clear();
    committed_ = true;
  }
  if (keep <= 0 || step < 0) return kept_for_readers;
  const auto found = list_checkpoints(checkpoints_dir());
  for (size_t i = 0; i + static_cast<size_t>(keep) < found.size(); ++i) {
    if (found[i].first < step && !remove_unless_read(found[i].second))
      kept_for_readers.push_back(found[i].second);
  }
  return kept_for_readers;
}

CheckpointReadLock::CheckpointReadLock(const std::string& path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) return;
  // Blocks only while a prune holds its exclusive lock, which it takes without waiting. A file system
  // without such locks reads unprotected, as before.
  while (::flock(fd_, LOCK_SH) != 0 && errno == EINTR) {
  }
  struct stat opened {
  }, named{};
  const bool same = ::fstat(fd_, &opened) == 0 && ::stat(path.c_str(), &named) == 0 &&
                    opened.st_dev == named.st_dev && opened.st_ino == named.st_ino;
  if (!same) {
    ::close(fd_);
    fd_ = -1;
  }
}

CheckpointReadLock::~CheckpointReadLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace tt::app
