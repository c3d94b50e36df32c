#include "apps/lib/memory_timeline.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "apps/lib/report.h"
#include "base/error.h"
#include "core/allocator.h"

namespace tt::app {

namespace {

// Just enough of Python's pickle format (protocol 2) for nested dicts, lists, strings and integers: what
// pytorch.org/memory_viz reads from a snapshot file. Python's own unpickler reads it too.
class PickleWriter {
 public:
  PickleWriter() : out_("\x80\x02") {}  // PROTO 2
  void begin_dict() { out_ += "}("; }   // EMPTY_DICT, MARK: the items follow as key, value, key, value ...
  void end_dict() { out_ += 'u'; }      // SETITEMS
  void begin_list() { out_ += "]("; }   // EMPTY_LIST, MARK
  void end_list() { out_ += 'e'; }      // APPENDS
  void text(const std::string& s) {
    out_ += 'X';  // BINUNICODE: 4-byte little-endian length, UTF-8 bytes
    put_le(static_cast<uint64_t>(s.size()), 4);
    out_ += s;
  }
  void integer(int64_t v) {
    if (v >= INT32_MIN && v <= INT32_MAX) {
      out_ += 'J';  // BININT: 4-byte little-endian two's complement
      put_le(static_cast<uint64_t>(v), 4);
    } else {
      out_ += '\x8a';  // LONG1: a length byte, then that many little-endian two's complement bytes
      out_ += '\x08';
      put_le(static_cast<uint64_t>(v), 8);
    }
  }
  void key(const char* name) { text(name); }
  std::string finish() { return out_ + '.'; }  // STOP

 private:
  void put_le(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_ += static_cast<char>((v >> (8 * i)) & 0xff);
  }
  std::string out_;
};

// One frame of a memory_viz "stack trace": the viewer prints it as filename:line:name.
void write_frames(PickleWriter& w, const std::string& filename, const std::string& name) {
  w.begin_list();
  w.begin_dict();
  w.key("filename");
  w.text(filename);
  w.key("line");
  w.integer(0);
  w.key("name");
  w.text(name);
  w.end_dict();
  w.end_list();
}

// A snapshot for pytorch.org/memory_viz's "Active Memory Timeline": the step's allocations and frees as the
// device's trace, and the memory already allocated when the step began (parameters, gradients, optimizer
// state...) as one block, since the events carry no history for it. Frees of blocks allocated before the
// step appear as such by themselves, so they are left out of that block.
std::string memory_viz_snapshot(const std::vector<MemoryEvent>& events,
                                const std::vector<std::string>& phase_of, Device device, double t0) {
  int64_t before = 0;
  if (!events.empty()) {
    const MemoryEvent& e = events.front();
    before = e.current_bytes - (e.is_alloc ? e.bytes : -e.bytes);
  }
  std::map<const void*, bool> allocated_here;
  for (const MemoryEvent& e : events) {
    if (e.is_alloc) {
      allocated_here[e.address] = true;
    } else if (!allocated_here.count(e.address)) {
      before -= e.bytes;  // a block from before the step, freed during it: the trace accounts for it
    } else {
      allocated_here.erase(e.address);
    }
  }
  const int device_index = device.is_cuda() ? device.index : 0;
  PickleWriter w;
  w.begin_dict();
  w.key("segments");
  w.begin_list();
  if (before > 0) {
    w.begin_dict();
    w.key("device");
    w.integer(device_index);
    w.key("address");
    w.integer(0);
    w.key("total_size");
    w.integer(before);
    w.key("stream");
    w.integer(0);
    w.key("blocks");
    w.begin_list();
    w.begin_dict();
    w.key("size");
    w.integer(before);
    w.key("requested_size");
    w.integer(before);
    w.key("state");
    w.text("active_allocated");
    w.key("frames");
    write_frames(w, "before the step", "parameters, gradients, optimizer state and other live tensors");
    w.end_dict();
    w.end_list();
    w.end_dict();
  }
  w.end_list();
  w.key("device_traces");
  w.begin_list();
  for (int d = 0; d < device_index; ++d) {
    w.begin_list();
    w.end_list();
  }
  w.begin_list();
  for (size_t i = 0; i < events.size(); ++i) {
    const MemoryEvent& e = events[i];
    w.begin_dict();
    w.key("action");
    w.text(e.is_alloc ? "alloc" : "free_completed");
    w.key("addr");
    w.integer(static_cast<int64_t>(reinterpret_cast<uintptr_t>(e.address)));
    w.key("size");
    w.integer(e.bytes);
    w.key("stream");
    w.integer(0);
    w.key("time_us");
    w.integer(static_cast<int64_t>(e.time_us - t0));
    w.key("frames");
    write_frames(w, phase_of[i], e.tag.empty() ? "(untagged)" : e.tag);
    w.end_dict();
  }
  w.end_list();
  w.end_list();
  w.end_dict();
  return w.finish();
}

const char* const kTimelineSuffixes[] = {".svg", ".jsonl", ".pickle"};

void write_file(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary);
  out << contents;
  out.close();
  TT_CHECK(out.good(), "--memory-timeline: cannot write " + path);
}

}  // namespace

