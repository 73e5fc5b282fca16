// DistributedDataParallel on 1-3 ranks (threads over Gloo): gradient
// equivalence with one process on the whole batch, bit-identical weights,
// no_sync, unused parameters, buffers, mismatched models, compression hooks,
// coalesced construction, overlap, and hook removal.
#include <torch/nn.h>
#include <torch/optim.h>
#include "support/catch.h"

#include "ddp_models.h"
#include "lockstep/ddp/ddp.h"
#include "lockstep/util/error.h"
#include "support/thread_world.h"

using namespace lockstep;
using namespace lockstep::testing;
namespace F = torch::nn::functional;
using lockstep::testing::Contains;

namespace {

struct Batch {
  torch::Tensor x, y;
};

Batch make_batch(const std::string& model, int64_t rows, torch::Dtype dtype) {
  auto x = model == "cnn" ? torch::randn({rows, 1, 8, 8}) : torch::randn({rows, 12});
  return {x.to(dtype), torch::randint(0, 5, {rows})};
}

torch::nn::Sequential make_model(const std::string& model) {
  return model == "cnn" ? make_cnn() : make_mlp();
}

// Rank r's models start from different weights: DDP must broadcast rank 0's.
std::vector<torch::nn::Sequential> rank_models(const torch::nn::Sequential& base, int n) {
  std::vector<torch::nn::Sequential> models;
  for (int r = 0; r < n; ++r) {
    models.push_back(clone_of(base));
    torch::NoGradGuard no_grad;
    if (r > 0) {
      for (auto& p : models.back()->parameters()) p.add_(torch::randn_like(p));
    }
  }
  return models;
}

std::vector<torch::Tensor> reference_grads(const torch::nn::Sequential& base, const Batch& all) {
  auto model = clone_of(base);
  F::cross_entropy(model->forward(all.x), all.y).backward();
  return grads_of(*model);
}

}  // namespace

