// PowerSGD (ddp/powersgd.h): the seed and Q PyTorch would draw, the
// orthogonalisation, one bucket's compressed gradient against the same
// low-rank approximation computed directly (P = M Q, orthogonalise,
// Q = M^T P, summed, P Q^T), error feedback carried exactly, small tensors
// sent exactly, the bytes, ranks bit-identical under DDP, state round trips,
// hooks by name. tests/multiproc/powersgd.sh compares with PyTorch's own hook.
#include <torch/nn.h>
#include <torch/optim.h>
#include "support/catch.h"

#include <cstdlib>
#include <fstream>

#include "ddp_models.h"
#include "lockstep/ddp/ddp.h"
#include "lockstep/ddp/powersgd.h"
#include "lockstep/io/state_dict.h"
#include "lockstep/util/error.h"
#include "support/thread_world.h"

using namespace lockstep;
using namespace lockstep::testing;
namespace F = torch::nn::functional;
using lockstep::testing::Contains;

namespace {

// What the Reducer does with one bucket: first stage, then(), finish().
int64_t exchange(CommHook& hook, ProcessGroup& pg, GradBucket& bucket) {
  HookWork work = hook.run_bucket(pg, bucket);
  int64_t bytes = work.bytes;
  pg.wait(work.work, "test bucket");
  if (work.then) {
    work = work.then();
    bytes += work.bytes;
    pg.wait(work.work, "test bucket, second stage");
  }
  if (work.finish) work.finish();
  return bytes;
}

// A bucket of a [8, 6] weight and a [6] bias, as the Reducer lays it out.
GradBucket make_bucket(const torch::Tensor& weight, const torch::Tensor& bias) {
  GradBucket b;
  b.index = 0;
  b.count = 1;
  b.buffer = torch::cat({weight.reshape(-1), bias});
  b.offsets = {0, weight.numel()};
  b.gradients = {b.buffer.narrow(0, 0, weight.numel()).view(weight.sizes()),
                 b.buffer.narrow(0, weight.numel(), bias.numel())};
  return b;
}

torch::Tensor orthogonal(torch::Tensor m) {  // [n, r] -> the hook's orthogonalisation
  auto batch = m.unsqueeze(0).clone();
  powersgd_orthogonalize(batch, 0);
  return batch.squeeze(0);
}

}  // namespace

TEST_CASE("PowerSGD seeds Q as PyTorch does: numpy's randint, then torch.manual_seed",
          "[powersgd]") {
  // numpy.random.RandomState(0).randint(1_000_000_000), five times; seed 7 thrice.
  std::mt19937 zero(0);
  for (uint32_t want : {209652396u, 398764591u, 924231285u, 404868288u, 441365315u}) {
    CHECK(numpy_randint_1e9(zero) == want);
  }
  std::mt19937 seven(7);
  for (uint32_t want : {327741615u, 976413892u, 128500249u})
    CHECK(numpy_randint_1e9(seven) == want);
  // torch.manual_seed(209652396); torch.randn(3, 2, 1) in PyTorch 1.13 and 2.6.
  auto generator = at::make_generator<at::CPUGeneratorImpl>(209652396);
  const auto q = at::randn({3, 2, 1}, generator, at::TensorOptions(at::kFloat)).flatten();
  const std::vector<float> want{-0.8103023767471313f, 0.41339945793151855f, -1.2778252363204956f,
                                0.3302519619464874f,  0.33864617347717285f, -0.6434366703033447f};
  for (size_t i = 0; i < want.size(); ++i)
    CHECK(q[static_cast<int64_t>(i)].item<float>() == want[i]);
}

