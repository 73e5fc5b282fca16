#include "lockstep/model/gpt.h"
#include "lockstep/model/recompute.h"
#include "lockstep/util/unit_call.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <cmath>

#include "lockstep/util/error.h"
#include "lockstep/util/torch_compat.h"

namespace lockstep {
namespace {

// nn.LayerNorm(n, bias=...): weight always, bias when asked.
class LayerNorm : public torch::nn::Module {
 public:
  LayerNorm(int64_t n, bool bias) : n_(n) {
    weight_ = register_parameter("weight", at::ones({n}));
    if (bias) bias_ = register_parameter("bias", at::zeros({n}));
  }
  at::Tensor forward(const at::Tensor& x) { return at::layer_norm(x, {n_}, weight_, bias_, 1e-5); }

 private:
  int64_t n_;
  at::Tensor weight_, bias_;
};

torch::nn::Linear linear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

// Note [ATen's linear, not the C++ frontend's]
// torch::nn::Linear's forward (torch::nn::functional::linear, LibTorch 1.13
// and 2.6 alike) runs a 3-D input as matmul and then `output += bias`:
// under bf16 autocast the matmul comes out in bf16 while the bias stays
// float32, so the in-place add takes ATen's mixed-dtype loop. PyTorch's
// F.linear is at::linear, which autocast runs wholly in bf16 (bias cast
// once, folded into the product), and so runs such a layer markedly faster
// under bf16 autocast (docs/lab/gpt-demo.md has the measurement); in
// float32 both give the same bits. The GPT's layers therefore call
// at::linear, as Python's GPT does.
at::Tensor run_linear(const torch::nn::Linear& layer, const at::Tensor& x) {
  return at::linear(x, layer->weight, layer->bias);
}

at::Tensor maybe_dropout(const at::Tensor& x, double p, bool training) {
  return p > 0 && training ? at::dropout(x, p, /*train=*/true) : x;
}

class Attention : public torch::nn::Module {
 public:
  explicit Attention(const GptOptions& o) : o_(o) {
    c_attn = register_module("c_attn", linear(o.n_embd, 3 * o.n_embd, o.bias));
    c_proj = register_module("c_proj", linear(o.n_embd, o.n_embd, o.bias));
  }
  at::Tensor forward(const at::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2), hs = c / o_.n_head;
    auto qkv = run_linear(c_attn, x).split(c, 2);
    auto heads = [&](const at::Tensor& z) { return z.view({b, t, o_.n_head, hs}).transpose(1, 2); };
    auto y =
        causal_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), o_.dropout, is_training());
    y = y.transpose(1, 2).contiguous().view({b, t, c});
    return maybe_dropout(run_linear(c_proj, y), o_.dropout, is_training());
  }
  torch::nn::Linear c_attn{nullptr}, c_proj{nullptr};

 private:
  GptOptions o_;
};

class Mlp : public torch::nn::Module {
 public:
  explicit Mlp(const GptOptions& o) : p_(o.dropout) {
    c_fc = register_module("c_fc", linear(o.n_embd, 4 * o.n_embd, o.bias));
    c_proj = register_module("c_proj", linear(4 * o.n_embd, o.n_embd, o.bias));
  }
  at::Tensor forward(const at::Tensor& x) {
    return maybe_dropout(run_linear(c_proj, at::gelu(run_linear(c_fc, x))), p_, is_training());
  }
  torch::nn::Linear c_fc{nullptr}, c_proj{nullptr};

 private:
  double p_;
};

class Block : public torch::nn::Module {
 public:
  explicit Block(const GptOptions& o) {
    ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(o.n_embd, o.bias));
    attn = register_module("attn", std::make_shared<Attention>(o));
    ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(o.n_embd, o.bias));
    mlp = register_module("mlp", std::make_shared<Mlp>(o));
  }
  at::Tensor forward(at::Tensor x) {
    x = x + attn->forward(ln_1->forward(x));
    return x + mlp->forward(ln_2->forward(x));
  }
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<Attention> attn;
  std::shared_ptr<Mlp> mlp;
};

}  // namespace

struct Gpt::Body : torch::nn::Module {
  explicit Body(const GptOptions& o) {
    wte = register_module("wte", torch::nn::Embedding(o.vocab_size, o.n_embd));
    wpe = register_module("wpe", torch::nn::Embedding(o.block_size, o.n_embd));
    h = register_module("h", torch::nn::ModuleList());
    for (int64_t i = 0; i < o.n_layer; ++i) {
      auto block = std::make_shared<Block>(o);
      h->push_back(block);
      blocks.push_back(block);
    }
    ln_f = register_module("ln_f", std::make_shared<LayerNorm>(o.n_embd, o.bias));
  }
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList h{nullptr};
  std::vector<std::shared_ptr<Block>> blocks;
  std::shared_ptr<LayerNorm> ln_f;
};

