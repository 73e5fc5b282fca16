// CUDA and NCCL, with values (issue 23). Hidden from the CPU suite by the
// [.cuda] tag: ctest runs them as unit.cuda in a build against a CUDA
// LibTorch on a machine with a GPU, and reports unit.cuda skipped (exit 77)
// anywhere else. They use only ATen's device-generic API, so every build
// compiles them: an API slip fails the CPU build, not the first GPU run.
//
// One GPU: NCCL refuses two ranks on one device, so NCCL runs at world size
// 1 (the backend called directly: lockstep's ProcessGroup returns early at
// world size 1), and DDP's CUDA path at world size 2 goes through Gloo,
// which all-reduces CUDA tensors (two processes sharing the GPU, tagged
// [.cuda_ranks]: Note [Two ranks of DDP on one GPU]).
//
// Not CUDA-graph-safe: the Reducer's hooks and the end-of-backward wait run
// on the host, and the checks synchronise; capture a step in a graph and the
// exchange is not replayed (docs/gpu.md).
#include <ATen/ATen.h>
#include <torch/nn.h>
#include <torch/optim.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <cstdlib>
#include <string>

#include "ddp/ddp_models.h"
#include "lockstep/check/fingerprint.h"
#include "lockstep/ddp/ddp.h"
#include "lockstep/distributed/init.h"
#include "lockstep/optim/foreach_adam.h"
#include "lockstep/optim/grad_norms.h"
#include "lockstep/optim/optim.h"
#include "support/catch.h"
#include "support/thread_world.h"

using namespace lockstep;
using namespace lockstep::testing;
namespace F = torch::nn::functional;

namespace {

const at::Device kGpu(at::kCUDA, 0);

std::vector<at::Tensor> on_cpu(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  for (const auto& t : tensors) out.push_back(t.cpu());
  return out;
}

}  // namespace

// Note [Two ranks of DDP on one GPU]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Not as threads of one process: the autograd engine runs every CUDA
// backward of a process on ONE worker thread per device, so rank 0's
// end-of-backward wait for the exchange (queued on that thread, as
// PyTorch's DDP does) blocks rank 1's backward behind it: the first GPU run
// (docs/gpu.md) hung there until Gloo's 120 s timeout. Real jobs run a
// process per rank, and so does this case: scripts/gpu_check.sh launches it
// with `lockstep-run --nproc-per-node 2 lockstep_tests "[.cuda_ranks]"`;
// with LOCKSTEP_TEST_DEVICE=cpu it runs on the CPU (ctest's
// unit.ddp_processes, and the kit's rehearsal). Rank 1 starts from other
// weights (DDP's first broadcast must replace them) and three SGD steps
// take it past the bucket rebuild.
TEST_CASE("DDP over CUDA parameters, a process per rank, equals one process on the whole batch",
          "[.cuda_ranks]") {
  const char* where = std::getenv("LOCKSTEP_TEST_DEVICE");
  const at::Device device =
      where != nullptr && std::string(where) == "cpu" ? at::Device(at::kCPU) : kGpu;
  if (device.is_cuda()) REQUIRE(at::hasCUDA());
  InitOptions init;
  init.backend = BackendKind::kGloo;  // NCCL refuses two ranks on one GPU
  auto dist = init_distributed(init);
  REQUIRE(dist.size() == 2);
  const int64_t b = 4;
  const int steps = 3;  // past the bucket rebuild after the first step
  for (bool view : {true, false}) {
    INFO("gradient_as_bucket_view " << view);
    torch::manual_seed(7);  // every rank: the same model and batches
    auto base = make_mlp();
    const auto x = torch::randn({steps, 2 * b, 12});
    const auto y = torch::randint(0, 5, {steps, 2 * b});
    auto reference = clone_of(base);
    reference->to(device);
    torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.1));

    auto model = clone_of(base);
    if (dist.rank() == 1) {  // DDP's first broadcast must make it rank 0's
      torch::NoGradGuard no_grad;
      for (auto& p : model->parameters()) p.add_(1.0);
    }
    model->to(device);
    DdpOptions options;
    options.gradient_as_bucket_view = view;
    options.bucket_cap_mb = 0.001;  // several buckets
    options.first_bucket_cap_mb = 0.0005;
    DistributedDataParallel ddp(model, dist.pg, options);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
    const auto rows = torch::indexing::Slice(dist.rank() * b, (dist.rank() + 1) * b);
    for (int s = 0; s < steps; ++s) {
      INFO("step " << s);
      ref_opt.zero_grad();
      F::cross_entropy(reference->forward(x[s].to(device)), y[s].to(device)).backward();
      const auto want = on_cpu(grads_of(*reference));
      ref_opt.step();

      opt.zero_grad();
      const auto out = ddp.forward(x[s].index({rows}).to(device));
      REQUIRE(out.device() == device);
      F::cross_entropy(out, y[s].index({rows}).to(device)).backward();
      std::vector<NamedTensor> grads;
      for (const auto& item : model->named_parameters()) {
        REQUIRE(item.value().grad().device() == device);
        grads.push_back({item.key(), item.value().grad()});
      }
      CHECK(relative_error(on_cpu(grads_of(*model)), want) < 1e-5);
      // Bit-identical across the ranks (the digest of each rank's gradients).
      const auto agreed = fingerprint_check(*dist.pg, grads, DigestMode::kChecksum, s + 1);
      INFO(agreed.message);
      CHECK(agreed.consistent);
      opt.step();
    }
    CHECK(relative_error(on_cpu(weights_of(*model)), on_cpu(weights_of(*reference))) < 1e-5);
  }
  dist.shutdown();
}

