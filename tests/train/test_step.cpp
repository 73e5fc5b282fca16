// The one training step (train/step.h) with values: two ranks with
// accumulation, clipping and a warmup-then-cosine schedule against one
// process that steps on the concatenated batch; and the check mode, which
// now runs the same step, ending on the weights of `lockstep train`.
#include <torch/nn/functional/loss.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/sgd.h>

#include <limits>

#include "lockstep/optim/optim.h"
#include "lockstep/train/check_run.h"
#include "lockstep/train/recipe.h"
#include "lockstep/train/step.h"
#include "lockstep/train/trainer.h"
#include "support/catch.h"
#include "support/temp_dir.h"
#include "support/thread_world.h"

using namespace lockstep;
using namespace lockstep::testing;

namespace {

constexpr int kRanks = 2;
constexpr int64_t kAcc = 2, kRows = 3, kSteps = 4, kFeatures = 5, kClasses = 3;

ModelConfig small_mlp() {
  ModelConfig model;
  model.name = "mlp";
  model.hidden = 7;
  model.layers = 2;
  return model;
}

OptimConfig schedule() {
  OptimConfig optim;
  optim.name = OptimizerKind::kSgd;
  optim.lr = 0.5;
  optim.momentum = 0.9;
  optim.schedule = Schedule::kCosine;
  optim.warmup_steps = 2;
  optim.min_lr = 0.01;
  return optim;
}

std::vector<at::Tensor> copy_of(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone());
  return out;
}

}  // namespace

TEST_CASE("two ranks' step with accumulation, clipping and the schedule equals one process",
          "[step][ddp]") {
  // 0.05 clips every step, so a per-rank norm would show; 0 does not clip,
  // so a gradient off by a factor (a missing division by the accumulation
  // count, a sum over ranks) would show.
  for (const double clip : {0.05, 0.0}) {
    DYNAMIC_SECTION("clip_grad_norm " << clip) {
      at::manual_seed(3);
      // x[step][rank][micro]: every micro-batch of every rank of every step.
      const auto x = at::randn({kSteps, kRanks, kAcc, kRows, kFeatures});
      const auto y = at::randint(0, kClasses, {kSteps, kRanks, kAcc, kRows}, at::kLong);
      std::vector<std::shared_ptr<Classifier>> models;
      for (int r = 0; r < kRanks; ++r) {
        at::manual_seed(11);
        models.push_back(model_create(small_mlp(), {kFeatures}, kClasses));
      }
      at::manual_seed(11);
      auto reference = model_create(small_mlp(), {kFeatures}, kClasses);
      const auto cross_entropy = [](const at::Tensor& out, const at::Tensor& target) {
        return torch::nn::functional::cross_entropy(out, target);
      };

      StepOptions options;
      options.accumulation_steps = kAcc;
      options.clip_grad_norm = clip;
      options.optim = schedule();
      options.total_steps = 6;
      options.check.every = 1;
      struct Outcome {
        std::vector<at::Tensor> weights;
        std::vector<double> lrs, losses;
      };
      auto outcomes = run_ranks<Outcome>(kRanks, [&](ProcessGroup& pg) {
        auto& model = models[pg.rank()];
        ClassifierDdp ddp(model, pg.shared_from_this());
        auto optimizer = optimizer_create(options.optim, model->parameters());
        TrainStep step(pg, ddp, *model, *optimizer, cross_entropy, true, options);
        Outcome outcome;
        for (int64_t s = 0; s < kSteps; ++s) {
          int64_t micro = 0;
          const auto stats = step.run(
              [&]() -> std::optional<Batch> {
                const auto i = micro++;
                return Batch{x[s][pg.rank()][i], y[s][pg.rank()][i]};
              },
              s);
          outcome.lrs.push_back(stats.lr);
          outcome.losses.push_back(stats.loss_sum.item<double>() / stats.samples);
        }
        step.finish_checks();  // every per-step check passed (abort policy)
        outcome.weights = copy_of(model->parameters());
        return outcome;
      });
      for (const auto& o : outcomes) REQUIRE(error_text(o.error) == "");

      // One process on the concatenated batch: the mean loss over all ranks'
      // micro-batches, the global norm clipped, the schedule's lr.
      auto optimizer = optimizer_create(schedule(), reference->parameters());
      for (int64_t s = 0; s < kSteps; ++s) {
        optimizer->zero_grad();
        const auto all_x = x[s].reshape({kRanks * kAcc * kRows, kFeatures});
        const auto all_y = y[s].reshape({kRanks * kAcc * kRows});
        const auto loss = cross_entropy(reference->forward(all_x), all_y);
        loss.backward();
        const double lr = lr_at(schedule(), s, 6);
        optimizer_set_lr(*optimizer, lr);
        if (clip > 0) {
          const double norm = torch::nn::utils::clip_grad_norm_(reference->parameters(), clip);
          CHECK(norm > clip);  // the clipping is exercised
        }
        optimizer->step();
        double mean_loss = 0;  // each rank reports its own mean; equal shares
        for (int r = 0; r < kRanks; ++r) {
          CHECK(outcomes[r].result.lrs[s] == Approx(lr));
          mean_loss += outcomes[r].result.losses[s] / kRanks;
        }
        CHECK(mean_loss == Approx(loss.item<double>()).epsilon(1e-6));
      }
      // Warmup then cosine: the lr really changes from step to step.
      CHECK(outcomes[0].result.lrs[0] < outcomes[0].result.lrs[1]);
      CHECK(outcomes[0].result.lrs[1] > outcomes[0].result.lrs[3]);
      const auto want = reference->parameters();
      for (int r = 0; r < kRanks; ++r) {
        const auto& got = outcomes[r].result.weights;
        REQUIRE(got.size() == want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          INFO("rank " << r << " parameter " << i);
          CHECK(at::allclose(got[i], want[i].detach(), 1e-5, 1e-6));
          CHECK(at::equal(got[i], outcomes[0].result.weights[i]));
        }
      }
    }
  }
}

