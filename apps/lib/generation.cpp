#include "apps/lib/generation.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <sstream>

#include "base/error.h"
#include "core/allocator.h"
#include "core/cuda_context.h"
#include "core/cuda_graph.h"
#include "core/pinned_upload.h"
#include "nn/kv_cache.h"

namespace tt::app {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Each prompt's draws: counters prompt * 2^40 onwards of the seed's stream.
CounterRng prompt_rng(uint64_t seed, int64_t prompt) {
  return CounterRng{seed, static_cast<uint64_t>(prompt) << 40};
}

// A decoding step (one new token for each of n rows) replayed as a CUDA graph: the ids and the cache entries
// are copied into the graph's input tensors, then one launch runs every layer. The graph is captured at the
// second step of a batch size, so that the first, run kernel by kernel, does the matmuls' one-time set-up
// outside the capture, and again when rows end and the batch shrinks.
class DecodeGraph {
 public:
  DecodeGraph(const nn::TransformerLM& model, nn::KVCache& cache)
      : model_(model), cache_(cache), upload_(cache.device()) {
    // The allocator keeps one graph pool per device; a second graph would share the first one's blocks.
    if (graph_pool_held(cache.device()))
      declined_ = "another CUDA graph (the training step's) holds the device's graph memory pool";
  }

  // The logits (n, vocab) of rows `active` (distinct, each with room for one more token) after their next
  // tokens `next`; the cache advances by one token per row.
  std::vector<float> step(const std::vector<int32_t>& next, const std::vector<int64_t>& active) {
    const auto n = static_cast<int64_t>(active.size());
    const bool size_seen = n == previous_rows_;
    previous_rows_ = n;
    if (!declined_.empty() || (n != graph_rows_ && (!size_seen || !capture(active)))) {
      return model_.forward_cached(Tensor::from_ints(next, {n, 1}, cache_.device()), cache_, active)
          .to_floats();
    }
    for (int64_t row : active)
      TT_ASSERT(cache_.length(row) < cache_.capacity(), "DecodeGraph: a row's context is full");
    upload_.ints_into(next, ids_);
    cache_.entries(active, table_);
    graph_->replay();
    ++replays_;
    std::vector<float> logits = logits_.to_floats();
    for (int64_t row : active) cache_.advance(row, 1);
    return logits;
  }
  int64_t replays() const { return replays_; }
  // Why the steps run kernel by kernel (empty while graphs are used).
  const std::string& declined() const { return declined_; }

 private:
  // Captures the step for `active`'s number of rows; false, with declined_ saying why, when it cannot be
  // captured (decoding then goes on kernel by kernel: a capture runs nothing, so the cache is untouched).
  bool capture(const std::vector<int64_t>& active) {
    const auto n = static_cast<int64_t>(active.size());
    graph_.reset();  // its pool goes back before the next capture takes one
    logits_ = Tensor();
    graph_rows_ = -1;
    // The kernel-by-kernel steps' freed blocks go back to the driver: the capture allocates from its own
    // pool, and could not use them.
    synchronize(cache_.device());
    empty_cache(cache_.device());
    ids_ = Tensor::empty({n, 1}, DType::i32, cache_.device());
    table_ = Tensor::empty({2, n}, DType::i32, cache_.device());
    // The entries' values at the capture only pass the ops' checks; every replay reads table_.
    ops::CacheEntries entries{active, {}, table_};
    for (int64_t row : active) entries.starts.push_back(cache_.length(row));
    try {
      auto graph = std::make_unique<CudaGraph>(cache_.device());
      graph->capture([&] { logits_ = model_.forward_entries(ids_, cache_, entries); });
      graph_ = std::move(graph);
    } catch (const std::exception& e) {
      logits_ = Tensor();
      declined_ = std::string("its step could not be captured as a CUDA graph: ") + e.what();
      return false;
    }
    graph_rows_ = n;
    return true;
  }

  const nn::TransformerLM& model_;
  nn::KVCache& cache_;
  PinnedUpload upload_;
  std::string declined_;
  int64_t previous_rows_ = -1, graph_rows_ = -1, replays_ = 0;
  Tensor ids_, table_, logits_;  // the graph's inputs and output, at fixed addresses
  std::unique_ptr<CudaGraph> graph_;
};

}  // namespace

