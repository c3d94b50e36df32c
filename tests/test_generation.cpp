// Generation with the key/value cache against the full forward, batches against single prompts, sampling,
// and the SentencePiece tokenizer: round trips, prepared data, damaged or mismatched tokenizer.model files.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>

#include "apps/lib/data.h"
#include "apps/lib/generation.h"
#include "apps/lib/prepare.h"
#include "apps/lib/tokenizer.h"
#include "core/autograd.h"
#include "core/cuda_context.h"
#include "core/ops.h"
#include "gradcheck.h"
#include "nn/kv_cache.h"

using namespace tt;
namespace fs = std::filesystem;

namespace {

nn::ModelConfig tiny_config(int64_t vocab, int64_t context) {
  nn::ModelConfig config = nn::preset("tiny");
  config.vocab_size = vocab;
  config.context_length = context;
  return config;
}

std::vector<int32_t> some_ids(int64_t count, int64_t vocab, uint64_t seed) {
  CounterRng rng{seed, 0};
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < count; ++i) ids.push_back(static_cast<int32_t>(rng.next_below(vocab)));
  return ids;
}

// The logits of the last position of `ids` from the full forward (no cache).
std::vector<float> full_forward_last(const nn::TransformerLM& model, const std::vector<int32_t>& ids) {
  NoGradGuard no_grad;
  const int64_t n = static_cast<int64_t>(ids.size()), vocab = model.config().vocab_size;
  const std::vector<float> all = model.forward(Tensor::from_ints(ids, {1, n})).to_floats();
  return {all.end() - vocab, all.end()};
}

int32_t argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Greedy continuation recomputing the full forward at every step over the tokens the cached generator holds:
// the whole history, or after the context filled up, from where it restarted (its last context/2 tokens).
std::vector<int32_t> greedy_by_full_forward(const nn::TransformerLM& model, std::vector<int32_t> ids,
                                            int64_t tokens) {
  const int64_t capacity = model.config().context_length, keep = capacity / 2;
  size_t start = 0;
  std::vector<int32_t> out;
  for (int64_t t = 0; t < tokens; ++t) {
    // The pending token (the last) does not fit beside a full context: restart from the half before it.
    if (t > 0 && static_cast<int64_t>(ids.size() - 1 - start) == capacity) start = ids.size() - 1 - keep;
    const std::vector<int32_t> window(ids.begin() + static_cast<std::ptrdiff_t>(start), ids.end());
    const int32_t next = argmax(full_forward_last(model, window));
    ids.push_back(next);
    out.push_back(next);
  }
  return out;
}

std::string temp_dir(const std::string& name) {
  const std::string dir = (fs::temp_directory_path() / ("tt_test_generation_" + name)).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// Text with what a tokenizer must survive: several scripts, digits, tabs, runs of spaces, blank lines.
std::string corpus_text() {
  const char* words[] = {"the",  "cat",    "sat",      "on",       "a",    "mat",   "naïve",
                         "café", "日本語", "テキスト", "Ελληνικά", "🙂", "x=42;", "  ",
                         "\t",   "(1999)", "don't",    "über",     "ÆØÅ",  "end."};
  CounterRng rng{5, 0};
  std::string text;
  for (int doc = 0; doc < 60; ++doc) {
    for (int w = 0; w < 30; ++w) {
      text += words[rng.next_below(20)];
      text += w % 9 == 8 ? "\n" : " ";
    }
    text += "\n%\n";
  }
  return text;
}

// The documents a tokenizer trains on: here the whole text as one.
std::vector<std::string_view> as_texts(const std::string& text) {
  return {std::string_view(text)};
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A message on one line that names `what`.
void check_one_line_error(const std::function<void()>& run, const std::string& what) {
  try {
    run();
    FAIL("no error for " << what);
  } catch (const Error& e) {
    const std::string message = e.what();
    CAPTURE(message);
    CHECK(message.find('\n') == std::string::npos);
    CHECK(message.find(what) != std::string::npos);
  }
}

// Entry i's query j over positions 0 .. starts[i] + j of its cache row, one query at a time with the ops of
// ops::naive_attention (the per-row path forward_cached took before the batched op): f32 scores, softmax,
// the probabilities in q's dtype times the values, the result in q's dtype. Returns (n, count, heads, d_head)
// as doubles.
std::vector<double> attention_row_by_row(const Tensor& q, const Tensor& keys, const Tensor& values,
                                         const std::vector<int64_t>& rows,
                                         const std::vector<int64_t>& starts) {
  const int64_t n = q.size(0), count = q.size(1), heads = q.size(2), d_head = q.size(3);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d_head));
  std::vector<double> out;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < count; ++j) {
      const int64_t seen = starts[static_cast<size_t>(i)] + j + 1;
      // (heads, positions, d_head) of the row's first `seen` positions.
      auto held = [&](const Tensor& store) {
        const Tensor part = store.narrow_view(0, rows[static_cast<size_t>(i)], 1).narrow_view(1, 0, seen);
        return ops::contiguous(
            ops::reshape(ops::contiguous(part), {seen, heads, d_head}).transpose_view(0, 1));
      };
      const Tensor query = ops::contiguous(
          ops::reshape(ops::contiguous(q.narrow_view(0, i, 1).narrow_view(1, j, 1)), {heads, 1, d_head}));
      const Tensor probs = ops::softmax(ops::matmul(query, held(keys), false, true), scale, false);
      const Tensor o = ops::cast(ops::matmul(ops::cast(probs, q.dtype()), held(values)), q.dtype());
      const std::vector<double> values_out = o.to_doubles();  // (heads, 1, d_head)
      out.insert(out.end(), values_out.begin(), values_out.end());
    }
  }
  return out;
}

}  // namespace