TEST_CASE("PowerSGD's orthogonalisation gives orthonormal columns, and zeros stay zeros",
          "[powersgd]") {
  torch::manual_seed(3);
  for (int64_t r : {1, 2, 4}) {  // Gram-Schmidt for 1 and 2, QR for 4
    auto m = torch::randn({2, 9, r});
    const auto original = m.clone();
    powersgd_orthogonalize(m, 0);
    const auto gram = torch::bmm(m.transpose(1, 2), m);
    CHECK(torch::allclose(gram, torch::eye(r).expand({2, r, r}), 1e-5, 1e-5));
    // The same column space: projecting the original onto it loses nothing.
    const auto projected = torch::bmm(m, torch::bmm(m.transpose(1, 2), original));
    CHECK(torch::allclose(projected, original, 1e-4, 1e-4));
  }
  auto zeros = torch::zeros({1, 5, 2});
  powersgd_orthogonalize(zeros, 0);
  CHECK(torch::equal(zeros, torch::zeros({1, 5, 2})));  // PyTorch would give NaN
}

TEST_CASE("PowerSGD's compressed gradient equals the low-rank approximation computed directly",
          "[powersgd]") {
  const int n = 2;
  torch::manual_seed(11);
  // Per rank and iteration: a weight gradient [8, 6] and a bias gradient [6].
  std::vector<std::vector<torch::Tensor>> w(n), bias(n);
  for (int r = 0; r < n; ++r) {
    for (int it = 0; it < 4; ++it) {
      w[r].push_back(torch::randn({8, 6}));
      bias[r].push_back(torch::randn({6}));
    }
  }
  PowerSgdOptions options;
  options.start_iter = 2;
  options.matrix_approximation_rank = 1;

  struct Seen {
    std::vector<torch::Tensor> buffers;
    std::vector<int64_t> bytes;
    int64_t iter = 0;
  };
  auto outcomes = run_ranks<Seen>(n, [&](ProcessGroup& pg) {
    PowerSgdHook hook(options);
    Seen seen;
    for (int it = 0; it < 4; ++it) {
      auto bucket = make_bucket(w[pg.rank()][it], bias[pg.rank()][it]);
      seen.bytes.push_back(exchange(hook, pg, bucket));
      seen.buffers.push_back(bucket.buffer.clone());
    }
    seen.iter = hook.stats().iter;
    return seen;
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << error_text(outcomes[r].error));
    REQUIRE_FALSE(outcomes[r].error);
  }

  // Iterations 0 and 1: plain all-reduce of the whole bucket, divided.
  for (int it = 0; it < 2; ++it) {
    const auto mean =
        torch::cat({(w[0][it] + w[1][it]).reshape(-1) / 2, (bias[0][it] + bias[1][it]) / 2});
    for (int r = 0; r < n; ++r)
      CHECK(torch::allclose(outcomes[r].result.buffers[it], mean, 1e-6, 1e-7));
    CHECK(outcomes[0].result.bytes[it] == (48 + 6) * 4);
  }
  // Iterations 2 and 3: compressed, computed here the long way.
  std::mt19937 engine(0);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(numpy_randint_1e9(engine));
  auto q = orthogonal(at::randn({6, 1}, generator, at::TensorOptions(at::kFloat)));
  std::vector<torch::Tensor> error(n, torch::zeros({48 + 6}));
  for (int it = 2; it < 4; ++it) {
    if (it > 2) q = orthogonal(q);  // warm start: last iteration's averaged Q
    std::vector<torch::Tensor> m(n);
    for (int r = 0; r < n; ++r) {
      m[r] = torch::cat({w[r][it].reshape(-1), bias[r][it]}) + error[r];
    }
    auto p = orthogonal(torch::mm(m[0].narrow(0, 0, 48).view({8, 6}), q) +
                        torch::mm(m[1].narrow(0, 0, 48).view({8, 6}), q));
    q = (torch::mm(m[0].narrow(0, 0, 48).view({8, 6}).t(), p) +
         torch::mm(m[1].narrow(0, 0, 48).view({8, 6}).t(), p)) /
        2;
    const auto approx = torch::mm(p, q.t());
    const auto bias_mean = (m[0].narrow(0, 48, 6) + m[1].narrow(0, 48, 6)) / 2;
    const auto want = torch::cat({approx.reshape(-1), bias_mean});
    for (int r = 0; r < n; ++r) {
      INFO("iteration " << it << ", rank " << r);
      const auto& got = outcomes[r].result.buffers[it];
      CHECK(torch::allclose(got, want, 1e-5, 1e-6));
      // The bias (below the compression rate) is sent exactly: its mean.
      CHECK(torch::allclose(got.narrow(0, 48, 6), bias_mean, 1e-6, 1e-7));
      error[r] = m[r] - got;  // what the hook carries to the next iteration
    }
    // Ranks agree bit for bit.
    CHECK(torch::equal(outcomes[0].result.buffers[it], outcomes[1].result.buffers[it]));
    // 6 bias + 8 P elements in the first exchange, 6 Q in the second.
    CHECK(outcomes[0].result.bytes[it] == (6 + 8 + 6) * 4);
  }
  // The approximation is a real one: rank 1 of a random 8x6 is far from it.
  const auto full_mean = (w[0][3] + w[1][3]) / 2;
  CHECK_FALSE(torch::allclose(outcomes[0].result.buffers[3].narrow(0, 0, 48).view({8, 6}),
                              full_mean, 1e-2, 1e-2));
  CHECK(outcomes[0].result.iter == 4);
}

