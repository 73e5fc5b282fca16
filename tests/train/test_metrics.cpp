// metrics.jsonl records with values: an interval's global means over ranks,
// epochs numbered from 1 in training and validation records alike, and a
// validation at a stop inside an epoch marked partial.
#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <sstream>

#include "lockstep/io/tensorboard.h"
#include "lockstep/train/step.h"
#include "support/catch.h"
#include "support/temp_dir.h"
#include "support/thread_world.h"
#include "train/metrics.h"

using namespace lockstep;
using namespace lockstep::testing;

TEST_CASE("metrics records: global means, epochs from 1, partial validation", "[metrics]") {
  TempDir dir;
  LogConfig log;
  log.progress = Progress::kPlain;
  auto outcomes = run_ranks<double>(2, [&](ProcessGroup& pg) {
    Metrics metrics(log, pg, dir.path);
    // Rank r: loss sum 3 + r over 2 + r rows, 1 + r hits; two steps.
    Interval in;
    StepStats step;
    step.loss_sum = at::tensor(3.0 + pg.rank(), at::kDouble);
    step.correct = at::tensor(1.0 + pg.rank(), at::kDouble);
    step.samples = 2 + pg.rank();
    step.lr = 0.25;
    in.add(step);
    step.lr = 0.125;  // the interval reports its last step's
    in.add(step);
    TrainerState state;
    state.step = 40;
    state.epoch = 1;  // the second epoch
    const double loss = metrics.end_interval(in, state, 100);
    CHECK(in.steps == 0);  // reset for the next interval
    metrics.validation(state, 0.5, 0.75, 30, EvalAt::kEpochEnd);
    state.step = 45;
    metrics.validation(state, 0.25, 0.875, 30, EvalAt::kStop);
    return loss;
  });
  for (const auto& o : outcomes) {
    REQUIRE(error_text(o.error) == "");
    CHECK(o.result == Approx((2 * 3.0 + 2 * 4.0) / (2 * 2.0 + 2 * 3.0)));  // 1.4
  }
  std::istringstream lines(TempDir::read_file(dir.path + "/metrics.jsonl"));
  std::string train, whole, partial, extra;
  std::getline(lines, train);
  std::getline(lines, whole);
  std::getline(lines, partial);
  CHECK_FALSE(std::getline(lines, extra));  // rank 0 alone writes
  CHECK_THAT(train, Contains("{\"step\": 40, \"epoch\": 2, \"loss\": 1.4, \"accuracy\": 0.600000, "
                             "\"lr\": 0.125,"));
  CHECK(whole == "{\"step\": 40, \"epoch\": 2, \"val_loss\": 0.5, \"val_accuracy\": 0.750000}");
  CHECK(partial ==
        "{\"step\": 45, \"epoch\": 2, \"val_loss\": 0.25, \"val_accuracy\": 0.875000, "
        "\"partial\": true}");
}

TEST_CASE("metrics: a language model reports perplexity, tokens/s per rank and in all, FLOP/s",
          "[metrics]") {
  TempDir dir;
  LogConfig log;
  log.progress = Progress::kPlain;
  auto outcomes = run_ranks<int>(2, [&](ProcessGroup& pg) {
    Metrics metrics(log, pg, dir.path);
    metrics.set_language(/*tokens per sample=*/128, /*flops per token=*/1e6);
    metrics.set_peak_gflops(0.5);  // log.mfu: 5e8 FLOP/s per rank is all of it
    Interval in;
    in.start = std::chrono::steady_clock::now() - std::chrono::seconds(2);  // a 2 s interval
    StepStats step;
    step.loss_sum = at::tensor(8.0, at::kDouble);  // loss 2 over 4 rows
    step.samples = 4;
    step.lr = 0.001;
    in.add(step);
    TrainerState state;
    state.step = 10;
    metrics.end_interval(in, state, 100);
    metrics.validation(state, std::log(5.0), 0.5, 12, EvalAt::kEpochEnd);
    return 0;
  });
  for (const auto& o : outcomes) REQUIRE(error_text(o.error) == "");
  std::istringstream lines(TempDir::read_file(dir.path + "/metrics.jsonl"));
  std::string train, val;
  std::getline(lines, train);
  std::getline(lines, val);
  INFO(train);
  // 8 rows x 128 tokens over ~2 s: ~512 tokens/s, 256 per rank, 5.1e8 FLOP/s.
  const auto number = [&](const std::string& key) {
    const auto at = train.find("\"" + key + "\": ");
    REQUIRE(at != std::string::npos);
    return std::stod(train.substr(at + key.size() + 4));
  };
  CHECK(number("loss") == 2);
  CHECK(number("perplexity") == Approx(std::exp(2.0)).epsilon(1e-5));
  CHECK(number("tokens_per_s") == Approx(512).epsilon(0.05));
  CHECK(number("tokens_per_s_per_rank") == Approx(number("tokens_per_s") / 2).epsilon(1e-3));
  CHECK(number("flops_per_s") == Approx(number("tokens_per_s") * 1e6).epsilon(1e-3));
  // Per rank, over the peak: (flops_per_s / 2 ranks) / 0.5 GFLOP/s.
  CHECK(number("mfu") == Approx(number("flops_per_s") / 2 / 0.5e9).epsilon(1e-3));
  CHECK(train.find("accuracy") == std::string::npos);
  CHECK_THAT(val, Contains("\"val_perplexity\": 5,"));
}

TEST_CASE("TensorBoard records: CRC-32C and its mask on known values", "[metrics]") {
  // RFC 3720's check value of CRC-32C, and TensorFlow's masking of it
  // (crc32c::Mask in tensorflow/core/lib/hash/crc32c.h).
  const std::string digits = "123456789";
  CHECK(crc32c(digits.data(), digits.size()) == 0xe3069283u);
  const uint32_t c = 0xe3069283u;
  CHECK(crc32c_masked(digits.data(), digits.size()) == ((c >> 15) | (c << 17)) + 0xa282ead8u);
  CHECK(crc32c("", 0) == 0u);
  const std::string zeros(32, '\0');
  CHECK(crc32c(zeros.data(), zeros.size()) == 0x8a9136aau);  // RFC 3720 B.4: 32 bytes of 0
}
