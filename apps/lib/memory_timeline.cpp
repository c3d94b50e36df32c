#include "apps/lib/memory_timeline.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "apps/lib/report.h"
#include "core/allocator.h"

namespace tt::app {

void record_memory_timeline(const std::string& path_prefix, Device device, const std::vector<Phase>& phases,
                            const std::function<void()>& sync) {
  std::vector<MemoryEvent> events;
  std::vector<std::pair<double, std::string>> phase_starts;
  sync();
  set_memory_recorder([&](const MemoryEvent& e) { events.push_back(e); });
  const double start_us = now_seconds() * 1e6;
  for (const Phase& p : phases) {
    phase_starts.emplace_back(now_seconds() * 1e6 - start_us, p.name);
    MemoryTagGuard tag(p.name.c_str());
    p.run();
    sync();
  }
  const double end_us = now_seconds() * 1e6 - start_us;
  set_memory_recorder(nullptr);
  // Event times come from the allocator's own clock; rebase them on the first event.
  const double t0 = events.empty() ? 0 : events.front().time_us;
  {
    std::ofstream json(path_prefix + ".json");
    for (const MemoryEvent& e : events) {
      json << "{\"t_us\": " << e.time_us - t0 << ", \"action\": \"" << (e.is_alloc ? "alloc" : "free")
           << "\", \"bytes\": " << e.bytes << ", \"address\": \"" << e.address
           << "\", \"active_bytes\": " << e.current_bytes << ", \"owner\": " << JsonlWriter::quote(e.tag)
           << "}\n";
    }
  }
  // SVG: active bytes against event index (allocation order reads better than wall time, which is dominated
  // by a few long kernels), with the owner of the largest allocations labelled.
  const double width = 900, height = 420, left = 70, right = 20, top = 40, bottom = 50;
  int64_t max_bytes = 1, min_bytes = events.empty() ? 0 : events.front().current_bytes;
  for (const MemoryEvent& e : events) {
    max_bytes = std::max(max_bytes, e.current_bytes);
    min_bytes = std::min(min_bytes, e.current_bytes);
  }
  const double n = std::max<double>(1, static_cast<double>(events.size()));
  auto x_of = [&](double i) { return left + (width - left - right) * i / n; };
  auto y_of = [&](double b) {
    return top +
           (height - top - bottom) * (1.0 - (b - min_bytes) / std::max<double>(1, max_bytes - min_bytes));
  };
  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << width << "' height='" << height
      << "' font-family='sans-serif' font-size='11'>\n<rect width='100%' height='100%' fill='white'/>\n"
      << "<text x='" << width / 2
      << "' y='20' text-anchor='middle' font-size='14'>active memory during one step on " << device.str()
      << " (" << events.size() << " allocations and frees, " << format_fixed(end_us / 1e3, 1)
      << " ms)</text>\n";
  for (int i = 0; i <= 4; ++i) {
    const double b = min_bytes + (max_bytes - min_bytes) * i / 4.0;
    svg << "<line x1='" << left << "' x2='" << width - right << "' y1='" << y_of(b) << "' y2='" << y_of(b)
        << "' stroke='#ddd'/><text x='" << left - 4 << "' y='" << y_of(b) + 4 << "' text-anchor='end'>"
        << format_fixed(b / (1 << 20), 0) << " MiB</text>\n";
  }
  // Shade each phase and each owner change along the x axis.
  std::map<std::string, std::string> colors;
  const char* palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                           "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#393b79", "#ad494a",
                           "#637939", "#e7969c", "#6baed6", "#fd8d3c"};
  svg << "<polyline fill='none' stroke='#333' stroke-width='1.2' points='";
  for (size_t i = 0; i < events.size(); ++i)
    svg << x_of(static_cast<double>(i)) << "," << y_of(events[i].current_bytes) << " ";
  svg << "'/>\n";
  for (size_t i = 0; i < events.size(); ++i) {
    const std::string& owner = events[i].tag;
    if (!colors.count(owner)) colors[owner] = palette[colors.size() % 16];
    svg << "<rect x='" << x_of(static_cast<double>(i)) << "' y='" << height - bottom + 2 << "' width='"
        << std::max(1.0, (width - left - right) / n) << "' height='8' fill='" << colors[owner] << "'/>\n";
  }
  // Legend rows below the plot, wrapped to the width; the picture grows to hold them.
  double legend_x = left, legend_y = height - 24;
  for (const auto& [owner, color] : colors) {
    const std::string label = owner.empty() ? "(untagged)" : owner;
    const double item_width = 24 + 7.0 * static_cast<double>(label.size());
    if (legend_x + item_width > width - right) {
      legend_x = left;
      legend_y += 16;
    }
    svg << "<rect x='" << legend_x << "' y='" << legend_y << "' width='10' height='10' fill='" << color
        << "'/><text x='" << legend_x + 14 << "' y='" << legend_y + 9 << "'>" << label << "</text>\n";
    legend_x += item_width;
  }
  svg << "</svg>\n";
  // The height was written before the legend's extent was known.
  std::string text = svg.str();
  const std::string old_height = "height='" + format_fixed(height, 0) + "'";
  const size_t at = text.find(old_height);
  if (at != std::string::npos)
    text.replace(at, old_height.size(), "height='" + format_fixed(legend_y + 20, 0) + "'");
  std::ofstream(path_prefix + ".svg") << text;
  std::fprintf(stderr, "  memory timeline: %s.svg, %s.json (%zu events)\n", path_prefix.c_str(),
               path_prefix.c_str(), events.size());
}

}  // namespace tt::app
