#include "apps/lib/bench.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "apps/lib/report.h"

namespace tt::app {

Summary summarize(const std::vector<double>& samples) {
  Summary s;
  s.count = static_cast<int64_t>(samples.size());
  if (samples.empty()) return s;
  double total = 0;
  for (double v : samples) total += v;
  s.mean = total / static_cast<double>(samples.size());
  double var = 0;
  for (double v : samples) var += (v - s.mean) * (v - s.mean);
  s.std = samples.size() > 1 ? std::sqrt(var / static_cast<double>(samples.size() - 1)) : 0.0;
  s.min = *std::min_element(samples.begin(), samples.end());
  return s;
}

std::string format_mean_std(const Summary& s, int decimals) {
  const std::string mean = format_fixed(s.mean, decimals);
  return s.count < 2 ? mean : mean + " ± " + format_fixed(s.std, decimals);
}

StepTimings time_phases(int64_t warmup, int64_t steps, const std::vector<Phase>& phases,
                        const std::function<void()>& sync, const std::function<void(size_t)>& on_phase_end) {
  StepTimings out;
  for (const Phase& p : phases) out.phase_names.push_back(p.name);
  out.phase_ms.resize(phases.size());
  for (int64_t it = 0; it < warmup + steps; ++it) {
    const bool measured = it >= warmup;
    sync();
    const double step_start = now_seconds();
    double phase_start = step_start;
    for (size_t p = 0; p < phases.size(); ++p) {
      phases[p].run();
      sync();
      const double phase_end = now_seconds();
      if (measured) {
        out.phase_ms[p].push_back((phase_end - phase_start) * 1e3);
        if (on_phase_end) on_phase_end(p);
      }
      phase_start = phase_end;
    }
    if (measured) out.step_ms.push_back((phase_start - step_start) * 1e3);
  }
  return out;
}

void stream_rows_to_stdout() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
}

namespace {
std::string markdown_line(const std::vector<std::string>& cells) {
  std::string line = "|";
  for (const std::string& c : cells) line += " " + c + " |";
  return line + "\n";
}

std::string markdown_header(const std::vector<std::string>& header) {
  std::string separator = "|";
  for (size_t i = 0; i < header.size(); ++i) separator += "---|";
  return markdown_line(header) + separator + "\n";
}
}  // namespace

std::string markdown_table(const std::vector<std::string>& header,
                           const std::vector<std::vector<std::string>>& rows) {
  std::string out = markdown_header(header);
  for (const auto& row : rows) out += markdown_line(row);
  return out;
}

void StreamedTable::row(const std::vector<std::string>& cells) {
  if (!print_) return;
  if (!started_) std::fputs(markdown_header(header_).c_str(), stdout);
  started_ = true;
  std::fputs(markdown_line(cells).c_str(), stdout);
  std::fflush(stdout);
}

std::string format_mb(double mb) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", mb);
  return buf;
}

std::string format_fixed(double value, int digits) {
  if (!std::isfinite(value)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, value);
  return buf;
}

}  // namespace tt::app
