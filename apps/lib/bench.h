// The timing protocol of the benchmarks: run warm-up iterations untimed, then time each phase of every
// measured iteration between device synchronisations, so phase times add up to the step time and nothing
// queued by one phase is billed to the next.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace tt::app {

struct Phase {
  std::string name;
  std::function<void()> run;
};

struct Summary {
  double mean = 0, std = 0, min = 0;
  int64_t count = 0;
};
Summary summarize(const std::vector<double>& samples);
// "mean ± std" with `decimals`, or the mean alone for a single sample (which has no spread to show).
std::string format_mean_std(const Summary& s, int decimals);

struct StepTimings {
  std::vector<std::string> phase_names;
  std::vector<std::vector<double>> phase_ms;  // [phase][measured iteration]
  std::vector<double> step_ms;                // [measured iteration], first phase start to last phase end
};

// Runs `warmup` + `steps` iterations of the phases in order; `sync` waits for the device (called before
// the first phase and after every phase); `on_phase_end(phase index)` lets the caller read memory peaks.
StepTimings time_phases(int64_t warmup, int64_t steps, const std::vector<Phase>& phases,
                        const std::function<void()>& sync,
                        const std::function<void(size_t)>& on_phase_end = nullptr);

// Line-buffers stdout, so that table rows reach a pipe as they are measured and a sweep cut short (a time
// limit, an abort) keeps the rows it finished. Call first thing in a benchmark's main.
void stream_rows_to_stdout();

// Markdown table helper: header, separator and rows of already formatted cells.
std::string markdown_table(const std::vector<std::string>& header,
                           const std::vector<std::vector<std::string>>& rows);

// A Markdown table on stdout written as it is measured: the header and separator at the first row, then each
// row as it comes, so that a sweep cut short shows on stdout every row its --json file has. `print` false
// (ranks other than 0): nothing is printed.
class StreamedTable {
 public:
  explicit StreamedTable(std::vector<std::string> header, bool print = true)
      : header_(std::move(header)), print_(print) {}
  void row(const std::vector<std::string>& cells);

 private:
  std::vector<std::string> header_;
  bool print_, started_ = false;
};

std::string format_fixed(double value, int digits);
// A size in MB as given, without rounding it to whole MB: 1000, 1.5, 0.01.
std::string format_mb(double mb);

}  // namespace tt::app