TEST_CASE("greedy generation with the KV cache equals the argmax of the full forward at every step (f32)") {
  const nn::ModelConfig config = tiny_config(97, 48);
  nn::TransformerLM model(config);
  nn::FlatParameters params(model, Device::cpu(), 21);
  app::SamplingOptions greedy;
  greedy.temperature = 0;
  SUBCASE("within the context") {
    for (int64_t prompt_length : {1, 5, 17}) {
      CAPTURE(prompt_length);
      const std::vector<int32_t> prompt = some_ids(prompt_length, config.vocab_size, 100 + prompt_length);
      greedy.max_tokens = config.context_length - prompt_length;
      const app::GenerationResult result = app::generate_tokens(model, {prompt}, greedy, Device::cpu());
      CHECK(result.context_refills == 0);
      CHECK(result.tokens[0] == greedy_by_full_forward(model, prompt, greedy.max_tokens));
    }
  }
  SUBCASE("past the context: it restarts from the last half, as the reference does") {
    const std::vector<int32_t> prompt = some_ids(30, config.vocab_size, 7);
    greedy.max_tokens = 90;
    const app::GenerationResult result = app::generate_tokens(model, {prompt}, greedy, Device::cpu());
    CHECK(result.context_refills >= 2);
    CHECK(result.tokens[0] == greedy_by_full_forward(model, prompt, greedy.max_tokens));
  }
}

TEST_CASE("forward_cached's logits equal the full forward's, whatever the chunks (f32)") {
  const nn::ModelConfig config = tiny_config(61, 40);
  nn::TransformerLM model(config);
  nn::FlatParameters params(model, Device::cpu(), 4);
  const std::vector<int32_t> ids = some_ids(33, config.vocab_size, 9);
  nn::KVCache cache(config, 2, Device::cpu());
  // Row 1 in chunks of 1, 7, 1, 12 and 12 tokens (several new tokens after cached ones included); row 0
  // untouched meanwhile.
  size_t at = 0;
  for (size_t chunk : {1, 7, 1, 12, 12}) {
    const std::vector<int32_t> part(ids.begin() + static_cast<std::ptrdiff_t>(at),
                                    ids.begin() + static_cast<std::ptrdiff_t>(at + chunk));
    at += chunk;
    const std::vector<float> cached =
        model.forward_cached(Tensor::from_ints(part, {1, static_cast<int64_t>(chunk)}), cache, {1})
            .to_floats();
    const std::vector<float> full = full_forward_last(
        model, std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(at)));
    CAPTURE(at);
    REQUIRE(cached.size() == full.size());
    for (size_t v = 0; v < full.size(); ++v) CHECK(cached[v] == doctest::Approx(full[v]).epsilon(1e-4));
  }
  CHECK(cache.length(1) == 33);
  CHECK(cache.length(0) == 0);
  // A chunk that does not fit is refused before anything changes.
  CHECK_THROWS_WITH_AS(model.forward_cached(Tensor::from_ints(some_ids(8, 61, 1), {1, 8}), cache, {1}),
                       doctest::Contains("exceed the context length 40"), Error);
  CHECK(cache.length(1) == 33);
}

TEST_CASE(
    "cached_attention over ragged cache rows equals attention row by row (f32, bf16; 1 and 4 new tokens)") {
  NoGradGuard no_grad;
  const int64_t cache_rows = 5, capacity = 24, heads = 3;
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int64_t d_head : {8, 16}) {
      for (int64_t count : {1, 4}) {
        const std::string dtype_text = dtype_name(dtype);
        CAPTURE(dtype_text);
        CAPTURE(d_head);
        CAPTURE(count);
        const int64_t dim = heads * d_head;
        // Rows out of order and not all of them; one entry from position 0, one ending at the capacity.
        // Every position holds values, those past an entry's tokens too: reading one would show.
        const std::vector<int64_t> rows = {3, 0, 4, 1}, starts = {7, 0, capacity - count, 2};
        const auto n = static_cast<int64_t>(rows.size());
        const auto seed = static_cast<uint32_t>(d_head * 10 + count);
        const Tensor keys = testing::random_tensor({cache_rows, capacity, dim}, seed, dtype);
        const Tensor values = testing::random_tensor({cache_rows, capacity, dim}, seed + 1, dtype);
        const Tensor q = testing::random_tensor({n, count, heads, d_head}, seed + 2, dtype, 2.0);
        const Tensor out =
            ops::cached_attention(q, keys, values, ops::cache_entries(rows, starts, Device::cpu()));
        CHECK(out.shape() == Shape{n, count, dim});
        CHECK(out.dtype() == dtype);
        const double error =
            testing::relative_error(out.to_doubles(), attention_row_by_row(q, keys, values, rows, starts));
        // The same steps in the same dtypes: bf16 differs only where f32 sums made in another order round to
        // another bf16 value (rarely; an element one bf16 step off is about 1e-4 here).
        CHECK(error < (dtype == DType::f32 ? 1e-6 : 2e-3));
      }
    }
  }
}

