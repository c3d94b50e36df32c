// Activation recomputation per Transformer block, whole and selective (core/recompute.h,
// ModelConfig::recompute): the same losses, gradients and parameters as without it, bit for bit, through
// every gradient path of the training step (plain AdamW, gradient accumulation, AdamW in grad-ready hooks and
// inside the weight-gradient matmul, bf16 gradients); each parameter's hooks run once per pass; what forward
// keeps for backward (whole: the blocks' inputs; selective: all but the norms' outputs and the gate), and
// nothing left behind after backward; nothing changes without grad mode.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "core/recompute.h"
#include "core/rng.h"
#include "nn/transformer.h"
#include "optim/optimizer.h"
#include "optim/update_in_backward.h"

using namespace tt;

namespace {

constexpr int64_t kVocab = 40, kCtx = 12, kBatch = 2;

nn::ModelConfig recompute_config(nn::Recompute recompute, int64_t layers = 3, bool bf16 = false,
                                 nn::AttentionKind attention = nn::AttentionKind::naive) {
  nn::ModelConfig config = nn::preset("tiny");
  config.vocab_size = kVocab;
  config.context_length = kCtx;
  config.num_layers = layers;
  config.recompute = recompute;
  config.attention = attention;
  if (bf16) config.precision = nn::Precision::bf16;
  return config;
}

std::pair<Tensor, Tensor> batch_of(uint64_t seed, uint64_t index) {
  std::vector<int32_t> x(kBatch * kCtx), y(kBatch * kCtx);
  CounterRng rng{seed, index << 20};
  for (auto& v : x) v = static_cast<int32_t>(rng.next_below(kVocab));
  for (auto& v : y) v = static_cast<int32_t>(rng.next_below(kVocab));
  return {Tensor::from_ints(x, {kBatch, kCtx}), Tensor::from_ints(y, {kBatch, kCtx})};
}

struct Run {
  nn::Recompute recompute = nn::Recompute::none;
  bool bf16 = false;             // bf16 matmuls, bf16 gradient buffer and weight mirror
  bool flash = false;            // flash attention (attention_qkv) instead of the naive branch
  bool in_backward = false;      // AdamW in grad-ready hooks (UpdateInBackward)
  bool in_matmul = false;        // and inside the weight-gradient matmuls
  int64_t recompute_blocks = 0;  // ModelConfig::recompute_blocks
  int accumulate = 1;            // micro-batches per step (backward passes adding into .grad)
  bool freeze = false;           // layers.1.ln2.weight frozen
  int steps = 3;
};
struct Result {
  std::vector<double> losses, params, grads_after;
  int64_t hook_updates = 0, matmul_updates = 0;
  // Grad-ready hook calls per parameter, over all passes.
  std::map<std::string, int64_t> hook_calls;
};

Result train(const Run& run) {
  nn::ModelConfig config = recompute_config(run.recompute, 3, run.bf16,
                                            run.flash ? nn::AttentionKind::flash : nn::AttentionKind::naive);
  config.recompute_blocks = run.recompute_blocks;
  nn::TransformerLM model(config);
  nn::FlatParameters flat(model, Device::cpu(), 5, DType::f32, 7);
  if (run.bf16) flat.set_grad_dtype(DType::bf16);
  Result result;
  std::vector<uint64_t> hooks;
  for (const nn::NamedParameter& p : flat.parameters()) {
    if (run.freeze && p.name == "layers.1.ln2.weight") p.tensor->set_requires_grad(false);
    const std::string name = p.name;
    hooks.push_back(
        p.tensor->register_grad_ready_hook([&result, name](const Tensor&) { ++result.hook_calls[name]; }));
  }
  optim::AdamWOptions options;
  options.lr = 1e-2;
  optim::AdamW adamw({flat.flat_params()}, options);
  if (run.bf16) {
    flat.enable_bf16_mirror();
    adamw.write_bf16_mirror(&flat);
  }
  std::unique_ptr<optim::UpdateInBackward> fused;
  if (run.in_backward) fused = std::make_unique<optim::UpdateInBackward>(flat, adamw, run.in_matmul);
  for (int step = 0; step < run.steps; ++step) {
    if (fused) {
      const auto [ids, targets] = batch_of(9, static_cast<uint64_t>(step));
      const Tensor loss = model.loss(ids, targets);
      result.losses.push_back(loss.item());
      adamw.prepare_step();
      fused->begin();
      loss.backward();
      fused->finish();
      result.hook_updates += fused->updated_in_backward();
      result.matmul_updates += fused->updated_in_matmul();
      continue;
    }
    for (int micro = 0; micro < run.accumulate; ++micro) {
      const auto [ids, targets] = batch_of(9, static_cast<uint64_t>(step * run.accumulate + micro));
      const Tensor loss = model.loss(ids, targets);
      result.losses.push_back(loss.item());
      loss.backward();
    }
    adamw.step();
    flat.zero_grad();
  }
  for (size_t i = 0; i < hooks.size(); ++i) flat.parameters()[i].tensor->remove_grad_ready_hook(hooks[i]);
  result.params = flat.flat_params().to_doubles();
  result.grads_after = flat.flat_grads().to_doubles();
  return result;
}

// Bytes the CPU allocator holds after model.loss() beyond what it held before (what forward keeps for
// backward), and the peak over forward and backward above that same start.
struct Memory {
  int64_t kept = 0, peak = 0, left = 0;  // left: held after backward, beyond the start
};
Memory loss_memory(nn::Recompute recompute, int64_t layers, int64_t recompute_blocks = 0,
                   nn::AttentionKind attention = nn::AttentionKind::naive) {
  nn::ModelConfig config = recompute_config(recompute, layers, false, attention);
  config.recompute_blocks = recompute_blocks;
  config.context_length = 64;
  nn::TransformerLM model(config);
  nn::FlatParameters flat(model, Device::cpu(), 5);
  std::vector<int32_t> x(kBatch * 64), y(kBatch * 64);
  CounterRng rng{2, 0};
  for (auto& v : x) v = static_cast<int32_t>(rng.next_below(kVocab));
  for (auto& v : y) v = static_cast<int32_t>(rng.next_below(kVocab));
  const Tensor ids = Tensor::from_ints(x, {kBatch, 64}), targets = Tensor::from_ints(y, {kBatch, 64});
  const Device cpu = Device::cpu();
  const int64_t start = memory_stats(cpu).current_bytes;
  reset_peak_memory(cpu);
  Memory m;
  {
    const Tensor loss = model.loss(ids, targets);
    m.kept = memory_stats(cpu).current_bytes - start;
    loss.backward();
  }
  m.peak = memory_stats(cpu).peak_bytes - start;
  m.left = memory_stats(cpu).current_bytes - start;
  return m;
}

}  // namespace

