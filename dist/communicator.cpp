#include "dist/communicator.h"

#include <cstdlib>
#include <vector>

#include "dist/backends.h"
#include "dist/collective_timeout.h"
#include "dist/mpi_check.h"
#include "dist/runtime.h"
#ifdef TT_WITH_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace tt::dist {

const char* reduce_op_name(ReduceOp op) {
  return op == ReduceOp::sum ? "sum" : "avg";
}

const char* all_reduce_transport_name(AllReduceTransport transport) {
  return transport == AllReduceTransport::library ? "library" : "copy-engine";
}

AllReduceTransport parse_all_reduce_transport(const std::string& text) {
  if (text == "library") return AllReduceTransport::library;
  if (text == "copy-engine") return AllReduceTransport::copy_engine;
  throw Error("unknown all-reduce transport '" + text + "' (expected library or copy-engine)");
}

void check_all_reduce_flag(const std::string& text) {
  TT_CHECK(text == "auto" || text == "library" || text == "copy-engine",
           "unknown all-reduce transport '" + text + "' (expected auto, library or copy-engine)");
}

std::string select_all_reduce_transport(Communicator& comm, const std::string& text,
                                        const DistRuntime& runtime, bool will_all_reduce) {
  check_all_reduce_flag(text);
  const CollectiveWait wait("all-reduce transport selection");
  if (text != "auto") {
    comm.set_all_reduce_transport(parse_all_reduce_transport(text));
    return "";
  }
  // A rank is a candidate when a DDP all-reduce will run, on CUDA, with 2 to kAutoCopyEngineMaxRanks ranks
  // all on one host, and peer-to-peer is not disabled for NCCL (people set NCCL_P2P_DISABLE=1 where it is
  // broken). Only when every rank is one (so that all ranks enter the same collectives) is each GPU asked
  // whether it can map every other's memory.
  int usable = 0;
#ifdef TT_WITH_CUDA
  const char* p2p_disable = std::getenv("NCCL_P2P_DISABLE");
  const bool p2p_disabled = p2p_disable != nullptr && std::string(p2p_disable) == "1";
  const int world = runtime.world_size();
  const int candidate = will_all_reduce && !p2p_disabled && comm.device().is_cuda() && world >= 2 &&
                        world <= kAutoCopyEngineMaxRanks && runtime.local_size() == world;
  int every = 0;
  TT_MPI_CHECK(MPI_Allreduce(&candidate, &every, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (every == 1) {
    const int mine = comm.device().index;
    std::vector<int> devices(static_cast<size_t>(world), -1);
    TT_MPI_CHECK(MPI_Allgather(&mine, 1, MPI_INT, devices.data(), 1, MPI_INT, MPI_COMM_WORLD));
    usable = 1;
    for (int p = 0; p < world; ++p) {
      if (p != runtime.rank() && !cuda::can_access_peer(mine, devices[p])) usable = 0;
    }
  }
#endif
  int all = 0;
  TT_MPI_CHECK(MPI_Allreduce(&usable, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (all != 1) return "";
  try {
    // Fails on every rank or on none (the transport agrees on each step), so all fall back together.
    comm.set_all_reduce_transport(AllReduceTransport::copy_engine);
  } catch (const Error& e) {
    return std::string("the copy-engine all-reduce is not available, using ") + comm.backend() + ": " +
           e.what();
  }
  return "";
}

void Communicator::set_all_reduce_transport(AllReduceTransport transport) {
  TT_CHECK(transport == AllReduceTransport::library,
           std::string(
               "the copy-engine all-reduce needs CUDA tensors and the NCCL backend; this communicator is ") +
               backend());
}

void Communicator::all_reduce(Tensor& tensor, ReduceOp op) {
  all_reduce_async(tensor, op)->wait();
}
void Communicator::broadcast(Tensor& tensor, int root) {
  broadcast_async(tensor, root)->wait();
}
void Communicator::reduce_scatter(const Tensor& input, Tensor& output, ReduceOp op) {
  reduce_scatter_async(input, output, op)->wait();
}
void Communicator::all_gather(const Tensor& input, Tensor& output) {
  all_gather_async(input, output)->wait();
}

void Communicator::check_tensor(const Tensor& t, const char* collective, bool reduces) const {
  const std::string where = std::string(backend()) + " " + collective + ": ";
  TT_ASSERT(t.defined(), where + "undefined tensor");
  TT_ASSERT(t.is_contiguous(), where + "needs a contiguous tensor, got " + t.describe());
  TT_ASSERT(t.device() == device_,
            where + "tensor " + t.describe() + " is not on the communicator's device " + device_.str());
  TT_CHECK(supports(t.dtype(), reduces), where + "dtype " + dtype_name(t.dtype()) + " is not supported" +
                                             (reduces ? " for reductions" : ""));
}

void Communicator::check_root(int root) const {
  TT_ASSERT(root >= 0 && root < world_size_, std::string(backend()) + " broadcast: root " +
                                                 std::to_string(root) + " outside a world of " +
                                                 std::to_string(world_size_));
}

bool Communicator::is_rank_block(const Tensor& whole, const Tensor& part) const {
  return whole.storage() == part.storage() && whole.dtype() == part.dtype() &&
         part.offset() == whole.offset() + static_cast<int64_t>(rank_) * part.numel();
}

void Communicator::check_widened(const Tensor& tensor, const Tensor& widened) const {
  check_tensor(widened, "all_reduce_widen", false);
  TT_ASSERT(widened.shape() == tensor.shape(), std::string(backend()) +
                                                   " all_reduce_widen: " + widened.describe() +
                                                   " does not have the shape of " + tensor.describe());
}

void Communicator::check_gather_blocks(const Tensor& buffer, int64_t offset, int64_t count,
                                       int64_t stride) const {
  check_tensor(buffer, "all_gather_blocks", false);
  const std::string where = std::string(backend()) + " all_gather_blocks: ";
  TT_ASSERT(offset >= 0 && count >= 0 && stride >= count,
            where + "needs offset >= 0 and stride >= count >= 0 (offset " + std::to_string(offset) +
                ", count " + std::to_string(count) + ", stride " + std::to_string(stride) + ")");
  const int64_t end = offset + static_cast<int64_t>(world_size_ - 1) * stride + count;
  TT_ASSERT(end <= buffer.numel(), where + "the last block ends at element " + std::to_string(end) +
                                       ", past the buffer's " + std::to_string(buffer.numel()));
}

std::unique_ptr<Communicator> make_communicator(Device device, DistRuntime& runtime) {
  if (device.is_cpu()) return make_mpi_communicator(runtime);
#ifdef TT_WITH_CUDA
  return make_nccl_communicator(device, runtime);
#else
  throw Error("make_communicator: " + device.str() + " needs a build with CUDA (NCCL)");
#endif
}

}  // namespace tt::dist
