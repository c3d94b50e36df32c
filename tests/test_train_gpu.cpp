// The one training step on CUDA: its update runs beside the next step's forward (optim/overlapped_update.h),
// its batches go up through pinned buffers (core/pinned_upload.h), and with bf16 gradients it is replayed as
// one CUDA graph from the second step on. All of that only moves work in time, so the step must equal the
// same step written out plainly, with every update finished before the next forward.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "apps/lib/train_step.h"
#include "core/autograd.h"
#include "core/cuda_context.h"
#include "core/ops.h"
#include "core/rng.h"
#include "nn/transformer.h"
#include "optim/optimizer.h"

using namespace tt;

namespace {

double relative(double a, double b) {
  return std::abs(a - b) / std::max(std::abs(b), 1e-12);
}

// `precision`: f32 (f32 gradients; the reference clips with clip_grad_norm: losses within 1e-6) or bf16
// (bf16 gradients and weight mirror; the reference clips as TrainStep does, inside AdamW with the factor
// computed on the device, so every bit must match). Naive attention: no atomics, the same bits every run.
// With accum 2 the gradient buffer is cleared once per step and accumulated across micro-batches.
// `graph`: TrainStepOptions::cuda_graph (it applies with bf16 gradients only).
void check_train_step(nn::Precision precision, bool graph) {
  const Device gpu = Device::cuda(0);
  nn::ModelConfig config = nn::preset("tiny");
  config.vocab_size = 300;
  config.context_length = 32;
  config.precision = precision;
  const bool bf16 = precision == nn::Precision::bf16;
  const int64_t batch = 4;
  const double clip = 0.05;
  const double tolerance = bf16 ? 0.0 : 1e-6;
  for (const int64_t accum : {int64_t{1}, int64_t{2}}) {
    CAPTURE(accum);
    nn::TransformerLM model_a(config), model_b(config);
    nn::FlatParameters params_a(model_a, gpu, 11), params_b(model_b, gpu, 11);
    if (bf16) {
      params_a.set_grad_dtype(DType::bf16);
      params_b.set_grad_dtype(DType::bf16);
    }
    app::TrainStepOptions options;
    options.batch = batch;
    options.ctx = config.context_length;
    options.grad_accum = accum;
    options.clip = clip;
    options.adamw.weight_decay = 0.1;
    options.cuda_graph = graph ? app::GraphUse::on : app::GraphUse::off;
    app::TrainStep step(model_a, params_a, gpu, nullptr, options);
    CHECK(step.update_path().find("beside the next step's forward") != std::string::npos);
    CHECK((step.update_path().find("CUDA graph") != std::string::npos) == (graph && bf16));
    optim::AdamW adamw({params_b.flat_params()}, options.adamw);
    Tensor norm_b = Tensor::zeros({1}, DType::f32, gpu), factor_b = Tensor::zeros({1}, DType::f32, gpu);
    if (bf16) adamw.set_grad_scale(factor_b);
    CounterRng rng{5, 0};
    int clipped = 0;
    for (int64_t s = 1; s <= 12; ++s) {
      std::vector<app::Batch> batches(static_cast<size_t>(accum));
      for (app::Batch& b : batches) {
        for (int64_t i = 0; i < batch * config.context_length; ++i) {
          b.inputs.push_back(static_cast<int32_t>(rng.next_below(300)));
          b.targets.push_back(static_cast<int32_t>(rng.next_below(300)));
        }
      }
      const double lr = 2e-3;
      const app::StepResult a =
          step.run([&](int64_t micro) { return batches[static_cast<size_t>(micro)]; }, lr, false, s);

      adamw.set_lr(lr);
      params_b.zero_grad();
      double loss_b = 0;
      for (const app::Batch& b : batches) {
        const Tensor x = Tensor::from_ints(b.inputs, {batch, config.context_length}, gpu);
        const Tensor y = Tensor::from_ints(b.targets, {batch, config.context_length}, gpu);
        const Tensor loss = model_b.loss(x, y);
        (accum == 1 ? loss : ops::scale(loss, 1.0 / static_cast<double>(accum))).backward();
        loss_b += loss.item() / static_cast<double>(accum);
      }
      double norm = 0;
      if (bf16) {
        optim::clip_factor_on_device(params_b.flat_grads(), clip, norm_b, factor_b);
        norm = norm_b.item();
      } else {
        norm = optim::clip_grad_norm({params_b.flat_grads()}, clip);
      }
      adamw.step();
      synchronize(gpu);
      clipped += norm > clip;
      CHECK(relative(a.loss, loss_b) <= tolerance);
      CHECK(relative(a.grad_norm, norm) <= (bf16 ? 0.0 : 1e-5));
      if (s == 6) {
        // A forward between steps (an evaluation) reads the parameters through the model: it waits for
        // each unit's update by itself, with no settle().
        NoGradGuard no_grad;
        const Tensor x = Tensor::from_ints(batches[0].inputs, {batch, config.context_length}, gpu);
        const Tensor y = Tensor::from_ints(batches[0].targets, {batch, config.context_length}, gpu);
        CHECK(relative(model_a.loss(x, y).item(), model_b.loss(x, y).item()) <= tolerance);
      }
      // Settling between steps (a checkpoint) applies the update now: under the graph the next replay must
      // then skip it, not apply it twice.
      if (s == 8) step.settle();
    }
    CHECK(clipped == 12);
    step.settle();
    synchronize(gpu);
    const std::vector<float> pa = params_a.flat_params().to_floats(), pb = params_b.flat_params().to_floats();
    double worst = 0;
    for (size_t i = 0; i < pa.size(); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(pa[i]) - pb[i]) / (std::abs(pb[i]) + 1e-3));
    CHECK(worst <= (bf16 ? 0.0 : 1e-5));
    if (bf16) CHECK(params_a.bf16_mirror_is_current());
  }
}

}  // namespace

