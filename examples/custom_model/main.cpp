// Your own module, trained data-parallel with lockstep: one call sets up the
// ranks, DDP averages the gradients, the sampler shards the data, no_sync
// accumulates micro-batches, and a fingerprint proves every step that all
// ranks hold the same weights.
//   lockstep-run --nproc-per-node 2 build/custom_model   (or torchrun, srun, mpirun)
#include <lockstep/check/fingerprint.h>
#include <lockstep/data/sampler.h>
#include <lockstep/ddp/ddp.h>
#include <lockstep/distributed/init.h>
#include <torch/torch.h>

#include <cstdio>

// 1. Any torch::nn::Module. BatchNorm's running statistics are buffers: DDP
//    broadcasts rank 0's before forwards, as PyTorch does.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 3).padding(1)));
    bn = register_module("bn", torch::nn::BatchNorm2d(8));
    fc = register_module("fc", torch::nn::Linear(8 * 4 * 4, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(bn->forward(conv->forward(x))), 2);
    return fc->forward(x.flatten(1));
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Net);

// 2. Data: noisy 8x8 images whose bright quadrant is the class (0-3).
std::pair<torch::Tensor, torch::Tensor> make_data(int64_t n) {
  auto y = torch::randint(0, 4, {n});
  auto x = torch::randn({n, 1, 8, 8}) * 0.5;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = y[i].item<int64_t>();
    x[i].narrow(1, (c / 2) * 4, 4).narrow(2, (c % 2) * 4, 4).add_(1.0);
  }
  return {x, y};
}

int main() {
  auto dist = lockstep::init_distributed();  // reads torchrun/Slurm/Open MPI variables, or 1 rank
  torch::manual_seed(0);                     // the same data everywhere; DDP syncs the weights
  auto [x, y] = make_data(1024);
  Net net;
  lockstep::DistributedDataParallel ddp(net, dist.pg);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  // 3. This rank's shard, in the order PyTorch's DistributedSampler gives.
  lockstep::SamplerOptions shard;
  shard.num_replicas = dist.size();
  shard.rank = dist.rank();
  lockstep::DistributedSampler sampler(x.size(0), shard);
  const int64_t batch = 32, micro = 2;  // 2 micro-batches per optimizer step
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    sampler.set_epoch(epoch);
    const auto idx = torch::tensor(sampler.indices());
    for (int64_t at = 0; at + batch * micro <= idx.size(0); at += batch * micro) {
      sgd.zero_grad();
      for (int64_t m = 0; m < micro; ++m) {
        const auto rows = idx.narrow(0, at + m * batch, batch);
        auto run = [&] {
          auto out = ddp.forward(x.index_select(0, rows));
          (torch::nn::functional::cross_entropy(out, y.index_select(0, rows)) / micro).backward();
        };
        if (m + 1 < micro) {
          auto local_only = ddp.no_sync();  // 4. accumulate; the last micro-batch reduces all
          run();
        } else {
          run();
        }
      }
      sgd.step();
      // 5. Every rank must now hold bit-identical weights: prove it (one
      //    small all-gather). Buffers are left out: BatchNorm's statistics
      //    move with each rank's own batch until the next broadcast.
      lockstep::check_weights(*dist.pg, *net, ++step);  // throws ConsistencyError on a mismatch
    }
  }

  net->eval();
  torch::NoGradGuard no_grad;
  const double accuracy = net->forward(x).argmax(1).eq(y).to(torch::kDouble).mean().item<double>();
  const auto digest = lockstep::fingerprint_digest(lockstep::fingerprint_tensors(*net, false),
                                                   lockstep::DigestMode::kXxh3);
  std::printf("rank %d: %lld steps, every one checked; accuracy %.4f; weights %s\n", dist.rank(),
              static_cast<long long>(step), accuracy, lockstep::hex_of(digest).c_str());
  dist.shutdown();
  return 0;
}