TEST_CASE("forward_entries refuses entries without their table") {
  const nn::ModelConfig config = tiny_config(50, 16);
  nn::TransformerLM model(config);
  nn::FlatParameters params(model, Device::cpu(), 3);
  nn::KVCache cache(config, 2, Device::cpu());
  const Tensor ids = Tensor::from_ints({1, 2}, {2, 1});
  CHECK_THROWS_WITH_AS(model.forward_entries(ids, cache, ops::CacheEntries{{0, 1}, {0, 0}, Tensor()}),
                       doctest::Contains("need their i32 (2, 2) table"), Error);
  // The table KVCache::entries makes is taken.
  CHECK(model.forward_entries(ids, cache, cache.entries({0, 1})).shape() == Shape{2, 50});
}

TEST_CASE("rope_at gives rope's values at the rows' positions of a longer sequence (f32, f64, bf16)") {
  const int64_t len = 40, dim = 24, d_head = 8, count = 3;
  const std::vector<int32_t> starts = {0, 7, len - count, 21};
  const auto n = static_cast<int64_t>(starts.size());
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    const std::string dtype_text = dtype_name(dtype);
    CAPTURE(dtype_text);
    NoGradGuard no_grad;
    const Tensor whole = testing::random_tensor({1, len, dim}, 77, dtype);
    const std::vector<double> whole_values = whole.to_doubles();
    const std::vector<double> rotated = ops::rope(whole, d_head, 10000.0).to_doubles();
    // Row b: the whole sequence's tokens starts[b] .. starts[b] + count - 1.
    const std::vector<double> part = testing::rows_from(whole_values, starts, count, dim);
    const std::vector<double> expected = testing::rows_from(rotated, starts, count, dim);
    const Tensor x = ops::cast(Tensor::from_doubles(part, {n, count, dim}), dtype);
    const Tensor y = ops::rope_at(x, Tensor::from_ints(starts, {n}), d_head, 10000.0);
    CHECK(y.dtype() == dtype);
    CHECK(y.to_doubles() == expected);  // the same steps on the same values: equal, not close
  }
  const Tensor x = Tensor::zeros({2, 1, dim}, DType::f32);
  CHECK_THROWS_WITH_AS(ops::rope_at(x, Tensor::from_ints({0}, {1}), d_head, 1e4),
                       doctest::Contains("starts must be i32 (2)"), Error);
  CHECK_THROWS_WITH_AS(ops::rope_at(x, Tensor::from_ints({0, -1}, {2}), d_head, 1e4),
                       doctest::Contains("row 1 starts at -1"), Error);
  Tensor wants_grad = x.clone();
  wants_grad.set_requires_grad(true);
  CHECK_THROWS_WITH_AS(ops::rope_at(wants_grad, Tensor::from_ints({0, 1}, {2}), d_head, 1e4),
                       doctest::Contains("inference"), Error);
}

TEST_CASE("cache_append writes each entry's tokens at its row's start; everything else stays; bad entries") {
  auto on_cpu = [](const std::vector<int64_t>& rows, const std::vector<int64_t>& starts) {
    return ops::cache_entries(rows, starts, Device::cpu());
  };
  const int64_t cache_rows = 4, capacity = 10, dim = 6;
  for (DType dtype : {DType::f32, DType::bf16}) {
    NoGradGuard no_grad;
    const std::string dtype_text = dtype_name(dtype);
    CAPTURE(dtype_text);
    Tensor store = testing::random_tensor({cache_rows, capacity, dim}, 40, dtype);
    const std::vector<double> before = store.to_doubles();
    const std::vector<int64_t> rows = {2, 0, 3}, starts = {4, 0, 7};
    const int64_t count = 3;
    const Tensor fresh = testing::random_tensor({3, count, dim}, 41, dtype);
    ops::cache_append(store, ops::cache_entries(rows, starts, Device::cpu()), fresh);
    std::vector<double> expected = before;
    const std::vector<double> fresh_values = fresh.to_doubles();
    for (size_t i = 0; i < rows.size(); ++i) {
      for (int64_t t = 0; t < count; ++t) {
        for (int64_t e = 0; e < dim; ++e) {
          expected[static_cast<size_t>((rows[i] * capacity + starts[i] + t) * dim + e)] =
              fresh_values[static_cast<size_t>((static_cast<int64_t>(i) * count + t) * dim + e)];
        }
      }
    }
    CHECK(store.to_doubles() == expected);
    // A view of the new values (not dense) is taken as its values.
    const Tensor wide = testing::random_tensor({1, count, 2 * dim}, 42, dtype);
    ops::cache_append(store, on_cpu({1}, {5}), wide.narrow_view(2, dim, dim));
    CHECK(store.narrow_view(0, 1, 1).narrow_view(1, 5, count).to_doubles() ==
          ops::contiguous(wide.narrow_view(2, dim, dim)).to_doubles());
  }
  Tensor store = Tensor::zeros({cache_rows, capacity, dim}, DType::f32);
  const Tensor one = Tensor::zeros({2, 1, dim}, DType::f32);
  CHECK_THROWS_WITH_AS(ops::cache_append(store, on_cpu({1, 1}, {0, 3}), one),
                       doctest::Contains("given twice"), Error);
  CHECK_THROWS_WITH_AS(ops::cache_append(store, on_cpu({1, 4}, {0, 0}), one),
                       doctest::Contains("row 4 is outside the cache's 4 rows"), Error);
  CHECK_THROWS_WITH_AS(ops::cache_append(store, on_cpu({1, 2}, {0, 10}), one),
                       doctest::Contains("beyond the cache's 10 positions"), Error);
  CHECK_THROWS_WITH_AS(ops::cache_append(store, on_cpu({1}, {0}), one),
                       doctest::Contains("2 entries but 1 rows"), Error);
  const Tensor q = Tensor::zeros({2, 1, 2, 3}, DType::f32);
  CHECK_THROWS_WITH_AS(ops::cached_attention(q, store, store, on_cpu({0, 1}, {9, 10})),
                       doctest::Contains("beyond the cache's 10 positions"), Error);
  CHECK_THROWS_WITH_AS(
      ops::cached_attention(Tensor::zeros({2, 1, 2, 4}, DType::f32), store, store, on_cpu({0, 1}, {0, 0})),
      doctest::Contains("keys and values must be"), Error);
  // Inference only: with grad mode on, an input that requires grad is refused rather than silently detached.
  Tensor wants_grad = q.clone();
  wants_grad.set_requires_grad(true);
  CHECK_THROWS_WITH_AS(ops::cached_attention(wants_grad, store, store, on_cpu({0, 1}, {0, 0})),
                       doctest::Contains("inference"), Error);
}

