// A training run's folder (--out), owned by rank 0: the lock that keeps a second run out, the checkpoints in
// it, and metrics.jsonl. The rule that keeps users' work: nothing saved is deleted until a newer checkpoint
// of trained steps has been written and verified (a run replacing another writes no step 0: it would hold
// only the initial weights). A resumed run's replaced future (later checkpoints, later metrics) and an
// overwritten run's files are removed only then; older checkpoints are pruned only then.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tt::app {

// RUN/checkpoints/step_N.h5.
std::string checkpoint_file(const std::string& out, int64_t step);

// N for a file named step_N.h5 (a run's checkpoint of step N), else nothing.
std::optional<int64_t> checkpoint_step_of(const std::string& file_name);
// step_N.h5 files of a folder, oldest first. Names that do not parse are ignored.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir);

// The newest checkpoint of `dir` that verifies (verify_checkpoint; with `weights_only`, its /model part), or
// "" when none does. Each one that does not is reported on stderr with the reason.
std::string newest_loadable_checkpoint(const std::string& dir, bool weights_only = false);

// The folder whose checkpoints `--resume` means: `out`/checkpoints for "latest", a run folder's checkpoints/
// (or the folder itself); "" for a file or nothing.
std::string resume_checkpoints_dir(const std::string& resume, const std::string& out);

// A shared lock (flock) on a checkpoint file while a process reads it, so that the run writing its folder
// does not prune it meanwhile (RunFolder::commit leaves it for a later prune). held() is false when the file
// was gone, replaced or unreadable by the time it was locked. On a file system without flock the file is
// read unprotected, as before. Released when the process ends, however it ends.
class CheckpointReadLock {
 public:
  explicit CheckpointReadLock(const std::string& path);
  ~CheckpointReadLock();
  CheckpointReadLock(const CheckpointReadLock&) = delete;
  CheckpointReadLock& operator=(const CheckpointReadLock&) = delete;
  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

struct LockedCheckpoint {
  std::string path;
  std::unique_ptr<CheckpointReadLock> lock;  // held() false: the file is read unprotected
};
// What `--resume` names: a checkpoint file, "latest" (the newest loadable checkpoint of `out`), or a run
// folder (its newest loadable checkpoint, locked from its check on, as another run may be pruning that
// folder; a file named directly is not locked here). Returns no path for "latest" when `out` has no
// checkpoint yet (a first start of a job that always passes --resume latest); a folder without one is an
// error.
LockedCheckpoint resolve_resume(const std::string& resume, const std::string& out, bool weights_only = false);
// What --checkpoint names in generate and export (and train's --init-from): a checkpoint file as given, or
// for a run folder (or its checkpoints/ folder) its newest checkpoint (said on stderr; an error when its
// weights do not load, where --resume would pass over it to an older one),
// with a CheckpointReadLock held on it from its check on, so that the run writing the folder does not prune
// it while it is read. Throws, naming `flag`, when a folder has none, or for a Hugging Face folder or weights
// file (naming `import`).
LockedCheckpoint lock_newest_checkpoint(const std::string& given, const std::string& flag = "--checkpoint");
// Runs `read` on lock_newest_checkpoint(given)'s choice while it holds the lock.
void read_newest_checkpoint(const std::string& given, const std::function<void(const std::string&)>& read,
                            const std::string& flag = "--checkpoint");

class RunFolder {
 public:
  // Creates `out` and `out`/checkpoints as needed and takes the folder's lock (flock on out/.lock, released
  // by the kernel however the process ends). Throws when another process holds it. Leftover temporary files
  // of interrupted writes are removed.
  explicit RunFolder(const std::string& out);
  ~RunFolder();  // releases the lock; removes the folders it created if nothing was written into them
  RunFolder(const RunFolder&) = delete;
  RunFolder& operator=(const RunFolder&) = delete;

  const std::string& out() const { return out_; }
  std::string checkpoints_dir() const { return out_ + "/checkpoints"; }
  std::string checkpoint_path(int64_t step) const;
  std::string metrics_path() const { return out_ + "/metrics.jsonl"; }
  bool has_checkpoints() const { return !list_checkpoints(checkpoints_dir()).empty(); }
  // False when all the folder holds is a start point its seed recreates: step_0 alone, written by train
  // without --init-from (not imported, not another run's weights), and no metrics line. That is what a new
  // run leaves when it is killed in its first step.
  bool holds_trained_run() const;
  // Whether its only checkpoint is step_0.h5, a run's start point.
  bool holds_only_start_point() const;
  // Whether metrics.jsonl has a line (of any run: this one has written none yet).
  bool has_metrics_lines() const;

  // The run continues from `step` of this folder (kept_step = step; -1: a new run, nothing of the folder's
  // earlier contents is kept). Checkpoints after it (except `keep_file`, the one resumed from) and metrics
  // lines after it are replaced, but only at commit().
  void start(int64_t kept_step, const std::string& keep_file = "");
  // What this run replaces once it has written a checkpoint of trained steps (start() computes it).
  const std::vector<std::string>& replaced_checkpoints() const { return replaced_checkpoints_; }
  // A new run over another run's checkpoints or metrics (--overwrite). It writes no start point (step 0)
  // beside them: its first checkpoint is one of trained steps, and until then the folder holds the other
  // run alone, whole.
  bool replaces_another_run() const { return replaces_another_run_; }
  // Whether what the folder shows (loss.svg) may be this run's: not while it still holds the run this one
  // replaces.
  bool holds_this_run() const { return committed_ || !replaces_another_run_; }
  // Appends one metrics line. Until the first commit() lines wait in memory; afterwards they are appended
  // and flushed at once. A failed write is undone (no torn line) and throws.
  void append_metrics(const std::string& line);
  // Called after a checkpoint at `step` was written and verified: on the first call, metrics.jsonl becomes
  // the kept lines plus the new ones (written whole, then renamed) and the replaced checkpoints are deleted;
  // then all but the newest `keep` checkpoints (0: all) are pruned. step -1: a run that writes no
  // checkpoints takes the folder over at once. Returns the checkpoints it left because another process was
  // reading them (CheckpointReadLock); a later commit tries again.
  std::vector<std::string> commit(int64_t step, int64_t keep);
  // A new run (start(-1)) that failed before its first step completed: removes what it wrote (step_0,
  // metrics.jsonl), so that the corrected command is not refused as another run's folder.
  void discard_new_run();

 private:
  std::string out_;
  int lock_fd_ = -1;
  bool created_out_ = false, created_checkpoints_ = false, committed_ = false;
  bool replaces_another_run_ = false;
  int64_t kept_step_ = -1;
  std::vector<std::string> kept_metrics_, pending_metrics_, replaced_checkpoints_;
};

}  // namespace tt::app
