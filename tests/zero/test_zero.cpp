// ZeRO (optim/zero.h, Note [ZeRO]) and its collectives: the partition
// against PyTorch's sorted-greedy rule worked by hand; the flat
// reduce-scatter and all-gather against their closed forms on 1 to 4 ranks,
// and on shm the reduce-scatter's bits against its all-reduce's (random
// floats, several chunks); ZeroOptimizer's steps bit-identical to one
// unsharded optimizer's on the same gradients, its consolidated state equal
// to that optimizer's state dict, that state resumed on another world size
// stepping on alike, and the norms gathered from owners equal to the
// unsharded norms. Rank threads return results; the main thread asserts.
#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include "support/catch.h"

#include "lockstep/ddp/comm_hooks.h"
#include "lockstep/optim/optim.h"
#include "lockstep/util/error.h"
#include "lockstep/zero/zero.h"
#include "lockstep/zero/zero_grad_hook.h"
#include "support/thread_world.h"

using namespace lockstep;
using lockstep::testing::error_text;
using lockstep::testing::run_ranks;

namespace {

const auto kTimeout = std::chrono::seconds(60);

template <typename R>
void require_ok(const std::vector<lockstep::testing::RankOutcome<R>>& outcomes) {
  for (size_t r = 0; r < outcomes.size(); ++r) {
    INFO("rank " << r << ": " << error_text(outcomes[r].error));
    REQUIRE_FALSE(outcomes[r].error);
  }
}

}  // namespace

TEST_CASE("zero: the partition is PyTorch's sorted-greedy by size", "[zero]") {
  std::vector<at::Tensor> params;
  for (int64_t n : {10, 40, 30, 20, 5}) params.push_back(at::zeros({n}));
  // Largest first: 40 -> 0; 30 -> 1; 20 -> 1 (30 < 40); 10 -> 0 (40 < 50);
  // 5 -> 0 (50 = 50: the lower rank).
  CHECK(zero_partition(params, 2) == std::vector<int>{0, 0, 1, 1, 0});
  // Three ranks: 40 -> 0, 30 -> 1, 20 -> 2, 10 -> 2 (20 < 30), 5 -> 1 (30 = 30).
  CHECK(zero_partition(params, 3) == std::vector<int>{2, 0, 1, 2, 1});
  // Equal sizes keep their order: round robin.
  std::vector<at::Tensor> same(5, at::zeros({8}));
  CHECK(zero_partition(same, 2) == std::vector<int>{0, 1, 0, 1, 0});
  CHECK(zero_partition(params, 1) == std::vector<int>(5, 0));
}

TEST_CASE("reduce_scatter and all_gather: closed forms, and shm's bits are its all-reduce's",
          "[zero][collectives]") {
  for (int n : {1, 2, 3, 4}) {
    DYNAMIC_SECTION(n << " ranks") {
      const int64_t chunk = 40001;  // 160 KB of float: several 64 KiB shm chunks per rank
      std::vector<at::Tensor> inputs;
      for (int r = 0; r < n; ++r) inputs.push_back(at::randn({chunk * n}));
      struct Out {
        at::Tensor scattered, reduced, gathered, exact;
      };
      auto outcomes = run_ranks<Out>(
          n,
          [&](ProcessGroup& pg) {
            Out out;
            out.scattered = at::empty({chunk});
            pg.reduce_scatter(out.scattered, inputs[static_cast<size_t>(pg.rank())]);
            auto whole = inputs[static_cast<size_t>(pg.rank())].clone();
            pg.allreduce(whole, ReduceKind::kSum);
            out.reduced = whole.narrow(0, pg.rank() * chunk, chunk).clone();
            out.gathered = at::empty({chunk * n});
            pg.all_gather_into(out.gathered,
                               inputs[static_cast<size_t>(pg.rank())].narrow(0, 0, chunk));
            // Small integers: exact on every backend.
            auto ints = (at::arange(chunk * n).remainder(7) + pg.rank()).to(at::kFloat);
            out.exact = at::empty({chunk});
            pg.reduce_scatter(out.exact, ints);
            return out;
          },
          kTimeout, BackendKind::kShm);
      require_ok(outcomes);
      const auto k = at::arange(chunk * n).remainder(7).to(at::kFloat);
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r);
        const auto& o = outcomes[static_cast<size_t>(r)].result;
        // The sum in rank order, as shm's all-reduce sums.
        auto sum = inputs[0].narrow(0, r * chunk, chunk).clone();
        for (int q = 1; q < n; ++q)
          sum += inputs[static_cast<size_t>(q)].narrow(0, r * chunk, chunk);
        CHECK(at::equal(o.scattered, sum));
        CHECK(at::equal(o.scattered, o.reduced));
        std::vector<at::Tensor> heads;
        for (int q = 0; q < n; ++q)
          heads.push_back(inputs[static_cast<size_t>(q)].narrow(0, 0, chunk));
        CHECK(at::equal(o.gathered, at::cat(heads)));
        const auto want = (k.narrow(0, r * chunk, chunk) * n + n * (n - 1) / 2.0);
        CHECK(at::equal(o.exact, want));
      }
    }
  }
}