TEST_CASE("TrainStep on CUDA (update beside the next forward, pinned batches) equals the plain step, f32") {
  check_train_step(nn::Precision::f32, true);
}

TEST_CASE("TrainStep on CUDA (update beside the next forward, pinned batches) equals the plain step, bf16") {
  check_train_step(nn::Precision::bf16, false);
}

TEST_CASE("TrainStep on CUDA as one CUDA graph equals the plain step, bf16") {
  check_train_step(nn::Precision::bf16, true);
}

TEST_CASE("A TrainStep whose last update is still deferred to the next replay can be destroyed") {
  // What benchmark --mode train does: replays, then the step goes away without settle(). The capture's
  // events cannot be waited on outside the graph, so nothing may wait on them then.
  const Device gpu = Device::cuda(0);
  nn::ModelConfig config = nn::preset("tiny");
  config.vocab_size = 300;
  config.context_length = 32;
  config.precision = nn::Precision::bf16;
  nn::TransformerLM model(config);
  nn::FlatParameters params(model, gpu, 3);
  params.set_grad_dtype(DType::bf16);
  app::TrainStepOptions options;
  options.batch = 2;
  options.ctx = config.context_length;
  app::Batch batch;
  for (int64_t i = 0; i < options.batch * options.ctx; ++i) {
    batch.inputs.push_back(static_cast<int32_t>(i % 300));
    batch.targets.push_back(static_cast<int32_t>((i * 7) % 300));
  }
  for (const int steps : {1, 2, 3}) {
    CAPTURE(steps);
    auto step = std::make_unique<app::TrainStep>(model, params, gpu, nullptr, options);
    for (int s = 1; s <= steps; ++s) step->run([&](int64_t) { return batch; }, 1e-3, false, s);
    CHECK_NOTHROW(step.reset());
    CHECK_NOTHROW(synchronize(gpu));
  }
}
