// What training reports: statistics per logging interval (all-reduced over
// ranks), metrics.jsonl (rank 0; whole records only), the progress line or
// bar, the one-time warning when communication dominates the step, and the
// validation record.
#pragma once

#include <chrono>

#include "lockstep/util/progress.h"

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/checkpoint/run_state.h"
#include "lockstep/config/config.h"
#include "lockstep/distributed/process_group.h"
#include "lockstep/io/tensorboard.h"
#include "lockstep/train/step.h"

namespace lockstep {

// One logging interval of one rank: the sum of its steps' StepStats. Loss and correct counts stay
// tensors on the model's device until the interval ends: no host sync per micro-batch.
struct Interval {
  at::Tensor loss_sum, correct;
  double samples = 0;
  double forward_ms = 0, backward_ms = 0, comm_ms = 0, clip_ms = 0, optimizer_ms = 0, check_ms = 0;
  // The phases' sum: the interval's step time as the phases account for it.
  double phases_ms() const {
    return forward_ms + backward_ms + comm_ms + clip_ms + optimizer_ms + check_ms;
  }
  double comm_bytes = 0;
  int64_t steps = 0;
  double lr = 0;          // the last step's
  at::Tensor grad_norm;   // the last step's, before clipping
  bool scaling = false;   // a GradScaler runs (fp16)
  double loss_scale = 0;  // the last step's
  int64_t skipped = 0;    // steps the scaler skipped (inf/NaN gradients)
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();

  void add(const StepStats& step);
};

// Where an evaluation was taken: an epoch's end, every train.eval_every
// steps, or a stop inside an epoch (train.max_steps: "partial").
enum class EvalAt { kEpochEnd, kEvery, kStop };

struct MetricField;  // metrics.cpp

class Metrics {
 public:
  // Rank 0 appends to <run_dir>/metrics.jsonl; the other ranks write nothing.
  Metrics(const LogConfig& log, ProcessGroup& pg, const std::string& run_dir);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Ends `in` (every rank: one all-reduce) and reports it; returns the global
  // mean loss. `in` is reset for the next interval.
  double end_interval(Interval& in, const TrainerState& state, int64_t total_steps);
  // A validation result (rank 0 reports; no collective).
  void validation(const TrainerState& state, double loss, double accuracy, int64_t examples,
                  EvalAt at);
  // log.tensorboard: the resolved configuration as text, at step 0.
  void config_text(const std::string& yaml);
  // A line of its own in metrics.jsonl (rank 0), e.g. an early stop.
  void note(const std::string& json_fields);
  // A language model: intervals also report tokens/s (total and per rank),
  // the perplexity exp(loss) and the achieved FLOP/s, flops_per_token x
  // tokens/s (6N + attention: Gpt::flops_per_token).
  void set_language(double tokens_per_sample, double flops_per_token) {
    tokens_per_sample_ = tokens_per_sample;
    flops_per_token_ = flops_per_token;
  }
  // After every optimizer step (rank 0 acts; no collective): the live
  // progress line (Note [Progress line], util/progress.h): a record to
  // lockstep-run's pipe, or rank 0's own line on its terminal. `samples`:
  // this rank's samples in the step.
  void step_done(const TrainerState& state, int64_t total_steps, double samples);

  // log.mfu: intervals also report "mfu", the achieved FLOP/s per rank over
  // this peak (matmul_peak_gflops, util/matmul_peak.h).
  void set_peak_gflops(double gflops) { peak_gflops_ = gflops; }

 private:
  // One metrics.jsonl record, written whole or not at all: a failed write (a
  // full disk) is cut back to the last complete record and reported once;
  // training goes on, and later records are written when writes work again.
  void record(const char* format, ...) __attribute__((format(printf, 2, 3)));
  // An interval's global sums (one all-reduce) and its length.
  struct IntervalSums {
    double loss = 0, correct = 0, samples = 0, seconds = 0;
  };
  // Its figures, each named once for metrics.jsonl, TensorBoard and the
  // progress line (Note [Metric fields], metrics.cpp).
  std::vector<MetricField> interval_fields(const Interval& in, const TrainerState& state,
                                           const IntervalSums& sums) const;
  void warn_comm_share(const Interval& in);
  bool bar() const;

  LogConfig log_;
  ProcessGroup& pg_;
  std::FILE* file_ = nullptr;
  std::unique_ptr<EventWriter> events_;  // log.tensorboard, rank 0
  bool failed_ = false;
  bool warned_comm_share_ = false;
  double tokens_per_sample_ = 0;  // 0: not a language model
  double flops_per_token_ = 0;
  double peak_gflops_ = 0;  // 0: no MFU
  // Note [Progress line]: lockstep-run's pipe (-1: none), or this rank's own
  // live line when bar() (a terminal of its own).
  int progress_fd_ = -1;
  ProgressView view_;
  double units_ = 0, last_loss_ = -1, last_drawn_s_ = -1;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
};

}  // namespace lockstep
