#include "lockstep/model/models.h"

#include <algorithm>
#include <map>

#include <torch/nn.h>

#include <cmath>

#include "lockstep/model/gpt.h"
#include "lockstep/model/llama.h"
#include "lockstep/model/sync_batchnorm.h"
#include "lockstep/util/error.h"
#include "lockstep/util/registry.h"
#include "resnet.h"

namespace lockstep {
namespace {

int64_t product(const std::vector<int64_t>& shape) {
  int64_t p = 1;
  for (auto d : shape) p *= d;
  return p;
}

// layers.0 Linear, layers.1 ReLU, [Dropout], ... layers.k Linear (as nn.Sequential).
class Mlp : public Classifier {
 public:
  Mlp(const ModelConfig& c, int64_t in, int64_t out) : out_(out) {
    torch::nn::Sequential seq;
    int64_t width = in;
    for (int64_t i = 0; i < c.layers; ++i) {
      seq->push_back(torch::nn::Linear(width, c.hidden));
      seq->push_back(torch::nn::ReLU());
      if (c.dropout > 0) seq->push_back(torch::nn::Dropout(c.dropout));
      width = c.hidden;
    }
    seq->push_back(torch::nn::Linear(width, std::max<int64_t>(out, 1)));
    layers_ = register_module("layers", seq);
  }
  at::Tensor forward(at::Tensor x) override {
    auto y = layers_->forward(x.flatten(1));
    return out_ == 0 ? y.squeeze(1) : y;
  }

 private:
  int64_t out_;
  torch::nn::Sequential layers_{nullptr};
};

// features: two 3x3 convolutions (the second with stride 2), each followed
// by BatchNorm2d when model.batch_norm, and ReLU; adaptive pooling to 4x4;
// then classifier: Linear. A ModuleList rather than a Sequential: LibTorch
// 1.13's Sequential cannot hold BatchNorm2d (its forward is inherited); the
// names are the same as an nn.Sequential's (features.0.weight, ...).
class Cnn : public Classifier {
 public:
  Cnn(const ModelConfig& c, std::vector<int64_t> image, int64_t out) : image_(image), out_(out) {
    const int64_t ch = c.hidden;
    features_ = register_module("features", torch::nn::ModuleList());
    features_->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(image_[0], ch, 3).padding(1)));
    if (c.batch_norm) add_norm(ch, c.sync_batchnorm);
    features_->push_back(torch::nn::ReLU());
    features_->push_back(
        torch::nn::Conv2d(torch::nn::Conv2dOptions(ch, 2 * ch, 3).padding(1).stride(2)));
    if (c.batch_norm) add_norm(2 * ch, c.sync_batchnorm);
    features_->push_back(torch::nn::ReLU());
    features_->push_back(torch::nn::AdaptiveAvgPool2d(4));
    if (c.dropout > 0) dropout_ = register_module("dropout", torch::nn::Dropout(c.dropout));
    classifier_ =
        register_module("classifier", torch::nn::Linear(2 * ch * 16, std::max<int64_t>(out, 1)));
  }
  at::Tensor forward(at::Tensor x) override {
    auto h = x.reshape({x.size(0), image_[0], image_[1], image_[2]});
    // (model.sync_batchnorm: lockstep::SyncBatchNorm, the same names.)
    for (const auto& m : *features_) {
      if (auto* conv = m->as<torch::nn::Conv2dImpl>()) {
        h = conv->forward(h);
      } else if (auto* bn = m->as<torch::nn::BatchNorm2dImpl>()) {
        h = bn->forward(h);
      } else if (auto* sync = m->as<SyncBatchNormImpl>()) {
        h = sync->forward(h);
      } else if (auto* relu = m->as<torch::nn::ReLUImpl>()) {
        h = relu->forward(h);
      } else {
        h = m->as<torch::nn::AdaptiveAvgPool2dImpl>()->forward(h);
      }
    }
    h = h.flatten(1);
    if (!dropout_.is_empty()) h = dropout_->forward(h);
    auto y = classifier_->forward(h);
    return out_ == 0 ? y.squeeze(1) : y;
  }

 private:
  void add_norm(int64_t channels, bool sync) {
    if (sync) {
      features_->push_back(SyncBatchNorm(channels));
    } else {
      features_->push_back(torch::nn::BatchNorm2d(channels));
    }
  }

  std::vector<int64_t> image_;
  int64_t out_;
  torch::nn::ModuleList features_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
  torch::nn::Linear classifier_{nullptr};
};

