// Checking MPI calls: DistRuntime and the communicators switch to MPI_ERRORS_RETURN, so a failed call comes
// back here and becomes a tt::Error naming the call, file:line and rank, like every other failure.
#pragma once

#include <mpi.h>

#include "base/error.h"

namespace tt::dist {

[[noreturn]] void throw_mpi_error(int code, const char* call, const char* file, int line);

}  // namespace tt::dist

#define TT_MPI_CHECK(call)                                                                             \
  do {                                                                                                 \
    const int tt_mpi_rc_ = (call);                                                                     \
    if (tt_mpi_rc_ != MPI_SUCCESS) ::tt::dist::throw_mpi_error(tt_mpi_rc_, #call, __FILE__, __LINE__); \
  } while (0)
