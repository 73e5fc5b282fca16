// SyncBatchNorm against its closed form: one process's torch::nn::BatchNorm
// on the concatenated batch. Every rank's output and input gradient is
// that reference's slice, the sum of the ranks' weight and bias gradients
// is the reference's (the loss is a sum), and every rank's running
// statistics are the reference's, over several steps, with uneven batches,
// a rank with an empty batch, momentum None, affine off, channels_last,
// bfloat16 and 1d/3d inputs. A layer that forgot to weight by count, to
// all-reduce the backward's sums, to use the unbiased variance for
// running_var, or that synchronised nothing, fails here.
#include <torch/nn.h>

#include <map>

#include "lockstep/ddp/batch_stats_exchange.h"
#include "lockstep/io/state_dict.h"
#include "lockstep/model/sync_batchnorm.h"
#include "lockstep/util/error.h"
#include "support/catch.h"
#include "support/thread_world.h"

using namespace lockstep;
using namespace lockstep::testing;

namespace {

std::shared_ptr<ProcessGroup> borrowed(ProcessGroup& pg) {
  return std::shared_ptr<ProcessGroup>(std::shared_ptr<ProcessGroup>{}, &pg);
}

struct Case {
  std::vector<int64_t> rows;  // each rank's batch
  std::vector<int64_t> sample{3, 5, 4};
  at::ScalarType dtype = at::kDouble;
  std::optional<double> momentum = 0.1;
  bool affine = true;
  bool channels_last = false;
  int steps = 3;
};

struct Step {
  at::Tensor y, grad_x, grad_w, grad_b;
};
struct Outcome {
  std::vector<Step> steps;
  at::Tensor running_mean, running_var, eval_y;
};

at::Tensor shaped(const at::Tensor& t, const Case& c) {
  return c.channels_last && t.dim() == 4 ? t.contiguous(at::MemoryFormat::ChannelsLast) : t;
}

// The same batches and output gradients for the reference and the ranks.
struct Data {
  std::vector<at::Tensor> x, g;  // per step, the whole batch
  at::Tensor weight, bias;
};

Data make_data(const Case& c) {
  torch::manual_seed(7);
  int64_t total = 0;
  for (int64_t r : c.rows) total += r;
  std::vector<int64_t> shape{total};
  shape.insert(shape.end(), c.sample.begin(), c.sample.end());
  Data d;
  for (int s = 0; s < c.steps; ++s) {
    d.x.push_back(at::randn(shape, at::kDouble) * (1 + s) + 0.5 * s);
    d.g.push_back(at::randn(shape, at::kDouble));
  }
  d.weight = at::rand({c.sample[0]}, at::kDouble) + 0.5;
  d.bias = at::randn({c.sample[0]}, at::kDouble);
  return d;
}

template <typename Layer>
void load(Layer& bn, const Data& d) {
  at::NoGradGuard no_grad;
  if (bn.weight.defined()) {
    bn.weight.copy_(d.weight);
    bn.bias.copy_(d.bias);
  }
}

// One process, the whole batch: torch::nn::BatchNorm{1,2,3}d.
template <typename Impl, typename Options>
Outcome reference(const Case& c, const Data& d) {
  Options options(c.sample[0]);
  options.momentum(c.momentum ? c10::optional<double>(*c.momentum) : c10::nullopt);
  options.affine(c.affine);
  auto bn = std::make_shared<Impl>(options);
  bn->to(c.dtype);
  load(*bn, d);
  Outcome o;
  for (int s = 0; s < c.steps; ++s) {
    at::Tensor x = shaped(d.x[s].to(c.dtype).clone(), c).requires_grad_(true);
    if (bn->weight.defined()) {
      bn->weight.mutable_grad() = at::Tensor();
      bn->bias.mutable_grad() = at::Tensor();
    }
    at::Tensor y = bn->forward(x);
    (y.to(at::kDouble) * d.g[s]).sum().backward();
    Step st{y.detach(), x.grad(), bn->weight.defined() ? bn->weight.grad() : at::Tensor(),
            bn->weight.defined() ? bn->bias.grad() : at::Tensor()};
    o.steps.push_back(st);
  }
  o.running_mean = bn->running_mean.clone();
  o.running_var = bn->running_var.clone();
  bn->eval();
  o.eval_y = bn->forward(d.x[0].to(c.dtype)).detach();
  return o;
}

std::vector<RankOutcome<Outcome>> synchronised(const Case& c, const Data& d) {
  const int world = static_cast<int>(c.rows.size());
  return run_ranks<Outcome>(world, [&](ProcessGroup& pg) {
    SyncBatchNormOptions options(c.sample[0]);
    options.momentum = c.momentum;
    options.affine = c.affine;
    auto bn = std::make_shared<SyncBatchNormImpl>(options);
    bn->to(c.dtype);
    load(*bn, d);
    convert_sync_batchnorm(bn, batch_stats_exchange(borrowed(pg)));
    int64_t first = 0;
    for (int r = 0; r < pg.rank(); ++r) first += c.rows[r];
    const int64_t rows = c.rows[pg.rank()];
    Outcome o;
    for (int s = 0; s < c.steps; ++s) {
      at::Tensor x =
          shaped(d.x[s].narrow(0, first, rows).to(c.dtype).clone(), c).requires_grad_(true);
      if (bn->weight.defined()) {
        bn->weight.mutable_grad() = at::Tensor();
        bn->bias.mutable_grad() = at::Tensor();
      }
      at::Tensor y = bn->forward(x);
      (y.to(at::kDouble) * d.g[s].narrow(0, first, rows)).sum().backward();
      o.steps.push_back({y.detach(), x.grad(), c.affine ? bn->weight.grad() : at::Tensor(),
                         c.affine ? bn->bias.grad() : at::Tensor()});
    }
    o.running_mean = bn->running_mean.clone();
    o.running_var = bn->running_var.clone();
    bn->eval();
    o.eval_y = bn->forward(d.x[0].narrow(0, first, rows).to(c.dtype)).detach();
    return o;
  });
}

bool close(const at::Tensor& a, const at::Tensor& b, double tol) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  return a.sizes() == b.sizes() &&
         at::allclose(a.to(at::kDouble), b.to(at::kDouble), tol, tol * 1e-1);
}

