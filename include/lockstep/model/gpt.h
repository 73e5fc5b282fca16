// model.name: gpt, a decoder-only transformer as GPT-2 and nanoGPT define
// it: token and position embeddings, pre-LayerNorm blocks of causal
// self-attention and a GELU MLP, a final LayerNorm, and the output head
// tied to the token embedding. Parameter names follow nanoGPT's
// (transformer.wte.weight, transformer.h.0.attn.c_attn.weight, ...), less
// its lm_head.weight: the head is the token embedding itself, so each
// weight is one parameter and DDP reduces it once. tests/python/gpt.py is
// the same model in PyTorch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/model/models.h"

namespace lockstep {

// The shape's defaults are the model section's (model/model_config.h).
struct GptOptions {
  int64_t vocab_size = 256;
  int64_t block_size = ModelConfig{}.block_size;
  int64_t n_layer = ModelConfig{}.n_layer;
  int64_t n_head = ModelConfig{}.n_head;
  int64_t n_embd = ModelConfig{}.n_embd;
  double dropout = ModelConfig{}.dropout;
  bool bias = ModelConfig{}.bias;
  bool activation_checkpointing = ModelConfig{}.activation_checkpointing;
};

// GptOptions from the model section and the data's vocabulary; ConfigError
// when n_head does not divide n_embd.
GptOptions gpt_options(const ModelConfig& config, int64_t vocab_size);

// Every parameter a Gpt of `options` holds, by state-dict name, with its
// shape: arithmetic only, nothing allocated (a checkpoint's tensors are
// checked against it before a model is built from an untrusted config).
std::vector<std::pair<std::string, std::vector<int64_t>>> gpt_parameter_shapes(
    const GptOptions& options);

class Gpt : public Classifier {
 public:
  // GPT-2's initialisation: weights normal(0, 0.02), the residual
  // projections (attn.c_proj, mlp.c_proj) normal(0, 0.02 / sqrt(2 n_layer)),
  // biases zero, LayerNorms one and zero. Draws from the default generator.
  explicit Gpt(const GptOptions& options);
  // idx [batch, time <= block_size] int64 -> logits [batch, time, vocab].
  at::Tensor forward(at::Tensor idx) override;
  // The blocks (the embeddings, final norm and tied head are the root unit).
  std::vector<std::shared_ptr<torch::nn::Module>> sharding_units() override;
  const GptOptions& options() const { return options_; }
  // Parameters, less the position embedding (nanoGPT's count).
  int64_t parameters_without_positions() const;
  // FLOPs of one token's forward and backward at full context: 6 N plus
  // attention's 12 n_layer n_embd block_size (PaLM's estimate, as nanoGPT).
  double flops_per_token() const;

 private:
  struct Body;  // nanoGPT's `transformer`: embeddings, blocks, final LayerNorm
  GptOptions options_;
  std::shared_ptr<Body> body_;
};

}  // namespace lockstep
