// Mixed precision (optim/grad_scaler.h, train/precision.h) with values: the
// GradScaler against a closed form over a scripted sequence of finite and
// non-finite gradients; its fallback against ATen's kernels where the
// LibTorch has both; the order rules and the state; the agreement of
// found_inf across ranks, and the divergence it prevents; autocast's guard;
// the scaler inside the one step (scaled by a power of two, training is
// bit-identical to unscaled training). The same scripted fp16 run is
// compared with PyTorch's own GradScaler by tests/multiproc/amp_python.sh.
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>

#include "lockstep/checkpoint/checkpoint.h"
#include "lockstep/distributed/torch_compat.h"
#include "lockstep/optim/grad_scaler.h"
#include "lockstep/train/precision.h"
#include "lockstep/train/recipe.h"
#include "lockstep/train/step.h"
#include "lockstep/util/error.h"
#include "support/catch.h"
#include "support/temp_dir.h"
#include "support/thread_world.h"

using namespace lockstep;
using namespace lockstep::testing;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// One float32 weight w, SGD lr 1 without momentum: loss = c * w, so the
// gradient is c and a step subtracts it.
struct OneWeight {
  at::Tensor w = at::ones({1}).set_requires_grad(true);
  torch::optim::SGD sgd{std::vector<at::Tensor>{w}, torch::optim::SGDOptions(1.0)};
};

}  // namespace

TEST_CASE("GradScaler: scales, skips and growth follow the closed form", "[amp]") {
  amp::GradScalerOptions options;
  options.init_scale = 8;
  options.growth_interval = 3;
  amp::GradScaler scaler(options);
  OneWeight m;
  // c per step: finite ones are powers of two (exact after scaling).
  const std::vector<float> c{0.5f, 0.25f, 1.0f, kInf, 2.0f, std::nanf(""), 0.5f, 0.5f, 0.5f, 0.5f};
  // Closed form: x2 after 3 clean steps in a row, x0.5 (and a skip) on inf/NaN.
  const std::vector<double> scale_after{8, 8, 16, 8, 8, 4, 4, 4, 8, 8};
  const std::vector<int64_t> tracker_after{1, 2, 0, 0, 1, 0, 1, 2, 0, 1};
  double expected_w = 1;
  for (size_t k = 0; k < c.size(); ++k) {
    m.sgd.zero_grad();
    const double used = scaler.get_scale();
    scaler.scale(m.w * c[k]).sum().backward();
    if (std::isfinite(c[k])) REQUIRE(m.w.grad().item<float>() == static_cast<float>(c[k] * used));
    const bool stepped = scaler.step(m.sgd);
    scaler.update();
    const bool finite = std::isfinite(c[k]);
    INFO("step " << k);
    CHECK(stepped == finite);
    CHECK(scaler.last_step_skipped() == !finite);
    if (finite) expected_w -= c[k];
    CHECK(m.w.item<float>() == static_cast<float>(expected_w));
    CHECK(scaler.get_scale() == scale_after[k]);
    CHECK(scaler.growth_tracker() == tracker_after[k]);
  }
}

TEST_CASE("GradScaler: the scale never grows to inf", "[amp]") {
  amp::GradScalerOptions options;
  options.init_scale = std::ldexp(1.0, 127);  // x2 is inf in float32
  options.growth_interval = 1;
  amp::GradScaler scaler(options);
  OneWeight m;
  scaler.scale(m.w * std::ldexp(1.0f, -120)).sum().backward();
  CHECK(scaler.step(m.sgd));
  scaler.update();
  CHECK(scaler.get_scale() == std::ldexp(1.0, 127));
  CHECK(scaler.growth_tracker() == 0);
}

