// DDP defects a user would hit, each reproduced: a backward that throws half
// way, rank-dependent requires_grad, sparse gradients, forwards under
// NoGradGuard, PyTorch's buffer-broadcast rule, tied parameters, gradient
// layout (channels_last, transposed), and uneven inputs (join).
#include <torch/nn.h>
#include <torch/optim.h>

#include "ddp_models.h"
#include "lockstep/ddp/ddp.h"
#include "lockstep/util/error.h"
#include "support/catch.h"
#include "support/thread_world.h"

using namespace lockstep;
using namespace lockstep::testing;
namespace F = torch::nn::functional;
using lockstep::testing::Contains;

namespace {

// Three layers; a tensor hook on the first activation can be told to throw,
// which happens after the gradients of the two later layers have arrived.
struct FragileImpl : torch::nn::Module {
  FragileImpl() {
    l1 = register_module("l1", torch::nn::Linear(12, 8));
    l2 = register_module("l2", torch::nn::Linear(8, 8));
    l3 = register_module("l3", torch::nn::Linear(8, 5));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::tanh(l1->forward(x));
    if (h.requires_grad()) {
      h.register_hook([this](torch::Tensor g) {
        if (fail_in_middle) throw std::runtime_error("user hook failed");
        return g;
      });
    }
    auto out = l3->forward(torch::tanh(l2->forward(h)));
    if (out.requires_grad()) {
      out.register_hook([this](torch::Tensor g) {
        if (fail_at_start) throw std::runtime_error("user hook failed before any gradient");
        return g;
      });
    }
    return out;
  }
  torch::nn::Linear l1{nullptr}, l2{nullptr}, l3{nullptr};
  bool fail_in_middle = false;
  bool fail_at_start = false;
};
TORCH_MODULE(Fragile);

std::vector<Fragile> fragile_models(int n, uint64_t seed) {
  std::vector<Fragile> models;
  for (int r = 0; r < n; ++r) {
    torch::manual_seed(seed);
    models.emplace_back();
    models.back()->to(torch::kDouble);
  }
  return models;
}

}  // namespace

TEST_CASE("a backward that throws half way stops DDP with a clear error on every later forward",
          "[ddp]") {
  const int n = 2;
  for (bool find_unused : {false, true}) {
    DYNAMIC_SECTION("find_unused_parameters " << find_unused) {
      auto models = fragile_models(n, 41);
      DdpOptions options;
      options.find_unused_parameters = find_unused;
      options.bucket_cap_mb = 0.0001;  // l3 and l2 launch their buckets before the throw
      options.first_bucket_cap_mb = 0.0001;
      struct Seen {
        std::string first, second, third;
      };
      auto outcomes = run_ranks<Seen>(n, [&](ProcessGroup& pg) {
        auto& model = models[pg.rank()];
        DistributedDataParallel ddp(model, pg.shared_from_this(), options);
        const auto x = torch::randn({4, 12}, torch::kDouble);
        const auto y = torch::randint(0, 5, {4});
        Seen seen;
        auto step = [&]() -> std::string {
          try {
            F::cross_entropy(ddp.forward(x), y).backward();
            return "ok";
          } catch (const std::exception& e) {
            return e.what();
          }
        };
        model->fail_in_middle = true;
        seen.first = step();
        model->fail_in_middle = false;
        seen.second = step();
        seen.third = step();
        return seen;
      });
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r << ": " << error_text(outcomes[r].error));
        REQUIRE_FALSE(outcomes[r].error);
        const auto& seen = outcomes[r].result;
        CHECK_THAT(seen.first, Contains("user hook failed"));
        for (const auto& later : {seen.second, seen.third}) {
          CHECK_THAT(later, Contains("rank " + std::to_string(r) +
                                     ": DistributedDataParallel cannot continue: the previous "
                                     "synchronised backward stopped before its end"));
          CHECK_THAT(later, Contains("buckets were exchanged"));
          CHECK_THAT(later, !Contains("two gradients"));
        }
      }
    }
  }
}