template <typename Impl, typename Options>
void compare(const Case& c, double tol) {
  const Data d = make_data(c);
  const Outcome ref = reference<Impl, Options>(c, d);
  const auto ranks = synchronised(c, d);
  for (const auto& r : ranks) REQUIRE(error_text(r.error) == "");
  int64_t first = 0;
  for (size_t q = 0; q < ranks.size(); ++q) {
    const Outcome& o = ranks[q].result;
    const int64_t rows = c.rows[q];
    INFO("rank " << q << " of " << ranks.size() << ", " << rows << " rows");
    for (int s = 0; s < c.steps; ++s) {
      INFO("step " << s);
      CHECK(o.steps[s].y.scalar_type() == c.dtype);
      CHECK(close(o.steps[s].y, ref.steps[s].y.narrow(0, first, rows), tol));
      CHECK(close(o.steps[s].grad_x, ref.steps[s].grad_x.narrow(0, first, rows), tol));
      if (c.channels_last && rows > 0)
        CHECK(o.steps[s].y.is_contiguous(at::MemoryFormat::ChannelsLast));
    }
    CHECK(close(o.running_mean, ref.running_mean, tol));
    CHECK(close(o.running_var, ref.running_var, tol));
    CHECK(close(o.eval_y, ref.eval_y.narrow(0, first, rows), tol));
    first += rows;
  }
  if (!c.affine) return;
  for (int s = 0; s < c.steps; ++s) {
    at::Tensor w = at::zeros_like(ref.steps[s].grad_w), b = at::zeros_like(w);
    for (const auto& r : ranks) {
      w += r.result.steps[s].grad_w;
      b += r.result.steps[s].grad_b;
    }
    CHECK(close(w, ref.steps[s].grad_w, tol));
    CHECK(close(b, ref.steps[s].grad_b, tol));
  }
}

using BN1 = torch::nn::BatchNorm1dImpl;
using BN2 = torch::nn::BatchNorm2dImpl;
using BN3 = torch::nn::BatchNorm3dImpl;
using O1 = torch::nn::BatchNorm1dOptions;
using O2 = torch::nn::BatchNorm2dOptions;
using O3 = torch::nn::BatchNorm3dOptions;

}  // namespace

