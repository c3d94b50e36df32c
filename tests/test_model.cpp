// The Transformer LM and the optimizers: parameter names and counts, an end-to-end gradient check in
// double precision, AdamW against hand-computed torch.optim.AdamW values, and overfitting a fixed batch.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/rng.h"
#include "gradcheck.h"
#include "nn/transformer.h"
#include "optim/optimizer.h"
#include "optim/update_in_backward.h"

using namespace tt;

TEST_CASE("preset parameter counts equal the reference table") {
  const std::vector<std::pair<std::string, int64_t>> expected = {{"small", 128625408},
                                                                 {"medium", 423183360},
                                                                 {"large", 969411840},
                                                                 {"xl", 1998235200},
                                                                 {"2.7b", 3406809600}};
  for (const auto& [name, count] : expected) {
    CAPTURE(name);
    nn::ModelConfig config = nn::preset(name);
    config.vocab_size = 10000;
    nn::TransformerLM model(config);  // parameters have shapes but no storage yet
    CHECK(model.parameter_count() == count);
    CHECK(config.parameter_count() == count);
  }
}

// The names are the reference's state_dict keys; the order differs in one place: w3 comes before w2, so that
// w1 and w3 lie side by side in the flat parameters (ops::swiglu_projection takes them as one matrix).
TEST_CASE("parameter names follow the PyTorch state_dict") {
  nn::ModelConfig config = nn::preset("tiny");
  config.num_layers = 2;
  nn::TransformerLM model(config);
  std::vector<std::string> names;
  for (const auto& p : model.named_parameters()) names.push_back(p.name);
  const std::vector<std::string> expected = {
      "token_embeddings.weight",     "layers.0.attn.q_proj.weight",      "layers.0.attn.k_proj.weight",
      "layers.0.attn.v_proj.weight", "layers.0.attn.output_proj.weight", "layers.0.ln1.weight",
      "layers.0.ln2.weight",         "layers.0.ffn.w1.weight",           "layers.0.ffn.w3.weight",
      "layers.0.ffn.w2.weight"};
  for (size_t i = 0; i < expected.size(); ++i) CHECK(names[i] == expected[i]);
  CHECK(names[names.size() - 2] == "ln_final.weight");
  CHECK(names.back() == "lm_head.weight");
  CHECK(names.size() == 1 + 2 * 9 + 2);
}

TEST_CASE("initialisation: truncated normal with the reference std, norms at one, same on every call") {
  nn::ModelConfig config = nn::preset("tiny");
  config.vocab_size = 50;
  nn::TransformerLM a(config), b(config);
  nn::FlatParameters fa(a, Device::cpu(), 7), fb(b, Device::cpu(), 7);
  CHECK(fa.flat_params().to_floats() == fb.flat_params().to_floats());
  for (const auto& p : a.named_parameters()) {
    const std::vector<float> v = p.tensor->to_floats();
    if (p.init.kind == nn::Init::Kind::ones) {
      for (float x : v) CHECK(x == 1.0f);
      continue;
    }
    double sq = 0, peak = 0;
    for (float x : v) {
      sq += x * x;
      peak = std::max(peak, std::fabs(static_cast<double>(x)));
    }
    const double std = std::sqrt(sq / v.size());
    CAPTURE(p.name);
    CHECK(peak <= 3 * p.init.std + 1e-6);
    // Truncation at 3 std shrinks the std by ~1.3%; allow sampling noise.
    CHECK(std == doctest::Approx(p.init.std * 0.987).epsilon(0.1));
  }
}