TEST_CASE("recompute block: losses, parameters and gradients bit for bit those of a run without it") {
  struct Case {
    const char* what;
    Run run;
  };
  std::vector<Case> cases;
  Run run;
  cases.push_back({"AdamW after backward", run});
  run.flash = true;
  cases.push_back({"flash attention", run});
  run = Run();
  run.accumulate = 2;
  run.freeze = true;
  cases.push_back({"two micro-batches accumulated per step, a frozen norm", run});
  run = Run();
  run.in_backward = true;
  run.freeze = true;
  cases.push_back({"AdamW in grad-ready hooks", run});
  run.in_matmul = true;
  cases.push_back({"AdamW inside the weight-gradient matmuls", run});
  run.bf16 = true;
  cases.push_back({"bf16 with bf16 gradients and the weight mirror, AdamW inside the matmuls", run});
  run.in_backward = run.in_matmul = false;
  run.accumulate = 2;
  cases.push_back({"bf16 with bf16 gradients, two micro-batches", run});
  run.flash = true;
  cases.push_back({"bf16 with bf16 gradients, flash attention, two micro-batches", run});
  for (Case& c : cases) {
    CAPTURE(c.what);
    c.run.recompute = nn::Recompute::none;
    const Result plain = train(c.run);
    // Every recomputation setting: the same losses, parameters, gradients and update and hook counts.
    const auto same_as_plain = [&plain](nn::Recompute how, int64_t blocks, Run run) {
      const char* mode = nn::recompute_name(how);
      CAPTURE(mode);
      CAPTURE(blocks);
      run.recompute = how;
      run.recompute_blocks = blocks;
      const Result r = train(run);
      CHECK(r.losses == plain.losses);
      CHECK(r.params == plain.params);
      CHECK(r.grads_after == plain.grads_after);
      CHECK(r.hook_updates == plain.hook_updates);
      CHECK(r.matmul_updates == plain.matmul_updates);
      CHECK(r.hook_calls == plain.hook_calls);
      return r;
    };
    const Result recomputed = same_as_plain(nn::Recompute::block, 0, c.run);
    same_as_plain(nn::Recompute::block, 2, c.run);      // of 3; the third selectively
    same_as_plain(nn::Recompute::selective, 0, c.run);  // all
    same_as_plain(nn::Recompute::selective, 1, c.run);  // of 3; the others keep everything
    // Each parameter's grad-ready hooks ran once per backward pass, as without recomputation.
    const int64_t passes = c.run.steps * (c.run.in_backward ? 1 : c.run.accumulate);
    for (const auto& [name, calls] : recomputed.hook_calls) {
      CAPTURE(name);
      CHECK(calls == passes);
    }
    CHECK(recomputed.hook_calls.size() ==
          nn::TransformerLM(recompute_config(nn::Recompute::none)).named_parameters().size() -
              (c.run.freeze ? 1 : 0));
  }
}

