// A TorchScript module as a Classifier (models.h: torchscript_model).
//
// Note [Scripted parameters]: nn::Module cannot hold a jit::Module, but it
// can hold the very same tensors. Each scripted submodule becomes a
// ScriptedNode registering the submodule's own parameters and buffers (the
// same TensorImpls the script's forward reads) and a child node per scripted
// child, under the same names: named_parameters() then yields Python's
// state_dict() keys ("features.0.weight"), DDP hooks the accumulators the
// script's backward feeds, and a state dict saved here loads into the Python
// module with load_state_dict.
#include <torch/script.h>

#include <sstream>

#include "lockstep/model/models.h"
#include "lockstep/util/error.h"

namespace lockstep {
namespace {

class ScriptedNode : public torch::nn::Module {
 public:
  explicit ScriptedNode(const torch::jit::Module& script) { adopt(*this, script); }

  static void adopt(torch::nn::Module& node, const torch::jit::Module& script) {
    for (const auto& p : script.named_parameters(/*recurse=*/false)) {
      node.register_parameter(p.name, p.value, p.value.requires_grad());
    }
    for (const auto& b : script.named_buffers(/*recurse=*/false)) {
      node.register_buffer(b.name, b.value);
    }
    for (const auto& child : script.named_children()) {
      node.register_module(child.name, std::make_shared<ScriptedNode>(child.value));
    }
  }
};

class ScriptedClassifier : public Classifier {
 public:
  explicit ScriptedClassifier(torch::jit::Module script) : script_(std::move(script)) {
    ScriptedNode::adopt(*this, script_);
  }
  at::Tensor forward(at::Tensor x) override { return script_.forward({std::move(x)}).toTensor(); }
  // Dropout and BatchNorm inside the script follow the trainer's mode.
  void train(bool on) override {
    torch::nn::Module::train(on);
    script_.train(on);
  }

 private:
  torch::jit::Module script_;
};

std::string shape_text(at::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

std::string first_line(const std::string& text) {
  return text.substr(0, text.find('\n'));
}

}  // namespace

std::shared_ptr<Classifier> torchscript_model(const std::string& path,
                                              const std::vector<int64_t>& sample_shape,
                                              int64_t classes) {
  const std::string where = "model.path '" + path + "'";
  torch::jit::Module script;
  try {
    script = torch::jit::load(path);
  } catch (const std::exception& e) {
    throw ConfigError(where +
                      ": cannot be loaded as a TorchScript module (saved by "
                      "torch.jit.script(model).save(path)?): " +
                      first_line(e.what()));
  }
  auto model = std::make_shared<ScriptedClassifier>(std::move(script));
  model->train(true);
  // One probe batch of two examples, in eval mode and without autograd, so
  // that it changes no running statistic and draws no dropout mask.
  std::vector<int64_t> probe_shape{2};
  probe_shape.insert(probe_shape.end(), sample_shape.begin(), sample_shape.end());
  at::Tensor out;
  {
    torch::NoGradGuard no_grad;
    model->eval();
    try {
      out = model->forward(at::zeros(probe_shape));
    } catch (const std::exception& e) {
      model->train(true);
      throw ConfigError(where + ": its forward does not take a batch of shape " +
                        shape_text(probe_shape) + " (the data's examples are " +
                        shape_text(sample_shape) + "): " + first_line(e.what()));
    }
    model->train(true);
  }
  const bool fits = classes > 0 ? out.dim() == 2 && out.size(0) == 2 && out.size(1) == classes
                                : (out.dim() == 1 && out.size(0) == 2) ||
                                      (out.dim() == 2 && out.size(0) == 2 && out.size(1) == 1);
  if (!fits) {
    throw ConfigError(where + ": forward maps a batch of shape " + shape_text(probe_shape) +
                      " to " + shape_text(out.sizes()) + ", but the data needs [2, " +
                      std::to_string(classes) + "] (one score per class)");
  }
  return model;
}

}  // namespace lockstep
