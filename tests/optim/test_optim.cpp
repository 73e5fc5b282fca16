// Optimizers and learning-rate schedules (optim/optim.h): closed-form
// schedule values, every optimizer kind, optimizer state in fingerprints,
// and the foreach Adam/AdamW against LibTorch's own step.
#include <torch/optim.h>
#include "support/catch.h"

#include "lockstep/check/fingerprint.h"
#include "lockstep/model/models.h"
#include "lockstep/optim/foreach_adam.h"
#include "lockstep/optim/optim.h"
#include "lockstep/util/error.h"

using namespace lockstep;
using lockstep::testing::Contains;

TEST_CASE("learning-rate schedules: warmup, step, cosine", "[optim]") {
  OptimConfig c;
  c.lr = 1.0;
  c.warmup_steps = 4;
  CHECK(lr_at(c, 0, 100) == Approx(0.25));
  CHECK(lr_at(c, 3, 100) == Approx(1.0));
  CHECK(lr_at(c, 50, 100) == Approx(1.0));
  c.schedule = Schedule::kStep;
  c.step_size = 10;
  c.gamma = 0.5;
  CHECK(lr_at(c, 13, 100) == Approx(1.0));
  CHECK(lr_at(c, 14, 100) == Approx(0.5));
  CHECK(lr_at(c, 34, 100) == Approx(0.125));
  c.schedule = Schedule::kCosine;
  c.min_lr = 0.1;
  // 105 steps, 4 of warm-up: the cosine spans steps 4..104, min_lr at 104.
  CHECK(lr_at(c, 4, 105) == Approx(1.0));
  CHECK(lr_at(c, 54, 105) == Approx(0.55));
  CHECK(lr_at(c, 104, 105) == Approx(0.1));
  CHECK(lr_at(c, 103, 105) > 0.1 + 1e-6);
  CHECK(lr_at(c, 300, 105) == Approx(0.1));  // past the length: min_lr
  auto param = torch::zeros({2}, torch::requires_grad());
  for (const auto& [kind, name] : kOptimizerKindNames) {
    c.name = kind;
    auto optimizer = optimizer_create(c, {param});
    optimizer_set_lr(*optimizer, 0.3);
    CHECK(optimizer->param_groups()[0].options().get_lr() == Approx(0.3));
  }
  c.name = OptimizerKind::kSgd;
  c.nesterov = true;
  c.momentum = 0;
  REQUIRE_THROWS_WITH(optimizer_create(c, {param}),
                      Contains("optim.nesterov needs optim.momentum > 0"));
}

TEST_CASE("optimizer state joins the fingerprint when asked", "[optim]") {
  for (const auto& [kind, name] : kOptimizerKindNames) {
    DYNAMIC_SECTION(name) {
      ModelConfig m;
      m.hidden = 4;
      auto model = model_create(m, {3}, 2);
      OptimConfig c;
      c.name = kind;
      auto optimizer = optimizer_create(c, model->parameters());
      std::vector<std::pair<std::string, at::Tensor>> params;
      for (const auto& p : model->named_parameters()) params.emplace_back(p.key(), p.value());
      CHECK(optimizer_state_tensors(*optimizer, params).empty());  // no state before a step
      model->forward(torch::randn({4, 3})).sum().backward();
      optimizer->step();
      auto state = optimizer_state_tensors(*optimizer, params);
      REQUIRE_FALSE(state.empty());
      CHECK(state.front().name == (kind == OptimizerKind::kSgd
                                       ? "optim layers.0.weight.momentum_buffer"
                                       : "optim layers.0.weight.exp_avg"));
      const auto before = fingerprint_digest(state, DigestMode::kXxh3);
      {
        torch::NoGradGuard no_grad;
        state.front().tensor.view({-1})[0] += 1;
      }
      CHECK(fingerprint_digest(optimizer_state_tensors(*optimizer, params), DigestMode::kXxh3) !=
            before);
    }
  }
}