TEST_CASE("a step whose batches run dry is an internal error naming the micro-batch", "[step]") {
  at::manual_seed(11);
  auto model = model_create(small_mlp(), {kFeatures}, kClasses);
  StepOptions options;
  options.accumulation_steps = 3;
  auto outcomes = run_ranks<int>(1, [&](ProcessGroup& pg) {
    ClassifierDdp ddp(model, pg.shared_from_this());
    auto optimizer = optimizer_create(OptimConfig{}, model->parameters());
    TrainStep step(
        pg, ddp, *model, *optimizer,
        [](const at::Tensor& o, const at::Tensor& t) {
          return torch::nn::functional::cross_entropy(o, t);
        },
        true, options);
    int given = 0;
    step.run(
        [&]() -> std::optional<Batch> {
          if (given++ == 2) return std::nullopt;
          return Batch{at::randn({2, kFeatures}), at::zeros({2}, at::kLong)};
        },
        4);
    return 0;
  });
  CHECK_THAT(error_text(outcomes[0].error),
             Contains("the batches ran out in step 5 at micro-batch 3 of 3"));
}

TEST_CASE("check mode honours accumulation, clipping and the schedule: lockstep train's weights",
          "[step][check]") {
  TempDir dir;
  Config config;
  config.run.dir = dir.path;
  config.data.name = DatasetKind::kSynthetic;
  config.data.synthetic_size = 96;
  config.data.synthetic_features = 6;
  config.data.synthetic_classes = 3;
  config.data.batch_size = 8;
  config.train.accumulation_steps = 2;
  config.train.clip_grad_norm = 0.05;
  config.train.epochs = 3;
  config.train.max_steps = 7;  // past the first epoch (5 steps): the sampler's next epoch
  config.optim = schedule();
  config.log.every = 1000;
  config.log.progress = Progress::kPlain;
  config.model = small_mlp();
  config.model.dropout = 0.1;  // each rank's generator, seeded as the trainer seeds it
  auto fingerprints = [&](const Config& c) {
    auto outcomes = run_ranks<std::pair<std::string, std::string>>(1, [&](ProcessGroup& pg) {
      WorldInfo world;
      auto shared = pg.shared_from_this();
      Trainer trainer(c, world, shared);
      const auto trained = trainer.run();
      CheckRunOptions options;
      options.steps = c.train.max_steps;
      const auto checked = check_run(c, world, shared, options);
      if (!checked.passed) throw std::runtime_error(checked.summary);
      return std::make_pair(trained.fingerprint, checked.fingerprint);
    });
    REQUIRE(error_text(outcomes[0].error) == "");
    return outcomes[0].result;
  };
  const auto [trained, checked] = fingerprints(config);
  CHECK(trained == checked);
  CHECK(trained.size() == 32);
  // Without accumulation the weights differ: the comparison can fail.
  Config plain = config;
  plain.run.name = "plain";
  plain.train.accumulation_steps = 1;
  const auto [plain_trained, plain_checked] = fingerprints(plain);
  CHECK(plain_trained == plain_checked);
  CHECK(plain_trained != trained);
}

