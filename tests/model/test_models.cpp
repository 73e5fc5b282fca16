// Model registry (PyTorch state_dict names, shapes, errors) and the
// learning-rate schedules.
#include <torch/nn/modules/linear.h>
#include <torch/optim.h>
#include "support/catch.h"

#include "lockstep/model/models.h"
#include "lockstep/optim/optim.h"
#include "lockstep/util/error.h"

using namespace lockstep;
using lockstep::testing::Contains;

TEST_CASE("every model classifies a batch - names follow PyTorch", "[models]") {
  ModelConfig c;
  c.hidden = 16;
  for (const std::string name : {"mlp", "cnn", "transformer"}) {
    DYNAMIC_SECTION(name) {
      c.name = name;
      auto model = model_create(c, {64}, 10);
      CHECK(model->forward(torch::randn({5, 64})).sizes() == at::IntArrayRef{5, 10});
      auto regression = model_create(c, {64}, 0);
      CHECK(regression->forward(torch::randn({3, 64})).sizes() == at::IntArrayRef{3});
      std::vector<std::string> names;
      for (const auto& p : model->named_parameters()) names.push_back(p.key());
      if (name == "mlp") {
        CHECK(names == std::vector<std::string>{"layers.0.weight", "layers.0.bias",
                                                "layers.2.weight", "layers.2.bias",
                                                "layers.4.weight", "layers.4.bias"});
      } else if (name == "cnn") {
        CHECK(names.front() == "features.0.weight");
        CHECK(names.back() == "classifier.bias");
      } else {
        CHECK(names.front() == "pos");  // a module's own parameters first, as in PyTorch
        CHECK(names[1] == "embed.weight");
        CHECK(std::find(names.begin(), names.end(), "encoder.layers.0.self_attn.in_proj_weight") !=
              names.end());
      }
    }
  }
}

TEST_CASE("a model that does not fit the data is a clear error", "[models]") {
  ModelConfig c;
  c.name = "cnn";
  REQUIRE_THROWS_WITH(model_create(c, {10}, 2), Contains("10 features are not a square"));
  c.name = "transformer";
  c.token_size = 7;
  REQUIRE_THROWS_WITH(model_create(c, {64}, 2),
                      Contains("model.token_size=7 must divide the 64 features"));
}

namespace {
class Probe : public Classifier {
 public:
  Probe(int64_t features, int64_t classes) {
    fc_ = register_module("fc", torch::nn::Linear(features, classes));
  }
  at::Tensor forward(at::Tensor x) override { return fc_->forward(x.flatten(1)); }

 private:
  torch::nn::Linear fc_{nullptr};
};
}  // namespace

TEST_CASE("a registered model is created by name - names are unique", "[models]") {
  std::vector<int64_t> seen_shape;
  int64_t seen_classes = -1;
  register_model("probe-model",
                 [&](const ModelConfig&, const std::vector<int64_t>& shape, int64_t classes) {
                   seen_shape = shape;
                   seen_classes = classes;
                   return std::make_shared<Probe>(shape[0] * shape[1], classes);
                 });
  ModelConfig c;
  c.name = "probe-model";
  auto model = model_create(c, {8, 8}, 7);
  CHECK(seen_shape == std::vector<int64_t>{8, 8});
  CHECK(seen_classes == 7);
  CHECK(model->forward(torch::randn({3, 8, 8})).sizes() == at::IntArrayRef{3, 7});
  CHECK(model->named_parameters().contains("fc.weight"));
  CHECK_THROWS_WITH(
      register_model("probe-model", [](const ModelConfig&, const std::vector<int64_t>&,
                                       int64_t) { return std::shared_ptr<Classifier>(); }),
      Contains("a model named 'probe-model' is already registered"));
  CHECK_THROWS_WITH(register_model("mlp", [](const ModelConfig&, const std::vector<int64_t>&,
                                             int64_t) { return std::shared_ptr<Classifier>(); }),
                    Contains("a model named 'mlp' is already registered"));
  c.name = "nope";
  CHECK_THROWS_WITH(
      model_create(c, {64}, 10),
      Contains(
          "unknown model 'nope' (valid: mlp, cnn, transformer, gpt, torchscript, resnet, llama, "
          "probe-model)"));
  c.name = "gtp";  // a typo: the nearest name, registered ones included
  CHECK_THROWS_WITH(model_create(c, {64}, 10),
                    Contains("unknown model 'gtp' (did you mean 'gpt'?)"));
  c.name = "probe-modle";
  CHECK_THROWS_WITH(model_create(c, {64}, 10), Contains("(did you mean 'probe-model'?)"));
}