TEST_CASE("PowerSGD with two buckets: one iteration per backward, one seed per bucket",
          "[powersgd]") {
  const int n = 2;
  torch::manual_seed(13);
  std::vector<std::vector<torch::Tensor>> w(n);  // [iteration * 2 + bucket]
  for (int r = 0; r < n; ++r) {
    for (int k = 0; k < 6; ++k) w[r].push_back(torch::randn({8, 6}));
  }
  PowerSgdOptions options;
  options.start_iter = 2;
  // Assertions stay on the main thread (Catch2 v3's are not thread-safe).
  auto outcomes = run_ranks<std::vector<torch::Tensor>>(n, [&](ProcessGroup& pg) {
    PowerSgdHook hook(options);
    std::vector<torch::Tensor> out;
    for (int it = 0; it < 3; ++it) {
      // As the Reducer: both buckets' first stages, then their second ones.
      std::vector<GradBucket> buckets;
      std::vector<HookWork> works;
      for (size_t b = 0; b < 2; ++b) {
        buckets.push_back(make_bucket(w[pg.rank()][it * 2 + b], torch::zeros({6})));
        buckets.back().index = b;
        buckets.back().count = 2;
        buckets.back().params = {static_cast<int64_t>(2 * b), static_cast<int64_t>(2 * b + 1)};
      }
      for (auto& bucket : buckets) works.push_back(hook.run_bucket(pg, bucket));
      for (auto& work : works) {
        pg.wait(work.work, "first");
        if (work.then) work = work.then();
      }
      for (auto& work : works) {
        pg.wait(work.work, "second");
        if (work.finish) work.finish();
      }
      for (auto& bucket : buckets) out.push_back(bucket.buffer.narrow(0, 0, 48).clone());
    }
    out.push_back(torch::tensor({hook.stats().iter}));
    return out;
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << error_text(outcomes[r].error));
    REQUIRE_FALSE(outcomes[r].error);
  }
  // Counted once per backward, at the last bucket.
  CHECK(outcomes[0].result.back().item<int64_t>() == 3);
  // Iteration 2 compresses both buckets; bucket 0 draws numpy's first seed,
  // bucket 1 its second.
  std::mt19937 engine(0);
  for (int b = 0; b < 2; ++b) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(numpy_randint_1e9(engine));
    auto q = orthogonal(at::randn({6, 1}, generator, at::TensorOptions(at::kFloat)));
    const auto& m0 = w[0][4 + b];
    const auto& m1 = w[1][4 + b];
    auto p = orthogonal(torch::mm(m0, q) + torch::mm(m1, q));
    q = (torch::mm(m0.t(), p) + torch::mm(m1.t(), p)) / 2;
    const auto want = torch::mm(p, q.t()).reshape(-1);
    INFO("bucket " << b);
    CHECK(torch::allclose(outcomes[0].result[static_cast<size_t>(4 + b)], want, 1e-5, 1e-6));
  }
  // Iterations 0 and 1 were plain: the mean.
  CHECK(torch::allclose(outcomes[0].result[3], ((w[0][3] + w[1][3]) / 2).reshape(-1), 1e-6, 1e-7));
}