TEST_CASE("a backward that throws before any gradient arrived leaves DDP usable, with values",
          "[ddp]") {
  const int n = 2;
  const int64_t b = 4;
  auto models = fragile_models(n, 43);
  auto reference = fragile_models(1, 43)[0];
  torch::manual_seed(44);
  const auto x = torch::randn({n * b, 12}, torch::kDouble);
  const auto y = torch::randint(0, 5, {n * b});
  F::cross_entropy(reference->forward(x), y).backward();
  const auto want = grads_of(*reference);
  auto outcomes = run_ranks<std::vector<torch::Tensor>>(n, [&](ProcessGroup& pg) {
    auto& model = models[pg.rank()];
    DistributedDataParallel ddp(model, pg.shared_from_this());
    const auto rows = torch::indexing::Slice(pg.rank() * b, (pg.rank() + 1) * b);
    model->fail_at_start = true;
    try {
      F::cross_entropy(ddp.forward(x.index({rows})), y.index({rows})).backward();
      throw std::logic_error("the hook did not throw");
    } catch (const std::runtime_error&) {
    }
    model->fail_at_start = false;
    model->zero_grad();
    F::cross_entropy(ddp.forward(x.index({rows})), y.index({rows})).backward();
    return grads_of(*model);
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << error_text(outcomes[r].error));
    REQUIRE_FALSE(outcomes[r].error);
    CHECK(relative_error(outcomes[r].result, want) < 1e-9);
  }
}

TEST_CASE("requires_grad that differs between ranks is refused at construction, named", "[ddp]") {
  const int n = 2;
  std::vector<torch::nn::Sequential> models{make_mlp(), make_mlp()};
  models[1][2]->as<torch::nn::Linear>()->weight.requires_grad_(false);  // "2.weight" on rank 1
  auto outcomes = run_ranks<int>(n, [&](ProcessGroup& pg) {
    DistributedDataParallel ddp(models[pg.rank()], pg.shared_from_this());
    return 0;
  });
  for (int r = 0; r < n; ++r) {
    REQUIRE(outcomes[r].error);
    const auto what = error_text(outcomes[r].error);
    CHECK_THAT(what, Contains("model mismatch across ranks"));
    CHECK_THAT(what, Contains("rank 0 has '2.weight' Float [16, 16] requires_grad"));
    CHECK_THAT(what, Contains("rank 1 has '2.weight' Float [16, 16] without requires_grad"));
  }
}

namespace {
struct BagOfWordsImpl : torch::nn::Module {
  explicit BagOfWordsImpl(bool sparse) {
    emb = register_module("emb",
                          torch::nn::Embedding(torch::nn::EmbeddingOptions(20, 6).sparse(sparse)));
    fc = register_module("fc", torch::nn::Linear(6, 3));
  }
  torch::Tensor forward(const torch::Tensor& ids) { return fc->forward(emb->forward(ids).mean(1)); }
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(BagOfWords);
}  // namespace

TEST_CASE("sparse gradients are refused at construction, naming the module", "[ddp]") {
  const int n = 2;
  std::vector<BagOfWords> models{BagOfWords(true), BagOfWords(true)};
  auto outcomes = run_ranks<int>(n, [&](ProcessGroup& pg) {
    DistributedDataParallel ddp(models[pg.rank()], pg.shared_from_this());
    return 0;
  });
  for (int r = 0; r < n; ++r) {
    REQUIRE(outcomes[r].error);
    CHECK_THAT(error_text(outcomes[r].error),
               Contains("module 'emb' is an embedding with sparse(true)"));
  }
  // The dense embedding trains: gradients equal one process's.
  torch::manual_seed(47);
  std::vector<BagOfWords> dense;
  for (int r = 0; r <= n; ++r) {
    torch::manual_seed(48);
    dense.emplace_back(false);
  }
  const auto ids = torch::randint(0, 20, {n * 3, 5});
  const auto y = torch::randint(0, 3, {n * 3});
  F::cross_entropy(dense[n]->forward(ids), y).backward();
  const auto want = grads_of(*dense[n]);
  auto trained = run_ranks<std::vector<torch::Tensor>>(n, [&](ProcessGroup& pg) {
    DistributedDataParallel ddp(dense[pg.rank()], pg.shared_from_this());
    const auto rows = torch::indexing::Slice(pg.rank() * 3, (pg.rank() + 1) * 3);
    F::cross_entropy(ddp.forward(ids.index({rows})), y.index({rows})).backward();
    return grads_of(*dense[pg.rank()]);
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << error_text(trained[r].error));
    REQUIRE_FALSE(trained[r].error);
    CHECK(relative_error(trained[r].result, want) < 1e-5);
  }
}

TEST_CASE("a forward under NoGradGuard does not arm DDP: no_sync accumulation stays exact",
          "[ddp]") {
  // eval forward (no grad), then k-1 micro-batches under no_sync and one
  // synchronised: the k-times larger batch's gradients, with and without
  // find_unused_parameters. An armed eval forward would make the first
  // no_sync backward communicate.
  const int n = 2, k = 3;
  const int64_t b = 4;
  torch::manual_seed(53);
  auto base = make_mlp();
  base->to(torch::kDouble);
  const auto x = torch::randn({n * k * b, 12}, torch::kDouble);
  const auto y = torch::randint(0, 5, {n * k * b});
  auto ref = clone_of(base);
  F::cross_entropy(ref->forward(x), y).backward();
  const auto want = grads_of(*ref);
  for (bool find_unused : {false, true}) {
    DYNAMIC_SECTION("find_unused_parameters " << find_unused) {
      std::vector<torch::nn::Sequential> models{clone_of(base), clone_of(base)};
      DdpOptions options;
      options.find_unused_parameters = find_unused;
      struct Seen {
        std::vector<torch::Tensor> grads;
        uint64_t collectives_in_no_sync = 0;
      };
      auto outcomes = run_ranks<Seen>(n, [&](ProcessGroup& pg) {
        auto& model = models[pg.rank()];
        DistributedDataParallel ddp(model, pg.shared_from_this(), options);
        Seen seen;
        {
          torch::NoGradGuard no_grad;
          ddp.forward(x);  // evaluation
        }
        auto micro = [&](int m) {
          const int64_t start = (pg.rank() * k + m) * b;
          const auto rows = torch::indexing::Slice(start, start + b);
          (F::cross_entropy(ddp.forward(x.index({rows})), y.index({rows})) / k).backward();
        };
        {
          auto guard = ddp.no_sync();
          const auto before = pg.sequence();
          for (int m = 0; m < k - 1; ++m) micro(m);
          seen.collectives_in_no_sync = pg.sequence() - before;
        }
        micro(k - 1);
        seen.grads = grads_of(*model);
        return seen;
      });
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r << ": " << error_text(outcomes[r].error));
        REQUIRE_FALSE(outcomes[r].error);
        CHECK(relative_error(outcomes[r].result.grads, want) < 1e-9);
        CHECK(outcomes[r].result.collectives_in_no_sync == 0);
      }
    }
  }
}