TEST_CASE("a data file the config names but that is missing names the key and the resolved path",
          "[config][step]") {
  TempDir dir;
  const auto path = dir.write("run.yaml", "data:\n  name: csv\n  path: missing.csv\n");
  const Config config = config_load(path);
  REQUIRE_THROWS_WITH(
      dataset_from_config(config),
      Contains("data.path: '" + dir.path + "/missing.csv' does not exist (set at " + path +
               ":3); a relative path in a config file is resolved "
               "against that file's folder"));
}

TEST_CASE("the recipe: the step plan, and each section converted once", "[step][config]") {
  Config config;  // the digits: 1,797 examples, 20% validation
  config.train.accumulation_steps = 2;
  config.train.epochs = 3;
  const auto split = dataset_from_config(config);
  CHECK(split.train.size() == 1438);
  WorldInfo world;
  world.world_size = 2;
  world.rank = 1;
  const auto sampler = sampler_from_config(config, world, split.train.size());
  const StepPlan plan = step_plan(config, sampler, split.train.size());
  // 719 per rank: 23 batches of 32 (the last of 15), every one trained
  // (Note [Epoch tail]): 11 steps of 2 and a 12th of 1.
  CHECK(plan.micro_per_epoch == 23);
  CHECK(plan.steps_per_epoch == 12);
  CHECK(plan.total_steps == 36);
  // Note [Schedule length]: the epochs' steps, else max_steps (capped by
  // the epochs' end), else optim.decay_steps.
  CHECK(plan.schedule_steps == 36);
  CHECK(plan.schedule_from == ScheduleFrom::kEpochs);
  {
    Config c = config;
    c.train.max_steps = 20;
    const StepPlan p = step_plan(c, sampler, split.train.size());
    CHECK(p.total_steps == 36);
    CHECK(p.schedule_steps == 20);
    CHECK(p.schedule_from == ScheduleFrom::kMaxSteps);
    CHECK(stop_step(c, p.total_steps) == 20);
    c.train.max_steps = 500;  // past the epochs: the run and its schedule end with them
    CHECK(step_plan(c, sampler, split.train.size()).schedule_steps == 36);
    CHECK(stop_step(c, 36) == 36);
    c.optim.decay_steps = 50;
    const StepPlan d = step_plan(c, sampler, split.train.size());
    CHECK(d.schedule_steps == 50);
    CHECK(d.schedule_from == ScheduleFrom::kDecaySteps);
  }
  config.data.drop_last = true;  // whole batches and whole windows only: 22 fill 11 steps
  const auto dropping = sampler_from_config(config, world, split.train.size());
  CHECK(step_plan(config, dropping, split.train.size()).micro_per_epoch == 22);
  CHECK(step_plan(config, dropping, split.train.size()).steps_per_epoch == 11);
  config.train.accumulation_steps = 24;
  REQUIRE_THROWS_WITH(step_plan(config, dropping, split.train.size()),
                      Contains("gives 22 whole micro-batch(es) of data.batch_size=32 per rank "
                               "per epoch, fewer than train.accumulation_steps=24, and "
                               "data.drop_last drops the rest"));
  config.data.drop_last = false;  // one step of all 23
  CHECK(step_plan(config, sampler, split.train.size()).steps_per_epoch == 1);
  config.train.accumulation_steps = 2;

  config.dist.shm_chunk_mb = 1.5;
  config.dist.timeout_s = 2.5;
  config.dist.backend = BackendKind::kGloo;
  const InitOptions init = init_options_from_config(config);
  CHECK(init.shm_chunk_bytes == 1572864);
  CHECK(init.timeout == std::chrono::milliseconds(2500));
  CHECK(init.backend == BackendKind::kGloo);
  config.dist.shm_chunk_mb = 0.0625 + 1e-7;  // rounded down to a multiple of 64 bytes
  CHECK(init_options_from_config(config).shm_chunk_bytes == 65536);
  CHECK(Config{}.dist.shm_chunk_mb == 0.25);  // ShmOptions' default, in MiB

  const DdpOptions plain = ddp_options_from_config(Config{}.ddp);
  CHECK(plain.bucket_cap_mb == 25);  // DDP's own defaults, through the config
  CHECK(plain.first_bucket_cap_mb == 1);
  CHECK(plain.comm_hook == nullptr);
  DdpConfig fp16;
  fp16.comm_hook = "fp16";
  fp16.bucket_cap_mb = 4;
  const DdpOptions compressed = ddp_options_from_config(fp16);
  REQUIRE(compressed.comm_hook != nullptr);
  CHECK(compressed.comm_hook->name() == "fp16");
  CHECK(compressed.bucket_cap_mb == 4);
}