// The features split into tokens of token_size: embed (Linear) + learned
// positions (pos), a TransformerEncoder, mean over tokens, head (Linear).
class Transformer : public Classifier {
 public:
  Transformer(const ModelConfig& c, int64_t features, int64_t out)
      : tokens_(features / c.token_size), token_size_(c.token_size), out_(out) {
    embed_ = register_module("embed", torch::nn::Linear(c.token_size, c.hidden));
    pos_ = register_parameter("pos", torch::randn({tokens_, c.hidden}) * 0.02);
    auto layer = torch::nn::TransformerEncoderLayer(
        torch::nn::TransformerEncoderLayerOptions(c.hidden, c.heads)
            .dim_feedforward(2 * c.hidden)
            .dropout(c.dropout));
    encoder_ = register_module(
        "encoder",
        torch::nn::TransformerEncoder(torch::nn::TransformerEncoderOptions(layer, c.layers)));
    head_ = register_module("head", torch::nn::Linear(c.hidden, std::max<int64_t>(out, 1)));
  }
  at::Tensor forward(at::Tensor x) override {
    auto h = embed_->forward(x.reshape({x.size(0), tokens_, token_size_})) + pos_;
    h = encoder_->forward(h.transpose(0, 1));  // LibTorch's encoder is sequence-first
    auto y = head_->forward(h.mean(0));
    return out_ == 0 ? y.squeeze(1) : y;
  }

 private:
  int64_t tokens_, token_size_, out_;
  torch::nn::Linear embed_{nullptr};
  at::Tensor pos_;
  torch::nn::TransformerEncoder encoder_{nullptr};
  torch::nn::Linear head_{nullptr};
};

std::vector<int64_t> as_image(const std::vector<int64_t>& shape, const char* model) {
  if (shape.size() == 3) return shape;
  if (shape.size() == 2) return {1, shape[0], shape[1]};
  const int64_t n = product(shape);
  const auto side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(n))));
  if (side * side != n) {
    throw ConfigError(std::string("model.name=") + model + " needs images: " + std::to_string(n) +
                      " features are not a square (use mlp or transformer)");
  }
  return {1, side, side};
}

}  // namespace

void register_model(const std::string& name, ModelFactory factory) {
  if (name.empty() || !factory) throw ConfigError("register_model: empty name or factory");
  if (builtin_model(name) ||
      !registry_of<ModelFactory>().add(name, std::move(factory), /*replace=*/false))
    throw ConfigError("register_model: a model named '" + name + "' is already registered");
}

std::vector<std::string> model_names() {
  std::vector<std::string> names = names_of(kBuiltinModelNames);
  for (const auto& name : registry_of<ModelFactory>().names()) names.push_back(name);
  return names;
}

namespace {

std::shared_ptr<Classifier> builtin_model_create(BuiltinModel model, const ModelConfig& config,
                                                 const std::vector<int64_t>& sample_shape,
                                                 int64_t classes) {
  const int64_t features = product(sample_shape);
  switch (model) {
    case BuiltinModel::kMlp:
      return std::make_shared<Mlp>(config, features, classes);
    case BuiltinModel::kCnn:
      return std::make_shared<Cnn>(config, as_image(sample_shape, "cnn"), classes);
    case BuiltinModel::kResNet:
      return make_resnet(config, as_image(sample_shape, "resnet"), classes);
    case BuiltinModel::kTransformer: {
      if (features % config.token_size != 0) {
        throw ConfigError("model.token_size=" + std::to_string(config.token_size) +
                          " must divide the " + std::to_string(features) + " features");
      }
      if (config.hidden % config.heads != 0) {
        throw ConfigError("model.heads=" + std::to_string(config.heads) +
                          " must divide model.hidden=" + std::to_string(config.hidden));
      }
      return std::make_shared<Transformer>(config, features, classes);
    }
    case BuiltinModel::kGpt: {
      if (sample_shape.size() != 1 || sample_shape[0] > config.block_size)
        throw ConfigError("model.name: gpt reads windows of at most model.block_size=" +
                          std::to_string(config.block_size) +
                          " tokens (data.name: text or tokens)");
      return std::make_shared<Gpt>(gpt_options(config, classes));
    }
    case BuiltinModel::kLlama: {
      if (sample_shape.size() != 1 || sample_shape[0] > config.block_size)
        throw ConfigError("model.name: llama reads windows of at most model.block_size=" +
                          std::to_string(config.block_size) +
                          " tokens (data.name: text or tokens)");
      return std::make_shared<Llama>(llama_options(config, classes));
    }
    case BuiltinModel::kTorchScript: {
      if (config.path.empty()) {
        throw ConfigError(
            "model.name=torchscript needs model.path: the file saved by "
            "torch.jit.script(model).save(path)");
      }
      return torchscript_model(config.path, sample_shape, classes);
    }
  }
  throw InternalError("unhandled built-in model");
}

}  // namespace

std::shared_ptr<Classifier> model_create(const ModelConfig& config,
                                         const std::vector<int64_t>& sample_shape,
                                         int64_t classes) {
  if (const auto builtin = builtin_model(config.name))
    return builtin_model_create(*builtin, config, sample_shape, classes);
  if (const auto factory = registry_of<ModelFactory>().find(config.name)) {
    auto model = (*factory)(config, sample_shape, classes);
    if (!model) throw ConfigError("model '" + config.name + "': its factory returned no model");
    return model;
  }
  throw ConfigError("model.name: unknown model '" + shown_name(config.name) + "' (" +
                    near_miss(config.name, model_names()) + ")");
}

}  // namespace lockstep
