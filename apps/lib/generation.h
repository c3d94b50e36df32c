// Text generation with the key/value cache (nn/kv_cache.h): several prompts as one batch, each prompt
// prefilled on its own and the batch then advancing one token per row per step; greedy, temperature, top-k
// and top-p sampling. `generate` and train's end-of-run sample both run it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "apps/lib/tokenizer.h"
#include "core/rng.h"
#include "nn/transformer.h"

namespace tt::app {

struct SamplingOptions {
  int64_t max_tokens = 256;  // new tokens per prompt (the end-of-text id included when it stops a row)
  double temperature = 1.0;  // 0: greedy (the most likely token, the lowest id on ties)
  int64_t top_k = 0;         // sample among the k most likely tokens (0: all)
  double top_p = 1.0;        // ... and among the fewest whose probabilities reach p (1: all)
  uint64_t seed = 0;         // prompt i draws from the counter-based stream (seed, i)
  // The index of the batch's first prompt among all prompts: row r is prompt first_prompt + r, so its draws
  // do not depend on how the prompts were split into batches.
  int64_t first_prompt = 0;
  bool stop_at_end_of_text = true;
  int32_t end_of_text = -1;  // the id that ends a row (-1: none)
  int64_t vocab_limit = 0;   // choose only ids below this (a tokenizer smaller than the model's vocabulary)
  // Asked before each decoding step (optional): true ends every row there, keeping what it has (train's
  // final sample ends early on a stop request).
  std::function<bool()> stop;
  // On a CUDA device, decoding steps are replayed as one CUDA graph per batch size: the same kernels on the
  // same values, launched at once instead of one by one by the host. Not while another graph holds the
  // allocator's graph pool (train's final sample), nor where the capture fails: GenerationResult says why.
  bool cuda_graph = true;
};
// Throws one line naming the flag (--max-tokens, --temperature, --top-k, --top-p) for a value out of range.
void check_sampling_options(const SamplingOptions& options);

// The next token from one row of logits (`vocab` of them, of which ids below options.vocab_limit, when set,
// are candidates).
int32_t choose_token(const float* logits, int64_t vocab, const SamplingOptions& options, CounterRng& rng);

struct GenerationResult {
  std::vector<std::vector<int32_t>> tokens;  // per prompt: the new tokens (a final end-of-text id included)
  int64_t prompt_tokens = 0, new_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;  // prompts through the model; the steps after
  int64_t context_refills = 0;  // rows that filled the context and were restarted from their last half
  int64_t graph_steps = 0;      // decoding steps replayed from a CUDA graph (SamplingOptions::cuda_graph)
  std::string graph_declined;   // why no graph was used although asked for (empty otherwise)
};

// Called with each new token as soon as it is chosen: (prompt index, token).
using TokenCallback = std::function<void(int64_t prompt, int32_t token)>;

// Continues every prompt (non-empty token ids, each no longer than the model's context) on `device`, where
// the model's parameters live, as one batch: the same tokens as generating for each prompt alone with
// greedy choice (up to rounding, which decides only near-ties). A row whose context fills up continues from
// its last context/2 tokens, re-read. Throws one line for a prompt that is empty, too long or holds an id
// outside the vocabulary.
GenerationResult generate_tokens(const nn::TransformerLM& model,
                                 const std::vector<std::vector<int32_t>>& prompts,
                                 const SamplingOptions& options, Device device,
                                 const TokenCallback& on_token = {});

// The prompt's ids: its encoding, or the end-of-text id alone for an empty prompt (a document's start).
std::vector<int32_t> prompt_ids(const Tokenizer& tokenizer, const std::string& prompt);

// `prompt` and its continuation as text (what train writes to RUN/sample.txt): the tokenizer's end-of-text
// id stops it (with options.stop_at_end_of_text off it shows as "\n<|endoftext|>\n" instead), and ids
// beyond the tokenizer's vocabulary are never chosen.
std::string generate_text(const nn::TransformerLM& model, const Tokenizer& tokenizer,
                          const std::string& prompt, SamplingOptions options, Device device);

}  // namespace tt::app
