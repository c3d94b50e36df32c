#include "apps/lib/train_step.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "apps/lib/stop_signal.h"
#include "core/allocator.h"
#include "core/autograd.h"
#include "core/cuda_context.h"
#include "core/ops.h"
#include "dist/shard_collectives.h"

namespace tt::app {

GraphUse parse_graph_use(const std::string& text) {
  if (text == "auto") return GraphUse::automatic;
  if (text == "on") return GraphUse::on;
  if (text == "off") return GraphUse::off;
  throw Error("--cuda-graph takes auto, on or off, got '" + text + "'");
}

TrainStep::TrainStep(nn::TransformerLM& model, nn::FlatParameters& params, Device device,
                     dist::DistRuntime* runtime, const TrainStepOptions& options)
    : model_(model), params_(params), device_(device), options_(options) {
  world_ = runtime ? runtime->world_size() : 1;
  dist::check_all_reduce_flag(options.all_reduce);  // before any rank starts communicating
  if (world_ > 1) {
    comm_ = dist::make_communicator(device, *runtime);
    // ZeRO's reduce-scatter has nothing for the copy engine to carry.
    const std::string note = dist::select_all_reduce_transport(*comm_, options.all_reduce, *runtime,
                                                               ddp_averages_gradients(options));
    if (runtime->rank() == 0 && !note.empty()) std::fprintf(stderr, "note: %s\n", note.c_str());
    shared_read_ =
        SharedRead{runtime->rank(), world_, [this](Tensor& t, int root) { comm_->broadcast(t, root); }};
  }
  if (options.zero >= 1) {
    collectives_ = comm_ ? dist::shard_collectives(*comm_) : dist::single_process_collectives();
    if (comm_) comm_->broadcast(params.flat_params(), 0);
  }
  if (options.zero == 1) {
    sharded_ = std::make_unique<optim::ShardedOptimizer>(params, *collectives_, options.adamw);
    if (options.zero1_gather_chunk_mb > 0) {
      const double elements = options.zero1_gather_chunk_mb * 1024.0 * 1024.0 /
                              static_cast<double>(dtype_size(params.flat_params().dtype()));
      sharded_->set_gather_chunk(std::max<int64_t>(1, static_cast<int64_t>(elements)));
    }
    optimizer_state_ = app::optimizer_state(*sharded_);
  } else if (options.zero >= 2) {
    zero_ = std::make_unique<optim::ZeroOptimizer>(params, *collectives_, model.unit_first_parameters(),
                                                   options.zero, options.adamw,
                                                   model.config().precision == nn::Precision::bf16);
    model.set_parameter_units(zero_.get());
    // The full buffers the shards were cut from go back to the driver, for NCCL's and cuBLAS's own
    // allocations.
    empty_cache(device);
    optimizer_state_ = app::optimizer_state(*zero_);
  } else {
    adamw_ = std::make_unique<optim::AdamW>(std::vector<Tensor>{params.flat_params()}, options.adamw);
    optimizer_state_ = app::optimizer_state(*adamw_);
    if (device.is_cuda()) {
      overlap_ = std::make_unique<optim::OverlappedUpdate>(*adamw_, params, model.unit_first_parameters());
      model.set_parameter_units(overlap_.get());
    }
  }
  upload_ = std::make_unique<PinnedUpload>(device);
  if (device.is_cuda()) clock_ = std::make_unique<DeviceClock>(device);
  if (comm_ && ddp_averages_gradients(options)) {
    ddp_ = std::make_unique<dist::DataParallel>(params, *comm_, options.ddp, options.bucket_mb,
                                                options.grad_comm_bf16);
  }
  // What a CUDA graph captures (see TrainStepOptions::cuda_graph). The copy-engine all-reduce cannot be
  // replayed (its signals carry sequence numbers fixed when issued): a step using it runs kernel by kernel.
  const bool ddp_by_copy_engine =
      ddp_ && comm_->all_reduce_transport() == dist::AllReduceTransport::copy_engine;
  // Why the step cannot be captured here (none: it can). The update beside the next forward needs the
  // clipping factor on the device (bf16 gradients).
  std::string cannot;
  const auto add = [&](const std::string& reason) { cannot += (cannot.empty() ? "" : "; ") + reason; };
  if (!device.is_cuda()) add("CUDA graphs need a CUDA device");
  if (overlap_ && params.grad_dtype() != DType::bf16)
    add("with f32 gradients the step clips them on the host (bf16 gradients, with --precision bf16, are "
        "clipped on the GPU)");
  if (ddp_by_copy_engine) add("the copy-engine all-reduce cannot be replayed (--all-reduce library can)");
  const bool wanted =
      options.cuda_graph == GraphUse::on || (options.cuda_graph == GraphUse::automatic && options.zero == 0);
  graph_step_ = wanted && cannot.empty();
  if (options.cuda_graph == GraphUse::on) graph_declined_ = cannot;
}

TrainStep::~TrainStep() {
  if (zero_ || overlap_) model_.set_parameter_units(nullptr);
}

StateBytes TrainStep::state_bytes() const {
  StateBytes b;
  if (zero_) {
    b.parameters = zero_->parameter_bytes();
    b.gradients = zero_->gradient_bytes();
    b.optimizer = zero_->state_bytes();
    b.peak_gradient_staging = zero_->peak_staging_bytes();
    return b;
  }
  b.parameters = static_cast<int64_t>(params_.flat_params().nbytes() +
                                      (params_.bf16_mirror().defined() ? params_.bf16_mirror().nbytes() : 0));
  b.gradients = static_cast<int64_t>(params_.flat_grads().nbytes());
  b.optimizer = sharded_
                    ? sharded_->state_bytes()
                    : static_cast<int64_t>(adamw_->exp_avg()[0].nbytes() + adamw_->exp_avg_sq()[0].nbytes());
  return b;
}

double TrainStep::communication_wait_ms() {
  return ddp_ ? ddp_->communication_wait_ms() : 0.0;
}

void TrainStep::settle() {
  if (overlap_) overlap_->settle();
  if (zero_) zero_->settle();
}

std::string TrainStep::describe() const {
  if (!comm_) return "";
  const std::string transport = comm_->all_reduce_transport() == dist::AllReduceTransport::library
                                    ? comm_->backend()
                                    : dist::all_reduce_transport_name(comm_->all_reduce_transport());
  const char* zero[] = {"", "ZeRO-1 (sharded AdamW state)", "ZeRO-2 (sharded AdamW state and gradients)",
                        "ZeRO-3 (sharded AdamW state, gradients and parameters)"};
  const std::string strategy = options_.zero > 0
                                   ? std::string(zero[options_.zero])
                                   : std::string("DDP ") + dist::ddp_strategy_name(options_.ddp);
  return strategy + (ddp_averages_gradients(options_) ? ", all-reduce by " : ", collectives by ") +
         transport + (options_.grad_comm_bf16 ? " (f32 gradients sent in bf16)" : "");
}

std::string TrainStep::update_path() const {
  char clip_text[64];
  std::snprintf(clip_text, sizeof(clip_text), "exact global-norm clipping at %g", options_.clip);
  const std::string clip = options_.clip > 0 ? clip_text : "no clipping";
  if (zero_ || sharded_) {
    const std::string in_bf16 =
        model_.config().precision == nn::Precision::bf16 ? " (matmul weights in bf16)" : "";
    const std::string gathers =
        options_.zero == 2   ? "; updated weights gathered as the next forward needs them" + in_bf16
        : options_.zero == 3 ? "; weights gathered per unit before its forward and backward" + in_bf16
                             : "";
    return "AdamW after backward, sharded (ZeRO-" + std::to_string(options_.zero) + "), " + clip + gathers +
           (graph_step_ ? "; from step 2 on forward and backward are one CUDA graph" : "");
  }
  if (overlap_) {
    return "AdamW after backward (" + clip + "), beside the next step's forward" +
           (graph_step_ ? "; from step 2 on the whole step is one CUDA graph" : "");
  }
  return "AdamW after backward, " + clip;
}

void TrainStep::begin() {
  started_ = true;
  // bf16 with one AdamW over the flat buffer: the matmuls read a bf16 copy of the weights that AdamW writes
  // with each update, instead of casting every weight in every forward. From here on only that AdamW changes
  // the parameters (loading and the DDP broadcast are done), so the copy stays current.
  if (model_.config().precision == nn::Precision::bf16 && adamw_) {
    params_.enable_bf16_mirror();
    adamw_->write_bf16_mirror(&params_);
  }
  // bf16 gradients on the GPU are clipped by AdamW itself: the norm and the factor are computed on the
  // device and the update scales each gradient in f32 as it reads it (no second rounding, no extra pass).
  if (params_.grad_dtype() == DType::bf16 && device_.is_cuda() && adamw_) {
    clip_norm_ = Tensor::zeros({1}, DType::f32, device_);
    clip_factor_ = Tensor::zeros({1}, DType::f32, device_);
    adamw_->set_grad_scale(clip_factor_);
  }
}

namespace {
[[noreturn]] void diverged(const char* what, double value, int64_t step) {
  throw RunEnded(kExitDiverged, std::string(what) + " is " + (std::isnan(value) ? "NaN" : "infinite") +
                                    " at step " + std::to_string(step) +
                                    "; stopped before the update, the parameters are those of step " +
                                    std::to_string(step - 1));
}
}  // namespace

std::vector<Tensor> TrainStep::forward_backward(
    const std::function<std::pair<Tensor, Tensor>(int64_t)>& micro_batch) {
  const int64_t accum = options_.grad_accum;
  std::vector<Tensor> losses;
  for (int64_t micro = 0; micro < accum; ++micro) {
    const auto [x, y] = micro_batch(micro);
    const Tensor loss = model_.loss(x, y);
    if (overlap_ && micro == 0) {
      overlap_->settle();  // the last update has read the gradients: they can be cleared
      params_.zero_grad();
    }
    if (ddp_) {
      ddp_->set_sync(micro == accum - 1);  // only the last micro-batch communicates
      ddp_->begin_backward();
    }
    if (zero_) zero_->begin_backward();  // every micro-batch reduce-scatters into the shard
    (accum == 1 ? loss : ops::scale(loss, 1.0 / static_cast<double>(accum))).backward();
    if (ddp_) ddp_->finish_backward();
    if (zero_) zero_->finish_backward();
    losses.push_back(loss);
  }
  if (clip_factor_.defined())
    optim::clip_factor_on_device(params_.flat_grads(), options_.clip, clip_norm_, clip_factor_);
  return losses;
}

std::vector<Tensor> TrainStep::replay_step(const std::function<Batch(int64_t micro)>& next_batch) {
  const int64_t accum = options_.grad_accum;
  if (graph_inputs_.empty()) {
    for (int64_t micro = 0; micro < accum; ++micro) {
      graph_inputs_.push_back(Tensor::empty({options_.batch, options_.ctx}, DType::i32, device_));
      graph_targets_.push_back(Tensor::empty({options_.batch, options_.ctx}, DType::i32, device_));
    }
  }
  for (int64_t micro = 0; micro < accum; ++micro) {
    const Batch b = next_batch(micro);
    upload_->ints_into(b.inputs, graph_inputs_[static_cast<size_t>(micro)]);
    upload_->ints_into(b.targets, graph_targets_[static_cast<size_t>(micro)]);
  }
  // Without ZeRO the last step's update runs at the start of the replay (unless something ran it eagerly
  // since); with ZeRO the update runs eagerly after the replay, once the host has read the gradient norm.
  const bool was_deferred = overlap_ && overlap_->deferred();
  if (overlap_) overlap_->hand_to_replay();
  if (!graph_) {
    // The eager first step's blocks go back to the driver: the graph allocates from its own pool, which
    // keeps the step's activations for every replay.
    if (zero_) zero_->prepare_capture();  // its eager gathers' buffers go back too
    synchronize(device_);
    empty_cache(device_);
    auto graph = std::make_unique<CudaGraph>(device_);
    // A capture that fails leaves no graph, and the last update deferred as it was (its events, recorded
    // in the abandoned capture, are never waited on).
    const auto restore = [&] {
      if (overlap_) was_deferred ? overlap_->defer() : overlap_->hand_to_replay();
    };
    try {
      graph->capture([this] {
        if (overlap_) overlap_->launch();
        try {
          graph_losses_ = forward_backward([this](int64_t micro) {
            return std::make_pair(graph_inputs_[static_cast<size_t>(micro)],
                                  graph_targets_[static_cast<size_t>(micro)]);
          });
        } catch (...) {
          // The side stream joins the capture again, so that it can end cleanly.
          if (overlap_) overlap_->settle();
          throw;
        }
      });
    } catch (const OutOfMemory&) {
      restore();
      throw;  // as an eager step's would: the batch does not fit
    } catch (const std::exception& e) {
      restore();
      throw Error(std::string("the training step could not be captured as a CUDA graph (") + e.what() +
                  "); --cuda-graph off runs it without one");
    }
    graph_ = std::move(graph);
    if (overlap_)
      overlap_->hand_to_replay();  // the capture's launch() left events only the graph can wait on
  }
  if (clock_) clock_->mark();  // after the batches' uploads: the replay alone
  graph_->replay();
  if (comm_) comm_->watch_replay("the collectives of the step's CUDA graph");
  if (zero_) zero_->replayed();
  return graph_losses_;
}

StepResult TrainStep::run(const std::function<Batch(int64_t micro)>& next_batch, double lr, bool stop_here,
                          int64_t step) {
  if (!started_) begin();
  zero_ ? zero_->set_lr(lr) : sharded_ ? sharded_->set_lr(lr) : adamw_->set_lr(lr);
  if (!overlap_) params_.zero_grad();
  const int64_t accum = options_.grad_accum;
  // gpu_ms: from the replay's launch (eagerly: the step's start) to the end of its forward and backward.
  const bool replay = graph_step_ && runs_ > 0;
  if (clock_) {
    clock_->clear();
    if (!replay) clock_->mark();
  }
  // Nothing is read back until forward and backward are queued: the host runs ahead of the GPU within them.
  // The update is queued after the loss and the norm are read, so a non-finite one updates nothing.
  // The first step runs eagerly (it also warms up what a capture cannot: cuBLASLt's plans, the allocator).
  const std::vector<Tensor> losses = replay ? replay_step(next_batch) : forward_backward([&](int64_t micro) {
    const Batch b = next_batch(micro);
    return std::make_pair(upload_->ints(b.inputs, {options_.batch, options_.ctx}),
                          upload_->ints(b.targets, {options_.batch, options_.ctx}));
  });
  if (clock_) clock_->mark();
  ++runs_;
  const double clip = options_.clip;
  double loss_sum = 0;
  for (const Tensor& loss : losses) loss_sum += loss.item();  // the first waits for the step's work
  StepResult result;
  // The loss and the stop request travel together: one small all-reduce per step.
  result.loss = loss_sum / static_cast<double>(accum);
  result.stop_requested = stop_here;
  if (comm_) {
    Tensor t = Tensor::from_floats({static_cast<float>(result.loss), stop_here ? 1.0f : 0.0f}, {2}, device_);
    comm_->all_reduce(t, dist::ReduceOp::avg);
    const std::vector<float> both = t.to_floats();
    result.loss = both[0];
    result.stop_requested = both[1] > 0;
  }
  if (!std::isfinite(result.loss)) diverged("the loss", result.loss, step);
  const auto update = [this] {
    if (!overlap_) return adamw_->step();
    adamw_->prepare_step();
    // Under the graph step the next replay starts with this update.
    graph_step_ ? overlap_->defer() : overlap_->launch();
  };
  if (zero_) {
    result.grad_norm = zero_->step(clip);  // untouched when the norm is not finite
  } else if (sharded_) {
    // Leaves parameters and state untouched when the norm is not finite.
    result.grad_norm = sharded_->step(clip, ddp_ != nullptr);
  } else if (clip_factor_.defined()) {
    result.grad_norm = clip_norm_.item();
    if (std::isfinite(result.grad_norm)) update();
  } else {
    result.grad_norm = optim::clip_grad_norm({params_.flat_grads()}, clip);
    if (std::isfinite(result.grad_norm)) update();
  }
  if (!std::isfinite(result.grad_norm)) diverged("the gradient norm", result.grad_norm, step);
  if (clock_) result.gpu_ms = clock_->ms_between(0, 1);
  if (!overlap_) synchronize(device_);
  return result;
}

}  // namespace tt::app
