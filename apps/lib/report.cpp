#include "apps/lib/report.h"

#include <fcntl.h>
#include <unistd.h>

#include <mpi.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <sstream>

#include "base/error.h"

namespace tt::app {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string format_bytes(double bytes) {
  char text[32];
  if (bytes >= 1e9)
    std::snprintf(text, sizeof(text), "%.2f GB", bytes / 1e9);
  else
    std::snprintf(text, sizeof(text), "%.1f MB", bytes / 1e6);
  return text;
}

std::string format_seconds(double seconds) {
  char text[32];
  if (seconds >= 1)
    std::snprintf(text, sizeof(text), "%.1f s", seconds);
  else
    std::snprintf(text, sizeof(text), "%.0f ms", seconds * 1e3);
  return text;
}

std::string format_rate(double bytes, double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f GB/s", seconds > 0 ? bytes / 1e9 / seconds : 0.0);
  return text;
}

void check_writable(const std::string& path, const std::string& what) {
  const std::filesystem::file_status link = std::filesystem::symlink_status(path);
  // A link to nothing: opening it would create its target; the write itself will, if the user meant that.
  if (std::filesystem::is_symlink(link) && !std::filesystem::exists(path)) return;
  const bool existed = std::filesystem::exists(link);
  // Opened for appending: creates the file if need be, changes nothing in it.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int error = errno;
    const std::filesystem::path parent = std::filesystem::absolute(path).parent_path();
    throw Error("cannot write " + what + " '" + path + "': " +
                (std::filesystem::is_directory(path) ? "it is a folder (name a file)"
                 : !std::filesystem::is_directory(parent)
                     ? "its folder " + parent.string() + " does not exist"
                     : std::string(std::strerror(error))));
  }
  ::close(fd);
  if (!existed) std::filesystem::remove(path);
}

JsonlWriter::JsonlWriter(const std::string& path, bool append) : path_(path) {
  if (append) {
    out_.open(path, std::ios::app);
    if (!out_) throw Error("cannot write '" + path + "'");
  } else {
    check_writable(path, "JSON lines");
  }
}

std::ofstream& JsonlWriter::stream() {
  if (!out_.is_open()) {
    out_.open(path_, std::ios::trunc);
    if (!out_) throw Error("cannot write '" + path_ + "'");
  }
  return out_;
}

std::string JsonlWriter::object(const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string out = "{";
  for (size_t i = 0; i < fields.size(); ++i)
    out += (i ? ", " : "") + quote(fields[i].first) + ": " + fields[i].second;
  return out + "}";
}

void JsonlWriter::write(const std::vector<std::pair<std::string, std::string>>& fields) {
  write_raw(object(fields));
}

void JsonlWriter::write_raw(const std::string& object_json) {
  std::ofstream& out = stream();
  out << object_json << "\n";
  out.flush();
  if (!out) throw Error("cannot write '" + path_ + "' (disk full?)");
}

std::string JsonlWriter::number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

std::string JsonlWriter::quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