TEST_CASE("tiny model end to end: autograd equals finite differences (double)") {
  for (const char* attention : {"naive", "flash"}) {
    CAPTURE(attention);
    nn::ModelConfig config;
    config.vocab_size = 11;
    config.context_length = 6;
    config.d_model = 8;
    config.num_layers = 2;
    config.num_heads = 2;
    config.d_ff = 12;
    config.attention = nn::parse_attention(attention);
    nn::TransformerLM model(config);
    nn::FlatParameters flat(model, Device::cpu(), 3, DType::f64);
    const Tensor ids = Tensor::from_ints({1, 5, 2, 9, 10, 0, 3, 3, 7, 4, 8, 6}, {2, 6});
    const Tensor targets = Tensor::from_ints({5, 2, 9, 10, 0, 1, 3, 7, 4, 8, 6, 2}, {2, 6});
    model.loss(ids, targets).backward();
    const std::vector<double> analytic = flat.flat_grads().to_doubles();
    double* params = flat.flat_params().data<double>();
    const double eps = 1e-6;
    double worst = 0;
    for (int64_t i = 0; i < flat.numel(); i += 7) {
      NoGradGuard guard;
      const double saved = params[i];
      params[i] = saved + eps;
      const double plus = model.loss(ids, targets).item();
      params[i] = saved - eps;
      const double minus = model.loss(ids, targets).item();
      params[i] = saved;
      const double numeric = (plus - minus) / (2 * eps);
      worst = std::max(worst, std::fabs(numeric - analytic[i]) / std::max(1e-3, std::fabs(numeric)));
    }
    CHECK(worst < 1e-5);
  }
}

TEST_CASE("AdamW matches hand-computed torch.optim.AdamW values") {
  Tensor p = Tensor::from_doubles({1.0, -2.0}, {2});
  p.set_requires_grad(true);
  optim::AdamWOptions options;
  options.lr = 0.1;
  optim::AdamW adamw({p}, options);
  const std::vector<std::vector<double>> grads = {{0.5, -0.3}, {-0.2, 0.8}, {0.4, 0.1}};
  // p *= 1 - lr*wd; m, v updated; p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps), computed by hand.
  const std::vector<std::vector<double>> expected = {{0.899000002, -1.8980000033333333},
                                                     {0.8635404181145108, -1.9422650008936604},
                                                     {0.8031232098088184, -1.9831948428184747}};
  for (size_t step = 0; step < grads.size(); ++step) {
    p.set_grad(Tensor::from_doubles(grads[step], {2}));
    adamw.step();
    const std::vector<double> got = p.to_doubles();
    CHECK(got[0] == doctest::Approx(expected[step][0]).epsilon(1e-12));
    CHECK(got[1] == doctest::Approx(expected[step][1]).epsilon(1e-12));
  }
}

TEST_CASE("cosine schedule and gradient clipping") {
  CHECK(optim::cosine_lr(0, 1.0, 0.1, 10, 100) == 0.0);
  CHECK(optim::cosine_lr(5, 1.0, 0.1, 10, 100) == doctest::Approx(0.5));
  CHECK(optim::cosine_lr(10, 1.0, 0.1, 10, 100) == doctest::Approx(1.0));
  CHECK(optim::cosine_lr(55, 1.0, 0.1, 10, 100) == doctest::Approx(0.55));
  CHECK(optim::cosine_lr(100, 1.0, 0.1, 10, 100) == doctest::Approx(0.1));
  CHECK(optim::cosine_lr(500, 1.0, 0.1, 10, 100) == doctest::Approx(0.1));

  Tensor a = Tensor::from_doubles({3.0, 0.0}, {2}), b = Tensor::from_doubles({4.0}, {1});
  CHECK(optim::clip_grad_norm({a, b}, 1.0) == doctest::Approx(5.0));
  CHECK(a.to_doubles()[0] == doctest::Approx(3.0 / (5.0 + 1e-6)));
  CHECK(b.to_doubles()[0] == doctest::Approx(4.0 / (5.0 + 1e-6)));
  CHECK(optim::clip_grad_norm({a, b}, 10.0) == doctest::Approx(1.0).epsilon(1e-5));
  CHECK(b.to_doubles()[0] == doctest::Approx(4.0 / (5.0 + 1e-6)));  // unchanged below the threshold
}

TEST_CASE("SGD step") {
  Tensor p = Tensor::from_doubles({1.0, 2.0}, {2});
  p.set_requires_grad(true);
  p.set_grad(Tensor::from_doubles({0.5, -1.0}, {2}));
  optim::SGD sgd({p}, 0.1);
  sgd.step();
  CHECK(p.to_doubles() == std::vector<double>{0.95, 2.1});
}