void check_memory_timeline_writable(const std::string& path_prefix) {
  for (const char* suffix : kTimelineSuffixes) check_writable(path_prefix + suffix, "--memory-timeline file");
}

void record_memory_timeline(const std::string& path_prefix, Device device, const std::vector<Phase>& phases,
                            const std::function<void()>& sync) {
  std::vector<MemoryEvent> events;
  std::vector<std::pair<double, std::string>> phase_starts;
  sync();
  set_memory_recorder([&](const MemoryEvent& e) { events.push_back(e); });
  const double start_us = now_seconds() * 1e6;
  std::vector<size_t> phase_first_event;
  for (const Phase& p : phases) {
    phase_starts.emplace_back(now_seconds() * 1e6 - start_us, p.name);
    phase_first_event.push_back(events.size());
    MemoryTagGuard tag(p.name.c_str());
    p.run();
    sync();
  }
  const double end_us = now_seconds() * 1e6 - start_us;
  set_memory_recorder(nullptr);
  // Event times come from the allocator's own clock; rebase them on the first event.
  const double t0 = events.empty() ? 0 : events.front().time_us;
  {
    std::ostringstream json;
    for (const MemoryEvent& e : events) {
      json << "{\"t_us\": " << e.time_us - t0 << ", \"action\": \"" << (e.is_alloc ? "alloc" : "free")
           << "\", \"bytes\": " << e.bytes << ", \"address\": \"" << e.address
           << "\", \"active_bytes\": " << e.current_bytes << ", \"owner\": " << JsonlWriter::quote(e.tag)
           << "}\n";
    }
    write_file(path_prefix + ".jsonl", json.str());
  }
  {
    std::vector<std::string> phase_of(events.size());
    for (size_t p = 0; p < phases.size(); ++p) {
      const size_t end = p + 1 < phases.size() ? phase_first_event[p + 1] : events.size();
      for (size_t i = phase_first_event[p]; i < end; ++i) phase_of[i] = phases[p].name;
    }
    write_file(path_prefix + ".pickle", memory_viz_snapshot(events, phase_of, device, t0));
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
  // Enough decimals that the five labels differ (a tiny model's step spans a few MiB).
  const double tick_mib = (max_bytes - min_bytes) / 4.0 / (1 << 20);
  const int digits = tick_mib >= 10 ? 0 : tick_mib >= 1 ? 1 : tick_mib >= 0.1 ? 2 : 3;
  for (int i = 0; i <= 4; ++i) {
    const double b = min_bytes + (max_bytes - min_bytes) * i / 4.0;
    svg << "<line x1='" << left << "' x2='" << width - right << "' y1='" << y_of(b) << "' y2='" << y_of(b)
        << "' stroke='#ddd'/><text x='" << left - 4 << "' y='" << y_of(b) + 4 << "' text-anchor='end'>"
        << format_fixed(b / (1 << 20), digits) << " MiB</text>\n";
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
  write_file(path_prefix + ".svg", text);
  std::fprintf(stderr,
               "  memory timeline: %s.svg, %s.jsonl, %s.pickle (pytorch.org/memory_viz) (%zu events)\n",
               path_prefix.c_str(), path_prefix.c_str(), path_prefix.c_str(), events.size());
}

}  // namespace tt::app
