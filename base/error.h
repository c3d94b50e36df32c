// The exceptions every layer throws, the two check macros, and the process rank that error messages name.
//
// TT_CHECK is for what a user can get wrong: flags, files, data, the environment, or arguments to the
// public API (ops, Tensor, the communicators). It throws Error with the message as given, which the apps
// print as one line; say what is wrong in the user's terms.
// TT_ASSERT is for what tinytrain itself guarantees: a kernel's precondition that the dispatching op has
// established, the order of calls between two components, shapes that only library code builds. It
// throws InternalError, whose message says that this is a bug in tinytrain and where (file:line).
// When in doubt, use TT_CHECK. Both are always compiled in.
#pragma once

#include <exception>
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

// A failed TT_ASSERT: a bug in tinytrain, not in the user's input. what() reads
// "internal error: MESSAGE (core/ops_nn.cpp:123, rank 0; a bug in tinytrain, please report it)".
class InternalError : public Error {
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

[[noreturn]] void throw_internal_error(const std::string& message, const char* file, int line);

// The one line an app prints for an exception that ends it: "error: MESSAGE", or an InternalError's own
// message, which starts with "internal error:".
std::string error_line(const std::exception& e);

// Checks a condition about user input or API use; the message should say what is wrong.
#define TT_CHECK(cond, msg)                           \
  do {                                                \
    if (!(cond)) throw ::tt::Error(std::string(msg)); \
  } while (0)

// Checks an invariant that tinytrain's own code guarantees; the message names the function and what broke.
#define TT_ASSERT(cond, msg)                                                       \
  do {                                                                             \
    if (!(cond)) ::tt::throw_internal_error(std::string(msg), __FILE__, __LINE__); \
  } while (0)

}  // namespace tt
