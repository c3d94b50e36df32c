// The communicator backends (internal to dist/); make_communicator picks one by device.
#pragma once

#include <memory>

#include "dist/communicator.h"

namespace tt::dist {

std::unique_ptr<Communicator> make_mpi_communicator(DistRuntime& runtime);
#ifdef TT_WITH_CUDA
std::unique_ptr<Communicator> make_nccl_communicator(Device device, DistRuntime& runtime);
#endif

}  // namespace tt::dist