TEST_CASE("a batch of prompts gives each prompt's tokens generated alone (greedy, rows ending early)") {
  const nn::ModelConfig config = tiny_config(89, 64);
  nn::TransformerLM model(config);
  nn::FlatParameters params(model, Device::cpu(), 33);
  const std::vector<std::vector<int32_t>> prompts = {some_ids(3, 89, 1), some_ids(11, 89, 2),
                                                     some_ids(1, 89, 3), some_ids(20, 89, 4)};
  app::SamplingOptions options;
  options.temperature = 0;
  options.max_tokens = 25;
  // The end-of-text id: a token that the first prompt's continuation reaches at its fifth step, so rows end
  // at different steps.
  options.end_of_text = app::generate_tokens(model, {prompts[0]}, options, Device::cpu()).tokens[0][4];
  const app::GenerationResult batch = app::generate_tokens(model, prompts, options, Device::cpu());
  CHECK(batch.tokens[0].size() == 5);
  int64_t total = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    CAPTURE(i);
    const app::GenerationResult alone = app::generate_tokens(model, {prompts[i]}, options, Device::cpu());
    CHECK(batch.tokens[i] == alone.tokens[0]);
    total += static_cast<int64_t>(alone.tokens[0].size());
  }
  CHECK(batch.new_tokens == total);
  // Streaming: the callback saw every token of every row, in each row's order.
  std::vector<std::vector<int32_t>> seen(prompts.size());
  app::generate_tokens(model, prompts, options, Device::cpu(),
                       [&](int64_t row, int32_t token) { seen[static_cast<size_t>(row)].push_back(token); });
  CHECK(seen == batch.tokens);
}

TEST_CASE("sampled generation: the same seed gives the same tokens, rows draw from their own streams") {
  const nn::ModelConfig config = tiny_config(50, 32);
  nn::TransformerLM model(config);
  nn::FlatParameters params(model, Device::cpu(), 8);
  app::SamplingOptions options;
  options.temperature = 1.5;
  options.top_k = 20;
  options.top_p = 0.9;
  options.max_tokens = 20;
  options.seed = 5;
  const std::vector<int32_t> prompt = some_ids(4, 50, 6);
  const app::GenerationResult a = app::generate_tokens(model, {prompt, prompt}, options, Device::cpu());
  const app::GenerationResult b = app::generate_tokens(model, {prompt, prompt}, options, Device::cpu());
  CHECK(a.tokens == b.tokens);
  CHECK(a.tokens[0] != a.tokens[1]);
  CHECK(app::generate_tokens(model, {prompt}, options, Device::cpu()).tokens[0] == a.tokens[0]);
}

TEST_CASE("choose_token: greedy, top-k, top-p, temperature and the vocabulary limit") {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, 2.5f, -1.0f, 0.0f};
  CounterRng rng{1, 0};
  app::SamplingOptions o;
  o.temperature = 0;
  CHECK(app::choose_token(logits.data(), 6, o, rng) == 1);  // ties: the lower id
  o.vocab_limit = 1;
  CHECK(app::choose_token(logits.data(), 6, o, rng) == 0);
  auto histogram = [&](const app::SamplingOptions& options) {
    std::map<int32_t, int> counts;
    for (int i = 0; i < 20000; ++i) ++counts[app::choose_token(logits.data(), 6, options, rng)];
    return counts;
  };
  app::SamplingOptions k2;
  k2.top_k = 2;
  const auto top2 = histogram(k2);
  CHECK(top2.size() == 2);
  CHECK(top2.count(1) == 1);
  CHECK(top2.count(2) == 1);
  app::SamplingOptions p;
  p.top_p = 0.5;  // 1 and 2 hold 0.33 each of the mass
  const auto nucleus = histogram(p);
  CHECK(nucleus.size() == 2);
  app::SamplingOptions all;  // plain softmax at temperature 1
  const auto counts = histogram(all);
  double z = 0;
  for (float l : logits) z += std::exp(l);
  for (int32_t id = 0; id < 6; ++id) {
    CAPTURE(id);
    const double expected = std::exp(logits[static_cast<size_t>(id)]) / z;
    const double seen = counts.count(id) ? counts.at(id) / 20000.0 : 0.0;
    CHECK(seen == doctest::Approx(expected).epsilon(0.1).scale(0.1));
  }
  app::SamplingOptions bad;
  bad.top_p = 0;
  CHECK_THROWS_WITH_AS(app::check_sampling_options(bad), doctest::Contains("--top-p"), Error);
  bad = {};
  bad.temperature = -1;
  CHECK_THROWS_WITH_AS(app::check_sampling_options(bad), doctest::Contains("--temperature"), Error);
}