TEST_CASE("SyncBatchNorm equals one process's BatchNorm on the concatenated batch",
          "[ddp][sync_bn]") {
  SECTION("2 ranks, uneven batches (a short last batch)") {
    compare<BN2, O2>({{5, 3}}, 1e-10);
  }
  SECTION("3 ranks, one with an empty batch") {
    compare<BN2, O2>({{4, 0, 3}}, 1e-10);
  }
  SECTION("momentum None: a cumulative average") {
    Case c{{2, 3}};
    c.momentum = std::nullopt;
    compare<BN2, O2>(c, 1e-10);
  }
  SECTION("affine off") {
    Case c{{3, 3}};
    c.affine = false;
    compare<BN2, O2>(c, 1e-10);
  }
  SECTION("float, channels_last") {
    Case c{{4, 2, 3}};
    c.dtype = at::kFloat;
    c.channels_last = true;
    compare<BN2, O2>(c, 2e-5);
  }
  SECTION("1d: [N, C] and [N, C, L]") {
    Case c{{6, 2}};
    c.sample = {4};
    compare<BN1, O1>(c, 1e-10);
    c.sample = {4, 7};
    compare<BN1, O1>(c, 1e-10);
  }
  SECTION("3d") {
    Case c{{2, 3}};
    c.sample = {2, 3, 2, 4};
    compare<BN3, O3>(c, 1e-10);
  }
}

TEST_CASE("SyncBatchNorm with bfloat16 input: float statistics, bfloat16 output",
          "[ddp][sync_bn]") {
  // The reference: the same layer on the same (bfloat16-rounded) values in
  // float, one process. bfloat16 keeps 8 bits: a tolerance of its epsilon.
  Case c{{3, 5}};
  const Data d = make_data(c);
  const at::Tensor x = d.x[0].to(at::kBFloat16);
  auto ref = torch::nn::BatchNorm2d(3);
  load(*ref, d);
  const at::Tensor expected = ref->forward(x.to(at::kFloat));
  const auto ranks = run_ranks<at::Tensor>(2, [&](ProcessGroup& pg) {
    auto bn = SyncBatchNorm(3);
    load(*bn, d);
    convert_sync_batchnorm(bn.ptr(), batch_stats_exchange(borrowed(pg)));
    const int64_t first = pg.rank() == 0 ? 0 : 3;
    return bn->forward(x.narrow(0, first, c.rows[pg.rank()]));
  });
  for (const auto& r : ranks) REQUIRE(error_text(r.error) == "");
  CHECK(ranks[0].result.scalar_type() == at::kBFloat16);
  const at::Tensor got = at::cat({ranks[0].result, ranks[1].result}).to(at::kFloat);
  CHECK(at::allclose(got, expected.detach(), 1e-2, 1e-2));
}

TEST_CASE("SyncBatchNorm without an exchange is torch::nn::BatchNorm2d, bit for bit", "[sync_bn]") {
  torch::manual_seed(3);
  auto plain = torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(4).momentum(c10::nullopt));
  SyncBatchNormOptions options(4);
  options.momentum = std::nullopt;
  auto sync = SyncBatchNorm(options);
  for (int s = 0; s < 3; ++s) {
    const at::Tensor x = at::randn({6, 4, 3, 3});
    CHECK(at::equal(plain->forward(x), sync->forward(x)));
  }
  CHECK(at::equal(plain->running_var, sync->running_var));
  CHECK(sync->num_batches_tracked.item<int64_t>() == 3);
  plain->eval();
  sync->eval();
  const at::Tensor x = at::randn({2, 4, 3, 3});
  CHECK(at::equal(plain->forward(x), sync->forward(x)));
  // State dict names are BatchNorm's.
  std::vector<std::string> a, b;
  for (const auto& p : plain->named_parameters()) a.push_back(p.key());
  for (const auto& p : plain->named_buffers()) a.push_back(p.key());
  for (const auto& p : sync->named_parameters()) b.push_back(p.key());
  for (const auto& p : sync->named_buffers()) b.push_back(p.key());
  CHECK(a == b);
  CHECK_THROWS_WITH(sync->forward(at::randn({2, 5, 3})), Contains("the input has 5 channels"));
}