TEST_CASE("GradScaler: unscale_ once, before step, and state_dict with PyTorch's keys", "[amp]") {
  amp::GradScaler scaler;
  OneWeight m;
  CHECK_THROWS_WITH(scaler.unscale_(m.sgd), Contains("before scale()"));
  scaler.scale(m.w * 2.0f).sum().backward();
  CHECK(m.w.grad().item<float>() == 2.0f * 65536.0f);
  scaler.unscale_(m.sgd);
  CHECK(m.w.grad().item<float>() == 2.0f);  // unscaled once...
  CHECK_THROWS_WITH(scaler.unscale_(m.sgd), Contains("already been called"));
  CHECK(scaler.step(m.sgd));
  CHECK(m.w.item<float>() == -1.0f);  // ...and not again by step()
  CHECK_THROWS_WITH(scaler.step(m.sgd), Contains("already been called"));
  CHECK_THROWS_WITH(scaler.unscale_(m.sgd), Contains("after step()"));
  scaler.update();

  const auto state = scaler.state_dict();
  const std::map<std::string, double> expected{{"scale", 65536},
                                               {"growth_factor", 2},
                                               {"backoff_factor", 0.5},
                                               {"growth_interval", 2000},
                                               {"_growth_tracker", 1}};
  CHECK(state == expected);
  amp::GradScaler restored;
  auto changed = state;
  changed["scale"] = 1024;
  changed["_growth_tracker"] = 7;
  restored.load_state_dict(changed);
  CHECK(restored.get_scale() == 1024);
  CHECK(restored.growth_tracker() == 7);
  CHECK(restored.state_dict() == changed);
  // Into a scaler already in use: its live tensors change too.
  changed["scale"] = 256;
  changed["_growth_tracker"] = 3;
  scaler.load_state_dict(changed);
  CHECK(scaler.get_scale() == 256);
  CHECK(scaler.growth_tracker() == 3);
  m.sgd.zero_grad();
  scaler.scale(m.w * 1.0f).sum().backward();
  CHECK(m.w.grad().item<float>() == 256.0f);
  scaler.step(m.sgd);
  scaler.update();
  CHECK(scaler.growth_tracker() == 4);

  auto bad = state;
  bad.erase("backoff_factor");
  CHECK_THROWS_WITH(restored.load_state_dict(bad), Contains("no key 'backoff_factor'"));
  bad = state;
  bad["_growth_tracker"] = 2000;
  CHECK_THROWS_WITH(restored.load_state_dict(bad), Contains("_growth_tracker"));
  bad = state;
  bad["scale"] = -1;
  CHECK_THROWS_WITH(restored.load_state_dict(bad), Contains("scale -1"));
  CHECK_THROWS_WITH(restored.load_state_dict({}), Contains("disabled scaler"));
  // Values that would reach 0, a subnormal or inf in float32 (inv_scale inf:
  // NaN gradients no inf check sees).
  for (const double scale : {1e-60, 1e-40, 1e300}) {
    bad = state;
    bad["scale"] = scale;
    CHECK_THROWS_WITH(restored.load_state_dict(bad), Contains("normal positive float32"));
  }
  bad = state;
  bad["backoff_factor"] = 1e-300;
  CHECK_THROWS_WITH(restored.load_state_dict(bad), Contains("backoff_factor"));
  bad = state;
  bad["_growth_tracker"] = 2.5;
  CHECK_THROWS_WITH(restored.load_state_dict(bad), Contains("must be integers"));
  CHECK_THROWS_WITH(scaler.update(0.0), Contains("normal positive float32"));

  amp::GradScalerOptions off;
  off.enabled = false;
  amp::GradScaler disabled(off);
  OneWeight d;
  const auto loss = d.w * 3.0f;
  CHECK(disabled.scale(loss).item<float>() == 3.0f);
  CHECK(disabled.get_scale() == 1.0);
  CHECK(disabled.state_dict().empty());
}