void write_loss_svg(const std::string& path, const std::vector<LossPoint>& train,
                    const std::vector<LossPoint>& val, const std::string& title, double baseline,
                    const std::string& baseline_label) {
  const double width = 720, height = 420, left = 64, right = 20, top = 40, bottom = 50;
  double max_step = 1, lo = 1e300, hi = -1e300;
  for (const auto* series : {&train, &val}) {
    for (const LossPoint& p : *series) {
      if (!std::isfinite(p.loss)) continue;
      max_step = std::max(max_step, static_cast<double>(p.step));
      lo = std::min(lo, p.loss);
      hi = std::max(hi, p.loss);
    }
  }
  if (std::isfinite(baseline)) {
    lo = std::min(lo, baseline);
    hi = std::max(hi, baseline);
  }
  if (lo > hi) lo = 0, hi = 1;
  if (hi - lo < 1e-9) hi = lo + 1;
  auto x_of = [&](double step) { return left + (width - left - right) * step / max_step; };
  auto y_of = [&](double loss) { return top + (height - top - bottom) * (hi - loss) / (hi - lo); };
  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << width << "' height='" << height
      << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n";
  svg << "<text x='" << width / 2 << "' y='22' text-anchor='middle' font-size='14'>" << title << "</text>\n";
  for (int i = 0; i <= 5; ++i) {
    const double loss = lo + (hi - lo) * i / 5.0, y = y_of(loss);
    svg << "<line x1='" << left << "' x2='" << width - right << "' y1='" << y << "' y2='" << y
        << "' stroke='#ddd'/><text x='" << left - 6 << "' y='" << y + 4 << "' text-anchor='end'>"
        << JsonlWriter::number(std::round(loss * 1000) / 1000) << "</text>\n";
    const double step = max_step * i / 5.0, x = x_of(step);
    svg << "<text x='" << x << "' y='" << height - bottom + 18 << "' text-anchor='middle'>"
        << static_cast<int64_t>(std::round(step)) << "</text>\n";
  }
  svg << "<text x='" << width / 2 << "' y='" << height - 12 << "' text-anchor='middle'>step</text>\n";
  svg << "<text x='16' y='" << height / 2 << "' transform='rotate(-90 16 " << height / 2
      << ")' text-anchor='middle'>loss (nats/token)</text>\n";
  auto polyline = [&](const std::vector<LossPoint>& series, const char* color) {
    svg << "<polyline fill='none' stroke='" << color << "' stroke-width='1.5' points='";
    for (const LossPoint& p : series) {
      if (std::isfinite(p.loss)) svg << x_of(static_cast<double>(p.step)) << "," << y_of(p.loss) << " ";
    }
    svg << "'/>\n";
  };
  if (std::isfinite(baseline)) {
    svg << "<line x1='" << left << "' x2='" << width - right << "' y1='" << y_of(baseline) << "' y2='"
        << y_of(baseline) << "' stroke='#555' stroke-dasharray='6 4'/><text x='" << left + 6 << "' y='"
        << y_of(baseline) - 4 << "' fill='#555'>" << baseline_label << "</text>\n";
  }
  polyline(train, "#1f77b4");
  polyline(val, "#d62728");
  for (const LossPoint& p : val) {
    svg << "<circle cx='" << x_of(static_cast<double>(p.step)) << "' cy='" << y_of(p.loss)
        << "' r='3' fill='#d62728'/>\n";
  }
  svg << "<text x='" << width - right - 150 << "' y='" << top + 14 << "' fill='#1f77b4'>train loss</text>\n";
  svg << "<text x='" << width - right - 150 << "' y='" << top + 30
      << "' fill='#d62728'>validation loss</text>\n";
  svg << "</svg>\n";
  write_file_atomically(path, svg.str());
}

void read_metrics(const std::string& path, int64_t up_to_step, std::vector<LossPoint>& train,
                  std::vector<LossPoint>& val) {
  std::ifstream in(path);
  std::string line;
  const std::regex step_re("\"step\": ([0-9]+)"), loss_re("\"loss\": ([-0-9.eE+]+)"),
      val_re("\"val_loss\": ([-0-9.eE+]+)");
  while (std::getline(in, line)) {
    std::smatch m;
    if (!std::regex_search(line, m, step_re)) continue;
    const int64_t step = std::stoll(m[1]);
    if (step > up_to_step) continue;
    if (std::regex_search(line, m, loss_re)) train.push_back({step, std::stod(m[1])});
    if (std::regex_search(line, m, val_re)) val.push_back({step, std::stod(m[1])});
  }
}

PeakFlops device_peak_flops(const std::string& name, bool bf16) {
  // Dense (no sparsity) tensor-core bf16 and plain f32 peaks from NVIDIA's SXM datasheets.
  if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) {
    const std::string gpu = name.find("H200") != std::string::npos ? "H200" : "H100";
    return bf16 ? PeakFlops{989e12, gpu + " SXM dense bf16 peak 989 TFLOP/s"}
                : PeakFlops{67e12, gpu + " SXM f32 (non-tensor) peak 67 TFLOP/s"};
  }
  if (name.find("A100") != std::string::npos) {
    return bf16 ? PeakFlops{312e12, "A100 dense bf16 peak 312 TFLOP/s"}
                : PeakFlops{19.5e12, "A100 f32 peak 19.5 TFLOP/s"};
  }
  return {};
}

