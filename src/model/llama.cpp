#include "lockstep/model/llama.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/container/modulelist.h>

#include <cmath>

#include "lockstep/model/recompute.h"
#include "lockstep/util/error.h"
#include "lockstep/util/torch_compat.h"
#include "lockstep/util/unit_call.h"

namespace lockstep {

// Note [Llama as transformers computes it]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Each step follows modeling_llama.py (transformers 4.x and 5.x alike):
//   RMSNorm: in float32, x * rsqrt(mean(x^2) + eps), back to the input's
//     dtype, then times the weight;
//   rotary embeddings: inv_freq = 1 / theta^(2i / head_dim) in float32
//     (with Llama 3.1's scaling, rope_type llama3: wavelengths 2 pi /
//     inv_freq over original_max_position_embeddings / low_freq_factor
//     divided by factor, under .../ high_freq_factor kept, blended in
//     between: transformers' _compute_llama3_parameters, op for op),
//     angles = position x inv_freq, cos and sin of [angles, angles] in the
//     activations' dtype, q' = q cos + rotate_half(q) sin with
//     rotate_half(x) = [-x2, x1] (the halves of the head, Hugging Face's
//     order; Meta's original checkpoints interleave pairs and are permuted
//     by transformers' conversion script, so a Hugging Face folder needs no
//     permutation here);
//   grouped-query attention: key/value head j serves query heads
//     j r .. j r + r - 1 (repeat_kv: each repeated r = n_head / n_kv_head
//     times in place), causal, scaled by 1/sqrt(head_dim);
//   MLP: down_proj(silu(gate_proj(x)) * up_proj(x)).
// tests/multiproc/llama.sh checks logits and 20 training steps against
// transformers' LlamaForCausalLM.
namespace {

// A module holding one `weight` (a projection, the embedding, the head):
// LibTorch's parameter names have no dots, Hugging Face's names do.
class Weight : public torch::nn::Module {
 public:
  explicit Weight(std::vector<int64_t> shape) {
    weight = register_parameter("weight", at::empty(shape));
  }
  at::Tensor weight;
};

at::Tensor weight(torch::nn::Module& m, const std::string& name, std::vector<int64_t> shape) {
  return m.register_module(name, std::make_shared<Weight>(std::move(shape)))->weight;
}

class RmsNorm : public torch::nn::Module {
 public:
  RmsNorm(int64_t n, double eps) : eps_(eps) {
    weight_ = register_parameter("weight", at::ones({n}));
  }
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor h = x.to(at::kFloat);
    const at::Tensor normed = h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps_);
    return weight_ * normed.to(x.scalar_type());
  }

 private:
  double eps_;
  at::Tensor weight_;
};

// [t, head_dim] cos and sin of the rotary angles, in `dtype`.
std::pair<at::Tensor, at::Tensor> rotary(int64_t t, const LlamaOptions& o, at::ScalarType dtype,
                                         const at::Device& device) {
  const at::Tensor inv_freq = llama_inv_freq(o, device);
  const at::Tensor positions = at::arange(t, at::dtype(at::kLong).device(device)).to(at::kFloat);
  const at::Tensor angles = at::outer(positions, inv_freq);
  const at::Tensor both = at::cat({angles, angles}, -1);
  return {both.cos().to(dtype), both.sin().to(dtype)};
}

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

class Attention : public torch::nn::Module {
 public:
  explicit Attention(const LlamaOptions& o) : o_(o), hd_(o.n_embd / o.n_head) {
    q_proj = weight(*this, "q_proj", {o.n_head * hd_, o.n_embd});
    k_proj = weight(*this, "k_proj", {o.n_kv_head * hd_, o.n_embd});
    v_proj = weight(*this, "v_proj", {o.n_kv_head * hd_, o.n_embd});
    o_proj = weight(*this, "o_proj", {o.n_embd, o.n_head * hd_});
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    const int64_t b = x.size(0), t = x.size(1);
    const auto heads = [&](const at::Tensor& w, int64_t n) {
      return at::linear(x, w).view({b, t, n, hd_}).transpose(1, 2);
    };
    at::Tensor q = heads(q_proj, o_.n_head), k = heads(k_proj, o_.n_kv_head),
               v = heads(v_proj, o_.n_kv_head);
    q = q * cos + rotate_half(q) * sin;
    k = k * cos + rotate_half(k) * sin;
    const int64_t r = o_.n_head / o_.n_kv_head;
    if (r > 1) {
      k = k.repeat_interleave(r, 1);
      v = v.repeat_interleave(r, 1);
    }
    at::Tensor y = causal_attention(q, k, v, 0.0, is_training());
    y = y.transpose(1, 2).contiguous().view({b, t, o_.n_head * hd_});
    return at::linear(y, o_proj);
  }
  at::Tensor q_proj, k_proj, v_proj, o_proj;

 private:
  LlamaOptions o_;
  int64_t hd_;
};

