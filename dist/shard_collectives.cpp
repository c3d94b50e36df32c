#include "dist/shard_collectives.h"

namespace tt::dist {

namespace {

class PendingWork : public optim::ShardCollectives::Pending {
 public:
  explicit PendingWork(std::unique_ptr<Work> work) : work_(std::move(work)) {}
  void wait() override { work_->wait(); }

 private:
  std::unique_ptr<Work> work_;
};

class Done : public optim::ShardCollectives::Pending {
 public:
  void wait() override {}
};

class CommunicatorCollectives : public optim::ShardCollectives {
 public:
  explicit CommunicatorCollectives(Communicator& comm) : comm_(comm) {}
  int rank() const override { return comm_.rank(); }
  int world_size() const override { return comm_.world_size(); }
  void reduce_scatter_avg(const Tensor& input, Tensor& output) override {
    comm_.reduce_scatter(input, output, ReduceOp::avg);
  }
  void all_gather(const Tensor& input, Tensor& output) override { comm_.all_gather(input, output); }
  void all_reduce_sum(Tensor& tensor) override { comm_.all_reduce(tensor, ReduceOp::sum); }
  std::unique_ptr<Pending> reduce_scatter_avg_async(const Tensor& input, Tensor& output) override {
    return std::make_unique<PendingWork>(comm_.reduce_scatter_async(input, output, ReduceOp::avg));
  }
  std::unique_ptr<Pending> all_gather_async(const Tensor& input, Tensor& output) override {
    return std::make_unique<PendingWork>(comm_.all_gather_async(input, output));
  }
  std::unique_ptr<Pending> all_gather_blocks_async(Tensor& buffer, int64_t offset, int64_t count,
                                                   int64_t stride) override {
    return std::make_unique<PendingWork>(comm_.all_gather_blocks_async(buffer, offset, count, stride));
  }

 private:
  Communicator& comm_;
};

class SingleProcess : public optim::ShardCollectives {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  void reduce_scatter_avg(const Tensor& input, Tensor& output) override {
    output.copy_(input.view(output.shape()));
  }
  void all_gather(const Tensor& input, Tensor& output) override { output.copy_(input.view(output.shape())); }
  void all_reduce_sum(Tensor&) override {}
  std::unique_ptr<Pending> reduce_scatter_avg_async(const Tensor& input, Tensor& output) override {
    reduce_scatter_avg(input, output);
    return std::make_unique<Done>();
  }
  std::unique_ptr<Pending> all_gather_async(const Tensor& input, Tensor& output) override {
    all_gather(input, output);
    return std::make_unique<Done>();
  }
  std::unique_ptr<Pending> all_gather_blocks_async(Tensor&, int64_t, int64_t, int64_t) override {
    return std::make_unique<Done>();
  }
};

}  // namespace

std::unique_ptr<optim::ShardCollectives> shard_collectives(Communicator& comm) {
  return std::make_unique<CommunicatorCollectives>(comm);
}

std::unique_ptr<optim::ShardCollectives> single_process_collectives() {
  return std::make_unique<SingleProcess>();
}

}  // namespace tt::dist
