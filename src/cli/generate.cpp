#include "lockstep/cli/generate.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <limits>
#include <map>
#include <set>

#include "lockstep/checkpoint/checkpoint.h"
#include "lockstep/io/state_dict.h"
#include "lockstep/model/llama.h"
#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"

namespace lockstep {
std::string checkpoint_folder(const std::string& path) {
  if (path_exists(path + "/model.pt") || path_exists(path + "/metadata.txt")) return path;
  if (path_exists(path + "/checkpoints")) {
    if (auto newest = Checkpointer(path, 0).newest()) return *newest;
    throw ConfigError("--checkpoint '" + path + "': the run folder holds no checkpoint yet");
  }
  throw ConfigError(
      "--checkpoint '" + path +
      "': neither a checkpoint folder (with model.pt or metadata.txt) nor a run folder (with "
      "checkpoints/)" +
      (path_exists(path) ? "" : ": it does not exist"));
}

namespace {

std::string shape_text(at::IntArrayRef shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// The vocabulary: the token embedding's rows.
int64_t vocabulary(const StateDict& state, const std::string& embedding,
                   const std::string& folder) {
  int64_t vocab = 0;
  for (const auto& [name, tensor] : state)
    if (name == embedding && tensor.dim() == 2) vocab = tensor.size(0);
  if (vocab == 0) throw DataError("checkpoint '" + folder + "': model.pt has no 2-D " + embedding);
  if (vocab > (int64_t{1} << 24))
    throw DataError("checkpoint '" + folder + "': model.pt's " + embedding + " has " +
                    std::to_string(vocab) + " rows, over the 2^24 tokens data.vocab_size allows");
  return vocab;
}

}  // namespace

std::set<std::string> check_language_model_shapes(const StateDict& state, const ModelConfig& m,
                                                  const std::string& folder, int64_t* vocab_out) {
  const bool llama = is_model(m.name, BuiltinModel::kLlama);
  // Note [Untrusted model shapes]: the config comes from the checkpoint
  // folder like the weights, and a model built from it allocates what it
  // says (n_embd 4096 x block_size 131072: 3 GB from a 304 KiB file). So
  // before anything is built or written, every parameter the config
  // implies must be in model.pt with exactly its shape: the model then
  // costs what the file holds. The vocabulary is the token embedding's
  // first dimension.
  const int64_t vocab =
      vocabulary(state, llama ? "model.embed_tokens.weight" : "transformer.wte.weight", folder);
  const auto shapes = llama ? llama_parameter_shapes(llama_options(m, vocab))
                            : gpt_parameter_shapes(gpt_options(m, vocab));
  std::map<std::string, at::Tensor> by_name(state.begin(), state.end());
  std::set<std::string> parameters;
  for (const auto& [name, shape] : shapes) {
    parameters.insert(name);
    const auto it = by_name.find(name);
    if (it == by_name.end())
      throw DataError("checkpoint '" + folder + "': model.pt has no '" + name +
                      "', which the model of its config.yaml (model.name " + m.name + ", n_layer " +
                      std::to_string(m.n_layer) + ") needs");
    if (it->second.sizes() != at::IntArrayRef(shape))
      throw DataError("checkpoint '" + folder + "': model.pt's '" + name + "' is " +
                      shape_text(it->second.sizes()) + ", its config.yaml's model (block_size " +
                      std::to_string(m.block_size) + ", n_embd " + std::to_string(m.n_embd) +
                      ") needs " + shape_text(shape) +
                      " (its model section was edited, or is another run's)");
  }
  if (state.size() != parameters.size())
    for (const auto& [name, t] : state)
      if (!parameters.count(name))
        throw DataError("checkpoint '" + folder + "': model.pt holds '" + name +
                        "', which the model of its config.yaml does not have");
  if (vocab_out != nullptr) *vocab_out = vocab;
  return parameters;
}

LoadedLanguageModel load_language_model(const std::string& folder) {
  // Sharded or not: model.pt's entries (every shard file verified and read).
  const Checkpointer::Loaded checkpoint = Checkpointer::load(folder, nullptr, {"model.pt"});
  LoadedLanguageModel loaded;
  loaded.folder = folder;
  loaded.config = config_load(folder + "/config.yaml");
  const auto& m = loaded.config.model;
  if (!is_language_model(m.name))
    throw ConfigError("checkpoint '" + folder + "' holds a " + m.name +
                      " model: lockstep generate samples from model.name: gpt or llama");
  const bool llama = is_model(m.name, BuiltinModel::kLlama);
  loaded.bytes = loaded.config.data.name == DatasetKind::kText;
  const StateDict& state = checkpoint.part("model.pt");
  int64_t vocab = 0;
  const std::set<std::string> parameters = check_language_model_shapes(state, m, folder, &vocab);
  // Then the values, as a resume reads them (Note [Checkpoint values]).
  Checkpointer::check_model_values(state, parameters, folder + "/model.pt");
  if (llama) {
    loaded.model = std::make_shared<Llama>(llama_options(m, vocab));
  } else {
    loaded.model = std::make_shared<Gpt>(gpt_options(m, vocab));
  }
  loaded.vocab_size = vocab;
  loaded.block_size = m.block_size;
  state_dict_load(*loaded.model, state, folder + "/model.pt");
  loaded.model->eval();
  return loaded;
}

void sample_check(int64_t vocab_size, int64_t block_size, const std::vector<int64_t>& prompt,
                  const SampleOptions& options) {
  if (prompt.empty()) throw ConfigError("the prompt is empty: give at least one token");
  if (static_cast<int64_t>(prompt.size()) > block_size)
    throw ConfigError("the prompt is " + std::to_string(prompt.size()) +
                      " tokens, longer than the model's context of model.block_size=" +
                      std::to_string(block_size));
  for (int64_t t : prompt)
    if (t < 0 || t >= vocab_size)
      throw ConfigError("prompt token " + std::to_string(t) + " is outside the vocabulary of " +
                        std::to_string(vocab_size));
  if (!(options.temperature >= 0) || options.temperature > 100)
    throw ConfigError("--temperature must be in [0, 100] (0: greedy)");
  if (options.top_k < 0) throw ConfigError("--top-k must be >= 0 (0: every token)");
  if (options.max_new_tokens < 0) throw ConfigError("--max-new-tokens must be >= 0");
}

std::vector<int64_t> gpt_sample(Gpt& model, const std::vector<int64_t>& prompt,
                                const SampleOptions& options,
                                const std::function<void(int64_t)>& emit) {
  return sample(model, model.options().vocab_size, model.options().block_size, prompt, options,
                emit);
}

std::vector<int64_t> sample(Classifier& model, int64_t vocab_size, int64_t block_size,
                            const std::vector<int64_t>& prompt, const SampleOptions& options,
                            const std::function<void(int64_t)>& emit) {
  sample_check(vocab_size, block_size, prompt, options);
  // Below this a temperature only sharpens the distribution onto its
  // maximum, and dividing by it overflows: greedy, as 0 is.
  const bool greedy = options.temperature < kGreedyBelow;
  at::NoGradGuard no_grad;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  std::vector<int64_t> context = prompt, drawn;
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    const auto begin = context.size() > static_cast<std::size_t>(block_size)
                           ? context.end() - block_size
                           : context.begin();
    const std::vector<int64_t> window(begin, context.end());
    const auto idx = at::tensor(window, at::kLong).unsqueeze(0);
    auto logits = model.forward(idx).select(1, idx.size(1) - 1).squeeze(0).to(at::kFloat);
    if (options.vocab_limit > 0 && options.vocab_limit < logits.size(0))
      logits = logits.narrow(0, 0, options.vocab_limit);
    int64_t next = 0;
    if (greedy) {
      next = logits.argmax().item<int64_t>();
    } else {
      // In double, from the maximum down: no inf - inf, whatever the scale.
      logits = logits.to(at::kDouble);
      logits = (logits - logits.max()) / options.temperature;
      if (options.top_k > 0 && options.top_k < logits.size(0)) {
        const auto kth = std::get<0>(logits.topk(options.top_k)).min();
        logits = logits.masked_fill(logits < kth, -std::numeric_limits<double>::infinity());
      }
      next = at::multinomial(at::softmax(logits, 0), 1, false, generator).item<int64_t>();
    }
    context.push_back(next);
    if (context.size() > static_cast<std::size_t>(2 * block_size))  // only the last block is read
      context.erase(context.begin(), context.end() - block_size);
    drawn.push_back(next);
    if (emit) emit(next);
  }
  return drawn;
}

}  // namespace lockstep