namespace {
struct CountedImpl : torch::nn::Module {
  CountedImpl() {
    fc = register_module("fc", torch::nn::Linear(4, 2));
    tally = register_buffer("tally", torch::zeros({1}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc->forward(x); }
  torch::nn::Linear fc{nullptr};
  torch::Tensor tally;
};
TORCH_MODULE(Counted);
}  // namespace

TEST_CASE("buffers are broadcast as PyTorch does: before a forward that follows a synced one",
          "[ddp]") {
  // PyTorch's rule (torch/nn/parallel/distributed.py, require_forward_param_sync):
  // a forward broadcasts buffers when the previous forward synchronised
  // (grad mode on, not under no_sync), and the first forward always does.
  const int n = 2;
  std::vector<Counted> models(n);
  enum Kind { kSynced, kNoGrad, kNoSync };
  const std::vector<Kind> forwards{kSynced, kNoGrad, kSynced, kNoSync, kSynced, kSynced};
  const std::vector<bool> broadcast{true, true, false, true, false, true};
  auto outcomes = run_ranks<std::vector<float>>(n, [&](ProcessGroup& pg) {
    auto& model = models[pg.rank()];
    DistributedDataParallel ddp(model, pg.shared_from_this());
    std::vector<float> seen;
    const auto x = torch::randn({2, 4});
    for (size_t i = 0; i < forwards.size(); ++i) {
      {
        torch::NoGradGuard no_grad;
        model->tally.fill_(100.0 * pg.rank() + static_cast<double>(i));
      }
      if (forwards[i] == kNoGrad) {
        torch::NoGradGuard no_grad;
        ddp.forward(x);
      } else if (forwards[i] == kNoSync) {
        auto guard = ddp.no_sync();
        ddp.forward(x).sum().backward();
      } else {
        ddp.forward(x).sum().backward();
      }
      seen.push_back(model->tally.item<float>());
    }
    return seen;
  });
  REQUIRE_FALSE(outcomes[0].error);
  REQUIRE_FALSE(outcomes[1].error);
  for (size_t i = 0; i < forwards.size(); ++i) {
    INFO("forward " << i);
    CHECK(outcomes[0].result[i] == static_cast<float>(i));
    CHECK(outcomes[1].result[i] == (broadcast[i] ? i : 100.0f + i));
  }
}

namespace {
// An encoder/decoder pair with a tied weight, registered under two names.
struct TiedImpl : torch::nn::Module {
  TiedImpl() {
    w = register_parameter("encoder", torch::randn({6, 12}) * 0.3);
    register_parameter("decoder", w);
    head = register_module("head", torch::nn::Linear(12, 5));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto code = torch::tanh(torch::matmul(x, w.t()));
    return head->forward(torch::tanh(torch::matmul(code, w)));
  }
  torch::Tensor w;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Tied);
}  // namespace

TEST_CASE("a tied parameter is reduced once, with the right gradient", "[ddp]") {
  const int n = 2;
  const int64_t b = 3;
  std::vector<Tied> models;
  for (int r = 0; r <= n; ++r) {
    torch::manual_seed(59);
    models.emplace_back();
    models.back()->to(torch::kDouble);
  }
  REQUIRE(models[0]->named_parameters().size() == 4);  // LibTorch lists the tie twice
  const auto x = torch::randn({n * b, 12}, torch::kDouble);
  const auto y = torch::randint(0, 5, {n * b});
  auto& ref = models[n];
  for (int s = 0; s < 2; ++s) F::cross_entropy(ref->forward(x), y).backward();
  const auto want = grads_of(*ref);
  struct Seen {
    std::vector<torch::Tensor> grads;
    size_t reduced = 0;
  };
  for (bool view : {true, false}) {
    DYNAMIC_SECTION("gradient_as_bucket_view " << view) {
      DdpOptions options;
      options.gradient_as_bucket_view = view;
      auto outcomes = run_ranks<Seen>(n, [&](ProcessGroup& pg) {
        auto& model = models[pg.rank()];
        model->zero_grad();
        DistributedDataParallel ddp(model, pg.shared_from_this(), options);
        const auto rows = torch::indexing::Slice(pg.rank() * b, (pg.rank() + 1) * b);
        Seen seen;
        for (int s = 0; s < 2; ++s) {
          F::cross_entropy(ddp.forward(x.index({rows})), y.index({rows})).backward();
        }
        for (const auto& bucket : ddp.reducer()->bucket_indices()) seen.reduced += bucket.size();
        seen.grads = grads_of(*model);
        return seen;
      });
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r << ": " << error_text(outcomes[r].error));
        REQUIRE_FALSE(outcomes[r].error);
        CHECK(outcomes[r].result.reduced == 3);  // encoder (= decoder), head.weight, head.bias
        CHECK(relative_error(outcomes[r].result.grads, want) < 1e-9);
      }
    }
  }
}