TEST_CASE("GradScaler: the fallback equals ATen's kernels bit for bit", "[amp]") {
  const bool cpu_kernels_expected =
      kTorchVersionMajor > 2 || (kTorchVersionMajor == 2 && kTorchVersionMinor >= 3);
  // From 2.3 the CPU kernels exist: not finding them would make the scaler
  // use the fallback everywhere, unseen.
  CHECK(amp::detail::aten_has_amp_kernels(c10::DeviceType::CPU) == cpu_kernels_expected);
  if (!amp::detail::aten_has_amp_kernels(c10::DeviceType::CPU)) {
    WARN("LibTorch " << kTorchVersionMajor << "." << kTorchVersionMinor
                     << " has no CPU AMP kernels: the fallback alone runs (checked on 2.6)");
    return;
  }
  at::manual_seed(5);
  for (const float inv : {1.0f, 0.25f, 1.0f / 3.0f, 1.0f / 65536.0f}) {
    for (const bool poison : {false, true}) {
      std::vector<at::Tensor> a{at::randn({37}) * 1e3, at::randn({4, 5}),
                                at::randn({3}).to(at::kDouble)};
      if (poison) a[1][2][3] = kInf;
      std::vector<at::Tensor> b;
      for (const auto& t : a) b.push_back(t.clone());
      auto found_a = at::zeros({}), found_b = at::zeros({});
      const auto inv_scale = at::full({}, inv);
      amp::detail::non_finite_check_and_unscale(a, found_a, inv_scale, /*use_aten=*/true);
      amp::detail::non_finite_check_and_unscale(b, found_b, inv_scale, /*use_aten=*/false);
      INFO("inv_scale " << inv << " poisoned " << poison);
      CHECK(found_a.item<float>() == (poison ? 1.0f : 0.0f));
      CHECK(found_b.item<float>() == found_a.item<float>());
      for (size_t i = 0; i < a.size(); ++i) CHECK(at::equal(a[i].nan_to_num(), b[i].nan_to_num()));
    }
  }
  // Factors whose products round: the double product rounded once to float.
  for (const float found : {0.0f, 1.0f, 2.0f}) {
    for (const int tracker : {0, 3, 4}) {
      for (const float start : {3.0f, 1.1754944e-38f, 3.0e38f}) {
        auto s1 = at::full({}, start), s2 = at::full({}, start);
        auto t1 = at::full({}, tracker, at::kInt), t2 = at::full({}, tracker, at::kInt);
        const auto f = at::full({}, found);
        amp::detail::update_scale(s1, t1, f, 1.7, 0.3, 5, true);
        amp::detail::update_scale(s2, t2, f, 1.7, 0.3, 5, false);
        INFO("found " << found << " tracker " << tracker << " scale " << start);
        CHECK(s1.item<float>() == s2.item<float>());
        CHECK(t1.item<int>() == t2.item<int>());
      }
    }
  }
}

TEST_CASE("GradScaler: found_inf is agreed across ranks, so every rank skips the same step",
          "[amp][comm]") {
  // Rank 1's gradient holds an inf (a parameter outside DDP, a fault): with
  // the process group both ranks skip and back off; without it rank 0 steps
  // while rank 1 skips, and the ranks diverge.
  struct Result {
    float w = 0;
    double scale = 0;
    bool stepped = false;
  };
  for (const bool agreed : {true, false}) {
    const auto outcomes = run_ranks<Result>(2, [agreed](ProcessGroup& pg) {
      amp::GradScaler scaler({}, agreed ? &pg : nullptr);
      OneWeight m;
      const float c = pg.rank() == 1 ? kInf : 0.5f;
      scaler.scale(m.w * c).sum().backward();
      Result r;
      r.stepped = scaler.step(m.sgd);
      scaler.update();
      r.w = m.w.item<float>();
      r.scale = scaler.get_scale();
      return r;
    });
    for (const auto& o : outcomes) REQUIRE(error_text(o.error).empty());
    INFO("agreed " << agreed);
    if (agreed) {
      for (const auto& o : outcomes) {
        CHECK_FALSE(o.result.stepped);
        CHECK(o.result.w == 1.0f);
        CHECK(o.result.scale == 32768);
      }
    } else {
      CHECK(outcomes[0].result.stepped);
      CHECK(outcomes[0].result.w == 0.5f);
      CHECK(outcomes[0].result.scale == 65536);
      CHECK_FALSE(outcomes[1].result.stepped);
      CHECK(outcomes[1].result.w == 1.0f);
      CHECK(outcomes[1].result.scale == 32768);
    }
  }
}