TEST_CASE("the tiny model overfits a fixed batch") {
  nn::ModelConfig config = nn::preset("tiny");
  config.vocab_size = 32;
  config.context_length = 16;
  nn::TransformerLM model(config);
  nn::FlatParameters flat(model, Device::cpu(), 1);
  optim::AdamWOptions options;
  options.lr = 1e-2;
  optim::AdamW adamw({flat.flat_params()}, options);
  std::vector<int32_t> tokens(2 * 17);
  CounterRng rng{42, 0};
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng.next_below(32));
  std::vector<int32_t> x, y;
  for (int b = 0; b < 2; ++b) {
    for (int i = 0; i < 16; ++i) {
      x.push_back(tokens[b * 17 + i]);
      y.push_back(tokens[b * 17 + i + 1]);
    }
  }
  const Tensor ids = Tensor::from_ints(x, {2, 16}), targets = Tensor::from_ints(y, {2, 16});
  double first = 0, last = 0;
  for (int step = 0; step < 200; ++step) {
    flat.zero_grad();
    const Tensor loss = model.loss(ids, targets);
    loss.backward();
    adamw.step();
    last = loss.item();
    if (step == 0) first = last;
  }
  MESSAGE("loss " << first << " -> " << last);
  CHECK(last < 0.1 * first);
}

namespace {
// AdamW steps of the tiny LM (vocabulary 40, context 12, batches of 2 drawn from data_seed), the update
// after backward or fused into it, in f32 or bf16, with or without the bf16 weight mirror.
struct TinyRun {
  bool in_backward = false;  // AdamW fused into backward (UpdateInBackward)
  bool in_matmul = false;    // and linear weights updated inside their weight-gradient matmul
  bool bf16 = false;
  bool mirror = false;      // bf16 weights read from the mirror AdamW writes
  bool freeze = false;      // layers.1.ln2.weight frozen
  bool grads_bf16 = false;  // FlatParameters::set_grad_dtype(bf16)
  int steps = 3;
  size_t group = optim::AdamW::kFactoredGroup;  // weights per launch with in_matmul
  uint64_t init_seed = 3, data_seed = 8;
  int64_t pad = 7;  // flat buffers padded to a multiple of this
};
struct TinyResult {
  std::vector<double> params, grads_after, losses;
  int64_t hook_updates = 0;    // of the last step, with in_backward
  int64_t matmul_updates = 0;  // of those, inside a matmul (in_matmul)
  bool mirror_current = true;  // after every step, with mirror
};

// The tiny preset with a 40-token vocabulary and context 12, as all the optimizer and mirror tests use it.
nn::ModelConfig tiny_config(bool bf16) {
  nn::ModelConfig config = nn::preset("tiny");
  config.vocab_size = 40;
  config.context_length = 12;
  if (bf16) config.precision = nn::Precision::bf16;
  return config;
}

TinyResult train_tiny(Device device, const TinyRun& run) {
  const nn::ModelConfig config = tiny_config(run.bf16);
  nn::TransformerLM model(config);
  nn::FlatParameters flat(model, device, run.init_seed, DType::f32, run.pad);
  if (run.grads_bf16) flat.set_grad_dtype(DType::bf16);
  for (const nn::NamedParameter& p : flat.parameters()) {
    if (run.freeze && p.name == "layers.1.ln2.weight") p.tensor->set_requires_grad(false);
  }
  optim::AdamWOptions options;
  options.lr = 1e-2;
  optim::AdamW adamw({flat.flat_params()}, options);
  if (run.mirror) {
    flat.enable_bf16_mirror();
    adamw.write_bf16_mirror(&flat);
  }
  std::unique_ptr<optim::UpdateInBackward> fused;
  if (run.in_backward) {
    fused = std::make_unique<optim::UpdateInBackward>(flat, adamw, run.in_matmul, run.group);
  }
  TinyResult result;
  for (int step = 0; step < run.steps; ++step) {
    std::vector<int32_t> x(2 * 12), y(2 * 12);
    CounterRng rng{run.data_seed, static_cast<uint64_t>(step) << 20};
    for (auto& v : x) v = static_cast<int32_t>(rng.next_below(40));
    for (auto& v : y) v = static_cast<int32_t>(rng.next_below(40));
    const Tensor loss =
        model.loss(Tensor::from_ints(x, {2, 12}, device), Tensor::from_ints(y, {2, 12}, device));
    result.losses.push_back(loss.item());
    if (fused) {
      adamw.prepare_step();
      fused->begin();
      loss.backward();
      fused->finish();
      result.hook_updates = fused->updated_in_backward();
      result.matmul_updates = fused->updated_in_matmul();
    } else {
      loss.backward();
      adamw.step();
      flat.zero_grad();
    }
    if (run.mirror) result.mirror_current = result.mirror_current && flat.bf16_mirror_is_current();
  }
  result.grads_after = flat.flat_grads().to_doubles();
  result.params = flat.flat_params().to_doubles();
  return result;
}

// Three f32 steps, one parameter frozen and the flat buffer padded, so finish()'s own updates are exercised.
std::vector<double> train_three_steps(Device device, bool in_backward, std::vector<double>* grads_after,
                                      int64_t* hook_updates = nullptr) {
  TinyRun run;
  run.in_backward = in_backward;
  run.freeze = true;
  TinyResult r = train_tiny(device, run);
  *grads_after = r.grads_after;
  if (hook_updates) *hook_updates = r.hook_updates;
  return r.params;
}
}  // namespace