TEST_CASE("generation refuses prompts that are empty, too long or outside the vocabulary") {
  const nn::ModelConfig config = tiny_config(30, 16);
  nn::TransformerLM model(config);
  nn::FlatParameters params(model, Device::cpu(), 2);
  app::SamplingOptions o;
  o.max_tokens = 3;
  CHECK_THROWS_WITH_AS(app::generate_tokens(model, {some_ids(17, 30, 1)}, o, Device::cpu()),
                       doctest::Contains("the prompt has 17 tokens, more than the model's context length 16"),
                       Error);
  CHECK_THROWS_WITH_AS(app::generate_tokens(model, {{1, 2}, {}}, o, Device::cpu()),
                       doctest::Contains("prompt 2 has no tokens"), Error);
  CHECK_THROWS_WITH_AS(app::generate_tokens(model, {{1, 30}}, o, Device::cpu()),
                       doctest::Contains("token id 30, outside the vocabulary of 30"), Error);
}

TEST_CASE("SentencePiece: decode(encode(text)) is the text, bytes unseen in training included") {
  const std::string text = corpus_text();
  const std::unique_ptr<app::Tokenizer> sp = app::train_sentencepiece(as_texts(text), 400);
  CHECK(sp->name() == "sentencepiece");
  CHECK(sp->vocab_size() == 400);
  const std::vector<std::string> samples = {
      text,
      "the cat sat on a mat\n",
      "  leading and trailing spaces  ",
      "\n\nblank lines\n\n\n",
      "tabs\tand\r\nwindows line ends\r\n",
      "never seen: Ω≈ç√∫ 中文 ﬁ Ｆｕｌｌ ｗｉｄｔｈ 🚀🙂\u00a0nbsp",
      "digits 1234567890 and x=42;",
      std::string("a NUL \0 byte and \x7f", 19),
      "",
  };
  for (const std::string& sample : samples) {
    CAPTURE(sample);
    const std::vector<int32_t> ids = sp->encode(sample);
    CHECK(std::find(ids.begin(), ids.end(), sp->end_of_text()) == ids.end());
    CHECK(sp->decode(ids) == sample);
  }
  // Trained twice on the same text: the same model.
  CHECK(app::train_sentencepiece(as_texts(text), 400)->checksum() == sp->checksum());
  // A vocabulary too small for the 256 bytes, or too large for the text, is one line.
  check_one_line_error([&] { app::train_sentencepiece(as_texts(text), 100); }, "260..65536");
  check_one_line_error([&] { app::train_sentencepiece(as_texts(text), 60000); },
                       "SentencePiece training failed");
}

TEST_CASE("TextStream releases text as tokens come, holding back characters split across byte tokens") {
  const std::unique_ptr<app::Tokenizer> bytes = app::byte_tokenizer();
  const std::string text = "añ日🙂 z";
  app::TextStream stream(*bytes, bytes->encode("ab"));
  std::string out;
  std::vector<size_t> released;
  for (int32_t id : bytes->encode(text)) {
    const std::string piece = stream.push(id);
    out += piece;
    released.push_back(out.size());
  }
  out += stream.finish();
  CHECK(out == text);
  // "ñ" is 2 bytes: nothing after its first byte, both after its second.
  CHECK(released[1] == 1);
  CHECK(released[2] == 3);

  const std::string corpus = corpus_text();
  const std::unique_ptr<app::Tokenizer> sp = app::train_sentencepiece(as_texts(corpus), 400);
  const std::string sample = "the café 日本語 🙂 Ω≈ç √ done.\n";
  const std::vector<int32_t> prompt = sp->encode("the ");
  app::TextStream sp_stream(*sp, prompt);
  std::string streamed;
  for (int32_t id : sp->encode(sample.substr(4))) {
    const std::string piece = sp_stream.push(id);
    CHECK(piece.find("\xEF\xBF\xBD") == std::string::npos);  // never a replacement character
    streamed += piece;
  }
  streamed += sp_stream.finish();
  CHECK(streamed == sample.substr(4));

  // A long text, token by token: each token decodes only the ids after the last settled point (behind an
  // anchor), so the spaces between words and the characters split across byte pieces must still come out
  // exactly as the whole text.
  std::string long_text;
  const char* words[] = {"the", "café", "日本語", "🙂", "naïve", "Straße", "x", "√2", "done."};
  for (int i = 0; i < 600; ++i)
    long_text += std::string(words[(i * 7 + i / 3) % 9]) + (i % 17 == 0 ? "\n" : " ");
  for (const app::Tokenizer* tokenizer : {bytes.get(), sp.get()}) {
    app::TextStream long_stream(*tokenizer, tokenizer->encode("the "));
    std::string out_long;
    for (int32_t id : tokenizer->encode(long_text)) {
      const std::string piece = long_stream.push(id);
      CHECK(piece.find("\xEF\xBF\xBD") == std::string::npos);
      out_long += piece;
    }
    out_long += long_stream.finish();
    CHECK(out_long == long_text);
  }
}

