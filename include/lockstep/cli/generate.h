// Sampling from a trained language model, GPT or Llama (`lockstep
// generate`): the checkpoint found and loaded as the model it holds, and
// tokens drawn one at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "lockstep/config/config.h"
#include "lockstep/io/state_dict.h"
#include "lockstep/model/gpt.h"

namespace lockstep {

// A checkpoint folder (it holds model.pt), or a run folder meaning its
// newest checkpoint. Throws ConfigError naming the path when it is neither.
std::string checkpoint_folder(const std::string& path);

struct LoadedLanguageModel {
  std::shared_ptr<Classifier> model;  // a Gpt or a Llama, in eval mode
  int64_t vocab_size = 0;
  int64_t block_size = 0;  // the longest context
  Config config;           // the run's, from the checkpoint's config.yaml
  std::string folder;
  bool bytes = true;  // trained on data.name: text (tokens are bytes)
};

// Verifies the checkpoint's manifest, reads its config and weights. Throws
// ConfigError when the checkpoint holds another model than gpt or llama,
// DataError for a corrupt or truncated checkpoint or one whose weights do
// not have the shapes its config.yaml implies.
LoadedLanguageModel load_language_model(const std::string& folder);
// Note [Untrusted model shapes]: every parameter the model section (gpt or
// llama) implies is in `state` with exactly its shape, and nothing else;
// DataError naming `folder` and the tensor otherwise. Returns the
// parameters' names; *vocab (when given) the embedding's rows.
std::set<std::string> check_language_model_shapes(const StateDict& state, const ModelConfig& model,
                                                  const std::string& folder, int64_t* vocab);

// A temperature below this samples greedily (argmax), as 0 does: dividing
// logits by it would overflow, and the distribution is its maximum anyway.
constexpr double kGreedyBelow = 1e-5;

struct SampleOptions {
  int64_t max_new_tokens = 256;
  double temperature = 1.0;  // 0 (or below kGreedyBelow): greedy (argmax)
  int64_t top_k = 0;         // 0: every token
  uint64_t seed = 0;         // the same seed, the same tokens
  int64_t vocab_limit = 0;   // > 0: draw only ids below it (a tokenizer's vocabulary
                             // inside a padded model vocabulary)
};

// Draws max_new_tokens tokens after `prompt` (cropped to the last
// block_size tokens as the context grows), calling `emit` with each as it is
// chosen; returns them. ConfigError for an empty prompt, one longer than the
// context, a token outside the vocabulary or options out of range.
// The checks sample() makes first, alone: so that a command refuses bad
// options before it prints anything.
void sample_check(int64_t vocab_size, int64_t block_size, const std::vector<int64_t>& prompt,
                  const SampleOptions& options);
// `model` maps [1, t <= block_size] ids to [1, t, vocab_size] logits.
std::vector<int64_t> sample(Classifier& model, int64_t vocab_size, int64_t block_size,
                            const std::vector<int64_t>& prompt, const SampleOptions& options,
                            const std::function<void(int64_t)>& emit = {});
// The same for a Gpt, its shape from its options.
std::vector<int64_t> gpt_sample(Gpt& model, const std::vector<int64_t>& prompt,
                                const SampleOptions& options,
                                const std::function<void(int64_t)>& emit = {});

}  // namespace lockstep