TEST_CASE("the step reports the gradient norm before clipping, and clips by value first",
          "[step]") {
  // One rank, one linear layer whose gradient is known: loss = sum(w * g)
  // has gradient g. clip_value 0.5 clamps it, clip_grad_norm 0.3 then
  // scales it; grad_norm reports |g| before either.
  auto outcomes = run_ranks<int>(1, [&](ProcessGroup& pg) {
    at::manual_seed(1);
    auto model = model_create(small_mlp(), {kFeatures}, kClasses);
    ClassifierDdp ddp(model, pg.shared_from_this());
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(1.0));
    StepOptions options;
    options.clip_value = 0.01;
    options.clip_grad_norm = 0.02;
    options.total_steps = 1;
    options.check.every = 0;
    std::vector<at::Tensor> before, grads;
    TrainStep step(
        pg, ddp, *model, sgd,
        [](const at::Tensor& out, const at::Tensor& y) {
          return torch::nn::functional::cross_entropy(out, y);
        },
        true, options);
    step.hooks.optimizer_step = [&](torch::optim::Optimizer&) {
      for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
    };
    // The reference: the same forward and backward by hand.
    at::manual_seed(2);
    const auto x = at::randn({kRows, kFeatures});
    const auto y = at::randint(0, kClasses, {kRows}, at::kLong);
    bool given = false;
    const auto stats = step.run(
        [&]() -> std::optional<Batch> {
          if (given) return std::nullopt;
          given = true;
          return Batch{x, y};
        },
        0);
    auto reference = model_create(small_mlp(), {kFeatures}, kClasses);
    {
      at::NoGradGuard no_grad;
      auto ps = reference->parameters(), qs = model->parameters();
      for (size_t i = 0; i < ps.size(); ++i) ps[i].copy_(qs[i]);
    }
    torch::nn::functional::cross_entropy(reference->forward(x), y).backward();
    std::vector<at::Tensor> norms;
    for (const auto& p : reference->parameters()) norms.push_back(p.grad().norm());
    const double norm = at::stack(norms).norm().item<double>();
    REQUIRE(stats.grad_norm.defined());
    CHECK(stats.grad_norm.item<double>() == Approx(norm).epsilon(1e-6));
    std::vector<at::Tensor> clamped;
    for (const auto& p : reference->parameters()) clamped.push_back(p.grad().clamp(-0.01, 0.01));
    std::vector<at::Tensor> cn;
    for (const auto& g : clamped) cn.push_back(g.norm());
    const double clamped_norm = at::stack(cn).norm().item<double>();
    const double coef = std::min(1.0, 0.02 / (clamped_norm + 1e-6));
    for (size_t i = 0; i < grads.size(); ++i) {
      CHECK(at::allclose(grads[i], clamped[i] * coef, 1e-5, 1e-7));
    }
    CHECK(clamped_norm > 0.02);  // so the norm clipping did act
    return 0;
  });
  REQUIRE(error_text(outcomes[0].error).empty());
}