TEST_CASE("prepare_text with SentencePiece: documents come back, and tokenizer.model is checked") {
  const std::string dir = temp_dir("prepare");
  write_file(dir + "/corpus.txt", corpus_text());
  app::PrepareOptions options;
  options.tokenizer = "sentencepiece";
  options.vocab_size = 400;
  options.threads = 3;
  const app::PrepareStats stats = app::prepare_text(dir + "/corpus.txt", dir + "/data", "%", options);
  CHECK(stats.documents == 60);
  CHECK(stats.vocab_size == 400);
  const std::optional<app::DataMeta> meta = app::read_meta(dir + "/data");
  REQUIRE(meta.has_value());
  CHECK(meta->tokenizer == "sentencepiece");
  CHECK(meta->vocab_size == 400);
  const std::unique_ptr<app::Tokenizer> sp = app::load_data_tokenizer(dir + "/data");
  CHECK(meta->end_of_text == sp->end_of_text());
  CHECK(meta->tokenizer_checksum == sp->checksum());

  // The token files decode to the documents, each followed by the end-of-text id.
  const app::TokenFile train(dir + "/data/train.bin", 400), val(dir + "/data/val.bin", 400);
  std::vector<int32_t> train_ids(train.data(), train.data() + train.size());
  const std::string decoded = sp->decode(train_ids);
  std::string expected;
  std::istringstream in(corpus_text());
  std::string line, doc;
  int64_t index = 0;
  while (std::getline(in, line)) {
    if (line != "%") {
      doc += line + "\n";
      continue;
    }
    if (index++ % 10 != 9) expected += doc + "\n<|endoftext|>\n";
    doc.clear();
  }
  CHECK(decoded == expected);
  CHECK(val.size() > 0);

  // The same with one thread, and with the tokenizer.model reused: the same tokens.
  options.threads = 1;
  app::prepare_text(dir + "/corpus.txt", dir + "/one_thread", "%", options);
  CHECK(read_file(dir + "/one_thread/train.bin") == read_file(dir + "/data/train.bin"));
  app::PrepareOptions reuse;
  reuse.tokenizer = "sentencepiece";
  reuse.tokenizer_model = dir + "/data/tokenizer.model";
  app::prepare_text(dir + "/corpus.txt", dir + "/reused", "%", reuse);
  CHECK(read_file(dir + "/reused/train.bin") == read_file(dir + "/data/train.bin"));
  CHECK(read_file(dir + "/reused/tokenizer.model") == read_file(dir + "/data/tokenizer.model"));

  // A bytes dataset written over it drops the old tokenizer.model.
  app::prepare_text(dir + "/corpus.txt", dir + "/reused", "%");
  CHECK(!fs::exists(dir + "/reused/tokenizer.model"));
  CHECK(app::load_data_tokenizer(dir + "/reused")->name() == "bytes");
}

// The byte tokenizer's token files are each document's bytes and the end-of-text id, every tenth document
// to validation: known here without prepare_text. The input is read in batches and blocks much smaller than
// its documents and lines (a 2.4 MB document of one 1.5 MB line of two- and three-byte characters, cut
// into pieces), separators with Windows line ends, documents of whitespace only (dropped) and files
// without a final line break: each batch size gives the same files.
TEST_CASE("prepare_text streams the text: the token files do not depend on how much is read at once") {
  const std::string dir = temp_dir("stream");
  fs::create_directories(dir + "/text");
  std::vector<std::string> documents;
  std::string first, second;
  for (int d = 0; d < 40; ++d) {
    std::string doc;
    for (int line = 0; line <= d % 7; ++line)
      doc += "document " + std::to_string(d) + " line " + std::to_string(line) + (d % 5 == 2 ? "\r\n" : "\n");
    if (d == 13) {
      for (int i = 0; i < 300000; ++i) doc += "\xC3\xA9\xE6\x97\xA5";  // "é日"
      doc += "\n";
      for (int i = 0; i < 30000; ++i) doc += "a line of words after it, number " + std::to_string(i) + "\n";
    }
    documents.push_back(doc);
    std::string& file = d < 30 ? first : second;
    file += doc + (d % 4 == 1 ? "%\r\n" : "%\n");
    if (d % 9 == 4) file += " \t\n\n%\n";  // whitespace only: not a document
  }
  second.pop_back();  // the last separator line without its line break
  write_file(dir + "/text/a.txt", first);
  write_file(dir + "/text/b.txt", second + "\n" + "x" + "\n%\nlast document, no line break at the end");
  documents.push_back("x\n");
  documents.push_back("last document, no line break at the end\n");
  std::string expected_train, expected_val;
  for (size_t d = 0; d < documents.size(); ++d) {
    std::string& split = d % 10 == 9 ? expected_val : expected_train;
    for (unsigned char c : documents[d]) split.append({static_cast<char>(c), '\0'});
    split.append({'\0', '\1'});  // 256, little-endian
  }

  for (size_t batch : {size_t{32} << 20, size_t{1000}, size_t{7}}) {
    CAPTURE(batch);
    app::PrepareOptions options;
    options.batch_bytes = batch;
    options.threads = batch == 7 ? 1 : 2;
    const std::string out = dir + "/data_" + std::to_string(batch);
    const app::PrepareStats stats = app::prepare_text(dir + "/text", out, "%", options);
    CHECK(stats.documents == static_cast<int64_t>(documents.size()));
    CHECK(read_file(out + "/train.bin") == expected_train);
    CHECK(read_file(out + "/val.bin") == expected_val);
  }
}