TEST_CASE("recompute block: only the blocks' inputs are kept between forward and backward") {
  // One block more keeps exactly one more (batch, seq, d_model) f32 tensor with recomputation; without it,
  // every op's saved tensors.
  const int64_t block_input = kBatch * 64 * nn::preset("tiny").d_model * 4;
  const Memory none2 = loss_memory(nn::Recompute::none, 2), none4 = loss_memory(nn::Recompute::none, 4);
  const Memory block2 = loss_memory(nn::Recompute::block, 2), block4 = loss_memory(nn::Recompute::block, 4);
  MESSAGE("kept by forward, 4 layers: " << none4.kept << " bytes without recomputation, " << block4.kept
                                        << " with; peak " << none4.peak << " and " << block4.peak);
  CHECK(block4.kept - block2.kept == 2 * block_input);
  CHECK(none4.kept - none2.kept > 8 * block_input);
  CHECK(block4.kept < none4.kept);
  CHECK(block4.peak < none4.peak);
  // The peak of backward grows by one block input per block, not by a block's activations.
  CHECK(block4.peak - block2.peak < none4.peak - none2.peak);
  // Two of four blocks recomputed whole: the other two keep what they keep when recomputed selectively.
  const Memory half4 = loss_memory(nn::Recompute::block, 4, 2);
  const Memory sel2 = loss_memory(nn::Recompute::selective, 2),
               sel4 = loss_memory(nn::Recompute::selective, 4);
  CHECK(half4.kept - block2.kept == sel4.kept - sel2.kept);
  CHECK(sel4.kept - sel2.kept < none4.kept - none2.kept);
  // Selectively, the first two of four: the other two keep everything.
  const Memory sel_half4 = loss_memory(nn::Recompute::selective, 4, 2);
  CHECK(sel_half4.kept - sel2.kept == none4.kept - none2.kept);
}

TEST_CASE("recompute selective: the norms' outputs and the SwiGLU gate are what a block no longer keeps") {
  // f32 on the CPU, flash attention: a block's matmuls read their inputs as they are, so what selective
  // recomputation drops per block is ln1's and ln2's outputs (d_model each per token), the gate (d_ff) and
  // the two norms' 1/rms (one each per token); everything else is a matmul's or attention's result.
  const nn::ModelConfig tiny = nn::preset("tiny");
  const int64_t tokens = kBatch * 64;
  const int64_t dropped = tokens * (2 * tiny.d_model + tiny.d_ff + 2) * 4;
  const auto flash = nn::AttentionKind::flash;
  const Memory none2 = loss_memory(nn::Recompute::none, 2, 0, flash);
  const Memory none4 = loss_memory(nn::Recompute::none, 4, 0, flash);
  const Memory sel2 = loss_memory(nn::Recompute::selective, 2, 0, flash);
  const Memory sel4 = loss_memory(nn::Recompute::selective, 4, 0, flash);
  MESSAGE("kept by forward, 4 layers, flash: " << none4.kept << " bytes without recomputation, " << sel4.kept
                                               << " selectively; peak " << none4.peak << " and "
                                               << sel4.peak);
  CHECK((none4.kept - none2.kept) - (sel4.kept - sel2.kept) == 2 * dropped);
  CHECK(sel4.peak < none4.peak);
  // Backward frees all it kept: the gradients go into the flat buffer that was there before.
  CHECK(none4.left == 0);
  CHECK(sel4.left == 0);
  // Whole blocks for the first two of four, the other two selectively: between all whole and all selective.
  const Memory block4 = loss_memory(nn::Recompute::block, 4, 0, flash);
  const Memory mixed4 = loss_memory(nn::Recompute::block, 4, 2, flash);
  const Memory block2 = loss_memory(nn::Recompute::block, 2, 0, flash);
  CHECK(mixed4.kept - block2.kept == sel4.kept - sel2.kept);
  CHECK(block4.kept < mixed4.kept);
  CHECK(mixed4.kept < sel4.kept);
  CHECK(block4.left == 0);
  CHECK(mixed4.left == 0);
}

