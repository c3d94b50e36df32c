// What a run leaves behind and shows while it runs: metrics.jsonl lines, the loss-curve SVG, a progress bar
// on terminals (plain lines otherwise), and the GPU peak used for MFU.
#pragma once

#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace tt::app {

// One JSON object per line, flushed as written so a crash loses nothing already reported.
// Throws tt::Error when `path` cannot be opened for writing. Changes nothing: an existing file keeps its
// contents, and a file this check had to create is removed again.
void check_writable(const std::string& path, const std::string& what);

// JSON lines to a file. Appending opens at once; otherwise the constructor only checks that the file can be
// written, and the old contents are replaced at the first write, so a run that fails before producing a row
// (a bad flag, say) leaves an existing file as it was.
class JsonlWriter {
 public:
  JsonlWriter(const std::string& path, bool append);
  void write(const std::vector<std::pair<std::string, std::string>>& fields);  // values already JSON
  void write_raw(const std::string& object_json);
  static std::string number(double v);  // NaN/inf as null
  static std::string object(const std::vector<std::pair<std::string, std::string>>& fields);  // one line
  static std::string quote(const std::string& s);

 private:
  std::ofstream& stream();
  std::string path_;
  std::ofstream out_;
};

struct LossPoint {
  int64_t step;
  double loss;
};
// A self-contained SVG with train and validation loss against step, written atomically; throws when the
// file cannot be written.
// `baseline` (if finite) is drawn as a dashed horizontal line labelled `baseline_label` (e.g. the unigram
// entropy a model has to beat).
void write_loss_svg(const std::string& path, const std::vector<LossPoint>& train,
                    const std::vector<LossPoint>& val, const std::string& title, double baseline = NAN,
                    const std::string& baseline_label = "");

// Reads back the (step, loss, val_loss) pairs of an existing metrics.jsonl (for resumed runs' plots).
void read_metrics(const std::string& path, int64_t up_to_step, std::vector<LossPoint>& train,
                  std::vector<LossPoint>& val);

// Peak dense FLOP/s of the device for the given precision, and its description; 0 when unknown.
struct PeakFlops {
  double flops_per_s = 0;
  std::string description;
};
PeakFlops device_peak_flops(const std::string& device_name, bool bf16);

// Progress of steps first..last. A bar redrawn in place only where stdout is an interactive terminal of a
// single process (not under mpirun, whose ranks may write to a pseudo-terminal even when the job's output
// goes to a file, and not with TERM=dumb); everywhere else plain lines with elapsed time and ETA, never a
// carriage return or an escape code, so logs read well.
class Progress {
 public:
  Progress(int64_t first_step, int64_t last_step);
  bool interactive() const { return interactive_; }
  // Redraws the bar (terminal) or prints `line` (otherwise) - callers decide how often.
  void update(int64_t step, const std::string& line);
  void finish();
  // "42s", "3m05s", "2h07m".
  static std::string duration(double seconds);

 private:
  int64_t first_, last_;
  bool interactive_;
  double start_s_;
};

// Ends the progress bar's line when one is drawn on the terminal, so that what is printed next (a
// validation line, an error) starts on a line of its own; nothing otherwise.
void end_progress_line();

double now_seconds();

// "5.2 MB", "4.84 GB"; "21 ms", "10.4 s": sizes and short durations in log lines.
std::string format_bytes(double bytes);
std::string format_seconds(double seconds);
// bytes over seconds as "0.47 GB/s".
std::string format_rate(double bytes, double seconds);

// Writes all of `text` to the file descriptor (retrying short writes); false on failure, errno set.
bool write_all(int fd, const std::string& text);

// Writes `text` to `path` through a temporary file and a rename, so a reader never sees a partial file;
// throws naming `path` on any failure (the old file is then untouched).
void write_file_atomically(const std::string& path, const std::string& text);
// `values` (row-major, `shape`) as a NumPy .npy file (format 1.0, little-endian f32), written atomically.
void write_npy_f32(const std::string& path, const std::vector<float>& values,
                   const std::vector<int64_t>& shape);

}  // namespace tt::app
