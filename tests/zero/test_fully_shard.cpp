// fully_shard (optim/fully_shard.h) against one process on the whole batch,
// 2 ranks as threads: the gradients each owner ends with equal the
// unsharded model's (within float rounding of the mean), in the ways a
// training loop uses a model: accumulation without zero_grad, in-place ops
// on a unit's output, a unit used twice, an evaluation forward between a
// forward and its backward, a backward that throws; and the failures it
// must name (a parameter without gradient on one rank only).
#include <torch/torch.h>
#include "support/catch.h"

#include <mutex>

#include "lockstep/util/error.h"
#include "lockstep/util/module_tensors.h"
#include "lockstep/util/unit_call.h"
#include "lockstep/zero/fully_shard.h"
#include "support/thread_world.h"

namespace {

using lockstep::ProcessGroup;
namespace F = torch::nn::functional;

thread_local bool g_throw = false;  // per rank (thread)
struct Thrower : public torch::autograd::Function<Thrower> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) {
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list g) {
    if (g_throw) throw std::runtime_error("a failure in backward");
    return g;
  }
};

struct NetImpl : torch::nn::Module {
  NetImpl() {
    emb = register_module("emb", torch::nn::Linear(16, 16));
    for (int i = 0; i < 3; ++i)
      blocks.push_back(register_module("block" + std::to_string(i), torch::nn::Linear(16, 16)));
    head = register_module("head", torch::nn::Linear(16, 4));
  }
  std::string mode;
  int rank = 0;
  torch::Tensor block(size_t i, const torch::Tensor& x) {
    auto& b = blocks[i];
    if (mode == "unused" && i == 1 && rank == 1)  // this rank skips block 1's bias
      return lockstep::call_unit(*b, [&] { return torch::tanh(torch::linear(x, b->weight)) + x; });
    return lockstep::call_unit(*b, [&] { return torch::tanh(b->forward(x)) + x; });
  }
  torch::Tensor forward(torch::Tensor x) {
    x = emb->forward(x);  // a root parameter before the units
    for (size_t i = 0; i < blocks.size(); ++i) {
      x = block(i, x);
      if (mode == "inplace" && i == 0) x.mul_(0.5);
      if (mode == "throw" && i == 1) x = Thrower::apply(x);
    }
    if (mode == "twice") x = block(0, x);
    return head->forward(x);
  }
  std::vector<torch::nn::Linear> blocks;
  torch::nn::Linear emb{nullptr}, head{nullptr};
};
TORCH_MODULE(Net);

struct Probe {
  double worst = -1;  // largest |gradient - reference| over owned parameters
  int64_t held = 0;   // parameter bytes held right after fully_shard
  int64_t whole = 0;  // the model's
  std::string error;
};