TEST_CASE("AdamW fused into backward equals backward, then step, then zero_grad") {
  std::vector<double> grads_fused, grads_plain;
  int64_t hook_updates = 0;
  const std::vector<double> fused = train_three_steps(Device::cpu(), true, &grads_fused, &hook_updates);
  const std::vector<double> plain = train_three_steps(Device::cpu(), false, &grads_plain);
  CHECK(fused == plain);  // the same kernels on the same numbers, element by element: identical
  CHECK(grads_fused == grads_plain);
  CHECK(std::all_of(grads_fused.begin(), grads_fused.end(), [](double g) { return g == 0.0; }));
  // Every trainable parameter was updated from its hook during backward; only the frozen one waited.
  nn::TransformerLM probe(tiny_config(false));
  CHECK(hook_updates == static_cast<int64_t>(probe.named_parameters().size()) - 1);
}

TEST_CASE("AdamW inside the weight-gradient matmul equals backward, then step, then zero_grad (CPU)") {
  // f32: the factored gradient goes through the same CPU GEMM as backward's own, so the bits agree.
  // bf16 with bf16 gradients and the mirror: the gradient is rounded to bf16 as the buffer would hold it.
  // Groups of 4 weights are applied during backward as well as at finish(); the default group at finish().
  for (const auto& [bf16, group] : {std::pair<bool, size_t>{false, optim::AdamW::kFactoredGroup},
                                    {true, optim::AdamW::kFactoredGroup},
                                    {false, 4},
                                    {true, 4}}) {
    CAPTURE(bf16);
    CAPTURE(group);
    TinyRun run;
    run.freeze = true;
    run.bf16 = run.mirror = run.grads_bf16 = bf16;
    const TinyResult plain = train_tiny(Device::cpu(), run);
    run.in_backward = run.in_matmul = true;
    run.group = group;
    const TinyResult fused = train_tiny(Device::cpu(), run);
    CHECK(fused.params == plain.params);
    CHECK(fused.losses == plain.losses);
    CHECK(std::all_of(fused.grads_after.begin(), fused.grads_after.end(), [](double g) { return g == 0.0; }));
    CHECK(fused.mirror_current);
    // Every 2-D weight of a linear layer went through its matmul: q, k, v, o, w1, w2, w3 per layer. Not the
    // embedding (a gather), nor the output projection, whose gradient the fused classifier + loss makes
    // chunk by chunk during the forward pass and hands to the accumulator (the hook path).
    nn::TransformerLM probe(tiny_config(bf16));
    CHECK(fused.matmul_updates == 7 * probe.config().num_layers);
    CHECK(fused.hook_updates == static_cast<int64_t>(probe.named_parameters().size()) - 1);
  }
}