TEST_CASE("autocast: the guard switches this thread's autocast and restores it", "[amp]") {
  const auto a = at::randn({4, 8}), b = at::randn({8, 3});
  CHECK_FALSE(autocast_is_enabled(at::kCPU));
  {
    amp::AutocastGuard outer(at::kCPU, at::kBFloat16);
    CHECK(at::matmul(a, b).scalar_type() == at::kBFloat16);
    CHECK(at::softmax(a, 1).scalar_type() == at::kFloat);  // float32 list
    {
      amp::AutocastGuard inner(at::kCPU, at::kBFloat16);
      CHECK(autocast_is_enabled(at::kCPU));
    }
    CHECK(autocast_is_enabled(at::kCPU));  // the inner one restored the outer's
  }
  CHECK_FALSE(autocast_is_enabled(at::kCPU));
  CHECK(at::matmul(a, b).scalar_type() == at::kFloat);

  // Gradients reach the float32 weights as float32 (master weights).
  torch::nn::Linear layer(8, 3);
  {
    amp::AutocastGuard autocast(at::kCPU, at::kBFloat16);
    layer->forward(a).sum().backward();
  }
  CHECK(layer->weight.grad().scalar_type() == at::kFloat);
  CHECK(layer->weight.scalar_type() == at::kFloat);

  TrainConfig train;
  train.precision = Precision::kFp16;
  const std::string why = autocast_unsupported(at::kCPU, at::kHalf);
  if (why.empty()) {
    MixedPrecision fp16(train, at::Device(at::kCPU), nullptr);
    CHECK(fp16.scaling());
  } else {
    CHECK_THROWS_WITH(MixedPrecision(train, at::Device(at::kCPU), nullptr),
                      Contains("train.precision: fp16 on cpu: float16 autocast on the CPU needs "
                               "LibTorch 2.4"));
  }
}

TEST_CASE("the GradScaler in the one step: a power-of-two scale trains bit-identically",
          "[amp][step]") {
  // Scaling by 2^k and unscaling are exact in float32 (no overflow here), so
  // two ranks with accumulation 2 and clipping, with the scaler's hooks,
  // must end on the unscaled run's weights bit for bit: a scale applied
  // twice, an unscale before the last micro-batch or after clipping would
  // change them.
  constexpr int64_t kSteps = 4, kAcc = 2, kRows = 3, kFeatures = 5, kClasses = 3;
  struct Result {
    std::vector<at::Tensor> weights;
    double scale = 0;
  };
  // Data and models made here: the rank threads share the global generator.
  at::manual_seed(3);
  const auto x = at::randn({kSteps, 2, kAcc, kRows, kFeatures});
  const auto y = at::randint(0, kClasses, {kSteps, 2, kAcc, kRows}, at::kLong);
  const auto train = [&](bool scaled) {
    std::vector<std::shared_ptr<Classifier>> models;
    for (int r = 0; r < 2; ++r) {
      at::manual_seed(11);
      ModelConfig mc;
      mc.hidden = 7;
      models.push_back(model_create(mc, {kFeatures}, kClasses));
    }
    return run_ranks<Result>(2, [&, scaled](ProcessGroup& pg) {
      auto model = models[pg.rank()];
      ClassifierDdp ddp(model, pg.shared_from_this(), DdpOptions{});
      torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.3).momentum(0.9));
      StepOptions options;
      options.accumulation_steps = kAcc;
      options.clip_grad_norm = 0.05;
      options.total_steps = kSteps;
      options.check.every = 1;
      TrainStep step(
          pg, ddp, *model, sgd,
          [](const at::Tensor& out, const at::Tensor& t) {
            return torch::nn::functional::cross_entropy(out, t);
          },
          true, options);
      amp::GradScalerOptions so;
      so.init_scale = 1024;
      so.growth_interval = 2;  // it grows during the run: 1024, 2048, 4096
      amp::GradScaler scaler(so, &pg);
      if (scaled) {
        step.hooks.scale_loss = [&](const at::Tensor& l) { return scaler.scale(l); };
        step.hooks.before_clip = [&](torch::optim::Optimizer& o) { scaler.unscale_(o); };
        step.hooks.optimizer_step = [&](torch::optim::Optimizer& o) {
          scaler.step(o);
          scaler.update();
        };
      }
      for (int64_t s = 0; s < kSteps; ++s) {
        int64_t m = 0;
        step.run(
            [&]() -> std::optional<Batch> {
              Batch b;
              b.x = x[s][pg.rank()][m];
              b.y = y[s][pg.rank()][m];
              ++m;
              return b;
            },
            s);
      }
      step.finish_checks();
      Result r;
      for (const auto& p : model->parameters()) r.weights.push_back(p.detach().clone());
      r.scale = scaler.get_scale();
      return r;
    });
  };
  const auto plain = train(false), scaled = train(true);
  for (int r = 0; r < 2; ++r) {
    REQUIRE(error_text(plain[r].error).empty());
    REQUIRE(error_text(scaled[r].error).empty());
    CHECK(scaled[r].result.scale == 4096);
    for (size_t i = 0; i < plain[r].result.weights.size(); ++i)
      CHECK(at::equal(plain[r].result.weights[i], scaled[r].result.weights[i]));
  }
}

