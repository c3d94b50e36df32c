// The MPI backend: collectives on CPU tensors, in place, on a private duplicate of MPI_COMM_WORLD so they
// never match messages of other MPI users in the process. avg is a sum followed by a division by the world
// size on every rank (MPI has no average), which keeps the result bit-identical across ranks.
#include <algorithm>
#include <chrono>
#include <climits>
#include <functional>
#include <memory>
#include <vector>

#include "dist/backends.h"
#include "dist/collective_timeout.h"
#include "dist/mpi_check.h"
#include "dist/runtime.h"
#include "kernels/cpu/cpu_kernels.h"

namespace tt::dist {

namespace {

// MPI counts are ints; larger tensors are reduced in chunks (elementwise collectives only).
constexpr int64_t kMaxChunkElements = int64_t{1} << 30;

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::i32:
      return MPI_INT32_T;
    case DType::bf16:
      return MPI_UINT16_T;  // added by a user-defined operation (bf16_sum)
  }
  throw Error("no MPI type for this dtype");
}

// bf16 addition for MPI reductions: each pairwise sum is computed in f32 and rounded to bf16, as NCCL does.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const bf16*>(in);
  auto* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = bf16(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}

void divide_by(const Tensor& t, int divisor) {
  const int64_t n = t.numel();
  if (t.dtype() == DType::bf16) {
    bf16* p = t.data<bf16>();
    const float d = static_cast<float>(divisor);
    for (int64_t i = 0; i < n; ++i) p[i] = bf16(static_cast<float>(p[i]) / d);
  } else if (t.dtype() == DType::f32) {
    float* p = t.data<float>();
    const float d = static_cast<float>(divisor);
    for (int64_t i = 0; i < n; ++i) p[i] /= d;
  } else if (t.dtype() == DType::f64) {
    double* p = t.data<double>();
    const double d = divisor;
    for (int64_t i = 0; i < n; ++i) p[i] /= d;
  } else {
    throw Error(std::string("mpi: avg is not defined for ") + dtype_name(t.dtype()));
  }
}

bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.storage() != b.storage()) return false;
  const int64_t a_begin = a.offset() * static_cast<int64_t>(dtype_size(a.dtype()));
  const int64_t b_begin = b.offset() * static_cast<int64_t>(dtype_size(b.dtype()));
  return a_begin < b_begin + static_cast<int64_t>(b.nbytes()) &&
         b_begin < a_begin + static_cast<int64_t>(a.nbytes());
}

int checked_count(int64_t n, const char* collective) {
  TT_CHECK(n <= INT_MAX, std::string("mpi ") + collective + ": " + std::to_string(n) +
                             " elements per rank exceed MPI's int count");
  return static_cast<int>(n);
}

class MpiWork : public Work {
 public:
  MpiWork(const char* what, std::vector<MPI_Request> requests, std::function<void()> on_complete)
      : what_(what), requests_(std::move(requests)), on_complete_(std::move(on_complete)) {}
  ~MpiWork() override {
    if (done_) return;
    // The buffers may be freed right after this; an MPI failure here can only end the job.
    try {
      wait();
    } catch (const std::exception& e) {
      abort_job(e.what());
    }
  }
  void wait() override {
    if (done_) return;
    {
      const CollectiveWait wait(what_);
      TT_MPI_CHECK(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE));
    }
    done_ = true;  // only once the requests really completed: a failed wait must not look finished
    complete();
  }
  bool poll() override {
    if (done_) return true;
    int finished = 0;
    TT_MPI_CHECK(
        MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &finished, MPI_STATUSES_IGNORE));
    if (finished) {
      done_ = true;
      complete();
    }
    return done_;
  }

 private:
  void complete() {
    if (on_complete_) on_complete_();
    on_complete_ = nullptr;
  }

  const char* what_;
  std::vector<MPI_Request> requests_;
  std::function<void()> on_complete_;  // holds the tensors until the collective is done
  bool done_ = false;
};

class HostTimer : public StreamTimer {
 public:
  HostTimer() : start_(std::chrono::steady_clock::now()), stop_(start_) {}
  void stop() override { stop_ = std::chrono::steady_clock::now(); }
  double elapsed_ms() override { return std::chrono::duration<double, std::milli>(stop_ - start_).count(); }

 private:
  std::chrono::steady_clock::time_point start_, stop_;
};