class Mlp : public torch::nn::Module {
 public:
  explicit Mlp(const LlamaOptions& o) {
    gate_proj = weight(*this, "gate_proj", {o.intermediate_size, o.n_embd});
    up_proj = weight(*this, "up_proj", {o.intermediate_size, o.n_embd});
    down_proj = weight(*this, "down_proj", {o.n_embd, o.intermediate_size});
  }
  at::Tensor forward(const at::Tensor& x) {
    return at::linear(at::silu(at::linear(x, gate_proj)) * at::linear(x, up_proj), down_proj);
  }
  at::Tensor gate_proj, up_proj, down_proj;
};

class DecoderLayer : public torch::nn::Module {
 public:
  explicit DecoderLayer(const LlamaOptions& o) {
    self_attn = register_module("self_attn", std::make_shared<Attention>(o));
    mlp = register_module("mlp", std::make_shared<Mlp>(o));
    input_layernorm =
        register_module("input_layernorm", std::make_shared<RmsNorm>(o.n_embd, o.rms_norm_eps));
    post_attention_layernorm = register_module("post_attention_layernorm",
                                               std::make_shared<RmsNorm>(o.n_embd, o.rms_norm_eps));
  }
  at::Tensor forward(at::Tensor x, const at::Tensor& cos, const at::Tensor& sin) {
    x = x + self_attn->forward(input_layernorm->forward(x), cos, sin);
    return x + mlp->forward(post_attention_layernorm->forward(x));
  }
  std::shared_ptr<Attention> self_attn;
  std::shared_ptr<Mlp> mlp;
  std::shared_ptr<RmsNorm> input_layernorm, post_attention_layernorm;
};

}  // namespace

struct Llama::Body : torch::nn::Module {
  explicit Body(const LlamaOptions& o) {
    embed_tokens = weight(*this, "embed_tokens", {o.vocab_size, o.n_embd});
    layers = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < o.n_layer; ++i) {
      auto layer = std::make_shared<DecoderLayer>(o);
      layers->push_back(layer);
      decoder.push_back(layer);
    }
    norm = register_module("norm", std::make_shared<RmsNorm>(o.n_embd, o.rms_norm_eps));
  }
  at::Tensor embed_tokens;
  torch::nn::ModuleList layers{nullptr};
  std::vector<std::shared_ptr<DecoderLayer>> decoder;
  std::shared_ptr<RmsNorm> norm;
};

at::Tensor llama_inv_freq(const LlamaOptions& o, const at::Device& device) {
  const int64_t head_dim = o.n_embd / o.n_head;
  const at::Tensor steps =
      at::arange(0, head_dim, 2, at::dtype(at::kLong).device(device)).to(at::kFloat) /
      static_cast<double>(head_dim);
  const at::Tensor inv_freq = at::pow(o.rope_theta, steps).reciprocal();
  if (!o.rope_llama3) return inv_freq;
  // transformers' operations in its order (a Python scalar over a tensor is
  // reciprocal(tensor) * scalar), so that the frequencies are its own bits.
  const double factor = o.rope_factor, low = o.rope_low_freq_factor, high = o.rope_high_freq_factor,
               context = o.rope_original_max_position_embeddings;
  const double low_freq_wavelen = context / low, high_freq_wavelen = context / high;
  const at::Tensor wavelen = inv_freq.reciprocal() * (2 * M_PI);
  const at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq);
  const at::Tensor smooth = (wavelen.reciprocal() * context - low) / (high - low);
  const at::Tensor smoothed = at::rsub(smooth, 1) * scaled / factor + smooth * scaled;
  const at::Tensor medium =
      at::logical_not(wavelen < high_freq_wavelen) * at::logical_not(wavelen > low_freq_wavelen);
  return at::where(medium, smoothed, scaled);
}

