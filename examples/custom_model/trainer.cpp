// Your own model inside lockstep's trainer: register it under a name, then
// run `lockstep train` from your program. The config says model.name: tiny.
//   lockstep-run --nproc-per-node 2 build/custom_trainer --config tiny.yaml
#include <lockstep/train/models.h>
#include <lockstep/train/train_main.h>
#include <torch/torch.h>

// A Classifier maps [batch, ...example shape] to [batch, classes].
class Tiny : public lockstep::Classifier {
 public:
  Tiny(int64_t features, int64_t classes) {
    hidden_ = register_module("hidden", torch::nn::Linear(features, 32));
    out_ = register_module("out", torch::nn::Linear(32, classes));
  }
  at::Tensor forward(at::Tensor x) override {
    return out_->forward(torch::relu(hidden_->forward(x.flatten(1))));
  }

 private:
  torch::nn::Linear hidden_{nullptr}, out_{nullptr};
};

int main(int argc, char** argv) {
  lockstep::register_model(
      "tiny", [](const lockstep::ModelConfig&, const std::vector<int64_t>& shape, int64_t classes) {
        int64_t features = 1;
        for (auto d : shape) features *= d;
        return std::make_shared<Tiny>(features, classes);
      });
  return lockstep::train_main(argc, argv);  // lockstep train's options; its exit codes
}
