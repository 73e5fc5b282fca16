// Evaluation of the validation split, and the watched metrics it feeds:
// the best checkpoint (checkpoint.keep_best) and the early stop.
#include "trainer_impl.h"

#include <ATen/ATen.h>

#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdio>
#include "lockstep/util/error.h"

#include "lockstep/distributed/agree.h"
#include "lockstep/train/evaluate.h"

namespace lockstep {

bool Trainer::Impl::evaluate(TrainResult& result, EvalAt at, bool record) {
  const int64_t val_size = data.validation->size();
  if (val_size == 0) return false;     // the same on every rank: the split is deterministic
  if (data.validation->file_backed())  // Note [Token files]: every rank alike
    agree_on_failure(*pg, [&] { data.validation->check_unchanged(); });
  const int64_t rows = eval_rows(config, data.task);
  const EvalResult r = evaluate_split(*model, *data.validation, data.task, *precision, *pg, world,
                                      device, rows, config.train.eval_batches);
  result.val_loss = r.loss;
  result.val_accuracy = r.accuracy;
  result.val_examples = r.examples;
  if (!record) return true;
  metrics->validation(state, result.val_loss, result.val_accuracy, result.val_examples, at);
  for (auto& c : callbacks) c->on_evaluation_end(state, result);
  return true;
}

double Trainer::Impl::metric_value(WatchedMetric metric, const TrainResult& r) {
  switch (metric) {
    case WatchedMetric::kValAccuracy:
      return r.val_accuracy;
    case WatchedMetric::kValPerplexity:
      return std::exp(r.val_loss);
    case WatchedMetric::kValLoss:
    case WatchedMetric::kNone:
      break;
  }
  return r.val_loss;
}

bool Trainer::Impl::higher_is_better(WatchedMetric metric, MetricMode mode) {
  if (mode != MetricMode::kAuto) return mode == MetricMode::kMax;
  return metric == WatchedMetric::kValAccuracy;
}

bool Trainer::Impl::improve(MetricWatch& watch, double value, bool higher, double min_delta) {
  // A NaN (a diverged evaluation) is never better; any number beats none.
  const bool better = !std::isnan(value) &&
                      (watch.best_step < 0 || std::isnan(watch.best) ||
                       (higher ? value > watch.best + min_delta : value < watch.best - min_delta));
  if (better) {
    watch.best = value;
    watch.best_step = state.step;
    watch.bad = 0;
  } else {
    ++watch.bad;
  }
  return better;
}

bool Trainer::Impl::after_evaluation(TrainResult& result) {
  const auto& ck = config.checkpoint;
  if (ck.keep_best != WatchedMetric::kNone) {
    const double value = metric_value(ck.keep_best, result);
    if (improve(state.keep_best, value, higher_is_better(ck.keep_best, ck.mode), 0)) {
      char best[256];
      std::snprintf(best, sizeof best, "metric: %s\nmode: %s\nvalue: %.17g\nstep: %lld\n",
                    name_of(kWatchedMetricNames, ck.keep_best),
                    higher_is_better(ck.keep_best, ck.mode) ? "max" : "min", value,
                    static_cast<long long>(state.step));
      save_checkpoint(best);
      result.best_checkpoint = last_best;
    }
  }
  const auto& tr = config.train;
  if (tr.early_stop_metric == WatchedMetric::kNone) return false;
  const double value = metric_value(tr.early_stop_metric, result);
  improve(state.early_stop, value, higher_is_better(tr.early_stop_metric, MetricMode::kAuto),
          tr.early_stop_min_delta);
  if (state.early_stop.bad < tr.early_stop_patience) return false;
  char why[320];
  std::snprintf(why, sizeof why,
                "early stop at step %lld: %s has not improved by more than %g for %lld "
                "evaluations (best %.6g at step %lld)",
                static_cast<long long>(state.step),
                name_of(kWatchedMetricNames, tr.early_stop_metric), tr.early_stop_min_delta,
                static_cast<long long>(state.early_stop.bad), state.early_stop.best,
                static_cast<long long>(state.early_stop.best_step));
  result.stopped_early = why;
  if (world.rank == 0) spdlog::warn("{}", why);
  metrics->note("\"step\": " + std::to_string(state.step) + ", \"early_stop\": \"" +
                std::string(why) + "\"");
  return true;
}

}  // namespace lockstep