namespace {
// A terminal a person watches: stdout is a tty, the terminal can move the cursor, and this is a single
// process (under an MPI launcher every rank's output is forwarded, and may be going to a file).
bool interactive_terminal() {
  if (::isatty(STDOUT_FILENO) == 0) return false;
  const char* term = std::getenv("TERM");
  if (term == nullptr || std::strcmp(term, "dumb") == 0) return false;
  int mpi_started = 0;
  MPI_Initialized(&mpi_started);
  return mpi_started == 0;
}
}  // namespace

Progress::Progress(int64_t first_step, int64_t last_step)
    : first_(first_step), last_(last_step), interactive_(interactive_terminal()), start_s_(now_seconds()) {}

std::string Progress::duration(double seconds) {
  const int64_t s = std::isfinite(seconds) ? static_cast<int64_t>(std::max(0.0, std::round(seconds))) : 0;
  char text[32];
  if (s < 60)
    std::snprintf(text, sizeof(text), "%llds", static_cast<long long>(s));
  else if (s < 3600)
    std::snprintf(text, sizeof(text), "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  else
    std::snprintf(text, sizeof(text), "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60));
  return text;
}

namespace {
bool g_progress_line_open = false;  // the bar is drawn and its line not ended
}  // namespace

void end_progress_line() {
  if (!g_progress_line_open) return;
  std::printf("\n");
  std::fflush(stdout);
  g_progress_line_open = false;
}

void Progress::update(int64_t step, const std::string& line) {
  const double done =
      static_cast<double>(step - first_ + 1) / static_cast<double>(std::max<int64_t>(1, last_ - first_ + 1));
  const double elapsed = now_seconds() - start_s_;
  const double eta = done > 0 ? elapsed * (1 - done) / done : 0;
  if (!interactive_) {
    std::printf("%s | elapsed %s | ETA %s\n", line.c_str(), duration(elapsed).c_str(), duration(eta).c_str());
    std::fflush(stdout);
    return;
  }
  const int width = 24, filled = static_cast<int>(done * width);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(width, '.');
  std::printf("\r[%s] %3.0f%% ETA %s | %s\033[K", bar.c_str(), done * 100, duration(eta).c_str(),
              line.c_str());
  std::fflush(stdout);
  g_progress_line_open = true;
}

void Progress::finish() {
  end_progress_line();
}

bool write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TT_CHECK(fd >= 0, "cannot write " + path + ": " + std::string(std::strerror(errno)));
  const bool ok = write_all(fd, text) && ::fsync(fd) == 0;
  const std::string why = std::string(std::strerror(errno));
  ::close(fd);
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string reason = ok ? std::string(std::strerror(errno)) : why;
    std::remove(tmp.c_str());
    throw Error("cannot write " + path + " (disk full?): " + reason);
  }
}

void write_npy_f32(const std::string& path, const std::vector<float>& values,
                   const std::vector<int64_t>& shape) {
  int64_t count = 1;
  std::string dims;
  for (const int64_t d : shape) {
    count *= d;
    dims += std::to_string(d) + ", ";
  }
  TT_ASSERT(count == static_cast<int64_t>(values.size()),
            "write_npy_f32: the shape does not match the values");
  if (shape.size() > 1) dims.resize(dims.size() - 2);  // (a, b); a 1-D shape keeps its comma: (a,)
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Magic, version 1.0, a 2-byte header length, then the header padded with spaces so the data starts at a
  // multiple of 64 bytes, ending in a newline.
  const size_t preamble = 10;
  header.append((64 - (preamble + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8);
  bytes += static_cast<char>(header.size() & 0xff);
  bytes += static_cast<char>(header.size() >> 8);
  bytes += header;
  static_assert(sizeof(float) == 4, "f32 is 4 bytes");
  bytes.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  write_file_atomically(path, bytes);
}

}  // namespace tt::app