TEST_CASE("checkpoint: the GradScaler's state in state.yaml reads back exactly",
          "[amp][checkpoint]") {
  TempDir dir;
  torch::nn::Linear model(3, 2);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  Checkpointer checkpointer(dir.path, 2);
  TrainerState state;
  state.step = 5;
  state.model = "mlp";
  state.scaler = {{"scale", std::ldexp(1.0, -17) * 3},
                  {"growth_factor", 1.7},
                  {"backoff_factor", 0.3},
                  {"growth_interval", 5},
                  {"_growth_tracker", 4}};
  const auto folder = checkpointer.save(state,
                                        {{"model.pt", state_dict_of(*model)},
                                         {"optimizer.pt", {}},
                                         {"rng.pt", {{"", at::zeros({1, 4}, at::kByte)}}}},
                                        "x: 1\n");
  const auto loaded = Checkpointer::load(folder, nullptr);
  CHECK(loaded.state.scaler == state.scaler);
  std::ifstream yaml(folder + "/state.yaml");
  const std::string text((std::istreambuf_iterator<char>(yaml)), std::istreambuf_iterator<char>());
  CHECK_THAT(text, Contains("growth_interval: 5\n"));  // an int, as PyTorch's
  CHECK_THAT(text, Contains("_growth_tracker: 4\n"));
}

// The scripted fp16 run that tests/python/amp_parity.py repeats with
// PyTorch's GradScaler("cpu"): hidden from the normal run, written to the
// file LOCKSTEP_AMP_TRACE names (tests/multiproc/amp_python.sh).
TEST_CASE("amp trace: a scripted fp16 run for PyTorch's GradScaler to repeat", "[.amp_trace]") {
  const char* path = std::getenv("LOCKSTEP_AMP_TRACE");
  REQUIRE(path != nullptr);
  std::ofstream out(path);
  if (!autocast_unsupported(at::kCPU, at::kHalf).empty()) {
    out << "unsupported\n";
    return;
  }
  torch::nn::Linear layer(6, 4);
  {
    at::NoGradGuard no_grad;
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 6; ++j) layer->weight[i][j] = ((i * 7 + j * 3) % 11 - 5) / 16.0;
      layer->bias[i] = (i % 3 - 1) / 8.0;
    }
  }
  torch::optim::SGD sgd(layer->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  amp::GradScalerOptions so;
  so.init_scale = 1 << 20;  // overflows fp16 at first: skips and back-offs
  so.growth_interval = 3;   // then grows, and overflows again
  amp::GradScaler scaler(so);
  for (int k = 0; k < 24; ++k) {
    auto x = at::empty({8, 6}), t = at::empty({8, 4});
    for (int r = 0; r < 8; ++r) {
      for (int c = 0; c < 6; ++c) x[r][c] = ((k * 5 + r * 3 + c * 7) % 13 - 6) / 8.0;
      for (int i = 0; i < 4; ++i) t[r][i] = ((k + r + 2 * i) % 5 - 2) / 4.0;
    }
    sgd.zero_grad();
    at::Tensor loss;
    {
      amp::AutocastGuard autocast(at::kCPU, at::kHalf);
      const auto y = layer->forward(x);
      loss = (y.to(at::kFloat) - t).pow(2).mean() * (k == 13 ? 4096.0 : 1.0);
    }
    scaler.scale(loss).backward();
    scaler.unscale_(sgd);
    const bool stepped = scaler.step(sgd);
    scaler.update();
    char line[96];
    std::snprintf(line, sizeof line, "step %d scale %.9g stepped %d\n", k, scaler.get_scale(),
                  stepped ? 1 : 0);
    out << line;
  }
  for (const auto& p : layer->parameters()) {
    const auto f = p.detach().contiguous();
    const auto* bits = reinterpret_cast<const uint32_t*>(f.data_ptr<float>());
    out << "param";
    for (int64_t i = 0; i < f.numel(); ++i) {
      char hex[12];
      std::snprintf(hex, sizeof hex, " %08x", bits[i]);
      out << hex;
    }
    out << "\n";
  }
}

