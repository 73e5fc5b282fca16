#include "lockstep/model/llama_layout.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "lockstep/util/error.h"
#include "lockstep/util/json.h"

namespace lockstep {

// Note [Llama's config.json]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// LlamaConfig's fields and the model.* keys they must equal:
//   hidden_size n_embd, num_hidden_layers n_layer, num_attention_heads
//   n_head, num_key_value_heads n_kv_head (absent: n_head),
//   intermediate_size, vocab_size (the data's vocabulary), rope_theta,
//   rms_norm_eps, tie_word_embeddings tie_embeddings (absent: false, as
//   LlamaConfig's default).
//   The rope: rope_parameters (transformers 5, which keeps rope_theta there)
//   or rope_scaling (4.x and the Hub's Llama 3.x folders), rope_type
//   "default" (model.rope_scaling none) or "llama3" (model.rope_scaling
//   llama3, its factor, low_freq_factor, high_freq_factor and
//   original_max_position_embeddings equal to the model.rope_* keys).
// And what lockstep's Llama is, refused otherwise: model_type "llama",
// hidden_act "silu", no attention or MLP biases, no other rope type or
// field, pretraining_tp 1, head_dim (when given) hidden_size /
// num_attention_heads.
// max_position_embeddings only bounds the positions: model.block_size may be at most it.
namespace {

struct Field {
  const char* json;
  const char* key;  // the model.* key, "" for the data's vocabulary
  double want;
};

// The shortest of %.15g and %.17g that reads back as `v`: config.json's
// numbers round-trip, messages stay short.
std::string number(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.15g", v);
  if (std::strtod(text, nullptr) != v) std::snprintf(text, sizeof text, "%.17g", v);
  return text;
}

bool present(JsonValue v) {
  return !v.missing() && !v.is(JsonKind::kNull);
}

// The rope fields as transformers reads them: rope_parameters (5.x) or
// rope_scaling beside a top-level rope_theta (4.x, the Hub's Llama 3.x
// folders), an old "type" as rope_type; "default" is plain rope, "llama3"
// Llama 3.1's scaling, whose four numbers must equal the model.rope_* keys.
// Returns the object holding them (missing when neither is given).
template <typename Refuse>
JsonValue check_rope(JsonValue root, const LlamaOptions& o, const Refuse& refuse) {
  const JsonValue params = root.get("rope_parameters"), scaling = root.get("rope_scaling");
  if (present(params) && present(scaling))
    refuse("both rope_parameters and rope_scaling are set: give one");
  const char* name = present(params) ? "rope_parameters" : "rope_scaling";
  const JsonValue rope = present(params) ? params : scaling;
  if (!present(rope)) {
    if (o.rope_llama3)
      refuse("no rope scaling, but model.rope_scaling is llama3 (--set model.rope_scaling=none)");
    return JsonValue();
  }
  if (!rope.is(JsonKind::kObject)) refuse(std::string(name) + " is not an object");
  const JsonValue type = present(rope.get("rope_type")) ? rope.get("rope_type") : rope.get("type");
  const std::string kind = present(type) ? std::string(type.text()) : "default";
  if (kind != "default" && kind != "llama3")
    refuse(std::string(name) + ".rope_type is '" + kind +
           "': lockstep's Llama has plain rotary embeddings or Llama 3.1's scaling (llama3)");
  const bool llama3 = kind == "llama3";
  const Field scaled[] = {
      {"factor", "model.rope_factor", o.rope_factor},
      {"low_freq_factor", "model.rope_low_freq_factor", o.rope_low_freq_factor},
      {"high_freq_factor", "model.rope_high_freq_factor", o.rope_high_freq_factor},
      {"original_max_position_embeddings", "model.rope_original_max_position_embeddings",
       o.rope_original_max_position_embeddings},
  };
  for (const JsonValue v : rope) {
    const std::string key(v.key());
    bool known = key == "rope_type" || key == "type" || key == "rope_theta";
    for (const auto& f : scaled) known = known || (llama3 && key == f.json);
    if (!known)
      refuse(std::string(name) + "." + key + " is set: lockstep's Llama reads " +
             (llama3 ? "rope_theta, factor, low_freq_factor, high_freq_factor and "
                       "original_max_position_embeddings"
                     : "rope_theta with rope_type default"));
  }
  if (llama3 != o.rope_llama3)
    refuse(std::string(name) + ".rope_type is " + kind + ", but model.rope_scaling is " +
           (o.rope_llama3 ? "llama3" : "none") +
           " (--set model.rope_scaling=" + (llama3 ? "llama3" : "none") + ")");
  if (llama3) {
    for (const auto& f : scaled) {
      JsonValue v = rope.get(f.json);
      // transformers' standardize_rope_params: a top-level
      // original_max_position_embeddings wins, else the dict's, else
      // max_position_embeddings.
      const bool context = std::string(f.json) == "original_max_position_embeddings";
      std::string shown = std::string(name) + "." + f.json;
      if (context && root.get(f.json).is(JsonKind::kNumber)) {
        v = root.get(f.json);
        shown = f.json;
      } else if (context && !present(v)) {
        v = root.get("max_position_embeddings");
        shown = "max_position_embeddings (no original_max_position_embeddings)";
      }
      if (!v.is(JsonKind::kNumber)) refuse(shown + " is missing or not a number");
      if (v.number() != f.want)
        refuse(shown + " is " + number(v.number()) + ", but " + f.key + " is " + number(f.want) +
               " (--set " + f.key + "=" + number(v.number()) + ")");
    }
  }
  const JsonValue inner = rope.get("rope_theta"), top = root.get("rope_theta");
  if (inner.is(JsonKind::kNumber) && top.is(JsonKind::kNumber) && inner.number() != top.number())
    refuse("rope_theta " + number(top.number()) + " and " + name + ".rope_theta " +
           number(inner.number()) + " differ (transformers uses the latter)");
  return rope;
}
}  // namespace

void llama_check_hf_config(const std::string& text, const LlamaOptions& o,
                           const std::string& source) {
  const JsonDocument doc(text, source);
  const JsonValue root = doc.root();
  if (!root.is(JsonKind::kObject)) throw ConfigError(source + ": not a JSON object");
  const auto refuse = [&](const std::string& why) { throw ConfigError(source + ": " + why); };
  const JsonValue type = root.get("model_type");
  if (type.text() != "llama") refuse("model_type is '" + std::string(type.text()) + "', not llama");
  const JsonValue act = root.get("hidden_act");
  if (!act.missing() && act.text() != "silu")
    refuse("hidden_act '" + std::string(act.text()) + "': lockstep's Llama is SwiGLU (silu)");
  for (const char* bias : {"attention_bias", "mlp_bias"})
    if (root.get(bias).boolean())
      refuse(std::string(bias) + " is true: lockstep's Llama has no biases");
  const JsonValue rope = check_rope(root, o, refuse);
  const auto strict = [&](const char* key, JsonKind kind) {
    const JsonValue v = root.get(key);
    if (!v.missing() && !v.is(JsonKind::kNull) && !v.is(kind))
      refuse(std::string(key) + " is not a " + (kind == JsonKind::kBool ? "boolean" : "number"));
  };
  for (const char* key : {"tie_word_embeddings", "attention_bias", "mlp_bias"})
    strict(key, JsonKind::kBool);
  for (const char* key :
       {"pretraining_tp", "max_position_embeddings", "head_dim", "attention_dropout"})
    strict(key, JsonKind::kNumber);
  const JsonValue tp = root.get("pretraining_tp");
  if (tp.is(JsonKind::kNumber) && tp.number() != 1)
    refuse("pretraining_tp is " + number(tp.number()) + ", not 1");
  const JsonValue dropout = root.get("attention_dropout");
  if (dropout.is(JsonKind::kNumber) && dropout.number() != 0)
    refuse("attention_dropout is " + number(dropout.number()) +
           ": lockstep's Llama has no dropout");
  const int64_t hd = o.n_embd / o.n_head;
  const JsonValue head_dim = root.get("head_dim");
  if (!head_dim.missing() && !head_dim.is(JsonKind::kNull) && head_dim.number() != hd)
    refuse("head_dim " + number(head_dim.number()) + " is not hidden_size / num_attention_heads (" +
           std::to_string(hd) + ")");
  const Field fields[] = {
      {"hidden_size", "model.n_embd", static_cast<double>(o.n_embd)},
      {"num_hidden_layers", "model.n_layer", static_cast<double>(o.n_layer)},
      {"num_attention_heads", "model.n_head", static_cast<double>(o.n_head)},
      {"num_key_value_heads", "model.n_kv_head", static_cast<double>(o.n_kv_head)},
      {"intermediate_size", "model.intermediate_size", static_cast<double>(o.intermediate_size)},
      {"vocab_size", "", static_cast<double>(o.vocab_size)},
      {"rope_theta", "model.rope_theta", o.rope_theta},
      {"rms_norm_eps", "model.rms_norm_eps", o.rms_norm_eps},
  };
  for (const auto& f : fields) {
    JsonValue v = root.get(f.json);
    if (std::string(f.json) == "num_key_value_heads" && (v.missing() || v.is(JsonKind::kNull)))
      v = root.get("num_attention_heads");
    if (std::string(f.json) == "rope_theta" && rope.get("rope_theta").is(JsonKind::kNumber))
      v = rope.get("rope_theta");
    if (!v.is(JsonKind::kNumber)) refuse(std::string(f.json) + " is missing or not a number");
    const double got = v.number();
    if (!(std::fabs(got - f.want) <= 1e-9 * std::fabs(f.want))) {
      // A hint only where the value could be the key's.
      const bool settable = std::isfinite(got) && got > 0;
      refuse(std::string(f.json) + " is " + number(got) + ", but " +
             (*f.key ? std::string(f.key) + " is " + number(f.want) +
                           (settable ? " (--set " + std::string(f.key) + "=" + number(got) + ")"
                                     : std::string())
                     : "the data's vocabulary has " + number(f.want) +
                           " tokens (data.vocab_size, or the tokenizer)"));
    }
  }
  const JsonValue tied = root.get("tie_word_embeddings");
  if (tied.boolean() != o.tie_embeddings)
    refuse(std::string("tie_word_embeddings is ") + (tied.boolean() ? "true" : "false") +
           ", but model.tie_embeddings is " + (o.tie_embeddings ? "true" : "false") +
           " (--set model.tie_embeddings=" + (tied.boolean() ? "true" : "false") + ")");
  const JsonValue positions = root.get("max_position_embeddings");
  if (positions.is(JsonKind::kNumber) && positions.number() < o.block_size)
    refuse("max_position_embeddings " + number(positions.number()) + " is below model.block_size " +
           std::to_string(o.block_size));
}

NamedTensors llama_state_from_hf(NamedTensors hf, const LlamaOptions& o,
                                 const std::string& source) {
  NamedTensors out;
  at::Tensor embed, head;
  for (auto& [name, t] : hf) {
    if (!at::isFloatingType(t.scalar_type()))
      throw DataError(source + ": '" + name + "' holds " +
                      std::string(c10::toString(t.scalar_type())) + ", not floating-point weights");
    t = t.to(at::kFloat);
    if (name == "model.embed_tokens.weight") embed = t;
    if (name == "lm_head.weight") head = t;
  }
  for (auto& [name, t] : hf) {
    if (o.tie_embeddings && name == "lm_head.weight") {
      if (!embed.defined())
        throw DataError(source + ": holds lm_head.weight but no model.embed_tokens.weight");
      if (t.sizes() != embed.sizes() || !at::equal(t.nan_to_num(0), embed.nan_to_num(0)))
        throw DataError(source +
                        ": lm_head.weight differs from model.embed_tokens.weight, but "
                        "the head is tied (tie_word_embeddings)");
      continue;
    }
    out.emplace_back(name, std::move(t));
  }
  return out;
}

std::string llama_hf_config_json(const LlamaOptions& o) {
  std::string j = "{\n";
  const auto add = [&](const std::string& key, const std::string& value, bool last = false) {
    j += "  \"" + key + "\": " + value + (last ? "\n" : ",\n");
  };
  add("architectures", "[\"LlamaForCausalLM\"]");
  add("model_type", "\"llama\"");
  add("hidden_act", "\"silu\"");
  add("hidden_size", std::to_string(o.n_embd));
  add("intermediate_size", std::to_string(o.intermediate_size));
  add("num_hidden_layers", std::to_string(o.n_layer));
  add("num_attention_heads", std::to_string(o.n_head));
  add("num_key_value_heads", std::to_string(o.n_kv_head));
  add("head_dim", std::to_string(o.n_embd / o.n_head));
  add("vocab_size", std::to_string(o.vocab_size));
  add("max_position_embeddings", std::to_string(o.block_size));
  add("rope_theta", number(o.rope_theta));
  if (o.rope_llama3)  // as the Hub's Llama 3.x folders write it; transformers 5 reads it too
    add("rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": " + number(o.rope_factor) +
                            ", \"low_freq_factor\": " + number(o.rope_low_freq_factor) +
                            ", \"high_freq_factor\": " + number(o.rope_high_freq_factor) +
                            ", \"original_max_position_embeddings\": " +
                            number(o.rope_original_max_position_embeddings) + "}");
  add("rms_norm_eps", number(o.rms_norm_eps));
  add("tie_word_embeddings", o.tie_embeddings ? "true" : "false");
  add("attention_bias", "false");
  add("mlp_bias", "false");
  add("initializer_range", "0.02");
  add("torch_dtype", "\"float32\"", true);
  return j + "}\n";
}

}  // namespace lockstep