namespace {
struct LayoutsImpl : torch::nn::Module {
  LayoutsImpl() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3)));
    fc = register_module("fc", torch::nn::Linear(4 * 4 * 4, 5));
    torch::NoGradGuard no_grad;
    conv->weight.set_data(conv->weight.contiguous(at::MemoryFormat::ChannelsLast));
    fc->weight.set_data(fc->weight.t().contiguous().t());  // column-major
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc->forward(torch::relu(conv->forward(x)).flatten(1));
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Layouts);
}  // namespace

TEST_CASE("gradients keep each parameter's layout (channels_last, transposed)", "[ddp]") {
  const int n = 2;
  const int64_t b = 2;
  torch::manual_seed(61);
  const auto x = torch::randn({n * b, 3, 6, 6});
  const auto y = torch::randint(0, 5, {n * b});
  for (bool view : {true, false}) {
    DYNAMIC_SECTION("gradient_as_bucket_view " << view) {
      std::vector<Layouts> models;
      for (int r = 0; r <= n; ++r) {
        torch::manual_seed(62);
        models.emplace_back();
      }
      REQUIRE_FALSE(models[0]->conv->weight.is_contiguous());
      REQUIRE_FALSE(models[0]->fc->weight.is_contiguous());
      for (int s = 0; s < 2; ++s) F::cross_entropy(models[n]->forward(x), y).backward();
      const auto want = grads_of(*models[n]);
      DdpOptions options;
      options.gradient_as_bucket_view = view;
      auto outcomes = run_ranks<std::vector<torch::Tensor>>(n, [&](ProcessGroup& pg) {
        auto& model = models[pg.rank()];
        DistributedDataParallel ddp(model, pg.shared_from_this(), options);
        const auto rows = torch::indexing::Slice(pg.rank() * b, (pg.rank() + 1) * b);
        for (int s = 0; s < 2; ++s) {
          F::cross_entropy(ddp.forward(x.index({rows})), y.index({rows})).backward();
        }
        for (const auto& p : model->parameters()) {
          if (p.grad().strides() != p.strides()) {
            throw std::runtime_error("a gradient's strides differ from its parameter's");
          }
        }
        return grads_of(*model);
      });
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r << ": " << error_text(outcomes[r].error));
        REQUIRE_FALSE(outcomes[r].error);
        CHECK(relative_error(outcomes[r].result, want) < 1e-5);
      }
    }
  }
}