TEST_CASE("PowerSGD compresses a transposed gradient as its logical matrix", "[powersgd]") {
  const int n = 2;
  torch::manual_seed(17);
  std::vector<torch::Tensor> m{torch::randn({8, 6}), torch::randn({8, 6})};
  PowerSgdOptions options;  // compressing from the first iteration
  options.start_iter = 0;
  options.use_error_feedback = false;
  options.warm_start = false;
  auto outcomes = run_ranks<torch::Tensor>(n, [&](ProcessGroup& pg) {
    PowerSgdHook hook(options);
    GradBucket bucket;
    bucket.count = 1;
    bucket.buffer = torch::zeros({48});
    // The weight's memory is column-major: strides (1, 8), as a transposed parameter's.
    auto g = bucket.buffer.as_strided({8, 6}, {1, 8});
    g.copy_(m[static_cast<size_t>(pg.rank())]);
    bucket.gradients = {g};
    bucket.offsets = {0};
    bucket.params = {0};
    exchange(hook, pg, bucket);
    return g.clone();
  });
  for (int r = 0; r < n; ++r) REQUIRE_FALSE(outcomes[r].error);
  std::mt19937 engine(0);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(numpy_randint_1e9(engine));
  auto q = orthogonal(at::randn({6, 1}, generator, at::TensorOptions(at::kFloat)));
  auto p = orthogonal(torch::mm(m[0], q) + torch::mm(m[1], q));
  q = (torch::mm(m[0].t(), p) + torch::mm(m[1].t(), p)) / 2;
  CHECK(torch::allclose(outcomes[0].result, torch::mm(p, q.t()), 1e-5, 1e-6));
  CHECK(torch::equal(outcomes[0].result, outcomes[1].result));
}

TEST_CASE("PowerSGD's error feedback is carried exactly", "[powersgd]") {
  // One rank: the all-reduce is the identity, so after each compressed
  // iteration the error must be exactly input + previous error - output.
  PowerSgdOptions options;
  options.start_iter = 2;
  torch::manual_seed(5);
  std::vector<torch::Tensor> inputs;
  for (int it = 0; it < 5; ++it) inputs.push_back(torch::randn({54}));
  struct Seen {
    std::vector<torch::Tensor> outputs, errors;  // errors: undefined where none was kept
  };
  auto outcomes = run_ranks<Seen>(1, [&](ProcessGroup& pg) {
    PowerSgdHook hook(options);
    Seen seen;
    for (const auto& input : inputs) {
      auto bucket = make_bucket(input.narrow(0, 0, 48).view({8, 6}), input.narrow(0, 48, 6));
      exchange(hook, pg, bucket);
      seen.outputs.push_back(bucket.buffer.clone());
      torch::Tensor error;
      for (const auto& [key, t] : hook.state_dict()) {
        if (key == "error.0") error = t;
      }
      seen.errors.push_back(error);
    }
    return seen;
  });
  REQUIRE_FALSE(outcomes[0].error);
  const auto& seen = outcomes[0].result;
  torch::Tensor carried = torch::zeros({54});
  for (size_t it = 0; it < inputs.size(); ++it) {
    INFO("iteration " << it);
    if (it < 2) {  // plain all-reduce of one rank: the input itself
      CHECK(torch::equal(seen.outputs[it], inputs[it]));
      continue;
    }
    const auto& error = seen.errors[it];
    REQUIRE(error.defined());
    CHECK(torch::equal(error, (inputs[it] + carried) - seen.outputs[it]));
    CHECK(error.abs().max().item<float>() > 1e-3);  // rank 1 of 8x6 loses something
    CHECK(torch::equal(error.narrow(0, 48, 6), torch::zeros({6})));  // the bias: exact
    carried = error;
  }
}