namespace {

// A module whose forward reaches its layers through the registry.
struct ByNameImpl : torch::nn::Module {
  ByNameImpl() {
    register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 3, 1)));
    register_module("bn", torch::nn::BatchNorm2d(3));
  }
  at::Tensor forward(at::Tensor x) {
    for (const auto& child : children()) {
      if (auto* conv = child->as<torch::nn::Conv2dImpl>()) x = conv->forward(x);
      if (auto* bn = child->as<torch::nn::BatchNorm2dImpl>()) x = bn->forward(x);
      if (auto* bn = child->as<SyncBatchNormImpl>()) x = bn->forward(x);
    }
    return x;
  }
};

// A typed member: replacing it in the registry would change nothing.
struct TypedImpl : torch::nn::Module {
  TypedImpl() { bn = register_module("bn", torch::nn::BatchNorm2d(3)); }
  torch::nn::BatchNorm2d bn{nullptr};
};

}  // namespace

TEST_CASE("convert_sync_batchnorm", "[ddp][sync_bn]") {
  struct Seen {
    int64_t layers = 0;
    at::Tensor weight, running_mean;
    bool same_after_second = false;
  };
  const auto ranks = run_ranks<Seen>(2, [&](ProcessGroup& pg) {
    auto model = std::make_shared<ByNameImpl>();
    auto* old = model->named_children()["bn"]->as<torch::nn::BatchNorm2dImpl>();
    {
      at::NoGradGuard no_grad;
      old->weight.fill_(2.0);
      old->running_mean.fill_(0.25);
    }
    const auto exchange = batch_stats_exchange(borrowed(pg));
    convert_sync_batchnorm(model, exchange);
    Seen seen;
    seen.layers = count_sync_batchnorm(*model);
    auto bn = std::dynamic_pointer_cast<SyncBatchNormImpl>(model->named_children()["bn"]);
    seen.weight = bn->weight.detach().clone();
    seen.running_mean = bn->running_mean.clone();
    convert_sync_batchnorm(model, exchange);  // twice: nothing more
    seen.same_after_second =
        model->named_children()["bn"].get() == bn.get() && count_sync_batchnorm(*model) == 1;
    model->forward(at::randn({2 + pg.rank(), 2, 3, 3}));  // synchronised: no hang, no throw
    return seen;
  });
  for (const auto& r : ranks) {
    REQUIRE(error_text(r.error) == "");
    CHECK(r.result.layers == 1);
    CHECK(at::equal(r.result.weight, at::full({3}, 2.0)));
    CHECK(at::equal(r.result.running_mean, at::full({3}, 0.25)));
    CHECK(r.result.same_after_second);
  }
  auto typed = std::make_shared<TypedImpl>();
  CHECK_THROWS_WITH(convert_sync_batchnorm(typed, nullptr),
                    Contains("held outside the module registry (bn)"));
  CHECK(typed->named_children()["bn"]->as<torch::nn::BatchNorm2dImpl>() != nullptr);
  auto root = convert_sync_batchnorm(torch::nn::BatchNorm1d(5).ptr(), nullptr);
  CHECK(root->as<SyncBatchNormImpl>() != nullptr);
  // The old layer's dtype and frozen parameters are kept.
  auto frozen = torch::nn::BatchNorm2d(3);
  frozen->to(at::kDouble);
  frozen->weight.set_requires_grad(false);
  const auto converted = convert_sync_batchnorm(frozen.ptr(), nullptr);
  auto* kept = converted->as<SyncBatchNormImpl>();
  REQUIRE(kept != nullptr);
  CHECK(kept->weight.scalar_type() == at::kDouble);
  CHECK(kept->running_var.scalar_type() == at::kDouble);
  CHECK_FALSE(kept->weight.requires_grad());
  CHECK(kept->bias.requires_grad());
  // Ranks holding other layers are refused at the conversion, on every rank.
  const auto mismatched = run_ranks<int>(2, [&](ProcessGroup& pg) {
    auto bn = SyncBatchNorm(pg.rank() == 0 ? 3 : 4);
    convert_sync_batchnorm(bn.ptr(), batch_stats_exchange(borrowed(pg)));
    return 0;
  });
  for (const auto& r : mismatched)
    CHECK_THAT(error_text(r.error),
               Contains("rank 1 holds other SyncBatchNorm layers than rank 0"));
}

