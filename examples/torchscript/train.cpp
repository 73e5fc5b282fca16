// Trains the TorchScript module that model.py saved, on every rank, with
// lockstep's DDP; rank 0 writes the weights as a state dict that Python's
// load_state_dict takes.
//   lockstep-run --nproc-per-node 2 build/train_script DIR
#include <lockstep/data/sampler.h>
#include <lockstep/ddp/ddp.h>
#include <lockstep/distributed/init.h>
#include <lockstep/io/state_dict.h>
#include <lockstep/model/models.h>
#include <torch/torch.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : ".";
  auto dist = lockstep::init_distributed();

  // The data Python wrote (torch.save of an OrderedDict of tensors).
  torch::Tensor x, y;
  for (auto& [name, tensor] : lockstep::state_dict_load_file(dir + "/data.pt")) {
    (name == "x" ? x : y) = tensor;
  }
  // The scripted module as a torch::nn::Module: its parameters keep their
  // Python names ("features.0.weight"), which DDP and state dicts use.
  auto net = lockstep::torchscript_model(dir + "/model.ts", {x.size(1)}, 3);
  lockstep::DistributedDataParallel ddp(net, dist.pg);
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(0.01));

  lockstep::SamplerOptions shard;
  shard.num_replicas = dist.size();
  shard.rank = dist.rank();
  lockstep::DistributedSampler sampler(x.size(0), shard);
  for (int64_t epoch = 0; epoch < 5; ++epoch) {
    sampler.set_epoch(epoch);
    const auto idx = torch::tensor(sampler.indices());
    for (int64_t at = 0; at + 25 <= idx.size(0); at += 25) {
      const auto rows = idx.narrow(0, at, 25);
      adam.zero_grad();
      torch::nn::functional::cross_entropy(ddp.forward(x.index_select(0, rows)),
                                           y.index_select(0, rows))
          .backward();
      adam.step();
    }
  }

  net->eval();
  torch::NoGradGuard no_grad;
  const auto out = net->forward(x);
  if (dist.rank() == 0) {
    lockstep::state_dict_save_file(lockstep::state_dict_of(*net), dir + "/trained.pt");
    std::printf("c++: loss %.6f accuracy %.4f\n",
                torch::nn::functional::cross_entropy(out, y).item<double>(),
                out.argmax(1).eq(y).to(torch::kDouble).mean().item<double>());
  }
  dist.shutdown();
  return 0;
}