TEST_CASE("PowerSGD under DDP: ranks bit-identical, bytes cut, state round trip resumes exactly",
          "[powersgd][ddp]") {
  const int n = 2;
  torch::manual_seed(21);
  auto base = make_mlp(12, 64, 5);
  std::vector<torch::Tensor> xs, ys;
  for (int i = 0; i < 8 * n; ++i) {
    xs.push_back(torch::randn({8, 12}));
    ys.push_back(torch::randint(0, 5, {8}));
  }
  PowerSgdOptions options;
  options.start_iter = 2;
  options.matrix_approximation_rank = 2;
  // steps 0..7; `cut`: after that many steps the hook is rebuilt from its state_dict.
  auto train = [&](int cut, bool view = true) {
    return run_ranks<std::pair<std::vector<torch::Tensor>, std::vector<int64_t>>>(
        n, [&](ProcessGroup& pg) {
          auto model = clone_of(base);
          DdpOptions ddp_options;
          ddp_options.gradient_as_bucket_view = view;
          auto hook = std::make_shared<PowerSgdHook>(options);
          ddp_options.comm_hook = hook;
          auto ddp = std::make_unique<DistributedDataParallel<torch::nn::Sequential>>(
              model, pg.shared_from_this(), ddp_options);
          torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
          std::vector<int64_t> bytes;
          for (int step = 0; step < 8; ++step) {
            if (step == cut) {
              const auto saved = hook->state_dict();
              hook = std::make_shared<PowerSgdHook>(options);
              hook->load_state_dict(saved, "test");
              ddp_options.comm_hook = hook;
              ddp.reset();
              ddp = std::make_unique<DistributedDataParallel<torch::nn::Sequential>>(
                  model, pg.shared_from_this(), ddp_options);
            }
            sgd.zero_grad();
            const size_t k = static_cast<size_t>(step * n + pg.rank());
            F::cross_entropy(ddp->forward(xs[k]), ys[k]).backward();
            sgd.step();
            bytes.push_back(ddp->reducer()->last_stats().bytes);
          }
          std::vector<torch::Tensor> weights;
          for (const auto& p : model->parameters()) weights.push_back(p.detach().clone());
          return std::make_pair(weights, bytes);
        });
  };
  auto whole = train(-1);
  // A cut at step 5 rebuilds DDP too: its buckets are rebuilt after the
  // first step again, with the same layout, so the state still fits.
  auto resumed = train(5);
  auto copied = train(-1, /*view=*/false);  // gradients copied into the buckets and back
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << error_text(whole[r].error) << error_text(resumed[r].error));
    REQUIRE_FALSE(whole[r].error);
    REQUIRE_FALSE(resumed[r].error);
    REQUIRE_FALSE(copied[r].error);
  }
  const auto& w0 = whole[0].result.first;
  for (size_t i = 0; i < w0.size(); ++i) {
    CHECK(torch::equal(w0[i], whole[1].result.first[i]));    // ranks agree
    CHECK(torch::equal(w0[i], resumed[0].result.first[i]));  // and the resume is exact
    CHECK(torch::equal(w0[i], copied[0].result.first[i]));   // views or copies: the same
  }
  const auto& bytes = whole[0].result.second;
  const int64_t plain = bytes[0];
  int64_t params = 0;
  for (const auto& p : base->parameters()) params += p.numel();
  CHECK(plain == params * 4);
  CHECK(bytes[1] == plain);
  for (size_t s = 2; s < bytes.size(); ++s) CHECK(bytes[s] * 4 <= plain);
  // Compressed, and not the plain gradients: differs from an all-reduce run.
  auto model = clone_of(base);
  CHECK_FALSE(torch::equal(model->parameters()[0], w0[0]));
}