GptOptions gpt_options(const ModelConfig& c, int64_t vocab_size) {
  if (c.n_embd % c.n_head != 0)
    throw ConfigError("model.n_head=" + std::to_string(c.n_head) +
                      " must divide model.n_embd=" + std::to_string(c.n_embd));
  if (vocab_size < 1) throw ConfigError("model.name: gpt needs a vocabulary from the data");
  GptOptions o;
  o.vocab_size = vocab_size;
  o.block_size = c.block_size;
  o.n_layer = c.n_layer;
  o.n_head = c.n_head;
  o.n_embd = c.n_embd;
  o.dropout = c.dropout;
  o.bias = c.bias;
  o.activation_checkpointing = c.activation_checkpointing;
  return o;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> gpt_parameter_shapes(
    const GptOptions& o) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  const auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    shapes.emplace_back(name, std::move(shape));
  };
  const int64_t e = o.n_embd;
  const auto norm = [&](const std::string& at) {
    add(at + ".weight", {e});
    if (o.bias) add(at + ".bias", {e});
  };
  const auto linear = [&](const std::string& at, int64_t in, int64_t out) {
    add(at + ".weight", {out, in});
    if (o.bias) add(at + ".bias", {out});
  };
  add("transformer.wte.weight", {o.vocab_size, e});
  add("transformer.wpe.weight", {o.block_size, e});
  for (int64_t i = 0; i < o.n_layer; ++i) {
    const std::string b = "transformer.h." + std::to_string(i);
    norm(b + ".ln_1");
    linear(b + ".attn.c_attn", e, 3 * e);
    linear(b + ".attn.c_proj", e, e);
    norm(b + ".ln_2");
    linear(b + ".mlp.c_fc", e, 4 * e);
    linear(b + ".mlp.c_proj", 4 * e, e);
  }
  norm("transformer.ln_f");
  return shapes;
}

Gpt::Gpt(const GptOptions& options) : options_(options) {
  body_ = register_module("transformer", std::make_shared<Body>(options));
  // GPT-2's initialisation (nanoGPT's _init_weights and the c_proj rule).
  at::NoGradGuard no_grad;
  const double residual = 0.02 / std::sqrt(2.0 * static_cast<double>(options.n_layer));
  for (const auto& block : body_->blocks) {
    for (auto* layer :
         {&block->attn->c_attn, &block->attn->c_proj, &block->mlp->c_fc, &block->mlp->c_proj}) {
      const bool projection = layer == &block->attn->c_proj || layer == &block->mlp->c_proj;
      (*layer)->weight.normal_(0, projection ? residual : 0.02);
      if ((*layer)->bias.defined()) (*layer)->bias.zero_();
    }
  }
  body_->wte->weight.normal_(0, 0.02);
  body_->wpe->weight.normal_(0, 0.02);
}

at::Tensor Gpt::forward(at::Tensor idx) {
  if (idx.dim() != 2) throw ConfigError("gpt: tokens must be [batch, time]");
  const int64_t t = idx.size(1);
  if (t > options_.block_size)
    throw ConfigError(
        "gpt: a sequence of " + std::to_string(t) +
        " tokens is longer than model.block_size=" + std::to_string(options_.block_size));
  auto x = body_->wte->forward(idx) + body_->wpe->weight.narrow(0, 0, t);
  x = maybe_dropout(x, options_.dropout, is_training());
  for (const auto& block : body_->blocks) {
    // Each block is a unit that fully sharded parameters gather (call_unit).
    x = call_unit(*block, [&]() -> at::Tensor {
      // Note [Activation checkpointing]: the block keeps only its input.
      if (options_.activation_checkpointing && is_training())
        return recompute(
            *block, [&block](const at::Tensor& in) { return block->forward(in); }, x);
      return block->forward(x);
    });
  }
  x = body_->ln_f->forward(x);
  return at::linear(x, body_->wte->weight);  // the head is the token embedding
}

std::vector<std::shared_ptr<torch::nn::Module>> Gpt::sharding_units() {
  std::vector<std::shared_ptr<torch::nn::Module>> units;
  for (const auto& block : body_->blocks) units.push_back(block);
  return units;
}

int64_t Gpt::parameters_without_positions() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n - body_->wpe->weight.numel();
}

double Gpt::flops_per_token() const {
  const auto& o = options_;
  return 6.0 * static_cast<double>(parameters_without_positions()) +
         12.0 * static_cast<double>(o.n_layer * o.n_embd * o.block_size);
}

}  // namespace lockstep