TEST_CASE("join: ranks with different numbers of batches train as PyTorch's Join does", "[ddp]") {
  // Rank r has 2 + r batches of b rows. Each iteration the active ranks'
  // gradients are summed and divided by the initial world size (joined
  // ranks contribute zeros), and every rank ends with the weights of the
  // rank that finished last.
  const int n = 3;
  const int64_t b = 4;
  torch::manual_seed(67);
  auto base = make_mlp();
  base->to(torch::kDouble);
  auto batches = [&](int r) { return 2 + r; };
  std::vector<std::vector<std::pair<torch::Tensor, torch::Tensor>>> data(n);
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < batches(r); ++i) {
      data[r].emplace_back(torch::randn({b, 12}, torch::kDouble), torch::randint(0, 5, {b}));
    }
  }
  auto ref = clone_of(base);
  torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1));
  for (int i = 0; i < batches(n - 1); ++i) {
    ref_opt.zero_grad();
    for (int r = 0; r < n; ++r) {
      if (i >= batches(r)) continue;
      (F::cross_entropy(ref->forward(data[r][i].first), data[r][i].second) / n).backward();
    }
    ref_opt.step();
  }
  const auto want = weights_of(*ref);
  for (bool view : {true, false}) {
    DYNAMIC_SECTION("gradient_as_bucket_view " << view) {
      std::vector<torch::nn::Sequential> models;
      for (int r = 0; r < n; ++r) models.push_back(clone_of(base));
      DdpOptions options;
      options.gradient_as_bucket_view = view;
      options.bucket_cap_mb = 0.0005;
      options.first_bucket_cap_mb = 0.0001;
      struct Seen {
        std::vector<torch::Tensor> weights;
        int64_t shadowed = 0;
      };
      auto outcomes = run_ranks<Seen>(n, [&](ProcessGroup& pg) {
        auto& model = models[pg.rank()];
        DistributedDataParallel ddp(model, pg.shared_from_this(), options);
        torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
        Seen seen;
        auto join = ddp.join();
        for (const auto& [x, y] : data[pg.rank()]) {
          opt.zero_grad();
          F::cross_entropy(ddp.forward(x), y).backward();
          opt.step();
        }
        seen.shadowed = join.finish();
        seen.weights = weights_of(*model);
        return seen;
      });
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r << ": " << error_text(outcomes[r].error));
        REQUIRE_FALSE(outcomes[r].error);
        CHECK(outcomes[r].result.shadowed == batches(n - 1) - batches(r));
        CHECK(relative_error(outcomes[r].result.weights, want) < 1e-9);
        CHECK(bit_identical(outcomes[r].result.weights, outcomes[n - 1].result.weights));
      }
    }
  }
}

TEST_CASE("without join, a rank that runs out of inputs and leaves is named, not waited for",
          "[ddp]") {
  const int n = 2;
  torch::manual_seed(71);
  auto base = make_mlp();
  std::vector<torch::nn::Sequential> models{clone_of(base), clone_of(base)};
  // A generous collective timeout: the error must come from the peer leaving.
  auto outcomes = run_ranks<int>(
      n,
      [&](ProcessGroup& pg) {
        auto& model = models[pg.rank()];
        DistributedDataParallel ddp(model, pg.shared_from_this());
        const int batches = pg.rank() == 0 ? 1 : 3;
        for (int i = 0; i < batches; ++i) {
          F::cross_entropy(ddp.forward(torch::randn({4, 12})), torch::randint(0, 5, {4}))
              .backward();
        }
        return batches;
      },
      std::chrono::seconds(300));
  REQUIRE_FALSE(outcomes[0].error);
  REQUIRE(outcomes[1].error);
  const auto what = error_text(outcomes[1].error);
  CHECK_THAT(what, Contains("rank 1: "));
  CHECK_THAT(what, Contains("rank(s) 0 did not answer the roll call"));
}
