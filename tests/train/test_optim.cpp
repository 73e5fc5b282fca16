// Optimizers and learning-rate schedules (optim/optim.h): closed-form
// schedule values, every optimizer kind, and optimizer state in fingerprints.
#include <torch/optim.h>
#include "support/catch.h"

#include "lockstep/check/fingerprint.h"
#include "lockstep/model/models.h"
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