TEST_CASE("DDP gradients equal one process's on the concatenated batch", "[ddp]") {
  for (const std::string model_name : {"mlp", "cnn"}) {
    for (int n : {2, 3}) {
      for (double cap_mb : {0.0, 1000.0}) {
        for (bool view : {true, false}) {
          DYNAMIC_SECTION(model_name << " on " << n << " ranks, cap " << cap_mb << " MB, view "
                                     << view) {
            torch::manual_seed(7);
            auto base = make_model(model_name);
            base->to(torch::kDouble);
            const int64_t b = 4;
            const auto all = make_batch(model_name, n * b, torch::kDouble);
            const auto want = reference_grads(base, all);
            auto models = rank_models(base, n);
            DdpOptions options;
            options.bucket_cap_mb = cap_mb;
            options.first_bucket_cap_mb = cap_mb;
            options.gradient_as_bucket_view = view;
            auto outcomes = run_ranks<std::vector<torch::Tensor>>(n, [&](ProcessGroup& pg) {
              auto& model = models[pg.rank()];
              DistributedDataParallel ddp(model, pg.shared_from_this(), options);
              const auto rows = torch::indexing::Slice(pg.rank() * b, (pg.rank() + 1) * b);
              F::cross_entropy(ddp.forward(all.x.index({rows})), all.y.index({rows})).backward();
              return grads_of(*model);
            });
            for (int r = 0; r < n; ++r) {
              INFO("rank " << r << ": " << error_text(outcomes[r].error));
              REQUIRE_FALSE(outcomes[r].error);
              CHECK(relative_error(outcomes[r].result, want) < 1e-6);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("after K SGD steps on different data, weights are bit-identical across ranks", "[ddp]") {
  torch::manual_seed(11);
  auto base = make_mlp();
  const int n = 3, steps = 5;
  auto models = rank_models(base, n);
  std::vector<Batch> data;
  for (int r = 0; r < n; ++r) data.push_back(make_batch("mlp", 8 * steps, torch::kFloat));
  DdpOptions options;
  options.bucket_cap_mb = 0.0005;  // several buckets
  options.first_bucket_cap_mb = 0.0001;
  auto outcomes = run_ranks<std::vector<torch::Tensor>>(n, [&](ProcessGroup& pg) {
    auto& model = models[pg.rank()];
    DistributedDataParallel ddp(model, pg.shared_from_this(), options);
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int s = 0; s < steps; ++s) {
      sgd.zero_grad();
      const auto rows = torch::indexing::Slice(s * 8, (s + 1) * 8);
      const auto& d = data[pg.rank()];
      F::cross_entropy(ddp.forward(d.x.index({rows})), d.y.index({rows})).backward();
      sgd.step();
    }
    return weights_of(*model);
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << error_text(outcomes[r].error));
    REQUIRE_FALSE(outcomes[r].error);
  }
  CHECK_FALSE(bit_identical(outcomes[0].result, weights_of(*base)));  // it trained
  for (int r = 1; r < n; ++r) CHECK(bit_identical(outcomes[r].result, outcomes[0].result));
  // And they are the weights of one process on the concatenated batches.
  auto ref = clone_of(base);
  torch::optim::SGD sgd(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int s = 0; s < steps; ++s) {
    sgd.zero_grad();
    const auto rows = torch::indexing::Slice(s * 8, (s + 1) * 8);
    std::vector<torch::Tensor> xs, ys;
    for (int r = 0; r < n; ++r) {
      xs.push_back(data[r].x.index({rows}));
      ys.push_back(data[r].y.index({rows}));
    }
    F::cross_entropy(ref->forward(torch::cat(xs)), torch::cat(ys)).backward();
    sgd.step();
  }
  CHECK(relative_error(outcomes[0].result, weights_of(*ref)) < 1e-5);
}

TEST_CASE("no_sync on k-1 micro-batches then one synced equals one k-times larger batch", "[ddp]") {
  torch::manual_seed(13);
  auto base = make_mlp();
  base->to(torch::kDouble);
  const int n = 2, k = 3, b = 4;
  const auto all = make_batch("mlp", n * k * b, torch::kDouble);
  const auto want = reference_grads(base, all);
  for (bool view : {true, false}) {
    DYNAMIC_SECTION("gradient_as_bucket_view " << view) {
      auto models = rank_models(base, n);
      DdpOptions options;
      options.gradient_as_bucket_view = view;
      auto outcomes = run_ranks<std::vector<torch::Tensor>>(n, [&](ProcessGroup& pg) {
        auto& model = models[pg.rank()];
        DistributedDataParallel ddp(model, pg.shared_from_this(), options);
        // Rank r's share of the global batch: rows [r*k*b, (r+1)*k*b).
        auto micro = [&](int m) {
          const int64_t start = (pg.rank() * k + m) * b;
          const auto rows = torch::indexing::Slice(start, start + b);
          (F::cross_entropy(ddp.forward(all.x.index({rows})), all.y.index({rows})) / k).backward();
        };
        {
          auto guard = ddp.no_sync();
          for (int m = 0; m < k - 1; ++m) micro(m);
        }
        micro(k - 1);
        return grads_of(*model);
      });
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r << ": " << error_text(outcomes[r].error));
        REQUIRE_FALSE(outcomes[r].error);
        CHECK(relative_error(outcomes[r].result, want) < 1e-6);
      }
    }
  }
}

namespace {
// Two heads; forward uses head "b" only when asked: "a" is then unused.
struct TwoHeadsImpl : torch::nn::Module {
  TwoHeadsImpl() {
    trunk = register_module("trunk", torch::nn::Linear(12, 8));
    a = register_module("a", torch::nn::Linear(8, 5));
    b = register_module("b", torch::nn::Linear(8, 5));
  }
  torch::Tensor forward(const torch::Tensor& x, bool use_a) {
    auto h = torch::tanh(trunk->forward(x));
    return use_a ? a->forward(h) : b->forward(h);
  }
  torch::nn::Linear trunk{nullptr}, a{nullptr}, b{nullptr};
};
TORCH_MODULE(TwoHeads);
}  // namespace

TEST_CASE("a parameter with no gradient is an error naming it, unless find_unused_parameters",
          "[ddp]") {
  torch::manual_seed(17);
  const int n = 2;
  std::vector<TwoHeads> models;
  for (int r = 0; r < n; ++r) models.emplace_back();
  const auto x = torch::randn({n * 4, 12});
  const auto y = torch::randint(0, 5, {n * 4});

  SECTION("without the option: every rank reports the unused parameters") {
    auto outcomes = run_ranks<int>(n, [&](ProcessGroup& pg) {
      DistributedDataParallel ddp(models[pg.rank()], pg.shared_from_this());
      F::cross_entropy(ddp.forward(x, false), y).backward();
      return 0;
    });
    for (int r = 0; r < n; ++r) {
      REQUIRE(outcomes[r].error);
      const auto what = error_text(outcomes[r].error);
      CHECK_THAT(what, Contains("rank " + std::to_string(r) + ": 2 parameter(s) got no gradient"));
      // A model bug, not a network failure (exit 2, not 3).
      CHECK_THROWS_AS(std::rethrow_exception(outcomes[r].error), UsageError);
      CHECK_THAT(what, Contains("'a.weight'"));
      CHECK_THAT(what, Contains("'a.bias'"));
      CHECK_THAT(what, Contains("find_unused_parameters"));
    }
  }

  SECTION("with the option: used parameters are averaged, globally unused ones untouched") {
    DdpOptions options;
    options.find_unused_parameters = true;
    options.gradient_as_bucket_view = false;
    auto outcomes = run_ranks<std::vector<torch::Tensor>>(n, [&](ProcessGroup& pg) {
      auto& model = models[pg.rank()];
      DistributedDataParallel ddp(model, pg.shared_from_this(), options);
      const auto rows = torch::indexing::Slice(pg.rank() * 4, (pg.rank() + 1) * 4);
      F::cross_entropy(ddp.forward(x.index({rows}), false), y.index({rows})).backward();
      return grads_of(*model);
    });
    // Reference: one process, whole batch, rank 0's (broadcast) weights.
    auto ref = TwoHeads();
    {
      torch::NoGradGuard no_grad;
      auto src = models[0]->parameters();
      auto dst = ref->parameters();
      for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
    }
    F::cross_entropy(ref->forward(x, false), y).backward();
    const auto want = grads_of(*ref);
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r << ": " << error_text(outcomes[r].error));
      REQUIRE_FALSE(outcomes[r].error);
      const auto& got = outcomes[r].result;
      // Parameter order: trunk.weight, trunk.bias, a.weight, a.bias, b.weight, b.bias.
      CHECK_FALSE(got[2].defined());
      CHECK_FALSE(got[3].defined());
      for (size_t i : {0, 1, 4, 5}) CHECK(torch::allclose(got[i], want[i], 1e-5, 1e-7));
    }
  }

  SECTION("with the option: a head used on one rank only still gets the average") {
    DdpOptions options;
    options.find_unused_parameters = true;
    auto outcomes = run_ranks<std::vector<torch::Tensor>>(n, [&](ProcessGroup& pg) {
      auto& model = models[pg.rank()];
      DistributedDataParallel ddp(model, pg.shared_from_this(), options);
      const auto rows = torch::indexing::Slice(pg.rank() * 4, (pg.rank() + 1) * 4);
      // Rank 0 uses head a, rank 1 head b.
      F::cross_entropy(ddp.forward(x.index({rows}), pg.rank() == 0), y.index({rows})).backward();
      return grads_of(*model);
    });
    for (int r = 0; r < n; ++r) REQUIRE_FALSE(outcomes[r].error);
    for (size_t i = 0; i < outcomes[0].result.size(); ++i) {
      REQUIRE(outcomes[0].result[i].defined());
      CHECK(torch::equal(outcomes[0].result[i], outcomes[1].result[i]));
    }
  }
}

namespace {
struct NormedImpl : torch::nn::Module {
  NormedImpl() {
    fc = register_module("fc", torch::nn::Linear(6, 4));
    bn = register_module("bn", torch::nn::BatchNorm1d(4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return bn->forward(fc->forward(x)); }
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(Normed);
}  // namespace

TEST_CASE("buffers are broadcast from rank 0 before the first forward", "[ddp]") {
  const int n = 3;
  std::vector<Normed> models(n);
  for (bool broadcast : {true, false}) {
    DYNAMIC_SECTION("broadcast_buffers " << broadcast) {
      DdpOptions options;
      options.broadcast_buffers = broadcast;
      auto outcomes = run_ranks<torch::Tensor>(n, [&](ProcessGroup& pg) {
        auto& model = models[pg.rank()];
        DistributedDataParallel ddp(model, pg.shared_from_this(), options);
        model->eval();  // eval: forward reads the running stats and leaves them alone
        auto& bn = model->bn;
        {
          torch::NoGradGuard no_grad;
          bn->running_mean.fill_(10.0 * pg.rank());
        }
        ddp.forward(torch::randn({2, 6}));
        return bn->running_mean.clone();
      });
      for (int r = 0; r < n; ++r) {
        REQUIRE_FALSE(outcomes[r].error);
        const double expected = broadcast ? 0.0 : 10.0 * r;
        CHECK(torch::equal(outcomes[r].result, torch::full({4}, expected)));
      }
    }
  }
}

TEST_CASE("different models on different ranks: every rank names the rank and tensor", "[ddp]") {
  const int n = 3;
  std::vector<torch::nn::Sequential> models{make_mlp(12, 16), make_mlp(12, 16), make_mlp(12, 20)};
  auto outcomes = run_ranks<int>(n, [&](ProcessGroup& pg) {
    DistributedDataParallel ddp(models[pg.rank()], pg.shared_from_this());
    return 0;
  });
  for (int r = 0; r < n; ++r) {
    REQUIRE(outcomes[r].error);
    const auto what = error_text(outcomes[r].error);
    CHECK_THAT(what, Contains("model mismatch across ranks at parameter/buffer #0"));
    CHECK_THAT(what, Contains("rank 0 has '0.weight' Float [16, 12]"));
    CHECK_THAT(what, Contains("rank 2 has '0.weight' Float [20, 12]"));
    CHECK_THAT(what, !Contains("rank 1 has"));
  }
}

TEST_CASE("fp16 and bf16 compression hooks stay within their tolerance", "[ddp]") {
  torch::manual_seed(19);
  auto base = make_mlp();
  const int n = 2, b = 8;
  const auto all = make_batch("mlp", n * b, torch::kFloat);
  const auto want = reference_grads(base, all);
  for (const std::string hook : {"fp16", "bf16"}) {
    DYNAMIC_SECTION(hook) {
      auto models = rank_models(base, n);
      DdpOptions options;
      options.comm_hook = comm_hook_create(parse_named(kCommHookKindNames, hook, "hook"));
      if (hook == "bf16" && kTorchVersionMajor < 2) {
        // Gloo in LibTorch 1.13 has no bfloat16: a clear error on every rank.
        auto refused = run_ranks<int>(
            n,
            [&](ProcessGroup& pg) {
              DistributedDataParallel ddp(models[pg.rank()], pg.shared_from_this(), options);
              return 0;
            },
            std::chrono::seconds(60), BackendKind::kGloo);
        for (int r = 0; r < n; ++r) {
          REQUIRE(refused[r].error);
          CHECK_THAT(error_text(refused[r].error),
                     Contains("comm hook 'bf16': the gloo backend of this LibTorch cannot "
                              "all-reduce BFloat16"));
        }
        // The shm backend reduces bfloat16 itself: the hook works there.
        if (testing::test_backend() == BackendKind::kGloo) return;
      }
      auto outcomes = run_ranks<std::vector<torch::Tensor>>(n, [&](ProcessGroup& pg) {
        auto& model = models[pg.rank()];
        DistributedDataParallel ddp(model, pg.shared_from_this(), options);
        const auto rows = torch::indexing::Slice(pg.rank() * b, (pg.rank() + 1) * b);
        F::cross_entropy(ddp.forward(all.x.index({rows})), all.y.index({rows})).backward();
        return grads_of(*model);
      });
      // fp16 keeps 11 significant bits, bf16 8: a few units in the last place.
      const double tolerance = hook == "fp16" ? 2e-3 : 2e-2;
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r << ": " << error_text(outcomes[r].error));
        REQUIRE_FALSE(outcomes[r].error);
        const double err = relative_error(outcomes[r].result, want);
        CHECK(err < tolerance);
        CHECK(err > 0);  // the compression really happened
      }
      CHECK(bit_identical(outcomes[0].result, outcomes[1].result));
    }
  }
}

TEST_CASE("construction is coalesced and every bucket is launched during backward", "[ddp]") {
  torch::manual_seed(23);
  auto base = make_mlp();
  const int n = 2;
  auto models = rank_models(base, n);
  DdpOptions options;
  options.bucket_cap_mb = 0;  // one bucket per parameter: 6 buckets
  options.first_bucket_cap_mb = 0;
  struct Seen {
    uint64_t construction_collectives = 0;
    ReducerStats stats;
  };
  auto outcomes = run_ranks<Seen>(n, [&](ProcessGroup& pg) {
    Seen seen;
    const auto before = pg.sequence();
    DistributedDataParallel ddp(models[pg.rank()], pg.shared_from_this(), options);
    seen.construction_collectives = pg.sequence() - before;
    F::cross_entropy(ddp.forward(torch::randn({4, 12})), torch::randint(0, 5, {4})).backward();
    seen.stats = ddp.reducer()->last_stats();
    return seen;
  });
  for (int r = 0; r < n; ++r) {
    REQUIRE_FALSE(outcomes[r].error);
    // 2 all-gathers (counts, hashes) + 1 broadcast for the 6 float tensors,
    // and on shm one bucket_zeros per bucket (Note [Buckets in shared memory]).
    const bool shm = test_backend() != BackendKind::kGloo;
    CHECK(outcomes[r].result.construction_collectives == (shm ? 3 + 6 : 3));
    CHECK(outcomes[r].result.stats.buckets == 6);
    CHECK(outcomes[r].result.stats.launched_during_backward == 6);
  }
}

TEST_CASE("zero_grad works with bucket views and the next step still synchronises", "[ddp]") {
  torch::manual_seed(29);
  auto base = make_mlp();
  const int n = 2;
  auto models = rank_models(base, n);
  const auto x = torch::randn({3, n * 4, 12});  // [step, rows of all ranks]
  const auto y = torch::randint(0, 5, {3, n * 4});
  auto outcomes = run_ranks<std::vector<torch::Tensor>>(n, [&](ProcessGroup& pg) {
    auto& model = models[pg.rank()];
    DistributedDataParallel ddp(model, pg.shared_from_this());
    torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-2));
    const auto rows = torch::indexing::Slice(pg.rank() * 4, (pg.rank() + 1) * 4);
    for (int s = 0; s < 3; ++s) {
      adam.zero_grad();
      F::cross_entropy(ddp.forward(x[s].index({rows})), y[s].index({rows})).backward();
      adam.step();
    }
    return weights_of(*model);
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << error_text(outcomes[r].error));
    REQUIRE_FALSE(outcomes[r].error);
  }
  CHECK(bit_identical(outcomes[0].result, outcomes[1].result));
  auto ref = clone_of(base);
  torch::optim::Adam adam(ref->parameters(), torch::optim::AdamOptions(1e-2));
  for (int s = 0; s < 3; ++s) {
    adam.zero_grad();
    F::cross_entropy(ref->forward(x[s]), y[s]).backward();
    adam.step();
  }
  CHECK(relative_error(outcomes[0].result, weights_of(*ref)) < 1e-5);
}

TEST_CASE("destroying DDP removes its hooks - world size 1 communicates nothing", "[ddp]") {
  torch::manual_seed(31);
  auto base = make_mlp();
  auto models = rank_models(base, 2);
  auto outcomes = run_ranks<std::vector<torch::Tensor>>(2, [&](ProcessGroup& pg) {
    auto& model = models[pg.rank()];
    { DistributedDataParallel ddp(model, pg.shared_from_this()); }
    const auto before = pg.sequence();
    // Different data per rank and no DDP: gradients must stay local.
    torch::manual_seed(0);  // racy across threads, but only the values differ
    F::cross_entropy(model->forward(torch::full({2, 12}, 1.0 + pg.rank())), torch::tensor({0, 1}))
        .backward();
    if (pg.sequence() != before) throw std::runtime_error("a collective ran after DDP was gone");
    return grads_of(*model);
  });
  REQUIRE_FALSE(outcomes[0].error);
  REQUIRE_FALSE(outcomes[1].error);
  CHECK_FALSE(bit_identical(outcomes[0].result, outcomes[1].result));

  auto single = run_ranks<std::vector<torch::Tensor>>(1, [&](ProcessGroup& pg) {
    auto model = clone_of(base);
    DistributedDataParallel ddp(model, pg.shared_from_this());
    F::cross_entropy(ddp.forward(torch::ones({2, 12})), torch::tensor({0, 1})).backward();
    if (pg.sequence() != 0) throw std::runtime_error("world size 1 communicated");
    return grads_of(*model);
  });
  REQUIRE_FALSE(single[0].error);
  auto plain = clone_of(base);
  F::cross_entropy(plain->forward(torch::ones({2, 12})), torch::tensor({0, 1})).backward();
  CHECK(bit_identical(single[0].result, grads_of(*plain)));
}

namespace {
// Registered late-then-early but run early-then-late: gradients arrive in
// registration order, the opposite of the initial bucket order.
struct ReversedImpl : torch::nn::Module {
  ReversedImpl() {
    late = register_module("late", torch::nn::Linear(16, 5));
    early = register_module("early", torch::nn::Linear(12, 16));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return late->forward(torch::tanh(early->forward(x)));
  }
  torch::nn::Linear late{nullptr}, early{nullptr};
};
TORCH_MODULE(Reversed);
}  // namespace

TEST_CASE("buckets are rebuilt once in rank 0's observed gradient order", "[ddp]") {
  torch::manual_seed(37);
  const int n = 2;
  std::vector<Reversed> models(n);
  Reversed ref;  // rank 0's initial weights, which DDP broadcasts
  {
    torch::NoGradGuard no_grad;
    auto src = models[0]->parameters();
    auto dst = ref->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }
  const auto x = torch::randn({4, n * 4, 12});  // [step, rows of all ranks]
  const auto y = torch::randint(0, 5, {4, n * 4});
  struct Seen {
    std::vector<std::vector<size_t>> before, after;
    std::vector<torch::Tensor> weights;
  };
  DdpOptions options;
  options.bucket_cap_mb = 0;  // one parameter per bucket: the order is visible
  options.first_bucket_cap_mb = 0;
  auto outcomes = run_ranks<Seen>(n, [&](ProcessGroup& pg) {
    Seen seen;
    auto& model = models[pg.rank()];
    DistributedDataParallel ddp(model, pg.shared_from_this(), options);
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    for (int step = 0; step < 4; ++step) {
      if (step == 1) seen.before = ddp.reducer()->bucket_indices();
      sgd.zero_grad();
      const auto rows = torch::indexing::Slice(pg.rank() * 4, (pg.rank() + 1) * 4);
      F::cross_entropy(ddp.forward(x[step].index({rows})), y[step].index({rows})).backward();
      sgd.step();
    }
    seen.after = ddp.reducer()->bucket_indices();
    seen.weights = weights_of(*model);
    return seen;
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << error_text(outcomes[r].error));
    REQUIRE_FALSE(outcomes[r].error);
    // Parameters: 0 late.weight, 1 late.bias, 2 early.weight, 3 early.bias.
    // Initially reverse registration: early first. After the rebuild, the
    // observed order: late's gradients arrive first.
    CHECK(outcomes[r].result.before.front().front() >= 2);
    CHECK(outcomes[r].result.after.front().front() <= 1);
    CHECK(outcomes[r].result.after == outcomes[0].result.after);  // one layout everywhere
  }
  CHECK(bit_identical(outcomes[0].result.weights, outcomes[1].result.weights));
  torch::optim::SGD sgd(ref->parameters(), torch::optim::SGDOptions(0.1));
  for (int step = 0; step < 4; ++step) {
    sgd.zero_grad();
    F::cross_entropy(ref->forward(x[step]), y[step]).backward();
    sgd.step();
  }
  CHECK(relative_error(outcomes[0].result.weights, weights_of(*ref)) < 1e-5);
}