TEST_CASE("reduce_scatter on Gloo (native, or the all-reduce fallback) and bad shapes",
          "[zero][collectives]") {
  const int n = 3;
  const int64_t chunk = 1001;
  auto outcomes = run_ranks<std::vector<at::Tensor>>(
      n,
      [&](ProcessGroup& pg) {
        auto ints = (at::arange(chunk * n).remainder(7) + pg.rank()).to(at::kFloat);
        auto out = at::empty({chunk});
        pg.reduce_scatter(out, ints);
        auto gathered = at::empty({chunk * n});
        pg.all_gather_into(gathered, ints.narrow(0, pg.rank() * chunk, chunk));
        std::string refused;
        try {
          auto wrong = at::empty({chunk + 1});
          pg.reduce_scatter(wrong, ints);
        } catch (const UsageError& e) {
          refused = e.what();
        }
        return std::vector<at::Tensor>{
            out, gathered,
            at::tensor(
                {static_cast<int64_t>(refused.find("must hold 3 chunks") != std::string::npos)})};
      },
      kTimeout, BackendKind::kGloo);
  require_ok(outcomes);
  const auto k = at::arange(chunk * n).remainder(7).to(at::kFloat);
  for (int r = 0; r < n; ++r) {
    const auto& o = outcomes[static_cast<size_t>(r)].result;
    CHECK(at::equal(o[0], k.narrow(0, r * chunk, chunk) * n + 3.0));
    std::vector<at::Tensor> parts;
    for (int q = 0; q < n; ++q) parts.push_back(k.narrow(0, q * chunk, chunk) + q);
    CHECK(at::equal(o[1], at::cat(parts)));
    CHECK(o[2].item<int64_t>() == 1);  // a wrong output size is refused, naming the shapes
  }
}