TEST_CASE(
    "AdamW inside the matmul: a gradient already in .grad takes the hook path; a second source is refused") {
  const nn::ModelConfig config = tiny_config(false);
  std::vector<int32_t> ids(2 * 12), targets(2 * 12);
  CounterRng rng{4, 0};
  for (auto& v : ids) v = static_cast<int32_t>(rng.next_below(40));
  for (auto& v : targets) v = static_cast<int32_t>(rng.next_below(40));
  const Tensor x = Tensor::from_ints(ids, {2, 12}, Device::cpu()),
               y = Tensor::from_ints(targets, {2, 12}, Device::cpu());
  // Two backward passes accumulate, then one step: with the second pass fused, the weights whose .grad
  // already holds the first pass's gradient must not be updated from the product alone.
  auto accumulate_then_step = [&](bool fused_second_pass, int64_t* in_matmul) {
    nn::TransformerLM model(config);
    nn::FlatParameters flat(model, Device::cpu(), 3);
    optim::AdamW adamw({flat.flat_params()});
    optim::UpdateInBackward update(flat, adamw, /*in_matmul=*/true);
    model.loss(x, y).backward();  // not armed: an ordinary pass, its gradients left in .grad
    if (fused_second_pass) {
      adamw.prepare_step();
      update.begin();
      model.loss(x, y).backward();
      update.finish();
      *in_matmul = update.updated_in_matmul();
    } else {
      model.loss(x, y).backward();
      adamw.step();
    }
    return flat.flat_params().to_doubles();
  };
  int64_t in_matmul = -1;
  const std::vector<double> fused = accumulate_then_step(true, &in_matmul),
                            plain = accumulate_then_step(false, nullptr);
  CHECK(fused == plain);
  CHECK(in_matmul == 0);
  // A weight used by its linear and by another op in the same pass: the update inside the matmul could not
  // see the other gradient, so the pass is refused.
  nn::TransformerLM model(config);
  nn::FlatParameters flat(model, Device::cpu(), 3);
  optim::AdamW adamw({flat.flat_params()});
  optim::UpdateInBackward update(flat, adamw, /*in_matmul=*/true);
  const Tensor* q = nullptr;
  for (const nn::NamedParameter& p : flat.parameters()) {
    if (p.name == "layers.0.attn.q_proj.weight") q = p.tensor;
  }
  REQUIRE(q != nullptr);
  adamw.prepare_step();
  update.begin();
  const Tensor loss = ops::add(model.loss(x, y), ops::sum(ops::mul(*q, *q)));
  CHECK_THROWS_WITH_AS(loss.backward(), doctest::Contains("got another gradient in the same pass"), Error);
  // A group size outside 1 .. kFactoredGroup is refused.
  for (const size_t group : {size_t{0}, optim::AdamW::kFactoredGroup + 1}) {
    CHECK_THROWS_WITH_AS(optim::UpdateInBackward(flat, adamw, true, group),
                         doctest::Contains("weights per launch"), Error);
  }
  // Two consumers for one weight are refused too.
  CHECK_THROWS_WITH_AS(optim::UpdateInBackward(flat, adamw, true),
                       doctest::Contains("has a consumer already"), Error);
}

namespace {
// Four bf16 steps with the mirror (after backward or fused into it) or with every matmul casting its weight.
// Returns the parameters; the losses and whether the mirror matched the parameters after every step go to
// the pointers.
std::vector<double> train_bf16(Device device, bool mirror, bool in_backward, std::vector<double>* losses,
                               bool* mirror_current) {
  TinyRun run;
  run.in_backward = in_backward;
  run.bf16 = true;
  run.mirror = mirror;
  run.steps = 4;
  run.init_seed = 5;
  run.data_seed = 9;
  run.pad = 8;
  TinyResult r = train_tiny(device, run);
  *losses = r.losses;
  *mirror_current = r.mirror_current;
  return r.params;
}
}  // namespace

TEST_CASE("bf16 weight mirror written by AdamW: training identical to casting every step, mirror current") {
  std::vector<double> losses_cast, losses_mirror, losses_fused;
  bool current = false, current_fused = false;
  const std::vector<double> cast = train_bf16(Device::cpu(), false, false, &losses_cast, &current);
  const std::vector<double> mirrored = train_bf16(Device::cpu(), true, false, &losses_mirror, &current);
  const std::vector<double> fused = train_bf16(Device::cpu(), true, true, &losses_fused, &current_fused);
  CHECK(current);
  CHECK(current_fused);
  CHECK(losses_mirror == losses_cast);
  CHECK(losses_fused == losses_cast);
  CHECK(mirrored == cast);
  CHECK(fused == cast);
  CHECK(losses_cast.front() != losses_cast.back());  // the steps did change the model
}