TEST_CASE(
    "an epoch's short last step (Note [Epoch tail]) is the mean over the micro-batches it saw, "
    "as one process on them",
    "[step][ddp]") {
  // accumulation 3, but a window of 2 micro-batches: each loss divided by 2
  // (dividing by 3 would train the tail at two thirds of its weight).
  at::manual_seed(5);
  const auto x = at::randn({kRanks, 2, kRows, kFeatures});
  const auto y = at::randint(0, kClasses, {kRanks, 2, kRows}, at::kLong);
  std::vector<std::shared_ptr<Classifier>> models;
  for (int r = 0; r < kRanks; ++r) {
    at::manual_seed(11);
    models.push_back(model_create(small_mlp(), {kFeatures}, kClasses));
  }
  at::manual_seed(11);
  auto reference = model_create(small_mlp(), {kFeatures}, kClasses);
  const auto cross_entropy = [](const at::Tensor& out, const at::Tensor& target) {
    return torch::nn::functional::cross_entropy(out, target);
  };
  StepOptions options;
  options.accumulation_steps = 3;
  OptimConfig plain;
  plain.name = OptimizerKind::kSgd;
  plain.lr = 0.5;
  plain.momentum = 0;
  options.optim = plain;
  auto outcomes = run_ranks<std::vector<at::Tensor>>(kRanks, [&](ProcessGroup& pg) {
    auto& model = models[pg.rank()];
    ClassifierDdp ddp(model, pg.shared_from_this());
    auto optimizer = optimizer_create(plain, model->parameters());
    TrainStep step(pg, ddp, *model, *optimizer, cross_entropy, true, options);
    int64_t micro = 0;
    step.run(
        [&]() -> std::optional<Batch> {
          const auto i = micro++;
          if (i >= 2) return std::nullopt;  // a third would be an error
          return Batch{x[pg.rank()][i], y[pg.rank()][i]};
        },
        0, 2);
    return copy_of(model->parameters());
  });
  for (const auto& o : outcomes) REQUIRE(error_text(o.error) == "");
  auto optimizer = optimizer_create(plain, reference->parameters());
  cross_entropy(reference->forward(x.reshape({kRanks * 2 * kRows, kFeatures})),
                y.reshape({kRanks * 2 * kRows}))
      .backward();
  optimizer->step();
  const auto want = reference->parameters();
  for (size_t i = 0; i < want.size(); ++i)
    CHECK(at::allclose(outcomes[0].result[i], want[i].detach(), 1e-5, 1e-6));
}

TEST_CASE("the epoch tail: steps over m micro-batches with drop_last false and true", "[step]") {
  // The case: 203 rows, 2 ranks (102 each, padded), batch 8, accumulation 2.
  CHECK(micro_batches_used(102, 8, 2, false) == 13);  // 12 full + 1 of 6 rows
  CHECK(steps_over(13, 2) == 7);                      // the 7th over 1 micro-batch
  CHECK(micro_batches_used(102, 8, 2, true) == 12);   // drop_last: whole windows only
  CHECK(steps_over(12, 2) == 6);
  CHECK(micro_batches_used(7, 8, 4, true) == 0);
  CHECK(micro_batches_used(7, 8, 4, false) == 1);
}

TEST_CASE(
    "train.stop_on_nonfinite: a NaN loss on one rank stops every rank at that step, before the "
    "optimizer, and off, the step is taken",
    "[step]") {
  for (const bool stop : {true, false}) {
    std::vector<std::shared_ptr<Classifier>> models;
    for (int r = 0; r < kRanks; ++r) {
      at::manual_seed(11);
      models.push_back(model_create(small_mlp(), {kFeatures}, kClasses));
    }
    const auto before = copy_of(models[0]->parameters());
    StepOptions options;
    options.stop_on_nonfinite = stop;
    options.grad_norm_every = 0;
    auto outcomes = run_ranks<int>(kRanks, [&](ProcessGroup& pg) {
      auto& model = models[pg.rank()];
      ClassifierDdp ddp(model, pg.shared_from_this());
      auto optimizer = optimizer_create(OptimConfig{}, model->parameters());
      TrainStep step(
          pg, ddp, *model, *optimizer,
          [](const at::Tensor& o, const at::Tensor& t) {
            return torch::nn::functional::cross_entropy(o, t);
          },
          true, options);
      auto input = at::randn({2, kFeatures});
      if (pg.rank() == 1) input[0][0] = std::numeric_limits<float>::quiet_NaN();
      step.run(
          [&, given = false]() mutable -> std::optional<Batch> {
            if (given) return std::nullopt;
            given = true;
            return Batch{input, at::zeros({2}, at::kLong)};
          },
          6);
      return 0;
    });
    INFO("stop_on_nonfinite " << stop);
    if (stop) {
      for (int r = 0; r < kRanks; ++r) {
        CHECK_THAT(error_text(outcomes[r].error),
                   Contains("training diverged at step 7: the loss is "));
        CHECK_THAT(error_text(outcomes[r].error), Contains("on rank 1"));
        for (size_t i = 0; i < before.size(); ++i)  // not stepped
          CHECK(at::equal(models[r]->parameters()[i], before[i]));
      }
    } else {
      for (int r = 0; r < kRanks; ++r) CHECK(error_text(outcomes[r].error) == "");
      CHECK_FALSE(at::equal(models[0]->parameters()[0], before[0]));  // stepped (into NaN)
    }
  }
}
