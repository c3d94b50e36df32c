#include "base/error.h"

#include <atomic>
#include <filesystem>

namespace tt {

namespace {
std::atomic<int> g_rank{0};

// __FILE__ relative to the repository ("core/ops_nn.cpp"), as the sources name each other.
std::string source_path(const char* file) {
  const std::string path(file);
#ifdef TT_SOURCE_ROOT
  const std::string root(TT_SOURCE_ROOT);
  if (path.compare(0, root.size(), root) == 0) return path.substr(root.size());
#endif
  return path;
}
}  // namespace

int process_rank() {
  return g_rank.load();
}
void set_process_rank(int rank) {
  g_rank.store(rank);
}

void throw_call_error(const char* what, const char* call, const std::string& detail, const char* file,
                      int line) {
  throw Error(std::string(what) + " error in " + call + " at " + source_path(file) + ":" +
              std::to_string(line) + " (rank " + std::to_string(process_rank()) + "): " + detail);
}

void throw_internal_error(const std::string& message, const char* file, int line) {
  throw InternalError("internal error: " + message + " (" + source_path(file) + ":" + std::to_string(line) +
                      ", rank " + std::to_string(process_rank()) + "; a bug in tinytrain, please report it)");
}

std::string error_line(const std::exception& e) {
  if (dynamic_cast<const InternalError*>(&e) != nullptr) return e.what();
  // The standard library's "filesystem error: cannot create directories: Permission denied [/x]" as
  // "cannot create directories /x: Permission denied".
  if (const auto* fs_error = dynamic_cast<const std::filesystem::filesystem_error*>(&e)) {
    const std::string what = fs_error->what(), prefix = "filesystem error: ";
    const std::string reason = fs_error->code().message();
    const size_t end = what.find(": " + reason);
    if (what.rfind(prefix, 0) == 0 && end != std::string::npos && !fs_error->path1().empty()) {
      return "error: " + what.substr(prefix.size(), end - prefix.size()) + " " + fs_error->path1().string() +
             ": " + reason;
    }
  }
  return std::string("error: ") + e.what();
}

}  // namespace tt