namespace {

// A small model's parameters by name, made on the main thread.
NamedTensors model_params() {
  return {{"a.weight", at::randn({16, 8})},
          {"a.bias", at::randn({16})},
          {"b.weight", at::randn({4, 16})},
          {"b.bias", at::randn({4})},
          {"c", at::randn({3, 3})}};
}

NamedTensors copy_of(const NamedTensors& named) {
  NamedTensors out;
  for (const auto& [name, t] : named) out.emplace_back(name, t.clone());
  return out;
}

OptimConfig adam_config() {
  OptimConfig c;
  c.name = OptimizerKind::kAdam;
  c.lr = 0.01;
  c.weight_decay = 0.1;
  return c;
}

struct ZeroRun {
  std::vector<at::Tensor> weights;  // after the steps
  NamedTensors consolidated;
  at::Tensor norms;  // grad_norms() after releasing the others' gradients
  int64_t state_bytes = 0;
};

// `steps` steps with the given gradients; each rank starts from `start`
// and, if set, from a consolidated optimizer state.
ZeroRun zero_run(ProcessGroup& pg, const NamedTensors& start,
                 const std::vector<std::vector<at::Tensor>>& grads,
                 const NamedTensors& resume_from) {
  auto named = copy_of(start);
  ZeroOptimizer zero(pg.shared_from_this(), adam_config(), named, 2);
  if (!resume_from.empty()) zero.load_state_dict(resume_from, "test");
  ZeroRun run;
  for (const auto& step : grads) {
    for (size_t i = 0; i < named.size(); ++i) named[i].second.mutable_grad() = step[i].clone();
    zero.release_unowned_grads();
    run.norms = zero.grad_norms();
    zero.step();
  }
  for (const auto& [name, p] : named) run.weights.push_back(p.detach().clone());
  run.consolidated = zero.consolidated_state_dict();
  run.state_bytes = zero.state_bytes();
  return run;
}

}  // namespace

TEST_CASE(
    "ZeroOptimizer: steps, state and norms equal one unsharded Adam's, and resume on "
    "another world size",
    "[zero]") {
  const auto start = model_params();
  std::vector<std::vector<at::Tensor>> grads(3), more(2);
  for (auto* g : {&grads, &more}) {
    for (auto& step : *g)
      for (const auto& [name, p] : start) step.push_back(at::randn(p.sizes()));
  }
  // The reference: one Adam over all parameters.
  auto ref = copy_of(start);
  std::vector<at::Tensor> ref_params;
  for (auto& [name, p] : ref) ref_params.push_back(p);
  auto adam = optimizer_create(adam_config(), ref_params);
  at::Tensor ref_norms;
  for (const auto& step : grads) {
    for (size_t i = 0; i < ref.size(); ++i) ref[i].second.mutable_grad() = step[i].clone();
    std::vector<at::Tensor> each;
    for (auto& p : ref_params) each.push_back(p.grad().norm(2));
    ref_norms = at::stack(each);
    adam->step();
  }
  const auto ref_state = optimizer_state_dict(*adam, ref);
  REQUIRE(ref_state.size() == 15);  // 5 parameters x (exp_avg, exp_avg_sq, step)

  auto two = run_ranks<ZeroRun>(
      2, [&](ProcessGroup& pg) { return zero_run(pg, start, grads, {}); }, kTimeout,
      BackendKind::kShm);
  require_ok(two);
  int64_t bytes = 0;
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    const auto& run = two[static_cast<size_t>(r)].result;
    for (size_t i = 0; i < ref.size(); ++i) CHECK(at::equal(run.weights[i], ref[i].second));
    CHECK(at::equal(run.norms, ref_norms));
    bytes += run.state_bytes;
  }
  // Each state tensor is held once: 2 float moments of every element and an
  // int64 step per parameter, in all.
  int64_t elements = 0;
  for (const auto& [name, p] : start) elements += p.numel();
  CHECK(bytes == 2 * 4 * elements + 8 * 5);
  CHECK(two[0].result.state_bytes < bytes);
  CHECK(two[1].result.state_bytes < bytes);
  // Complete on rank 0, in the unsharded optimizer's order, the same values.
  const auto& consolidated = two[0].result.consolidated;
  REQUIRE(consolidated.size() == ref_state.size());
  for (size_t i = 0; i < ref_state.size(); ++i) {
    INFO(ref_state[i].first);
    CHECK(consolidated[i].first == ref_state[i].first);
    CHECK(at::equal(consolidated[i].second, ref_state[i].second));
  }
  CHECK(two[1].result.consolidated.empty());

  // Saved by 2 ranks, resumed by 3: two more steps, equal to the reference's.
  std::vector<at::Tensor> after;
  for (auto& p : ref_params) after.push_back(p.detach().clone());
  NamedTensors resumed_start;
  for (size_t i = 0; i < ref.size(); ++i)
    resumed_start.emplace_back(ref[i].first, two[0].result.weights[i]);
  for (const auto& step : more) {
    for (size_t i = 0; i < ref.size(); ++i) ref[i].second.mutable_grad() = step[i].clone();
    adam->step();
  }
  auto three = run_ranks<ZeroRun>(
      3, [&](ProcessGroup& pg) { return zero_run(pg, resumed_start, more, consolidated); },
      kTimeout, BackendKind::kShm);
  require_ok(three);
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    for (size_t i = 0; i < ref.size(); ++i)
      CHECK(at::equal(three[static_cast<size_t>(r)].result.weights[i], ref[i].second));
  }
  // A state dict naming a parameter the model lacks is refused by name.
  auto forged = consolidated;
  forged[0].first = "nope.exp_avg";
  auto refused = run_ranks<std::string>(
      2,
      [&](ProcessGroup& pg) -> std::string {
        auto named = copy_of(start);
        ZeroOptimizer zero(pg.shared_from_this(), adam_config(), named, 1);
        try {
          zero.load_state_dict(forged, "forged.pt");
        } catch (const DataError& e) {
          return e.what();
        }
        return "";
      },
      kTimeout, BackendKind::kShm);
  require_ok(refused);
  for (const auto& o : refused)
    CHECK_THAT(o.result,
               lockstep::testing::Contains("forged.pt: 'nope.exp_avg' names no parameter"));
}

