// The exceptions every layer throws, the check macro, and the process rank that error messages name.
#pragma once

#include <stdexcept>
#include <string>

namespace tt {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Raised when a device allocation cannot be satisfied even after emptying the cache; benchmarks turn it
// into an "OOM" row instead of crashing.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

// Rank of this process, set by the distributed runtime (0 until then); error messages name it.
int process_rank();
void set_process_rank(int rank);

// Throws Error for a failed library call (CUDA, cuBLASLt, NCCL, MPI, HDF5), naming the call, file:line and
// the rank.
[[noreturn]] void throw_call_error(const char* what, const char* call, const std::string& detail,
                                   const char* file, int line);

// Checks a plain condition about user input or API use; the message should say what is wrong.
#define TT_CHECK(cond, msg)                           \
  do {                                                \
    if (!(cond)) throw ::tt::Error(std::string(msg)); \
  } while (0)

}  // namespace tt