TEST_CASE("PowerSGD's settings and state are checked, and hooks are chosen by name", "[powersgd]") {
  PowerSgdOptions bad;
  bad.start_iter = 1;
  CHECK_THROWS_WITH(powersgd_validate(bad),
                    Contains("ddp.powersgd.start_iter: must be at least 2 with error_feedback"));
  bad.use_error_feedback = false;
  bad.warm_start = false;
  CHECK_NOTHROW(powersgd_validate(bad));
  bad.matrix_approximation_rank = 0;
  CHECK_THROWS_WITH(powersgd_validate(bad), Contains("ddp.powersgd.rank: must be at least 1"));

  PowerSgdHook hook(PowerSgdOptions{});
  const auto good = hook.state_dict();
  auto without = [&](const std::string& key) {
    HookState s;
    for (const auto& e : good)
      if (e.first != key) s.push_back(e);
    return s;
  };
  CHECK_THROWS_WITH(hook.load_state_dict(without("iter"), "f.pt"),
                    Contains("f.pt: PowerSGD state: 'iter' or 'rng' is missing"));
  auto junk = good;
  junk.emplace_back("error.x", torch::zeros({3}));
  CHECK_THROWS_WITH(hook.load_state_dict(junk, "f.pt"),
                    Contains("'error.x' does not name a bucket"));
  junk = good;
  for (auto& e : junk)
    if (e.first == "rng") e.second = torch::full({20}, 65, torch::kByte);
  CHECK_THROWS_WITH(hook.load_state_dict(junk, "f.pt"), Contains("'rng' is not an MT19937 state"));
  junk = good;
  junk.emplace_back("q.0", torch::zeros({2, 2}));
  CHECK_THROWS_WITH(hook.load_state_dict(junk, "f.pt"),
                    Contains("'q.0' is not a 1-D floating-point tensor"));

  CHECK(comm_hook_create("allreduce", PowerSgdOptions{}) == nullptr);
  CHECK(comm_hook_create("powersgd", PowerSgdOptions{})->name() == "powersgd");
  CHECK_THROWS_WITH(register_comm_hook("fp16", [] { return std::make_shared<AllReduceHook>(); }),
                    Contains("'fp16' is a built-in hook's name"));
  CHECK_THROWS_WITH(comm_hook_create("mine", PowerSgdOptions{}),
                    Contains("ddp.comm_hook: unknown hook 'mine' (valid: allreduce, fp16, bf16, "
                             "powersgd; register_comm_hook adds your own)"));
  register_comm_hook("mine", [] { return std::make_shared<AllReduceHook>(); });
  CHECK(comm_hook_create("mine", PowerSgdOptions{})->name() == "allreduce");
  register_comm_hook("nothing", [] { return std::shared_ptr<CommHook>(); });
  CHECK_THROWS_WITH(comm_hook_create("nothing", PowerSgdOptions{}),
                    Contains("comm hook 'nothing': its factory returned nothing"));
}