TEST_CASE("the checksum fingerprint runs on the GPU, equals the CPU's and sees one flipped element",
          "[.cuda]") {
  REQUIRE(at::hasCUDA());
  torch::manual_seed(3);
  std::vector<NamedTensor> cpu{{"w", torch::randn({64, 33})}, {"b", torch::randn({33})}};
  std::vector<NamedTensor> gpu;
  for (const auto& t : cpu) gpu.push_back({t.name, t.tensor.to(kGpu)});
  const auto on_gpu = fingerprint_digest(gpu, DigestMode::kChecksum);
  CHECK(on_gpu == fingerprint_digest(cpu, DigestMode::kChecksum));  // bit patterns, not floats
  CHECK(fingerprint_digest(gpu, DigestMode::kAuto) == on_gpu);      // auto: checksum for CUDA
  auto flipped = gpu;
  flipped[0].tensor = gpu[0].tensor.clone();
  // One bit of one element: the lowest mantissa bit of w[17][5].
  auto bits = flipped[0].tensor.view(at::kInt);
  bits[17][5].add_(1);
  CHECK(fingerprint_digest(flipped, DigestMode::kChecksum) != on_gpu);

  // Across two ranks sharing the GPU: equal, then the flipped one named.
  auto outcomes = run_ranks<std::pair<bool, std::string>>(
      2,
      [&](ProcessGroup& pg) {
        const auto& mine = pg.rank() == 1 ? flipped : gpu;
        const auto same = fingerprint_check(pg, gpu, DigestMode::kChecksum, 1);
        const auto differ = fingerprint_check(pg, mine, DigestMode::kChecksum, 2);
        return std::make_pair(same.consistent && !differ.consistent, differ.message);
      },
      std::chrono::seconds(120), BackendKind::kGloo);
  for (const auto& o : outcomes) {
    REQUIRE(error_text(o.error) == "");
    CHECK(o.result.first);
    CHECK_THAT(o.result.second, Contains("after step 2: first differing tensor 'w'"));
  }
}

// Note [Foreach optimizers]: on a GPU the default for Adam and AdamW, as in
// PyTorch; multi-tensor kernels of the same arithmetic as LibTorch's
// per-parameter step, so equal to it up to rounding (not asserted bit for
// bit: CUDA's per-tensor division by a host scalar multiplies by its
// reciprocal, the foreach one divides).
TEST_CASE("on a GPU optimizer_create steps AdamW with foreach, as LibTorch's step to rounding",
          "[.cuda]") {
  REQUIRE(at::hasCUDA());
  torch::manual_seed(5);
  std::vector<at::Tensor> init;
  for (int i = 0; i < 150; ++i) init.push_back(torch::randn({i % 7 + 1, 64}, kGpu));
  std::vector<at::Tensor> a, b;
  for (const auto& t : init) {
    a.push_back(t.clone().requires_grad_(true));
    b.push_back(t.clone().requires_grad_(true));
  }
  OptimConfig c;
  c.name = OptimizerKind::kAdamW;
  c.lr = 0.01;
  c.weight_decay = 0.1;
  auto reference = optimizer_create(c, a, false);
  auto multi = optimizer_create(c, b);  // every parameter on the GPU: foreach
  REQUIRE(dynamic_cast<ForeachAdamW*>(multi.get()) != nullptr);
  REQUIRE(dynamic_cast<ForeachAdamW*>(reference.get()) == nullptr);
  for (int step = 0; step < 5; ++step) {
    for (size_t i = 0; i < a.size(); ++i) {
      const auto grad = torch::randn_like(init[i]);
      a[i].mutable_grad() = grad.clone();
      b[i].mutable_grad() = grad.clone();
    }
    reference->step();
    multi->step();
  }
  double worst = 0, moved = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
    moved = std::max(moved, (a[i] - init[i]).abs().max().item<double>());
  }
  CHECK(moved > 0.01);  // 5 steps of lr 0.01 moved the weights
  CHECK(worst < 1e-6);
}