TEST_CASE("causal attention under bf16 autocast on the CPU", "[amp][gpt]") {
  // 2.x: the fused kernel is given float32 (fast there, slow in bf16) and the
  // result cast back; autocast must not cast its inputs down again.
  at::manual_seed(2);
  const auto q = at::randn({2, 2, 16, 8}).to(at::kBFloat16);
  const auto k = at::randn({2, 2, 16, 8}).to(at::kBFloat16);
  const auto v = at::randn({2, 2, 16, 8}).to(at::kBFloat16);
  at::Tensor out;
  {
    amp::AutocastGuard autocast(at::kCPU, at::kBFloat16);
    out = causal_attention(q, k, v, 0.0, false);
  }
  CHECK(out.scalar_type() == at::kBFloat16);
  const auto reference =
      causal_attention(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat), 0.0, false);
  if (kTorchVersionMajor >= 2) {
    CHECK(at::equal(out, reference.to(at::kBFloat16)));  // computed in float32
  } else {
    CHECK(at::allclose(out.to(at::kFloat), reference, 0.02, 0.02));  // the bf16 product
  }
}

TEST_CASE("train.precision knows the CPU: the verdict of a probe", "[amp]") {
  // Note [Precision that knows the CPU]: an AVX2-only EPYC's figures (bf16
  // 4 GFLOP/s against 58), an AMX Xeon's (996 against 177), and one between.
  const PrecisionProbe slow{58.0, 4.0, 384}, fast{177.0, 996.0, 384}, close{100.0, 110.0, 384};
  auto v = precision_verdict(Precision::kBf16, slow, "");
  CHECK(v.chosen == Precision::kBf16);  // asked for: kept, but warned of
  CHECK(v.warn);
  CHECK_THAT(v.message, Contains("bf16 is slower than fp32 here: this CPU's bf16 products ran at "
                                 "4.0 GFLOP/s against 58.0 in fp32 (0.07x, 384^3; no avx512_bf16 "
                                 "or amx_bf16 flag); set train.precision: fp32 (or auto"));
  v = precision_verdict(Precision::kBf16, fast, "avx512_bf16 amx_bf16");
  CHECK_FALSE(v.warn);
  CHECK_THAT(v.message, Contains("(5.63x, 384^3; native: avx512_bf16 amx_bf16)"));
  v = precision_verdict(Precision::kAuto, slow, "");
  CHECK(v.chosen == Precision::kFp32);
  CHECK_FALSE(v.warn);
  CHECK_THAT(v.message, Contains("auto chose fp32: this CPU's bf16 products ran at 4.0"));
  CHECK(precision_verdict(Precision::kAuto, fast, "amx_bf16").chosen == Precision::kBf16);
  // 1.1x is not worth bf16's rounding: auto wants kAutoBf16Speedup (1.2x).
  CHECK(precision_verdict(Precision::kAuto, close, "").chosen == Precision::kFp32);
  CHECK(precision_verdict(Precision::kAuto, PrecisionProbe{100.0, 120.0, 384}, "").chosen ==
        Precision::kBf16);
  v = precision_verdict(Precision::kFp16, PrecisionProbe{100.0, 30.0, 384}, "");
  CHECK(v.warn);
  CHECK_THAT(v.message, Contains("fp16 is slower than fp32 here: this CPU's fp16 products ran at "
                                 "30.0 GFLOP/s against 100.0 in fp32 (0.30x, 384^3; no "
                                 "avx512_fp16 or amx_fp16 flag)"));
  CHECK(precision_verdict(Precision::kFp32, slow, "").message.empty());
  // This machine's flags: exactly the bf16 ones of /proc/cpuinfo's flags line.
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, expected;
  while (std::getline(cpuinfo, line) && line.rfind("flags", 0) != 0) {
  }
  const std::string words = " " + line.substr(line.find(':') + 1) + " ";
  for (const char* flag : {"avx512_bf16", "amx_bf16"})
    if (words.find(std::string(" ") + flag + " ") != std::string::npos)
      expected += (expected.empty() ? "" : " ") + std::string(flag);
  const std::string flags = cpu_low_precision_flags(Precision::kBf16);
  CHECK(flags == expected);
  CHECK(flags.find("fp16") == std::string::npos);
}