namespace {
// Three parameters (a matrix, a vector, a 0-dim scalar) with the same
// values in two optimizers; the vector has no gradient on steps 2 and 4, so
// its step count (and bias corrections) lag the others'.
template <typename Reference, typename Foreach, typename Options>
void foreach_matches(const Options& options, int steps, size_t fields) {
  torch::manual_seed(7);
  std::vector<at::Tensor> init = {torch::randn({5, 3}), torch::randn({4}), torch::randn({})};
  std::vector<at::Tensor> a, b;
  for (const auto& t : init) {
    a.push_back(t.clone().requires_grad_(true));
    b.push_back(t.clone().requires_grad_(true));
  }
  Reference reference(a, options);
  Foreach multi(b, options);
  for (int step = 1; step <= steps; ++step) {
    for (size_t i = 0; i < a.size(); ++i) {
      const bool skip = i == 1 && step % 2 == 0;
      const auto grad = torch::randn_like(init[i]);
      a[i].mutable_grad() = skip ? at::Tensor() : grad.clone();
      b[i].mutable_grad() = skip ? at::Tensor() : grad.clone();
    }
    reference.step();
    multi.step();
    for (size_t i = 0; i < a.size(); ++i) {
      INFO("step " << step << ", parameter " << i);
      REQUIRE(torch::equal(a[i], b[i]));  // bit for bit
    }
  }
  const std::vector<std::pair<std::string, at::Tensor>> named_a = {
      {"w", a[0]}, {"v", a[1]}, {"s", a[2]}};
  const std::vector<std::pair<std::string, at::Tensor>> named_b = {
      {"w", b[0]}, {"v", b[1]}, {"s", b[2]}};
  const auto state_a = optimizer_state_dict(reference, named_a);
  const auto state_b = optimizer_state_dict(multi, named_b);
  REQUIRE(state_a.size() == state_b.size());
  REQUIRE(state_a.size() == 3 * fields);  // exp_avg, exp_avg_sq, [max_exp_avg_sq,] step
  for (size_t i = 0; i < state_a.size(); ++i) {
    INFO(state_a[i].first);
    CHECK(state_a[i].first == state_b[i].first);
    CHECK(torch::equal(state_a[i].second, state_b[i].second));
  }
  for (const auto& [name, value] : state_b) {
    if (name == "v.step")
      CHECK(value.template item<int64_t>() == steps - steps / 2);  // skipped evens
    if (name == "w.step") CHECK(value.template item<int64_t>() == steps);
  }
}
}  // namespace

// Note [Foreach optimizers]: on a CPU the multi-tensor step runs the same
// kernels as LibTorch's per-parameter one, op for op, so it must agree bit
// for bit, with each parameter's own bias corrections.
TEST_CASE("the foreach Adam and AdamW step bit-identically to LibTorch's", "[optim]") {
  SECTION("AdamW, decoupled weight decay") {
    foreach_matches<torch::optim::AdamW, ForeachAdamW>(
        torch::optim::AdamWOptions(0.01).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1), 6, 3);
  }
  SECTION("AdamW, no weight decay") {
    foreach_matches<torch::optim::AdamW, ForeachAdamW>(
        torch::optim::AdamWOptions(0.003).weight_decay(0), 6, 3);
  }
  SECTION("Adam, L2 weight decay") {
    foreach_matches<torch::optim::Adam, ForeachAdam>(
        torch::optim::AdamOptions(0.01).betas({0.8, 0.99}).weight_decay(0.05), 6, 3);
  }
  SECTION("Adam, amsgrad (LibTorch's own step)") {
    foreach_matches<torch::optim::Adam, ForeachAdam>(torch::optim::AdamOptions(0.01).amsgrad(true),
                                                     4, 4);
  }
}

TEST_CASE("optimizer_create steps with foreach when asked, or when every parameter is on a GPU",
          "[optim]") {
  auto param = torch::zeros({2}, torch::requires_grad());
  OptimConfig c;
  c.name = OptimizerKind::kAdamW;
  CHECK(dynamic_cast<ForeachAdamW*>(optimizer_create(c, {param}).get()) == nullptr);  // CPU
  CHECK(dynamic_cast<ForeachAdamW*>(optimizer_create(c, {param}, true).get()) != nullptr);
  c.name = OptimizerKind::kAdam;
  CHECK(dynamic_cast<ForeachAdam*>(optimizer_create(c, {param}, true).get()) != nullptr);
  CHECK(dynamic_cast<ForeachAdam*>(optimizer_create(c, {param}, false).get()) == nullptr);
  c.name = OptimizerKind::kSgd;  // per parameter always
  CHECK(dynamic_cast<torch::optim::SGD*>(optimizer_create(c, {param}, true).get()) != nullptr);
}
