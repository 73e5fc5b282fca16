// Fully sharded parameters (ZeRO-3) for your own module: between uses each
// weight lives on one rank only; a block's weights are gathered for its
// forward and backward, its gradients reduce-scattered to their owners,
// and each rank's optimizer steps only what it owns (docs/library.md).
//   lockstep-run --nproc-per-node 2 build/sharded
// It checks itself: every rank also trains an unsharded copy on the whole
// global batch in one process, and the two must end equal to float rounding.
#include <lockstep/ddp/ddp.h>
#include <lockstep/distributed/init.h>
#include <lockstep/util/module_tensors.h>
#include <lockstep/util/unit_call.h>
#include <lockstep/zero/fully_shard.h>
#include <torch/torch.h>

#include <cstdio>

// 1. The model runs each block through call_unit: the hook point where the
//    block's weights are gathered and freed (LibTorch has no forward hooks).
struct NetImpl : torch::nn::Module {
  NetImpl() {
    for (int i = 0; i < 4; ++i)
      blocks.push_back(register_module("block" + std::to_string(i), torch::nn::Linear(32, 32)));
    head = register_module("head", torch::nn::Linear(32, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& block : blocks)
      x = lockstep::call_unit(*block, [&] { return torch::relu(block->forward(x)) + x; });
    return head->forward(x);
  }
  std::vector<torch::nn::Linear> blocks;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Net);

int main() {
  auto dist = lockstep::init_distributed();
  torch::manual_seed(0);  // the same data and initial weights on every rank
  const int64_t world = dist.size(), rank = dist.rank(), rows = 16;
  const auto x = torch::randn({rows * world, 32});
  const auto y = torch::randint(0, 4, {rows * world});
  torch::manual_seed(1);
  Net net;
  torch::manual_seed(1);
  Net reference;  // the same initial weights, never sharded

  // 2. DDP without its Reducer (the sharding exchanges the gradients); it
  //    still broadcasts rank 0's weights once and owns no_sync.
  lockstep::DdpOptions ddp_options;
  ddp_options.reduce_gradients = false;
  lockstep::DistributedDataParallel ddp(net, dist.pg, ddp_options);
  std::vector<std::shared_ptr<torch::nn::Module>> units;
  for (auto& block : net->blocks) units.push_back(block.ptr());
  auto sharded = lockstep::fully_shard(*net, dist.pg, /*owners: balanced*/ {}, units);

  // 3. Each rank's optimizer over the parameters it owns.
  const auto params = lockstep::trainable_parameters(*net);
  std::vector<torch::Tensor> mine;
  for (size_t i = 0; i < params.size(); ++i)
    if (sharded->owners()[i] == rank) mine.push_back(params[i].second);
  torch::optim::SGD sgd(mine, torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD sgd_reference(reference->parameters(),
                                  torch::optim::SGDOptions(0.1).momentum(0.9));

  const auto local = torch::indexing::Slice(rank * rows, (rank + 1) * rows);
  for (int step = 0; step < 20; ++step) {
    sgd.zero_grad();
    auto out = ddp.forward(x.index({local}));  // gathers the root, then each block in turn
    torch::nn::functional::cross_entropy(out, y.index({local}))
        .backward();  // mean gradients on their owners
    sgd.step();
    sgd_reference.zero_grad();
    torch::nn::functional::cross_entropy(reference->forward(x), y).backward();
    sgd_reference.step();
  }
  const int64_t held = sharded->resident_parameter_bytes();
  // 4. A whole copy when you need one (a state dict, a check): collective.
  sharded->unshard_all();
  double worst = 0, total = 0;
  auto theirs = reference->parameters();
  auto ours = net->parameters();
  for (size_t i = 0; i < ours.size(); ++i) {
    worst = std::max(worst, (ours[i] - theirs[i]).abs().max().item<double>());
    total += static_cast<double>(ours[i].nbytes());
  }
  sharded->reshard_all();
  std::printf(
      "rank %lld: 20 steps sharded; held %lld of %.0f weight bytes between steps; largest "
      "difference from one process on the whole batch %.3g\n",
      static_cast<long long>(rank), static_cast<long long>(held), total, worst);
  dist.shutdown();
  return worst < 1e-5 ? 0 : 1;
}
