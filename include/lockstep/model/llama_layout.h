// The Llama in Hugging Face's layout (Note [Llama's config.json],
// llama_layout.cpp): lockstep's names are LlamaForCausalLM's, so the
// weights move as they are; config.json is checked against the model
// section on the way in and written from it on the way out.
#pragma once

#include <string>

#include "lockstep/model/llama.h"
#include "lockstep/util/module_tensors.h"

namespace lockstep {

// ConfigError naming `source`, the field and the model.* key to set when
// config.json (its text) describes another model than `options`, or one
// lockstep cannot represent (another model_type, activation, rope_scaling,
// biases, a head_dim other than hidden_size / num_attention_heads).
void llama_check_hf_config(const std::string& text, const LlamaOptions& options,
                           const std::string& source);
// The weights of a Hugging Face folder for a Llama of `options`: floating
// tensors in float32, a tied head's stored lm_head.weight dropped when it
// equals the embedding. DataError naming `source` otherwise.
NamedTensors llama_state_from_hf(NamedTensors hf, const LlamaOptions& options,
                                 const std::string& source);
// config.json of LlamaForCausalLM for `options`.
std::string llama_hf_config_json(const LlamaOptions& options);

}  // namespace lockstep