// Hidden: the lockstep side of tests/python/powersgd_parity.py, run by
// tests/multiproc/powersgd.sh with LOCKSTEP_POWERSGD_PARITY=<folder>.
TEST_CASE("PowerSGD parity run for tests/python/powersgd_parity.py", "[.powersgd_parity]") {
  const char* folder_env = std::getenv("LOCKSTEP_POWERSGD_PARITY");
  REQUIRE(folder_env != nullptr);
  const std::string folder = folder_env;
  const auto init = state_dict_load_file(folder + "/init.pt");
  auto lookup = [&](const std::string& key) {
    for (const auto& [k, t] : init)
      if (k == key) return t;
    throw std::runtime_error("init.pt has no " + key);
  };
  const int n = 2, steps = 10;
  // As powersgd_parity.py's VARIANTs (one bucket: PyTorch's hook pairs
  // mismatched collectives on Gloo with several, docs/ddp.md).
  for (const std::string variant : {"r1", "r2", "r4", "r2-batch"}) {
    PowerSgdOptions options;
    options.start_iter = 2;
    options.matrix_approximation_rank = std::stoi(variant.substr(1, 1));
    options.batch_tensors_with_same_shape = variant.find("-batch") != std::string::npos;
    auto outcomes = run_ranks<std::pair<StateDict, std::vector<int64_t>>>(n, [&](ProcessGroup& pg) {
      torch::nn::Sequential model(
          torch::nn::Linear(12, 32), torch::nn::ReLU(), torch::nn::Linear(32, 32),
          torch::nn::ReLU(), torch::nn::Linear(32, 12), torch::nn::ReLU(),
          torch::nn::Linear(12, 32), torch::nn::ReLU(), torch::nn::Linear(32, 5));
      StateDict weights;
      for (const auto& [k, t] : init)
        if (k.rfind("x.", 0) != 0 && k.rfind("y.", 0) != 0) weights.emplace_back(k, t);
      state_dict_load(*model, weights, "init.pt");
      DdpOptions ddp_options;
      ddp_options.comm_hook = std::make_shared<PowerSgdHook>(options);
      DistributedDataParallel<torch::nn::Sequential> ddp(model, pg.shared_from_this(), ddp_options);
      torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      std::vector<int64_t> bytes;
      for (int step = 0; step < steps; ++step) {
        sgd.zero_grad();
        const std::string at = std::to_string(step) + "." + std::to_string(pg.rank());
        F::cross_entropy(ddp.forward(lookup("x." + at)), lookup("y." + at)).backward();
        sgd.step();
        bytes.push_back(ddp.reducer()->last_stats().bytes);
      }
      return std::make_pair(state_dict_of(*model), bytes);
    });
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r << ": " << error_text(outcomes[r].error));
      REQUIRE_FALSE(outcomes[r].error);
    }
    const std::string name = folder + "/lockstep_" + variant;
    state_dict_save_file(outcomes[0].result.first, name + ".pt");
    std::ofstream bytes(name + ".bytes");
    for (size_t s = 0; s < outcomes[0].result.second.size(); ++s) {
      bytes << (s ? " " : "") << outcomes[0].result.second[s];
    }
    bytes << "\n";
  }
}

TEST_CASE("A PowerSGD hook serves one DistributedDataParallel", "[powersgd][ddp]") {
  torch::manual_seed(2);
  auto base = make_mlp();
  const auto x = torch::randn({4, 12});
  const auto y = torch::randint(0, 5, {4});
  auto said = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("(nothing thrown)");
  };
  auto outcomes = run_ranks<std::vector<std::string>>(2, [&](ProcessGroup& pg) {
    auto model = clone_of(base);
    DdpOptions options;
    options.comm_hook = std::make_shared<PowerSgdHook>(PowerSgdOptions{});
    DistributedDataParallel<torch::nn::Sequential> first(model, pg.shared_from_this(), options);
    auto other = clone_of(base);
    std::vector<std::string> out;
    out.push_back(said([&] {
      DistributedDataParallel<torch::nn::Sequential> second(other, pg.shared_from_this(), options);
    }));
    F::cross_entropy(first.forward(x), y).backward();
    out.push_back(said([&] { first.restore_bucket_order({0, 1, 2, 3}); }));
    return out;
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << error_text(outcomes[r].error));
    REQUIRE_FALSE(outcomes[r].error);
    CHECK_THAT(outcomes[r].result[0],
               Contains("comm hook 'powersgd' is already used by another DistributedDataParallel"));
    // And the bucket order is restored before the first forward only.
    CHECK_THAT(outcomes[r].result[1],
               Contains("restore_bucket_order: only before the first forward"));
  }
}
