// model.name: llama, today's decoder as Hugging Face's LlamaForCausalLM
// computes it: token embedding, pre-RMSNorm blocks of causal self-attention
// with rotary position embeddings (rotate-half, Hugging Face's convention)
// and grouped-query attention (model.n_kv_head key/value heads, each shared
// by n_head / n_kv_head query heads), a SwiGLU MLP (down(silu(gate(x)) *
// up(x))), a final RMSNorm and the head (its own lm_head, or the token
// embedding with model.tie_embeddings). No biases, no dropout. Parameter
// names are Hugging Face's (model.embed_tokens.weight,
// model.layers.0.self_attn.q_proj.weight, ..., lm_head.weight), so a
// Hugging Face folder loads as it is and an export is one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/model/models.h"

namespace lockstep {

struct LlamaOptions {
  int64_t vocab_size = 256;
  int64_t block_size = 128;  // the longest sequence (max_position_embeddings)
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_kv_head = 4;
  int64_t n_embd = 128;
  int64_t intermediate_size = 512;
  double rope_theta = 10000;
  double rms_norm_eps = 1e-5;
  bool tie_embeddings = false;
  bool activation_checkpointing = false;
  // Llama 3.1's rope scaling (ModelConfig's rope_* keys).
  bool rope_llama3 = false;
  double rope_factor = 8;
  double rope_low_freq_factor = 1;
  double rope_high_freq_factor = 4;
  double rope_original_max_position_embeddings = 8192;
};

// The rotary inverse frequencies [head_dim / 2] (float32): 1 / theta^(2i /
// head_dim), scaled as transformers' _compute_llama3_parameters when
// rope_llama3 (Note [Llama as transformers computes it]).
at::Tensor llama_inv_freq(const LlamaOptions& options, const at::Device& device);

// LlamaOptions from the model section and the data's vocabulary;
// ConfigError when the heads do not divide (n_head | n_embd, n_kv_head |
// n_head) or the head size is odd (rotary embeddings pair its halves).
LlamaOptions llama_options(const ModelConfig& config, int64_t vocab_size);

// Every parameter of a Llama of `options`, by name, with its shape.
std::vector<std::pair<std::string, std::vector<int64_t>>> llama_parameter_shapes(
    const LlamaOptions& options);

class Llama : public Classifier {
 public:
  // Hugging Face's initialisation: Linear and Embedding weights normal(0,
  // 0.02), RMSNorm weights one. Draws from the default generator.
  explicit Llama(const LlamaOptions& options);
  // idx [batch, time <= block_size] int64 -> logits [batch, time, vocab].
  at::Tensor forward(at::Tensor idx) override;
  // The decoder layers (the embedding, final norm and head are the root unit).
  std::vector<std::shared_ptr<torch::nn::Module>> sharding_units() override;
  const LlamaOptions& options() const { return options_; }
  // FLOPs of one token's forward and backward at full context: 6 N (N the
  // weights that multiply: all but an untied embedding) plus attention's
  // 12 n_layer n_embd block_size, as for the GPT.
  double flops_per_token() const;

 private:
  struct Body;  // Hugging Face's `model`: embedding, layers, final norm
  LlamaOptions options_;
  std::shared_ptr<Body> body_;
  at::Tensor lm_head_;  // undefined when tied
};

}  // namespace lockstep