TEST_CASE("SyncBatchNorm's hostile cases fail with the layer named", "[ddp][sync_bn]") {
  SECTION("one value per channel over all ranks") {
    const auto ranks = run_ranks<int>(2, [&](ProcessGroup& pg) {
      auto bn = SyncBatchNorm(2);
      convert_sync_batchnorm(bn.ptr(), batch_stats_exchange(borrowed(pg)));
      bn->forward(at::randn({pg.rank() == 0 ? 1 : 0, 2}));
      return 0;
    });
    for (const auto& r : ranks)
      CHECK_THAT(error_text(r.error), Contains("expected more than 1 value per channel"));
  }
  SECTION("a rank in eval mode while another trains") {
    const auto ranks = run_ranks<int>(
        2,
        [&](ProcessGroup& pg) {
          auto bn = SyncBatchNorm(2);
          convert_sync_batchnorm(bn.ptr(), batch_stats_exchange(borrowed(pg)));
          if (pg.rank() == 1) bn->eval();
          bn->forward(at::randn({4, 2}));
          return 0;
        },
        std::chrono::seconds(3));
    CHECK_THAT(error_text(ranks[0].error),
               Contains("SyncBatchNorm's all-gather of batch statistics"));
    CHECK(error_text(ranks[1].error) == "");
  }
  SECTION("NaN in one rank's batch: NaN statistics on every rank alike") {
    const auto ranks = run_ranks<at::Tensor>(2, [&](ProcessGroup& pg) {
      auto bn = SyncBatchNorm(2);
      convert_sync_batchnorm(bn.ptr(), batch_stats_exchange(borrowed(pg)));
      at::Tensor x = at::ones({3, 2});
      if (pg.rank() == 1) x[0][0] = std::numeric_limits<float>::quiet_NaN();
      bn->forward(x);
      return bn->running_mean.clone();
    });
    for (const auto& r : ranks) {
      REQUIRE(error_text(r.error) == "");
      CHECK(std::isnan(r.result[0].item<float>()));
      CHECK(r.result[1].item<float>() == Approx(0.1));
    }
  }
}

// tests/multiproc/sync_batchnorm.sh with LOCKSTEP_SYNC_BN_PEER=<folder>: the
// batches of tests/python/sync_batchnorm_peer.py's data.pt through lockstep's
// SyncBatchNorm, one thread per rank: lockstep_r<rank>.pt for its compare.
TEST_CASE("SyncBatchNorm run for tests/python/sync_batchnorm_peer.py", "[.sync_bn_peer]") {
  const char* folder_env = std::getenv("LOCKSTEP_SYNC_BN_PEER");
  REQUIRE(folder_env != nullptr);
  const std::string folder = folder_env;
  std::map<std::string, at::Tensor> data;
  for (auto& [k, t] : state_dict_load_file(folder + "/data.pt")) data[k] = t;
  const at::Tensor rows = data.at("rows");
  const int world = static_cast<int>(rows.numel());
  const auto ranks = run_ranks<int>(world, [&](ProcessGroup& pg) {
    const int64_t first = rows.narrow(0, 0, pg.rank()).sum().item<int64_t>();
    const int64_t mine = rows[pg.rank()].item<int64_t>();
    auto bn = SyncBatchNorm(3);
    bn->to(at::kDouble);
    {
      at::NoGradGuard no_grad;
      bn->weight.copy_(data.at("weight"));
      bn->bias.copy_(data.at("bias"));
    }
    convert_sync_batchnorm(bn.ptr(), batch_stats_exchange(borrowed(pg)));
    StateDict out;
    for (int s = 0; s < 3; ++s) {
      const std::string n = std::to_string(s);
      at::Tensor x = data.at("x" + n).narrow(0, first, mine).clone().requires_grad_(true);
      bn->weight.mutable_grad() = at::Tensor();
      bn->bias.mutable_grad() = at::Tensor();
      at::Tensor y = bn->forward(x);
      (y * data.at("g" + n).narrow(0, first, mine)).sum().backward();
      out.emplace_back("y" + n, y.detach());
      out.emplace_back("gx" + n, x.grad());
      out.emplace_back("gw" + n, bn->weight.grad());
      out.emplace_back("gb" + n, bn->bias.grad());
    }
    out.emplace_back("running_mean", bn->running_mean.clone());
    out.emplace_back("running_var", bn->running_var.clone());
    state_dict_save_file(out, folder + "/lockstep_r" + std::to_string(pg.rank()) + ".pt");
    return 0;
  });
  for (const auto& r : ranks) REQUIRE(error_text(r.error) == "");
}