TEST_CASE("recompute(): a second run that calls other ops than the first is refused") {
  Tensor w = Tensor::from_floats({0.5f, -1.5f, 2.0f, 1.0f}, {2, 2});
  w.set_requires_grad(true);
  const Tensor x = Tensor::from_floats({1.0f, 2.0f}, {1, 2});
  // Results are matched to ops by their order: a second run with fewer matmuls, or another one, is a bug.
  int reruns = 0;
  auto fewer = [&w, &reruns](const Tensor& in) {
    return ++reruns == 1 ? ops::linear(ops::linear(in, w), w) : ops::linear(in, w);
  };
  CHECK_THROWS_WITH(ops::sum(recompute(fewer, x, {&w}, RecomputeKeep::matmuls)).backward(),
                    doctest::Contains("fewer kept results"));
  Tensor w2 = Tensor::from_floats({1.0f, 0.0f, 0.0f, 1.0f}, {2, 2});
  w2.set_requires_grad(true);
  int orders = 0;
  auto swapped = [&w, &w2, &orders](const Tensor& in) {
    const bool first = ++orders == 1;
    const Tensor a = ops::linear(in, first ? w : w2), b = ops::linear(in, first ? w2 : w);
    return ops::mul(a, b);
  };
  CHECK_THROWS_WITH(ops::sum(recompute(swapped, x, {&w, &w2}, RecomputeKeep::matmuls)).backward(),
                    doctest::Contains("linear where the first did not"));
  int swaps = 0;
  auto other_op = [&w, &swaps](const Tensor& in) {
    return ++swaps == 1 ? ops::linear(in, w) : ops::linear_residual(in, in, w, DType::f32, false, Tensor());
  };
  CHECK_THROWS_WITH(ops::sum(recompute(other_op, x, {&w}, RecomputeKeep::matmuls)).backward(),
                    doctest::Contains("linear_residual where the first did not"));
}

TEST_CASE("recompute block: without grad mode nothing is recorded and the logits are the same") {
  const auto [ids, targets] = batch_of(3, 0);
  nn::TransformerLM plain(recompute_config(nn::Recompute::none));
  nn::TransformerLM recomputed(recompute_config(nn::Recompute::block));
  nn::FlatParameters flat_plain(plain, Device::cpu(), 5), flat_recomputed(recomputed, Device::cpu(), 5);
  const NoGradGuard no_grad;
  const Tensor a = plain.forward(ids), b = recomputed.forward(ids);
  CHECK_FALSE(b.requires_grad());
  CHECK(b.grad_fn() == nullptr);
  CHECK(a.to_doubles() == b.to_doubles());
  CHECK(plain.loss(ids, targets).item() == recomputed.loss(ids, targets).item());
}

TEST_CASE("recompute(): gradients of input and parameters, the input's gradient alone, and errors") {
  Tensor w = Tensor::from_floats({0.5f, -1.5f, 2.0f}, {3});
  w.set_requires_grad(true);
  Tensor x0 = Tensor::from_floats({1.0f, 2.0f, 3.0f}, {3});
  x0.set_requires_grad(true);
  int hook_calls = 0;
  w.register_grad_ready_hook([&](const Tensor&) { ++hook_calls; });
  auto fn = [&w](const Tensor& in) { return ops::mul(ops::mul(in, w), in); };  // w * x^2
  const Tensor x = ops::mul(x0, x0);                                           // a non-leaf input: x0^2
  const Tensor y = recompute(fn, x, {&w});
  CHECK(y.requires_grad());
  ops::sum(y).backward();
  // d/dx0 of w * x0^4 = 4 w x0^3; d/dw = x0^4.
  CHECK(x0.grad().to_floats() == std::vector<float>{2.0f, -48.0f, 216.0f});
  CHECK(w.grad().to_floats() == std::vector<float>{1.0f, 16.0f, 81.0f});
  CHECK(hook_calls == 1);
  CHECK_THROWS_WITH(ops::sum(y).backward(), doctest::Contains("already used"));
  // An input that needs no gradient: only the parameters get one.
  w.set_grad(Tensor());
  const Tensor c = Tensor::from_floats({1.0f, 2.0f, 3.0f}, {3});
  ops::sum(recompute(fn, c, {&w})).backward();
  CHECK(w.grad().to_floats() == std::vector<float>{1.0f, 4.0f, 9.0f});
  CHECK(hook_calls == 2);
  // Nothing requires grad: fn(x) itself.
  const Tensor d = recompute([](const Tensor& in) { return ops::mul(in, in); }, c, {});
  CHECK_FALSE(d.requires_grad());
  CHECK(d.to_floats() == std::vector<float>{1.0f, 4.0f, 9.0f});
}