TEST_CASE("bf16 weight mirror: goes stale when parameters change behind it, refresh and disable restore") {
  nn::TransformerLM model(tiny_config(true));
  nn::FlatParameters flat(model, Device::cpu(), 5);
  const Tensor ids = Tensor::from_ints(std::vector<int32_t>(12, 3), {1, 12});
  const double before = model.loss(ids, ids).item();
  flat.enable_bf16_mirror();
  CHECK(flat.bf16_mirror_is_current());
  CHECK(model.loss(ids, ids).item() == before);  // the mirror holds exactly what the casts produced
  CHECK(flat.parameters()[0].tensor->low_precision_copy().defined());
  // Changed without the mirror: a forward would read the old weights until refreshed.
  flat.flat_params().copy_(ops::scale(flat.flat_params(), 0.5));
  CHECK_FALSE(flat.bf16_mirror_is_current());
  const double stale = model.loss(ids, ids).item();
  flat.refresh_bf16_mirror();
  CHECK(flat.bf16_mirror_is_current());
  const double refreshed = model.loss(ids, ids).item();
  CHECK(stale != refreshed);  // so the matmuls did read the mirror rather than cast the weights
  flat.disable_bf16_mirror();
  CHECK_FALSE(flat.parameters()[0].tensor->low_precision_copy().defined());
  CHECK(model.loss(ids, ids).item() == refreshed);
  CHECK(refreshed != before);
  optim::AdamW two({flat.flat_params(), flat.flat_params()});
  CHECK_THROWS_WITH_AS(two.write_bf16_mirror(&flat),
                       doctest::Contains("exactly the flat f32 parameter buffer"), Error);
  optim::AdamW other({flat.flat_params().clone()});
  CHECK_THROWS_WITH_AS(other.write_bf16_mirror(&flat),
                       doctest::Contains("exactly the flat f32 parameter buffer"), Error);
}

TEST_CASE("bf16 weight mirror: AdamW keeps writing it across disable and re-enable") {
  nn::TransformerLM model(tiny_config(true));
  nn::FlatParameters flat(model, Device::cpu(), 5);
  optim::AdamW adamw({flat.flat_params()});
  adamw.write_bf16_mirror(&flat);
  const Tensor ids = Tensor::from_ints(std::vector<int32_t>(12, 3), {1, 12});
  auto step = [&] {
    flat.zero_grad();
    model.loss(ids, ids).backward();
    adamw.step();
  };
  step();  // no mirror yet: nothing to write
  flat.enable_bf16_mirror();
  step();
  CHECK(flat.bf16_mirror_is_current());
  flat.disable_bf16_mirror();
  step();
  flat.enable_bf16_mirror();  // a new buffer: the AdamW writes this one
  step();
  step();
  CHECK(flat.bf16_mirror_is_current());
}

namespace {
// One backward of the tiny bf16 LM (mirror on) on batch `batch_seed`; the gradients as floats.
std::vector<float> tiny_bf16_gradients(nn::TransformerLM& model, nn::FlatParameters& flat,
                                       uint64_t batch_seed) {
  std::vector<int32_t> x(2 * 12), y(2 * 12);
  CounterRng rng{batch_seed, 0};
  for (auto& v : x) v = static_cast<int32_t>(rng.next_below(40));
  for (auto& v : y) v = static_cast<int32_t>(rng.next_below(40));
  model.loss(Tensor::from_ints(x, {2, 12}), Tensor::from_ints(y, {2, 12})).backward();
  return flat.flat_grads().to_floats();
}
}  // namespace

