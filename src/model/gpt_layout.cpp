#include "lockstep/model/gpt_layout.h"

#include <ATen/ATen.h>

#include <set>

#include "lockstep/util/error.h"

namespace lockstep {

// Note [GPT-2 layout]
// ~~~~~~~~~~~~~~~~~~~
// lockstep's GPT has nanoGPT's names, which are GPT2LMHeadModel's:
// transformer.wte/wpe, transformer.h.N.{ln_1, attn.c_attn, attn.c_proj,
// ln_2, mlp.c_fc, mlp.c_proj}, transformer.ln_f. Hugging Face's GPT-2 keeps
// the four projections as Conv1D, whose weight is [in, out]: the transpose
// of a Linear's. Its head (lm_head) is tied to wte, so a file holds it at
// most as a copy; OpenAI's original upload leaves out the "transformer."
// prefix and stores the attention's causal mask as attn.bias (and
// masked_bias), buffers lockstep computes instead. lockstep's GELU is the
// exact one (nanoGPT's nn.GELU()), which config.json says
// ("activation_function": "gelu"); GPT-2's own checkpoints say
// "gelu_new" (the tanh approximation): their logits differ from
// Hugging Face's by that approximation, as nanoGPT's do.
namespace {

bool conv1d(const std::string& name) {
  const auto ends = [&](const std::string& tail) {
    return name.size() >= tail.size() &&
           name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return ends(".attn.c_attn.weight") || ends(".attn.c_proj.weight") || ends(".mlp.c_fc.weight") ||
         ends(".mlp.c_proj.weight");
}

}  // namespace

NamedTensors gpt_state_to_hf(const NamedTensors& state, const GptOptions& options) {
  if (!options.bias)
    throw ConfigError(
        "--layout hf: GPT-2 has biases in every Linear and LayerNorm, this model has none "
        "(model.bias: false); export with --layout lockstep");
  NamedTensors out;
  for (const auto& [name, tensor] : state)
    out.emplace_back(name, conv1d(name) ? tensor.t().contiguous() : tensor);
  return out;
}

NamedTensors gpt_state_from_hf(const NamedTensors& hf, const std::string& source) {
  NamedTensors out;
  at::Tensor head;
  std::set<std::string> seen;
  for (const auto& [raw, tensor] : hf) {
    const std::string name = raw.rfind("transformer.", 0) == 0 ? raw : "transformer." + raw;
    const auto ends = [&](const std::string& tail) {
      return name.size() >= tail.size() &&
             name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    };
    if (raw == "lm_head.weight") {
      head = tensor;
      continue;
    }
    if (ends(".attn.bias") || ends(".attn.masked_bias")) continue;  // the causal mask
    if (!seen.insert(name).second)
      throw DataError(source + ": '" + raw + "' appears twice (with and without transformer.)");
    if (conv1d(name)) {
      if (tensor.dim() != 2)
        throw DataError(source + ": '" + raw + "' is a Conv1D weight, 2-D, not " +
                        std::to_string(tensor.dim()) + "-D");
      out.emplace_back(name, tensor.t().contiguous());
    } else {
      out.emplace_back(name, tensor);
    }
  }
  if (head.defined()) {
    at::Tensor wte;
    for (const auto& [name, tensor] : out)
      if (name == "transformer.wte.weight") wte = tensor;
    if (!wte.defined() || head.sizes() != wte.sizes() || !at::equal(head, wte))
      throw DataError(source +
                      ": lm_head.weight differs from transformer.wte.weight: lockstep's "
                      "GPT ties its head to the token embedding");
  }
  return out;
}

std::string gpt_hf_config_json(const GptOptions& o) {
  return "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
         "  \"vocab_size\": " +
         std::to_string(o.vocab_size) + ",\n  \"n_positions\": " + std::to_string(o.block_size) +
         ",\n  \"n_ctx\": " + std::to_string(o.block_size) +
         ",\n  \"n_embd\": " + std::to_string(o.n_embd) +
         ",\n  \"n_layer\": " + std::to_string(o.n_layer) +
         ",\n  \"n_head\": " + std::to_string(o.n_head) +
         ",\n  \"activation_function\": \"gelu\",\n  \"layer_norm_epsilon\": 1e-05,\n"
         "  \"tie_word_embeddings\": true\n}\n";
}

}  // namespace lockstep
