// Small models and helpers for the DDP tests. Models are built on the main
// thread (LibTorch's default RNG is global) and handed to rank threads.
#pragma once

#include <torch/nn.h>

#include <vector>

namespace lockstep::testing {

inline torch::nn::Sequential make_mlp(int64_t in = 12, int64_t hidden = 16, int64_t out = 5) {
  return torch::nn::Sequential(torch::nn::Linear(in, hidden), torch::nn::Tanh(),
                               torch::nn::Linear(hidden, hidden), torch::nn::Tanh(),
                               torch::nn::Linear(hidden, out));
}

// Input [N, 1, 8, 8] -> 5 classes.
inline torch::nn::Sequential make_cnn() {
  return torch::nn::Sequential(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)), torch::nn::ReLU(),
      torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 6, 3).stride(2)), torch::nn::ReLU(),
      torch::nn::Flatten(), torch::nn::Linear(6 * 2 * 2, 5));
}

inline torch::nn::Sequential clone_of(const torch::nn::Sequential& model) {
  return torch::nn::Sequential(
      std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone()));
}

inline std::vector<torch::Tensor> grads_of(const torch::nn::Module& model) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : model.parameters()) {
    grads.push_back(p.grad().defined() ? p.grad().detach().clone() : torch::Tensor());
  }
  return grads;
}

inline std::vector<torch::Tensor> weights_of(const torch::nn::Module& model) {
  std::vector<torch::Tensor> weights;
  for (const auto& p : model.parameters()) weights.push_back(p.detach().clone());
  return weights;
}

// max |a - b| / max |b|, over all tensors.
inline double relative_error(const std::vector<torch::Tensor>& a,
                             const std::vector<torch::Tensor>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, (a[i] - b[i]).abs().max().item<double>());
    scale = std::max(scale, b[i].abs().max().item<double>());
  }
  return diff / scale;
}

inline bool bit_identical(const std::vector<torch::Tensor>& a,
                          const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

}  // namespace lockstep::testing