void check_sampling_options(const SamplingOptions& o) {
  auto text = [](double v) {  // as given ("0", "1.5"), not to_string's six decimals
    std::ostringstream out;
    out << v;
    return out.str();
  };
  TT_CHECK(o.max_tokens >= 0, "--max-tokens must not be negative, got " + std::to_string(o.max_tokens));
  TT_CHECK(std::isfinite(o.temperature) && o.temperature >= 0,
           "--temperature must be a finite number >= 0 (0: greedy), got " + text(o.temperature));
  TT_CHECK(o.top_k >= 0, "--top-k must not be negative (0: no limit), got " + std::to_string(o.top_k));
  TT_CHECK(o.top_p > 0 && o.top_p <= 1, "--top-p must be in (0, 1] (1: no limit), got " + text(o.top_p));
  TT_CHECK(o.vocab_limit >= 0, "vocab_limit must not be negative");
}

int32_t choose_token(const float* logits, int64_t vocab, const SamplingOptions& options, CounterRng& rng) {
  const int64_t n = options.vocab_limit > 0 ? std::min(vocab, options.vocab_limit) : vocab;
  TT_CHECK(n > 0, "no token to choose from");
  // A NaN counts as -inf (a model of finite weights does not produce one); ties go to the lower id.
  auto key = [&](int32_t i) { return std::isnan(logits[i]) ? -INFINITY : logits[i]; };
  auto before = [&](int32_t a, int32_t b) { return key(a) > key(b) || (key(a) == key(b) && a < b); };
  if (options.temperature == 0 || options.top_k == 1) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; ++i)
      if (before(i, best)) best = i;
    return best;
  }
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  int64_t kept = options.top_k > 0 ? std::min(options.top_k, n) : n;
  if (kept < n || options.top_p < 1)
    std::partial_sort(order.begin(), order.begin() + kept, order.end(), before);
  double top = -INFINITY;
  for (int64_t i = 0; i < kept; ++i) top = std::max(top, static_cast<double>(key(order[i])));
  TT_CHECK(std::isfinite(top), "the logits are not finite: the model's weights are damaged");
  std::vector<double> weights(static_cast<size_t>(kept));
  double total = 0;
  for (int64_t i = 0; i < kept; ++i) {
    weights[i] = std::exp((static_cast<double>(key(order[i])) - top) / options.temperature);
    total += weights[i];
  }
  if (options.top_p < 1) {
    // The fewest most likely tokens whose probabilities reach top_p (at least one).
    double mass = 0;
    int64_t cut = 0;
    while (cut < kept && mass < options.top_p * total) mass += weights[cut++];
    kept = std::max<int64_t>(1, cut);
    total = mass;
  }
  double u = rng.next_double() * total;
  for (int64_t i = 0; i < kept; ++i) {
    if ((u -= weights[i]) < 0) return order[i];
  }
  return order[kept - 1];  // rounding left u at the very end
}

