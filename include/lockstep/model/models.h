// The model registry: mlp, cnn, transformer, torchscript (model.path: a
// module saved by torch.jit.script(...).save(...)), and any model a program
// registers. Every model is a Classifier
// (one virtual forward), so DDP and the trainer treat them alike. Parameter
// names follow PyTorch's state_dict naming (layers.0.weight, ...), so state
// dicts move between lockstep and Python.
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/model/model_config.h"

namespace lockstep {

class Classifier : public torch::nn::Module {
 public:
  // x: [batch, ...sample_shape] -> [batch, classes] (or [batch] for regression).
  virtual at::Tensor forward(at::Tensor x) = 0;
  // The units fully sharded parameters gather one at a time (optim.zero 3,
  // optim/fully_shard.h): modules whose forward this model runs through
  // call_unit (util/unit_call.h). None: the whole model is one unit.
  virtual std::vector<std::shared_ptr<torch::nn::Module>> sharding_units() { return {}; }
};

// sample_shape: one example's shape (e.g. {64} or {1, 28, 28}); classes: 0
// for regression (one output). Throws ConfigError when the shape does not
// suit the model (e.g. a transformer's token_size not dividing the features).
std::shared_ptr<Classifier> model_create(const ModelConfig& config,
                                         const std::vector<int64_t>& sample_shape, int64_t classes);

// A program's own model for `model.name: <name>` (lockstep train through
// train_main). The factory gets the model section, one example's shape and
// the class count; every rank calls it with the same seed set. Throws
// ConfigError when `name` is empty or taken (built-ins included). Register
// before train_main; not thread-safe against concurrent model_create.
using ModelFactory = std::function<std::shared_ptr<Classifier>(
    const ModelConfig& config, const std::vector<int64_t>& sample_shape, int64_t classes)>;
void register_model(const std::string& name, ModelFactory factory);
// Built-in and registered names, for messages.
std::vector<std::string> model_names();

// A TorchScript module (torch.jit.script(model).save(path)) as a Classifier:
// its parameters and buffers, under the names Python's state_dict() gives
// them, are this module's, so DDP, fingerprints and state dicts see them,
// and forward calls the script. Checks that forward maps a batch of
// `sample_shape` to [batch, classes] ([batch] or [batch, 1] when classes is
// 0); any failure is a ConfigError naming the file.
std::shared_ptr<Classifier> torchscript_model(const std::string& path,
                                              const std::vector<int64_t>& sample_shape,
                                              int64_t classes);

}  // namespace lockstep