TEST_CASE("zero stage 2 hook: each owner gets its sums, also after DDP rebuilds a bucket",
          "[zero]") {
  // Parameter 0 has 5 elements, parameter 1 has 3: on 2 ranks 0 is rank 0's,
  // 1 is rank 1's. The bucket of index 0 first holds [0, 1], then (as after
  // DDP's rebuild in arrival order) [1, 0].
  const std::vector<int> owners{0, 1};
  const std::vector<int64_t> sizes{5, 3};
  std::vector<at::Tensor> grads;  // rank r's gradient of parameter p: grads[2 r + p]
  for (int r = 0; r < 2; ++r)
    for (int64_t n : sizes) grads.push_back(at::randn({n}));
  auto outcomes = run_ranks<std::vector<at::Tensor>>(
      2,
      [&](ProcessGroup& pg) {
        auto hook = zero_grad_hook(owners, pg.rank());
        std::vector<at::Tensor> out;
        for (const std::vector<int64_t>& order :
             {std::vector<int64_t>{0, 1}, std::vector<int64_t>{1, 0}, std::vector<int64_t>{0, 1}}) {
          GradBucket b;
          b.index = 0;
          b.count = 1;
          b.buffer = at::empty({8});
          int64_t at_ = 0;
          for (int64_t p : order) {
            const auto& g = grads[static_cast<size_t>(2 * pg.rank() + p)];
            b.buffer.narrow(0, at_, g.numel()).copy_(g);
            b.gradients.push_back(b.buffer.narrow(0, at_, g.numel()));
            b.offsets.push_back(at_);
            b.params.push_back(p);
            at_ += g.numel();
          }
          auto work = hook->run_bucket(pg, b);
          pg.wait(work.work, "bucket");
          if (work.finish) work.finish();
          // This rank's own parameter, wherever the bucket put it.
          const int64_t mine = pg.rank();
          const size_t slot = order[0] == mine ? 0 : 1;
          out.push_back(
              b.buffer.narrow(0, b.offsets[slot], sizes[static_cast<size_t>(mine)]).clone());
        }
        return out;
      },
      kTimeout, BackendKind::kShm);
  require_ok(outcomes);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    const auto want = grads[static_cast<size_t>(r)] + grads[static_cast<size_t>(2 + r)];
    for (const auto& got : outcomes[static_cast<size_t>(r)].result) CHECK(at::equal(got, want));
  }
}