GenerationResult generate_tokens(const nn::TransformerLM& model,
                                 const std::vector<std::vector<int32_t>>& prompts,
                                 const SamplingOptions& options, Device device,
                                 const TokenCallback& on_token) {
  check_sampling_options(options);
  const nn::ModelConfig& config = model.config();
  const int64_t rows = static_cast<int64_t>(prompts.size()), vocab = config.vocab_size;
  GenerationResult result;
  result.tokens.resize(prompts.size());
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<int32_t>& p = prompts[static_cast<size_t>(r)];
    const std::string which = rows > 1 ? "prompt " + std::to_string(r + 1) : "the prompt";
    TT_CHECK(!p.empty(), which + " has no tokens");
    TT_CHECK(static_cast<int64_t>(p.size()) <= config.context_length,
             which + " has " + std::to_string(p.size()) + " tokens, more than the model's context length " +
                 std::to_string(config.context_length));
    for (int32_t id : p)
      TT_CHECK(id >= 0 && id < vocab, which + " holds token id " + std::to_string(id) +
                                          ", outside the vocabulary of " + std::to_string(vocab));
    result.prompt_tokens += static_cast<int64_t>(p.size());
  }
  if (rows == 0 || options.max_tokens == 0) return result;

  nn::KVCache cache(config, rows, device);
  std::vector<std::vector<int32_t>> history(prompts);  // each row's tokens; the last one not yet in the cache
  std::vector<CounterRng> rngs;
  for (int64_t r = 0; r < rows; ++r) rngs.push_back(prompt_rng(options.seed, options.first_prompt + r));
  std::vector<int64_t> active;
  // Takes row r's next token from its logits; false when the row is done.
  auto take = [&](int64_t r, const float* logits) {
    const int32_t token = choose_token(logits, vocab, options, rngs[static_cast<size_t>(r)]);
    history[static_cast<size_t>(r)].push_back(token);
    std::vector<int32_t>& mine = result.tokens[static_cast<size_t>(r)];
    mine.push_back(token);
    ++result.new_tokens;
    if (on_token) on_token(r, token);
    const bool ended = options.stop_at_end_of_text && token == options.end_of_text;
    return !ended && static_cast<int64_t>(mine.size()) < options.max_tokens;
  };
  auto ids_tensor = [&](const std::vector<int32_t>& ids, int64_t n) {
    return Tensor::from_ints(ids, {n, static_cast<int64_t>(ids.size()) / n}, device);
  };

  // Prompts of any lengths: each prefilled on its own.
  const auto prefill_start = std::chrono::steady_clock::now();
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> logits =
        model.forward_cached(ids_tensor(prompts[static_cast<size_t>(r)], 1), cache, {r}).to_floats();
    if (take(r, logits.data())) active.push_back(r);
  }
  result.prefill_seconds = seconds_since(prefill_start);

  std::unique_ptr<DecodeGraph> graph;
  if (options.cuda_graph && device.is_cuda()) graph = std::make_unique<DecodeGraph>(model, cache);
  const auto decode_start = std::chrono::steady_clock::now();
  while (!active.empty() && !(options.stop && options.stop())) {
    std::vector<int32_t> next;
    for (int64_t r : active) {
      std::vector<int32_t>& seen = history[static_cast<size_t>(r)];
      if (cache.length(r) == cache.capacity()) {
        // The context is full: start again from the last half of it (RoPE positions from 0 again).
        cache.reset(r);
        const int64_t keep = cache.capacity() / 2;
        if (keep > 0) {
          const std::vector<int32_t> tail(seen.end() - 1 - keep, seen.end() - 1);
          model.forward_cached(ids_tensor(tail, 1), cache, {r});
        }
        ++result.context_refills;
      }
      next.push_back(seen.back());
    }
    const int64_t n = static_cast<int64_t>(active.size());
    const std::vector<float> logits =
        graph ? graph->step(next, active)
              : model.forward_cached(ids_tensor(next, n), cache, active).to_floats();
    std::vector<int64_t> still;
    for (int64_t i = 0; i < n; ++i)
      if (take(active[static_cast<size_t>(i)], logits.data() + i * vocab))
        still.push_back(active[static_cast<size_t>(i)]);
    active = std::move(still);
  }
  result.decode_seconds = seconds_since(decode_start);
  if (graph) {
    result.graph_steps = graph->replays();
    result.graph_declined = graph->declined();
  }
  return result;
}

std::vector<int32_t> prompt_ids(const Tokenizer& tokenizer, const std::string& prompt) {
  std::vector<int32_t> ids = tokenizer.encode(prompt);
  if (ids.empty()) ids.push_back(tokenizer.end_of_text());
  return ids;
}

std::string generate_text(const nn::TransformerLM& model, const Tokenizer& tokenizer,
                          const std::string& prompt, SamplingOptions options, Device device) {
  TT_CHECK(tokenizer.vocab_size() <= model.config().vocab_size,
           "the " + tokenizer.name() + " tokenizer has " + std::to_string(tokenizer.vocab_size()) +
               " ids, more than the model's vocabulary of " + std::to_string(model.config().vocab_size));
  options.end_of_text = tokenizer.end_of_text();
  options.vocab_limit = tokenizer.vocab_size();
  const std::vector<int32_t> ids = prompt_ids(tokenizer, prompt);
  const GenerationResult result = generate_tokens(model, {ids}, options, device);
  TextStream stream(tokenizer, ids);
  std::string text = prompt;
  for (int32_t token : result.tokens[0]) {
    if (token == options.end_of_text && options.stop_at_end_of_text) break;
    text += stream.push(token);
  }
  return text + stream.finish();
}

}  // namespace tt::app