Probe probe(ProcessGroup& group, const std::string& which) {
  std::shared_ptr<ProcessGroup> pg(&group, [](ProcessGroup*) {});
  const int64_t world = pg->size(), rank = pg->rank(), rows = 8;
  // The default generator is the process's: the ranks (threads) draw the
  // same data and weights one at a time.
  static std::mutex drawing;
  std::unique_lock<std::mutex> lock(drawing);
  torch::manual_seed(0);
  const auto x = torch::randn({rows * world, 16}), x2 = torch::randn({rows * world, 16});
  const auto y = torch::randint(0, 4, {rows * world}), y2 = torch::randint(0, 4, {rows * world});
  torch::manual_seed(1);
  Net net;
  torch::manual_seed(1);
  Net ref;
  lock.unlock();
  std::vector<std::shared_ptr<torch::nn::Module>> units;
  for (auto& b : net->blocks) units.push_back(b.ptr());
  auto sharded = lockstep::fully_shard(*net, pg, {}, units);
  Probe out;
  out.held = sharded->resident_parameter_bytes();
  for (const auto& p : ref->parameters()) out.whole += static_cast<int64_t>(p.nbytes());
  const auto local = torch::indexing::Slice(rank * rows, (rank + 1) * rows);
  const auto fwd = [&](const torch::Tensor& in) {
    return lockstep::call_unit(*net, [&] { return net->forward(in); });
  };
  try {
    if (which == "base" || which == "inplace" || which == "twice") {
      net->mode = ref->mode = which;
      F::cross_entropy(fwd(x.index({local})), y.index({local})).backward();
      F::cross_entropy(ref->forward(x), y).backward();
    } else if (which == "backward_twice") {  // accumulation without no_sync or zero_grad
      F::cross_entropy(fwd(x.index({local})), y.index({local})).backward();
      F::cross_entropy(fwd(x2.index({local})), y2.index({local})).backward();
      F::cross_entropy(ref->forward(x), y).backward();
      F::cross_entropy(ref->forward(x2), y2).backward();
    } else if (which == "throw") {  // a failed backward, caught, then a normal one
      net->mode = "throw";
      g_throw = true;
      try {
        F::cross_entropy(fwd(x.index({local})), y.index({local})).backward();
      } catch (const std::exception&) {
      }
      g_throw = false;
      for (auto& p : net->parameters()) p.mutable_grad().reset();
      F::cross_entropy(fwd(x2.index({local})), y2.index({local})).backward();
      F::cross_entropy(ref->forward(x2), y2).backward();
    } else if (which == "interleave") {  // an evaluation forward before the pending backward
      auto loss = F::cross_entropy(fwd(x.index({local})), y.index({local}));
      {
        torch::NoGradGuard no_grad;
        fwd(x2.index({local}));
      }
      loss.backward();
      F::cross_entropy(ref->forward(x), y).backward();
    } else if (which == "unused") {
      net->mode = "unused";
      net->rank = static_cast<int>(rank);
      F::cross_entropy(fwd(x.index({local})), y.index({local})).backward();
      return out;
    }
  } catch (const std::exception& e) {
    out.error = lockstep::what_of(e);
    return out;
  }
  const auto mine = lockstep::trainable_parameters(*net);
  const auto theirs = lockstep::trainable_parameters(*ref);
  out.worst = 0;
  for (size_t i = 0; i < mine.size(); ++i) {
    if (sharded->owners()[i] != rank) continue;
    const auto& g = mine[i].second.grad();
    if (!g.defined()) return out.worst = 1e9, out;
    out.worst = std::max(out.worst, (g - theirs[i].second.grad()).abs().max().item<double>());
  }
  return out;
}

std::vector<Probe> run(const std::string& which) {
  auto outcomes = lockstep::testing::run_ranks<Probe>(
      2, [&](ProcessGroup& pg) { return probe(pg, which); }, std::chrono::seconds(30));
  std::vector<Probe> probes;
  for (auto& o : outcomes) {
    if (o.error) std::rethrow_exception(o.error);
    probes.push_back(o.result);
  }
  return probes;
}

}  // namespace

TEST_CASE("fully_shard: each owner's gradients equal one process on the whole batch",
          "[fully_shard]") {
  for (const char* which : {"base", "backward_twice", "inplace", "twice", "throw", "interleave"}) {
    INFO(which);
    for (const auto& p : run(which)) {
      CHECK(p.error.empty());
      CHECK(p.worst >= 0);
      CHECK(p.worst < 1e-6);
    }
  }
}

TEST_CASE("fully_shard: right after it, a rank holds its own parameters only", "[fully_shard]") {
  for (const auto& p : run("base")) {
    INFO("held " << p.held << " of " << p.whole);
    CHECK(p.held < p.whole * 7 / 10);  // ~half, one parameter of imbalance
    CHECK(p.held > p.whole * 3 / 10);
  }
}

TEST_CASE("fully_shard: a parameter without gradient on one rank stops every rank, named",
          "[fully_shard]") {
  const auto probes = run("unused");
  for (const auto& p : probes) {
    INFO(p.error);
    CHECK(p.error.find("got no gradient in a backward on rank 1") != std::string::npos);
  }
  CHECK(probes[1].error.find("block1.bias") != std::string::npos);
}