// Below the sample's size SentencePiece learns from the documents whole, though they are read in pieces: a
// line of 1.1 MB of three-byte characters, cut into pieces at 1 MiB, gives the model trained on the text
// directly.
TEST_CASE("prepare_text trains SentencePiece on whole documents") {
  const std::string dir = temp_dir("whole_docs");
  std::string first = "a short document\nof two lines\n", long_line;
  CounterRng rng{11, 0};
  for (int i = 0; i < 380000; ++i) {
    const uint32_t c = 0x4E00 + static_cast<uint32_t>(rng.next_below(40));  // CJK: three bytes each
    long_line += {static_cast<char>(0xE0 | (c >> 12)), static_cast<char>(0x80 | ((c >> 6) & 0x3F)),
                  static_cast<char>(0x80 | (c & 0x3F))};
  }
  const std::string second = long_line + "\n";
  write_file(dir + "/corpus.txt", first + "%\n" + second + "%\n");
  app::PrepareOptions options;
  options.tokenizer = "sentencepiece";
  options.vocab_size = 500;
  options.threads = 1;
  app::prepare_text(dir + "/corpus.txt", dir + "/data", "%", options);
  const std::unique_ptr<app::Tokenizer> direct = app::train_sentencepiece({first, second}, 500, 1);
  CHECK(read_file(dir + "/data/tokenizer.model") == direct->model_bytes());
}

// Above the sample's size, SentencePiece learns from lines spread over the training documents, about that
// many bytes of them.
TEST_CASE("prepare_text trains SentencePiece on a sample of a large input") {
  const std::string dir = temp_dir("sample");
  std::string text;
  while (text.size() < 400000) text += corpus_text();
  write_file(dir + "/corpus.txt", text);
  app::PrepareOptions options;
  options.tokenizer = "sentencepiece";
  options.vocab_size = 400;
  options.tokenizer_sample_bytes = 40000;
  const app::PrepareStats stats = app::prepare_text(dir + "/corpus.txt", dir + "/data", "%", options);
  // The sample takes the budget's share of each document; a tenth of them are validation, not sampled.
  CHECK(stats.tokenizer_sample_bytes >= 30000);
  CHECK(stats.tokenizer_sample_bytes <= 40000);
  const std::unique_ptr<app::Tokenizer> sp = app::load_data_tokenizer(dir + "/data");
  CHECK(sp->vocab_size() == 400);
  const std::string sentence = "a sentence of the corpus, decoded as it was\n";
  const std::vector<int32_t> ids = sp->encode(sentence);
  CHECK(sp->decode(ids) == sentence);
  // Below it, every line of the training documents.
  int64_t training_bytes = 0, index = 0;
  std::istringstream in(text);
  std::string line, doc;
  while (std::getline(in, line)) {
    if (line != "%") {
      doc += line + "\n";
      continue;
    }
    if (index++ % 10 != 9) training_bytes += static_cast<int64_t>(doc.size());
    doc.clear();
  }
  options.tokenizer_sample_bytes = size_t{1} << 30;
  CHECK(app::prepare_text(dir + "/corpus.txt", dir + "/whole", "%", options).tokenizer_sample_bytes ==
        training_bytes);
}

TEST_CASE("a malformed, truncated or mismatched tokenizer.model is one line naming it") {
  const std::string dir = temp_dir("damaged");
  write_file(dir + "/corpus.txt", corpus_text());
  app::PrepareOptions options;
  options.tokenizer = "sentencepiece";
  options.vocab_size = 400;
  app::prepare_text(dir + "/corpus.txt", dir + "/data", "%", options);
  const std::string model_path = dir + "/data/tokenizer.model";
  const std::string good = read_file(model_path);

  check_one_line_error([&] { app::load_sentencepiece(dir + "/missing.model"); }, "does not exist");
  write_file(dir + "/text.model", "this is not a model\n");
  check_one_line_error([&] { app::load_sentencepiece(dir + "/text.model"); }, dir + "/text.model");
  write_file(dir + "/empty.model", "");
  check_one_line_error([&] { app::load_sentencepiece(dir + "/empty.model"); }, "is empty");
  write_file(dir + "/noise.model", std::string(good.size(), '\xff'));
  check_one_line_error([&] { app::load_sentencepiece(dir + "/noise.model"); },
                       "not a valid SentencePiece model");
  // Cut anywhere: refused by SentencePiece, or else by meta.json's checksum.
  for (size_t cut : {good.size() / 7, good.size() / 2, good.size() - 3}) {
    CAPTURE(cut);
    write_file(model_path, good.substr(0, cut));
    check_one_line_error([&] { app::load_data_tokenizer(dir + "/data"); }, model_path);
  }
  // Another model of the same size: the checksum tells.
  const std::string other_text = corpus_text() + "more words to make another model\n";
  write_file(model_path, app::train_sentencepiece(as_texts(other_text), 400)->model_bytes());
  check_one_line_error([&] { app::load_data_tokenizer(dir + "/data"); }, "does not match");
  // Missing beside a meta.json that names sentencepiece.
  fs::remove(model_path);
  check_one_line_error([&] { app::load_data_tokenizer(dir + "/data"); }, "tokenizer.model is missing");
  write_file(model_path, good);
  CHECK(app::load_data_tokenizer(dir + "/data")->vocab_size() == 400);
}

