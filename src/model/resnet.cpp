// A BasicBlock ResNet (He et al. 2015) with torchvision's parameter names
// (conv1, bn1, layer1.0.conv1, ..., layer2.0.downsample.0/1, fc), so that a
// state dict loads into torchvision.models.resnet18 with its stem changed
// the same way (docs/models.md has the Python twin). model.depth picks the
// blocks per stage (10: 1,1,1,1; 18: 2,2,2,2; 34: 3,4,6,3), model.width the
// first stage's channels (doubled at each stage, 64 in ResNet-18); the
// stem is "cifar" (a 3x3 convolution, stride 1, no pooling: small images)
// or "imagenet" (7x7, stride 2, then 3x3 max pooling). Every normalisation
// is a lockstep::SyncBatchNorm: BatchNorm2d until model.sync_batchnorm
// gives it the ranks. Each block is a unit of optim.zero: 3.
#include "resnet.h"

#include <ATen/ATen.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include "lockstep/model/sync_batchnorm.h"
#include "lockstep/util/error.h"
#include "lockstep/util/unit_call.h"

namespace lockstep {
namespace {

torch::nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  auto c = torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
  torch::nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
  return c;
}

// downsample.0 (a 1x1 convolution) and downsample.1 (its normalisation).
struct DownsampleImpl : torch::nn::Module {
  DownsampleImpl(int64_t in, int64_t out, int64_t stride) {
    conv_ = register_module("0", conv(in, out, 1, stride));
    bn_ = register_module("1", SyncBatchNorm(out));
  }
  at::Tensor forward(const at::Tensor& x) { return bn_->forward(conv_->forward(x)); }
  torch::nn::Conv2d conv_{nullptr};
  SyncBatchNorm bn_{nullptr};
};
TORCH_MODULE(Downsample);

struct BasicBlockImpl : torch::nn::Module {
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride) {
    conv1 = register_module("conv1", conv(in, out, 3, stride));
    bn1 = register_module("bn1", SyncBatchNorm(out));
    conv2 = register_module("conv2", conv(out, out, 3, 1));
    bn2 = register_module("bn2", SyncBatchNorm(out));
    if (stride != 1 || in != out)
      downsample = register_module("downsample", Downsample(in, out, stride));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = bn1->forward(conv1->forward(x)).relu_();
    h = bn2->forward(conv2->forward(h));
    return (h + (downsample.is_empty() ? x : downsample->forward(x))).relu_();
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  SyncBatchNorm bn1{nullptr}, bn2{nullptr};
  Downsample downsample{nullptr};
};
TORCH_MODULE(BasicBlock);

std::vector<int64_t> blocks_for(int64_t depth) {
  switch (depth) {
    case 10:
      return {1, 1, 1, 1};
    case 18:
      return {2, 2, 2, 2};
    case 34:
      return {3, 4, 6, 3};
    default:
      throw ConfigError("model.depth=" + std::to_string(depth) +
                        " is not a BasicBlock ResNet's depth: 10, 18 or 34");
  }
}

class ResNet : public Classifier {
 public:
  ResNet(const ModelConfig& c, const std::vector<int64_t>& image, int64_t classes)
      : image_(image), imagenet_stem_(c.stem == ResNetStem::kImageNet) {
    const int64_t width = c.width;
    conv1_ = register_module(
        "conv1", imagenet_stem_ ? conv(image[0], width, 7, 2) : conv(image[0], width, 3, 1));
    bn1_ = register_module("bn1", SyncBatchNorm(width));
    int64_t in = width;
    const auto blocks = blocks_for(c.depth);
    for (size_t s = 0; s < blocks.size(); ++s) {
      const int64_t out = width << s;
      auto stage = torch::nn::ModuleList();
      for (int64_t b = 0; b < blocks[s]; ++b) {
        auto block = BasicBlock(in, out, b == 0 && s > 0 ? 2 : 1);
        stage->push_back(block);
        blocks_.push_back(block.ptr());
        in = out;
      }
      stages_.push_back(register_module("layer" + std::to_string(s + 1), stage));
    }
    fc_ = register_module("fc", torch::nn::Linear(in, classes));
  }

  at::Tensor forward(at::Tensor x) override {
    at::Tensor h = x.reshape({x.size(0), image_[0], image_[1], image_[2]});
    h = bn1_->forward(conv1_->forward(h)).relu_();
    if (imagenet_stem_)
      h = at::max_pool2d(h, /*kernel_size=*/{3, 3}, /*stride=*/{2, 2}, /*padding=*/{1, 1});
    for (const auto& block : blocks_) {
      h = call_unit(*block, [&, b = block.get()]() -> at::Tensor {
        return static_cast<BasicBlockImpl*>(b)->forward(h);
      });
    }
    return fc_->forward(h.mean({2, 3}));
  }

  std::vector<std::shared_ptr<torch::nn::Module>> sharding_units() override { return blocks_; }

 private:
  std::vector<int64_t> image_;
  bool imagenet_stem_;
  torch::nn::Conv2d conv1_{nullptr};
  SyncBatchNorm bn1_{nullptr};
  std::vector<torch::nn::ModuleList> stages_;
  std::vector<std::shared_ptr<torch::nn::Module>> blocks_;
  torch::nn::Linear fc_{nullptr};
};

}  // namespace

std::shared_ptr<Classifier> make_resnet(const ModelConfig& config,
                                        const std::vector<int64_t>& image, int64_t classes) {
  if (classes < 1)
    throw ConfigError("model.name=resnet is a classifier: the data has no classes (regression)");
  return std::make_shared<ResNet>(config, image, classes);
}

}  // namespace lockstep