TEST_CASE("bf16 gradients: each the f32 gradient rounded once; a second pass adds in f32 and rounds again") {
  nn::TransformerLM wide_model(tiny_config(true)), narrow_model(tiny_config(true));
  nn::FlatParameters wide(wide_model, Device::cpu(), 5), narrow(narrow_model, Device::cpu(), 5);
  wide.enable_bf16_mirror();
  narrow.enable_bf16_mirror();
  narrow.set_grad_dtype(DType::bf16);
  CHECK(narrow.grad_dtype() == DType::bf16);
  CHECK(narrow.flat_grads().dtype() == DType::bf16);
  CHECK(narrow.parameters()[0].tensor->grad().dtype() == DType::bf16);
  const std::vector<float> g1 = tiny_bf16_gradients(wide_model, wide, 21);
  // Poisoned with NaN but marked as zero (marks last until the next backward pass ends, so after the pass
  // above): every element must be overwritten, by the matmul's epilogue or by the accumulator.
  narrow.flat_grads().copy_(
      ops::cast(Tensor::full(narrow.flat_grads().shape(), NAN, DType::f32), DType::bf16));
  for (const nn::NamedParameter& p : narrow.parameters()) mark_grad_zeroed(*p.tensor);
  const std::vector<float> n1 = tiny_bf16_gradients(narrow_model, narrow, 21);
  REQUIRE(g1.size() == n1.size());
  size_t mismatches = 0, nonzero = 0;
  for (size_t i = 0; i < g1.size(); ++i) {
    if (n1[i] != static_cast<float>(bf16(g1[i]))) ++mismatches;
    if (g1[i] != 0.0f) ++nonzero;
  }
  CHECK(mismatches == 0);
  CHECK(nonzero > g1.size() / 2);

  // Without zero_grad: the second pass's gradient is added to the stored bf16 one in f32, rounded once.
  wide.zero_grad();
  const std::vector<float> g2 = tiny_bf16_gradients(wide_model, wide, 22);
  const std::vector<float> n2 = tiny_bf16_gradients(narrow_model, narrow, 22);
  mismatches = 0;
  size_t rounded = 0;  // elements where rounding the sum differs from adding the rounded parts
  for (size_t i = 0; i < g2.size(); ++i) {
    const float sum = n1[i] + g2[i];
    if (n2[i] != static_cast<float>(bf16(sum))) ++mismatches;
    if (static_cast<float>(bf16(sum)) != static_cast<float>(bf16(static_cast<float>(bf16(g2[i])) + n1[i])))
      ++rounded;
  }
  CHECK(mismatches == 0);
  MESSAGE(rounded << " of " << g2.size() << " elements tell the two roundings apart");

  // zero_grad clears the bf16 buffer too, and the next pass overwrites it again.
  narrow.zero_grad();
  const std::vector<float> cleared = narrow.flat_grads().to_floats();
  CHECK(std::all_of(cleared.begin(), cleared.end(), [](float v) { return v == 0.0f; }));
  CHECK(tiny_bf16_gradients(narrow_model, narrow, 21) == n1);
}

TEST_CASE("bf16 gradients: AdamW and clipping equal their f32 runs on the widened gradients") {
  const int64_t n = 37;  // a tail past the groups of four
  Tensor narrow_p = testing::random_tensor({n}, 50, DType::f32, 1.0), wide_p = narrow_p.clone();
  narrow_p.set_requires_grad(true);
  wide_p.set_requires_grad(true);
  optim::AdamW narrow_opt({narrow_p}), wide_opt({wide_p});
  for (int step = 0; step < 3; ++step) {
    const Tensor g = ops::cast(testing::random_tensor({n}, 51 + step, DType::f32, 4.0), DType::bf16);
    narrow_p.set_grad(g.clone());
    wide_p.set_grad(ops::cast(g, DType::f32));
    const double narrow_norm = optim::clip_grad_norm({narrow_p.grad()}, 1.0);
    const double wide_norm = optim::clip_grad_norm({wide_p.grad()}, 1.0);
    CHECK(narrow_norm == wide_norm);
    CHECK(narrow_norm > 1.0);  // clipping did scale
    // The clipped bf16 gradient is the clipped f32 one rounded to bf16; AdamW then reads the same numbers.
    CHECK(narrow_p.grad().to_floats() == ops::cast(wide_p.grad(), DType::bf16).to_floats());
    wide_p.set_grad(ops::cast(narrow_p.grad(), DType::f32));
    narrow_opt.step();
    wide_opt.step();
  }
  CHECK(narrow_p.to_floats() == wide_p.to_floats());
}