TEST_CASE("generate_text: the prompt and its continuation, stopped at the end-of-text id") {
  const nn::ModelConfig config = tiny_config(app::kByteVocab, 32);
  nn::TransformerLM model(config);
  nn::FlatParameters params(model, Device::cpu(), 12);
  const std::unique_ptr<app::Tokenizer> bytes = app::byte_tokenizer();
  app::SamplingOptions o;
  o.temperature = 0;
  o.max_tokens = 12;
  const std::string text = app::generate_text(model, *bytes, "The ", o, Device::cpu());
  const std::vector<int32_t> tokens =
      app::generate_tokens(model, {bytes->encode("The ")}, o, Device::cpu()).tokens[0];
  std::vector<int32_t> shown;
  for (int32_t t : tokens) {
    if (t == app::kEndOfText) break;
    shown.push_back(t);
  }
  CHECK(text == "The " + bytes->decode(shown));
  // Past the end-of-text id when asked: it shows as a marker.
  o.stop_at_end_of_text = false;
  o.max_tokens = 40;
  const std::vector<int32_t> all =
      app::generate_tokens(model, {bytes->encode("The ")}, o, Device::cpu()).tokens[0];
  CHECK(all.size() == 40);
  CHECK(app::generate_text(model, *bytes, "The ", o, Device::cpu()) == "The " + bytes->decode(all));
  // A tokenizer with more ids than the model is refused.
  const nn::ModelConfig small = tiny_config(100, 32);
  nn::TransformerLM small_model(small);
  nn::FlatParameters small_params(small_model, Device::cpu(), 12);
  CHECK_THROWS_WITH_AS(app::generate_text(small_model, *bytes, "x", o, Device::cpu()),
                       doctest::Contains("more than the model's vocabulary of 100"), Error);
}

TEST_CASE("CUDA: cached generation matches the CPU's greedy tokens (f32) and runs in bf16") {
  if (!cuda_available()) {
    MESSAGE("no CUDA device: skipped");
    return;
  }
  const nn::ModelConfig config = tiny_config(97, 48);
  nn::TransformerLM cpu_model(config), gpu_model(config);
  nn::FlatParameters cpu_params(cpu_model, Device::cpu(), 21), gpu_params(gpu_model, Device::cuda(0), 21);
  app::SamplingOptions greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 60;  // past the context: refills included
  const std::vector<int32_t> prompt = some_ids(9, config.vocab_size, 3);
  const auto on_cpu = app::generate_tokens(cpu_model, {prompt, {1, 2}}, greedy, Device::cpu());
  const auto on_gpu = app::generate_tokens(gpu_model, {prompt, {1, 2}}, greedy, Device::cuda(0));
  CHECK(on_gpu.tokens == on_cpu.tokens);
  nn::ModelConfig bf16 = config;
  bf16.precision = nn::Precision::bf16;
  nn::TransformerLM bf16_model(bf16);
  nn::FlatParameters bf16_params(bf16_model, Device::cuda(0), 21);
  const auto in_bf16 = app::generate_tokens(bf16_model, {prompt}, greedy, Device::cuda(0));
  CHECK(in_bf16.tokens[0].size() == 60);
  // bf16 rounding may change a near-tie; most tokens agree with f32.
  int64_t same = 0;
  for (size_t i = 0; i < 60; ++i) same += in_bf16.tokens[0][i] == on_cpu.tokens[0][i];
  CHECK(same >= 10);
}

TEST_CASE("CUDA: decoding steps replayed as a CUDA graph give the tokens of kernel-by-kernel steps") {
  if (!cuda_available()) {
    MESSAGE("no CUDA device: skipped");
    return;
  }
  for (nn::Precision precision : {nn::Precision::f32, nn::Precision::bf16}) {
    CAPTURE(nn::precision_name(precision));
    nn::ModelConfig config = tiny_config(97, 40);
    config.precision = precision;
    nn::TransformerLM model(config);
    nn::FlatParameters params(model, Device::cuda(0), 23);
    if (precision == nn::Precision::bf16) params.enable_bf16_mirror();
    const std::vector<std::vector<int32_t>> prompts = {some_ids(5, 97, 1), some_ids(17, 97, 2),
                                                       some_ids(1, 97, 3), some_ids(30, 97, 4)};
    for (double temperature : {0.0, 1.0}) {
      CAPTURE(temperature);
      app::SamplingOptions options;
      options.temperature = temperature;
      options.top_k = 30;
      options.seed = 9;
      options.max_tokens = 70;  // past the context of 40: rows refill their caches between graph replays
      options.cuda_graph = false;
      // The end-of-text id: the first prompt's 12th token, so rows end at different steps and the batch
      // shrinks (a graph for each new batch size).
      options.end_of_text = app::generate_tokens(model, {prompts[0]}, options, Device::cuda(0)).tokens[0][11];
      const app::GenerationResult by_kernel = app::generate_tokens(model, prompts, options, Device::cuda(0));
      options.cuda_graph = true;
      const app::GenerationResult by_graph = app::generate_tokens(model, prompts, options, Device::cuda(0));
      CHECK(by_kernel.graph_steps == 0);
      CHECK(by_graph.graph_steps > 20);
      CHECK(by_graph.context_refills > 0);
      CHECK(by_graph.tokens == by_kernel.tokens);
      CHECK(by_graph.graph_declined.empty());
    }
  }
}
