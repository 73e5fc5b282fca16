// metrics.jsonl records with values: an interval's global means over ranks,
// epochs numbered from 1 in training and validation records alike, and a
// validation at a stop inside an epoch marked partial.
#include <ATen/ATen.h>

#include <sstream>

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
    metrics.validation(state, 0.5, 0.75, 30, true);
    state.step = 45;
    metrics.validation(state, 0.25, 0.875, 30, false);
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