TEST_CASE("bf16 gradients train the tiny LM; fused into backward equals the plain step; bad dtypes refused") {
  TinyRun run;
  run.bf16 = true;
  run.mirror = true;
  run.grads_bf16 = true;
  run.freeze = true;
  run.steps = 4;
  const TinyResult plain = train_tiny(Device::cpu(), run);
  run.in_backward = true;
  const TinyResult fused = train_tiny(Device::cpu(), run);
  CHECK(fused.params == plain.params);
  CHECK(fused.losses == plain.losses);
  CHECK(plain.mirror_current);
  CHECK(std::all_of(fused.grads_after.begin(), fused.grads_after.end(), [](double g) { return g == 0.0; }));
  // Close to f32 gradients (the roundings are small next to AdamW's normalised step), but not identical.
  run.in_backward = false;
  run.grads_bf16 = false;
  const TinyResult f32 = train_tiny(Device::cpu(), run);
  CHECK(f32.params != plain.params);
  CHECK(testing::relative_error(plain.params, f32.params) < 1e-2);
  CHECK(plain.losses.back() == doctest::Approx(f32.losses.back()).epsilon(1e-2));

  // Too late once something holds the gradients: it would keep the old buffer.
  {
    nn::TransformerLM lm(tiny_config(true));
    nn::FlatParameters flat(lm, Device::cpu(), 1);
    optim::AdamW adamw({flat.flat_params()});
    optim::UpdateInBackward fused_update(flat, adamw);
    CHECK_THROWS_WITH_AS(flat.set_grad_dtype(DType::bf16), doctest::Contains("already in use"), Error);
    const Tensor slice = flat.flat_grads().narrow_view(0, 0, 8);
    CHECK_THROWS_WITH_AS(flat.set_grad_dtype(DType::bf16), doctest::Contains("already in use"), Error);
    flat.set_grad_dtype(DType::f32);  // no change: always fine
  }
  nn::TransformerLM model(tiny_config(false));
  nn::FlatParameters f64(model, Device::cpu(), 1, DType::f64);
  CHECK_THROWS_WITH_AS(f64.set_grad_dtype(DType::bf16), doctest::Contains("bf16 for f32 parameters"), Error);
  CHECK_THROWS_WITH_AS(f64.set_grad_dtype(DType::f32), doctest::Contains("like the parameters"), Error);
}

TEST_CASE(
    "TransformerLM::loss (fused classifier + cross-entropy) trains like cross_entropy over the logits") {
  // A 257-token vocabulary (rows padded inside the op), 2 x 12 rows in one chunk or in chunks of 7 (the last
  // one short); four AdamW steps of each model from the same initial weights.
  for (const bool bf16 : {false, true}) {
    for (const int64_t chunk : {int64_t{0}, int64_t{7}}) {
      CAPTURE(bf16);
      CAPTURE(chunk);
      nn::ModelConfig config = tiny_config(bf16);
      config.vocab_size = 257;
      config.loss_chunk_rows = chunk;
      auto train = [&](bool fused, std::vector<double>* losses) {
        nn::TransformerLM model(config);
        nn::FlatParameters flat(model, Device::cpu(), 11);
        optim::AdamWOptions options;
        options.lr = 1e-2;
        optim::AdamW adamw({flat.flat_params()}, options);
        for (int step = 0; step < 4; ++step) {
          std::vector<int32_t> x(2 * 12), y(2 * 12);
          CounterRng rng{21, static_cast<uint64_t>(step) << 20};
          for (auto& v : x) v = static_cast<int32_t>(rng.next_below(257));
          for (auto& v : y) v = static_cast<int32_t>(rng.next_below(257));
          const Tensor ids = Tensor::from_ints(x, {2, 12}), targets = Tensor::from_ints(y, {2, 12});
          // bf16: the logits as autocast's matmul returns them (rounded to bf16 once), upcast for the loss.
          auto logits = [&] {
            const Tensor product = model.forward(ids);
            return bf16 ? ops::cast(ops::cast(product, DType::bf16), DType::f32) : product;
          };
          const Tensor loss =
              fused ? model.loss(ids, targets)
                    : ops::cross_entropy(ops::reshape(logits(), {24, 257}), ops::reshape(targets, {24}));
          losses->push_back(loss.item());
          flat.zero_grad();
          loss.backward();
          adamw.step();
        }
        return flat.flat_params().to_doubles();
      };
      std::vector<double> fused_losses, plain_losses;
      const std::vector<double> fused = train(true, &fused_losses), plain = train(false, &plain_losses);
      // The same roundings (bf16 too); in chunks the weight gradient is summed in another order.
      CHECK(testing::relative_error(fused_losses, plain_losses) < 1e-6);
      CHECK(testing::relative_error(fused, plain) < 1e-6);
      CHECK(fused_losses.front() != fused_losses.back());
    }
  }
}