// Note [Clipping's kernels]: on a GPU the norms come from one multi-tensor
// kernel. A tensor's norm must not depend on the rest of the list (a ZeRO
// owner takes the norms of its own gradients only, DDP of all): bit for
// bit alike in the whole list, in half of it and alone; within rounding of
// the CPU's; and the scaling multiplies every tensor by the factor.
TEST_CASE("on a GPU the gradients' norms are each tensor's alone, and the scaling is exact",
          "[.cuda]") {
  REQUIRE(at::hasCUDA());
  torch::manual_seed(6);
  std::vector<at::Tensor> all, half;
  // Sizes across the kernel's 65536-element chunks, one over 512 chunks.
  for (int64_t n : {1, 7, 65535, 65536, 65537, 300000, 33554432 + 5, 3})
    all.push_back(torch::randn({n}, kGpu));
  for (size_t i = 0; i < all.size(); i += 2) half.push_back(all[i]);
  const auto whole = tensor_norms(all), some = tensor_norms(half);
  REQUIRE(whole.size() == all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    const auto alone = tensor_norms({all[i]});
    INFO("tensor " << i << " of " << all[i].numel() << " elements");
    CHECK(at::equal(whole[i], alone[0]));
    if (i % 2 == 0) CHECK(at::equal(whole[i], some[i / 2]));
    const double cpu = all[i].cpu().to(at::kDouble).norm(2).item<double>();
    CHECK(std::abs(whole[i].item<double>() - cpu) <= 1e-5 * cpu);
  }
  // A bfloat16 gradient in the list leaves the float ones' norms alone (the
  // norms are taken by dtype, as PyTorch's clip_grad_norm_ groups them).
  auto mixed = all;
  mixed.insert(mixed.begin() + 1, torch::randn({1000}, kGpu).to(at::kBFloat16));
  const auto with_bf16 = tensor_norms(mixed);
  CHECK(with_bf16[1].scalar_type() == at::kBFloat16);
  CHECK(at::equal(with_bf16[0], whole[0]));
  for (size_t i = 1; i < all.size(); ++i) CHECK(at::equal(with_bf16[i + 1], whole[i]));
  std::vector<at::Tensor> scaled;
  for (const auto& t : all) scaled.push_back(t.clone());
  const auto factor = torch::tensor(0.375, at::TensorOptions().dtype(at::kFloat));  // CPU: moved
  scale_tensors(scaled, factor);
  for (size_t i = 0; i < all.size(); ++i) CHECK(at::equal(scaled[i], all[i] * 0.375));
}

TEST_CASE("NCCL at world size 1: communicator set-up, all-reduce and broadcast", "[.cuda]") {
  REQUIRE(at::hasCUDA());
  REQUIRE(nccl_available());
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto backend = nccl_backend_create(store, 0, 1, std::chrono::seconds(60));
  std::vector<at::Tensor> sum{at::arange(1000, at::TensorOptions(kGpu).dtype(at::kFloat))};
  c10d::AllreduceOptions all;
  all.reduceOp = c10d::ReduceOp::SUM;
  backend->allreduce(sum, all)->wait();
  CHECK(at::equal(sum[0].cpu(), at::arange(1000, at::kFloat)));  // one rank: the sum is itself
  std::vector<at::Tensor> max{at::full({7}, 2.5, at::TensorOptions(kGpu))};
  all.reduceOp = c10d::ReduceOp::MAX;
  backend->allreduce(max, all)->wait();
  CHECK(at::equal(max[0].cpu(), at::full({7}, 2.5)));
  std::vector<at::Tensor> root{at::full({5}, 3.0, at::TensorOptions(kGpu).dtype(at::kDouble))};
  c10d::BroadcastOptions from;
  from.rootRank = 0;
  backend->broadcast(root, from)->wait();
  CHECK(at::equal(root[0].cpu(), at::full({5}, 3.0, at::kDouble)));

  // Through lockstep's ProcessGroup: the device NCCL's tensors live on, and
  // DDP at world size 1 on it (nothing to reduce; the forward still runs).
  auto outcomes = run_ranks<int>(
      1,
      [&](ProcessGroup& pg) {
        if (pg.device() != kGpu) throw std::runtime_error("NCCL's device is not cuda:0");
        auto model = make_mlp();
        model->to(kGpu);
        DistributedDataParallel ddp(model, pg.shared_from_this());
        F::cross_entropy(ddp.forward(torch::randn({3, 12}, kGpu)),
                         torch::zeros({3}, at::TensorOptions(kGpu).dtype(at::kLong)))
            .backward();
        return 0;
      },
      std::chrono::seconds(120), BackendKind::kNccl);
  CHECK(error_text(outcomes[0].error) == "");
}
