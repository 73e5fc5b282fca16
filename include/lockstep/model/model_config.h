// The model section of a run's configuration (model.*): plain data, the one
// home of its defaults (train/config.h's field table reads them from here).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "lockstep/util/names.h"

namespace lockstep {

// The built-in models (model.name); a program adds its own with
// register_model (model/models.h), which never takes these names.
enum class BuiltinModel { kMlp, kCnn, kTransformer, kGpt, kTorchScript, kResNet, kLlama };
inline constexpr NameTable<BuiltinModel, 7> kBuiltinModelNames{
    {{BuiltinModel::kMlp, "mlp"},
     {BuiltinModel::kCnn, "cnn"},
     {BuiltinModel::kTransformer, "transformer"},
     {BuiltinModel::kGpt, "gpt"},
     {BuiltinModel::kTorchScript, "torchscript"},
     {BuiltinModel::kResNet, "resnet"},
     {BuiltinModel::kLlama, "llama"}}};
// The built-in model `name` names; nullopt: a registered (or unknown) one.
inline std::optional<BuiltinModel> builtin_model(const std::string& name) {
  return value_named(kBuiltinModelNames, name);
}
inline bool is_model(const std::string& name, BuiltinModel model) {
  return builtin_model(name) == model;
}
// The language models: token windows in, next-token logits out.
inline bool is_language_model(const std::string& name) {
  return is_model(name, BuiltinModel::kGpt) || is_model(name, BuiltinModel::kLlama);
}

// resnet's first layers: for small images, or ImageNet's.
enum class ResNetStem { kCifar, kImageNet };
inline constexpr NameTable<ResNetStem, 2> kResNetStemNames{
    {{ResNetStem::kCifar, "cifar"}, {ResNetStem::kImageNet, "imagenet"}}};

// llama: how the rotary frequencies are scaled (transformers' rope_type):
// none ("default") or Llama 3.1's long-context scaling ("llama3").
enum class RopeScaling { kNone, kLlama3 };
inline constexpr NameTable<RopeScaling, 2> kRopeScalingNames{
    {{RopeScaling::kNone, "none"}, {RopeScaling::kLlama3, "llama3"}}};

struct ModelConfig {
  std::string name = "mlp";
  int64_t hidden = 128;
  int64_t layers = 2;
  double dropout = 0;
  bool batch_norm = false;
  // Every BatchNorm synchronised over the ranks (model/sync_batchnorm.h).
  bool sync_batchnorm = false;
  // resnet (model/resnet.cpp): 10, 18 or 34 layers; the first stage's
  // channels (ResNet-18: 64); the stem.
  int64_t depth = 18;
  int64_t width = 64;
  ResNetStem stem = ResNetStem::kCifar;
  int64_t heads = 4;
  int64_t token_size = 8;
  std::string path;  // torchscript: the saved module
  std::string init_from;
  // gpt (model/gpt.h): GPT-2's shape; the vocabulary comes from the data.
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  int64_t block_size = 128;  // context length; also the data's window (text, tokens)
  bool bias = true;          // biases in Linear layers and LayerNorms
  // gpt, llama: each block's activations recomputed in backward instead of
  // kept (model/recompute.h); gradients bit-identical.
  bool activation_checkpointing = false;
  // llama (model/llama.h): key/value heads (0: n_head), the MLP's width (0:
  // 4 n_embd), the rotary base, RMSNorm's epsilon, the head tied to the
  // token embedding.
  int64_t n_kv_head = 0;
  int64_t intermediate_size = 0;
  double rope_theta = 10000;
  double rms_norm_eps = 1e-5;
  bool tie_embeddings = false;
  // llama: Llama 3.1's rope scaling (rope_scaling: llama3) and its
  // parameters, transformers' names: factor, low_freq_factor,
  // high_freq_factor, original_max_position_embeddings.
  RopeScaling rope_scaling = RopeScaling::kNone;
  double rope_factor = 8;
  double rope_low_freq_factor = 1;
  double rope_high_freq_factor = 4;
  int64_t rope_original_max_position_embeddings = 8192;
};

}  // namespace lockstep
