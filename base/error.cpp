#include "base/error.h"

#include <atomic>

namespace tt {

namespace {
std::atomic<int> g_rank{0};
}

int process_rank() {
  return g_rank.load();
}
void set_process_rank(int rank) {
  g_rank.store(rank);
}

void throw_call_error(const char* what, const char* call, const std::string& detail, const char* file,
                      int line) {
  throw Error(std::string(what) + " error in " + call + " at " + file + ":" + std::to_string(line) +
              " (rank " + std::to_string(process_rank()) + "): " + detail);
}

}  // namespace tt