LlamaOptions llama_options(const ModelConfig& c, int64_t vocab_size) {
  const int64_t kv = c.n_kv_head > 0 ? c.n_kv_head : c.n_head;
  if (c.n_embd % c.n_head != 0)
    throw ConfigError("model.n_head=" + std::to_string(c.n_head) +
                      " must divide model.n_embd=" + std::to_string(c.n_embd));
  if ((c.n_embd / c.n_head) % 2 != 0)
    throw ConfigError(
        "model.name: llama needs an even head size (rotary embeddings pair its "
        "halves): model.n_embd / model.n_head is " +
        std::to_string(c.n_embd / c.n_head));
  if (c.n_head % kv != 0)
    throw ConfigError("model.n_kv_head=" + std::to_string(kv) +
                      " must divide model.n_head=" + std::to_string(c.n_head) +
                      " (each key/value head serves a group of query heads)");
  if (vocab_size < 1) throw ConfigError("model.name: llama needs a vocabulary from the data");
  if (c.dropout > 0)
    throw ConfigError(
        "model.dropout: lockstep's Llama has no dropout (as transformers' "
        "attention_dropout 0); leave it 0");
  LlamaOptions o;
  o.vocab_size = vocab_size;
  o.block_size = c.block_size;
  o.n_layer = c.n_layer;
  o.n_head = c.n_head;
  o.n_kv_head = kv;
  o.n_embd = c.n_embd;
  o.intermediate_size = c.intermediate_size > 0 ? c.intermediate_size : 4 * c.n_embd;
  o.rope_theta = c.rope_theta;
  o.rms_norm_eps = c.rms_norm_eps;
  o.tie_embeddings = c.tie_embeddings;
  o.activation_checkpointing = c.activation_checkpointing;
  o.rope_llama3 = c.rope_scaling == RopeScaling::kLlama3;
  if (o.rope_llama3 && !(c.rope_high_freq_factor > c.rope_low_freq_factor))
    throw ConfigError(
        "model.rope_high_freq_factor=" + std::to_string(c.rope_high_freq_factor) +
        " must be above model.rope_low_freq_factor=" + std::to_string(c.rope_low_freq_factor) +
        " (the band between them is blended)");
  o.rope_factor = c.rope_factor;
  o.rope_low_freq_factor = c.rope_low_freq_factor;
  o.rope_high_freq_factor = c.rope_high_freq_factor;
  o.rope_original_max_position_embeddings =
      static_cast<double>(c.rope_original_max_position_embeddings);
  return o;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> llama_parameter_shapes(
    const LlamaOptions& o) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  const int64_t e = o.n_embd, hd = o.n_embd / o.n_head, i = o.intermediate_size;
  shapes.push_back({"model.embed_tokens.weight", {o.vocab_size, e}});
  for (int64_t l = 0; l < o.n_layer; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    shapes.push_back({p + "self_attn.q_proj.weight", {o.n_head * hd, e}});
    shapes.push_back({p + "self_attn.k_proj.weight", {o.n_kv_head * hd, e}});
    shapes.push_back({p + "self_attn.v_proj.weight", {o.n_kv_head * hd, e}});
    shapes.push_back({p + "self_attn.o_proj.weight", {e, o.n_head * hd}});
    shapes.push_back({p + "mlp.gate_proj.weight", {i, e}});
    shapes.push_back({p + "mlp.up_proj.weight", {i, e}});
    shapes.push_back({p + "mlp.down_proj.weight", {e, i}});
    shapes.push_back({p + "input_layernorm.weight", {e}});
    shapes.push_back({p + "post_attention_layernorm.weight", {e}});
  }
  shapes.push_back({"model.norm.weight", {e}});
  if (!o.tie_embeddings) shapes.push_back({"lm_head.weight", {o.vocab_size, e}});
  return shapes;
}

Llama::Llama(const LlamaOptions& options) : options_(options) {
  body_ = register_module("model", std::make_shared<Body>(options));
  if (!options.tie_embeddings)
    lm_head_ = weight(*this, "lm_head", {options.vocab_size, options.n_embd});
  at::NoGradGuard no_grad;
  for (auto& p : named_parameters()) {
    if (p.key().size() > 11 && p.key().compare(p.key().size() - 11, 11, "norm.weight") == 0)
      continue;
    p.value().normal_(0, 0.02);
  }
}

at::Tensor Llama::forward(at::Tensor idx) {
  if (idx.dim() != 2) throw ConfigError("llama: tokens must be [batch, time]");
  const int64_t t = idx.size(1);
  if (t > options_.block_size)
    throw ConfigError(
        "llama: a sequence of " + std::to_string(t) +
        " tokens is longer than model.block_size=" + std::to_string(options_.block_size));
  at::Tensor x = at::embedding(body_->embed_tokens, idx);
  const auto angles = rotary(t, options_, x.scalar_type(), x.device());
  const at::Tensor &cos = angles.first, &sin = angles.second;
  for (const auto& layer : body_->decoder) {
    x = call_unit(*layer, [&]() -> at::Tensor {
      // Note [Activation checkpointing]: the layer keeps only its input.
      if (options_.activation_checkpointing && is_training())
        return recompute(
            *layer,
            [layer, cos, sin](const at::Tensor& in) {  // by value: backward runs it later
              return layer->forward(in, cos, sin);
            },
            x);
      return layer->forward(x, cos, sin);
    });
  }
  x = body_->norm->forward(x);
  return at::linear(x, options_.tie_embeddings ? body_->embed_tokens : lm_head_);
}

std::vector<std::shared_ptr<torch::nn::Module>> Llama::sharding_units() {
  std::vector<std::shared_ptr<torch::nn::Module>> units;
  for (const auto& layer : body_->decoder) units.push_back(layer);
  return units;
}

double Llama::flops_per_token() const {
  const auto& o = options_;
  double n = 0;
  for (const auto& p : parameters()) n += static_cast<double>(p.numel());
  if (!o.tie_embeddings) n -= static_cast<double>(body_->embed_tokens.numel());
  return 6.0 * n + 12.0 * static_cast<double>(o.n_layer * o.n_embd * o.block_size);
}

}  // namespace lockstep
