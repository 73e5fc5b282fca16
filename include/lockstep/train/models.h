// The model registry: mlp, cnn, transformer. Every model is a Classifier
// (one virtual forward), so DDP and the trainer treat them alike. Parameter
// names follow PyTorch's state_dict naming (layers.0.weight, ...), so state
// dicts move between lockstep and Python.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <vector>

#include "lockstep/train/config.h"

namespace lockstep {

class Classifier : public torch::nn::Module {
 public:
  // x: [batch, ...sample_shape] -> [batch, classes] (or [batch] for regression).
  virtual at::Tensor forward(at::Tensor x) = 0;
};

// sample_shape: one example's shape (e.g. {64} or {1, 28, 28}); classes: 0
// for regression (one output). Throws ConfigError when the shape does not
// suit the model (e.g. a transformer's token_size not dividing the features).
std::shared_ptr<Classifier> model_create(const ModelConfig& config,
                                         const std::vector<int64_t>& sample_shape, int64_t classes);

}  // namespace lockstep
