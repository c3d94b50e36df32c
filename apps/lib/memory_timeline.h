// --memory-timeline: records every allocation and free of one training step and draws "active memory over
// time" (SVG), with the raw events as JSON lines (time, bytes, address, owner) for other tools, and as a
// snapshot that pytorch.org/memory_viz opens (PREFIX.pickle: its "Active Memory Timeline" view).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "apps/lib/bench.h"
#include "core/device.h"

namespace tt::app {

// Throws tt::Error naming the first of PREFIX.svg, .jsonl, .pickle that cannot be opened for writing (checked
// before a run, so a bad path fails at once instead of after the measurements; nothing is created or
// changed).
void check_memory_timeline_writable(const std::string& path_prefix);

// Throws tt::Error when a file cannot be written.
void record_memory_timeline(const std::string& path_prefix, Device device, const std::vector<Phase>& phases,
                            const std::function<void()>& sync);

}  // namespace tt::app
