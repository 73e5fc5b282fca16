// lockstep's GPT in Hugging Face's GPT-2 layout and back (Note [GPT-2
// layout], gpt_layout.cpp): model.safetensors with GPT2LMHeadModel's names
// and Conv1D's [in, out] weights, and its config.json.
#pragma once

#include <string>

#include "lockstep/model/gpt.h"
#include "lockstep/util/module_tensors.h"

namespace lockstep {

// lockstep's state dict (nanoGPT's names, Linear [out, in]) -> Hugging
// Face's (the same names, the four Conv1D weights transposed; the head is
// the token embedding, not stored). Throws ConfigError for bias: false
// (GPT-2 has biases everywhere).
NamedTensors gpt_state_to_hf(const NamedTensors& state, const GptOptions& options);
// Hugging Face's -> lockstep's: names with or without "transformer.", the
// attention's mask buffers (attn.bias, attn.masked_bias) dropped, a stored
// lm_head.weight required to equal wte (a tied head). DataError naming
// `source` and the entry for anything that does not fit.
NamedTensors gpt_state_from_hf(const NamedTensors& hf, const std::string& source);
// config.json of GPT2LMHeadModel for `options`.
std::string gpt_hf_config_json(const GptOptions& options);

}  // namespace lockstep