class MpiCommunicator : public Communicator {
 public:
  explicit MpiCommunicator(DistRuntime& runtime)
      : Communicator(Device::cpu(), runtime.rank(), runtime.world_size()) {
    {
      const CollectiveWait wait("communicator set-up");
      TT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    }
    TT_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    TT_MPI_CHECK(MPI_Op_create(&bf16_sum, /*commute=*/1, &bf16_sum_));
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      MPI_Op_free(&bf16_sum_);
      MPI_Comm_free(&comm_);
    }
  }
  const char* backend() const override { return "mpi"; }

  void all_reduce(Tensor& t, ReduceOp op) override {
    check_reduce(t, "all_reduce", op);
    const CollectiveWait wait("all_reduce");
    for (int64_t begin = 0; begin < t.numel(); begin += kMaxChunkElements) {
      const int count = static_cast<int>(std::min(kMaxChunkElements, t.numel() - begin));
      TT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, element(t, begin), count, mpi_type(t.dtype()),
                                 sum_op(t.dtype()), comm_));
    }
    if (op == ReduceOp::avg) divide_by(t, world_size());
  }

  std::unique_ptr<Work> all_reduce_async(Tensor& t, ReduceOp op) override {
    return start_all_reduce(t, op, nullptr);
  }

  std::unique_ptr<Work> all_reduce_widen_async(Tensor& t, ReduceOp op, Tensor& widened) override {
    check_widened(t, widened);
    return start_all_reduce(t, op, [t, widened] {
      cpu::cast(t.raw_data(), t.dtype(), widened.raw_data(), widened.dtype(), t.numel());
    });
  }

  void broadcast(Tensor& t, int root) override {
    check_tensor(t, "broadcast", false);
    check_root(root);
    const CollectiveWait wait("broadcast");
    for (int64_t begin = 0; begin < t.numel(); begin += kMaxChunkElements) {
      const int count = static_cast<int>(std::min(kMaxChunkElements, t.numel() - begin));
      TT_MPI_CHECK(MPI_Bcast(element(t, begin), count, mpi_type(t.dtype()), root, comm_));
    }
  }

  std::unique_ptr<Work> broadcast_async(Tensor& t, int root) override {
    check_tensor(t, "broadcast", false);
    check_root(root);
    std::vector<MPI_Request> requests;
    for (int64_t begin = 0; begin < t.numel(); begin += kMaxChunkElements) {
      const int count = static_cast<int>(std::min(kMaxChunkElements, t.numel() - begin));
      requests.push_back(MPI_REQUEST_NULL);
      TT_MPI_CHECK(MPI_Ibcast(element(t, begin), count, mpi_type(t.dtype()), root, comm_, &requests.back()));
    }
    return std::make_unique<MpiWork>("broadcast", std::move(requests), [t] {});
  }

  std::unique_ptr<Work> reduce_scatter_async(const Tensor& input, Tensor& output, ReduceOp op) override {
    check_reduce(input, "reduce_scatter", op);
    check_reduce(output, "reduce_scatter", op);
    check_blocks(input, output, "reduce_scatter");
    const int count = checked_count(output.numel(), "reduce_scatter");
    // MPI forbids aliased send and receive buffers, and its in-place form puts the result at the start of
    // the input rather than in this rank's block: receive into a scratch tensor instead.
    const bool in_place = overlaps(input, output);
    TT_ASSERT(!in_place || is_rank_block(input, output),
              "mpi reduce_scatter: output overlaps input but is not this rank's block of it");
    Tensor received = in_place ? Tensor::empty(output.shape(), output.dtype()) : output;
    std::vector<MPI_Request> requests(1, MPI_REQUEST_NULL);
    TT_MPI_CHECK(MPI_Ireduce_scatter_block(input.raw_data(), received.raw_data(), count,
                                           mpi_type(input.dtype()), sum_op(input.dtype()), comm_,
                                           &requests[0]));
    const int world = world_size();
    return std::make_unique<MpiWork>("reduce_scatter", std::move(requests),
                                     [input, output, received, in_place, op, world]() mutable {
                                       if (in_place) output.copy_(received);
                                       if (op == ReduceOp::avg) divide_by(output, world);
                                     });
  }

  std::unique_ptr<Work> all_gather_async(const Tensor& input, Tensor& output) override {
    check_tensor(input, "all_gather", false);
    check_tensor(output, "all_gather", false);
    check_blocks(output, input, "all_gather");
    const int count = checked_count(input.numel(), "all_gather");
    const bool in_place = overlaps(input, output);
    TT_ASSERT(!in_place || is_rank_block(output, input),
              "mpi all_gather: input overlaps output but is not this rank's block of it");
    const MPI_Datatype type = mpi_type(input.dtype());
    std::vector<MPI_Request> requests(1, MPI_REQUEST_NULL);
    if (in_place) {
      TT_MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, output.raw_data(), count, type, comm_,
                                  &requests[0]));
    } else {
      TT_MPI_CHECK(
          MPI_Iallgather(input.raw_data(), count, type, output.raw_data(), count, type, comm_, &requests[0]));
    }
    return std::make_unique<MpiWork>("all_gather", std::move(requests), [input, output] {});
  }

  std::unique_ptr<Work> all_gather_blocks_async(Tensor& buffer, int64_t offset, int64_t count,
                                                int64_t stride) override {
    check_gather_blocks(buffer, offset, count, stride);
    const int n = checked_count(count, "all_gather_blocks");
    // MPI_Allgatherv places each rank's block at its own displacement (in elements of the type).
    std::vector<int> counts(static_cast<size_t>(world_size()), n), displacements;
    for (int r = 0; r < world_size(); ++r)
      displacements.push_back(checked_count(offset + static_cast<int64_t>(r) * stride, "all_gather_blocks"));
    std::vector<MPI_Request> requests(1, MPI_REQUEST_NULL);
    TT_MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buffer.raw_data(), counts.data(),
                                 displacements.data(), mpi_type(buffer.dtype()), comm_, &requests[0]));
    // The count and displacement arrays must live until the collective completes.
    auto arrays = std::make_shared<std::pair<std::vector<int>, std::vector<int>>>(std::move(counts),
                                                                                  std::move(displacements));
    return std::make_unique<MpiWork>("all_gather_blocks", std::move(requests), [buffer, arrays] {});
  }

  void barrier() override {
    const CollectiveWait wait("barrier");
    TT_MPI_CHECK(MPI_Barrier(comm_));
  }
  void synchronize() override {}  // CPU collectives are complete when their call or wait() returns
  std::unique_ptr<StreamTimer> start_timer() override { return std::make_unique<HostTimer>(); }

 protected:
  bool supports(DType dtype, bool reduces) const override {
    return dtype == DType::f32 || dtype == DType::f64 || dtype == DType::i32 || dtype == DType::bf16;
  }

 private:
  MPI_Op sum_op(DType dtype) const { return dtype == DType::bf16 ? bf16_sum_ : MPI_SUM; }

  // A non-blocking all-reduce; on completion the average's division, then `then` (when set).
  std::unique_ptr<Work> start_all_reduce(Tensor& t, ReduceOp op, std::function<void()> then) {
    check_reduce(t, "all_reduce", op);
    std::vector<MPI_Request> requests;
    for (int64_t begin = 0; begin < t.numel(); begin += kMaxChunkElements) {
      const int count = static_cast<int>(std::min(kMaxChunkElements, t.numel() - begin));
      requests.push_back(MPI_REQUEST_NULL);
      TT_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, element(t, begin), count, mpi_type(t.dtype()),
                                  sum_op(t.dtype()), comm_, &requests.back()));
    }
    const int world = world_size();
    return std::make_unique<MpiWork>("all_reduce", std::move(requests),
                                     [t, op, world, then = std::move(then)] {
                                       if (op == ReduceOp::avg) divide_by(t, world);
                                       if (then) then();
                                     });
  }

  void check_reduce(const Tensor& t, const char* collective, ReduceOp op) const {
    check_tensor(t, collective, true);
    TT_ASSERT(op == ReduceOp::sum || t.dtype() != DType::i32,
              std::string("mpi ") + collective + ": avg needs a floating-point tensor");
  }
  // `whole` holds world_size blocks the size of `part`.
  void check_blocks(const Tensor& whole, const Tensor& part, const char* collective) const {
    TT_ASSERT(whole.dtype() == part.dtype(),
              std::string("mpi ") + collective + ": input and output dtypes differ");
    TT_ASSERT(whole.numel() == part.numel() * world_size(),
              std::string("mpi ") + collective + ": " + whole.describe() + " is not " +
                  std::to_string(world_size()) + " blocks of " + part.describe());
  }
  static void* element(const Tensor& t, int64_t index) {
    return static_cast<char*>(t.raw_data()) + index * static_cast<int64_t>(dtype_size(t.dtype()));
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Op bf16_sum_ = MPI_OP_NULL;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(DistRuntime& runtime) {
  return std::make_unique<MpiCommunicator>(runtime);
}

}  // namespace tt::dist
