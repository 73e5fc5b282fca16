// Silent data corruption that identical weights cannot show (Note [Silent
// corruption], corruption.cpp): a rank whose backward produced a wrong
// gradient hands it to the exchange, which averages it into every rank
// alike; the weight check then passes on a wrong run. Two checks look at
// each rank's local gradient before the exchange:
//   the screen (check.grad_screen), every step: each parameter's local
//     gradient norm, exchanged (one small all-gather); a rank with a
//     non-finite one where the others have none, or a total 10x the other
//     ranks' median and its own recent maximum (after 10 steps), is named;
//   the replay (check.replay_every: N), every N steps: rank r also computes
//     rank r+1's local gradient from the same weights, batch and generator
//     state, and the two are compared bit for bit (XXH3 per parameter); a
//     mismatch is settled by every rank computing that batch once more.
//
//   CorruptionChecks checks(pg, trainable_parameters(model), buffers, gen, options);
//   ddp.set_local_grad_observer(checks.observer());
//   for each step:
//     checks.begin_step(step, /*scaling=*/false);
//     ... forward, backward through DDP ...
//     auto finding = checks.verdict(batches, rng_at_start, loss, recompute);
//     if (finding.rank >= 0) ... stop, or zero the gradients and retake the step
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/check/check_kinds.h"
#include "lockstep/ddp/local_grads.h"
#include "lockstep/distributed/process_group.h"
#include "lockstep/util/module_tensors.h"

namespace lockstep {

struct CorruptionOptions {
  bool screen = false;
  int64_t replay_every = 0;  // 0: no replay
  // The screen's outlier factor: a rank's total local-gradient norm above
  // this times the other ranks' median, and above this times its own
  // largest of the last `history` screened steps (Megatron-Core's 10x).
  double threshold = 10;
  int64_t history = 100;
};

// What a check found (rank -1: nothing). The same on every rank.
struct CorruptionFinding {
  int rank = -1;
  // The replay, when two ranks each reproduce their own result and a third
  // cannot settle it (2 ranks): the other one, which may be the faulty one.
  int other = -1;
  int64_t step = 0;
  std::string check;      // "grad_screen" or "replay"
  std::string parameter;  // the first parameter whose local gradient differs
  std::string detail;     // the figures
  std::string where;      // the rank's host and device
  std::string message() const;
};

// Pure, for the screen: `norms[r][i]` is rank r's local-gradient 2-norm of
// parameter i (negative: none this step); `recent[r]` its largest total of
// the recent steps (0: none yet). `nonfinite_expected`: a GradScaler runs,
// whose overflow is not corruption. Names the rank, the parameter and why.
CorruptionFinding screen_verdict(const std::vector<std::vector<double>>& norms,
                                 const std::vector<double>& recent, bool nonfinite_expected,
                                 double threshold, const std::vector<std::string>& names);

// Pure, for the replay: `own[o]` rank o's per-parameter digests of its own
// local gradients, `replayed[r]` rank r's of rank (r+1)'s batch; `again[r]`
// (after a mismatch, empty before) every rank's recomputation of the
// mismatched owner's batch. Returns the owner and replayer of the first
// mismatch (rank -1: none) and, given `again`, who is wrong.
CorruptionFinding replay_verdict(const std::vector<std::vector<std::string>>& own,
                                 const std::vector<std::vector<std::string>>& replayed,
                                 const std::vector<std::vector<std::string>>& again,
                                 const std::vector<std::string>& names);

class CorruptionChecks {
 public:
  using MicroBatches = std::vector<std::pair<at::Tensor, at::Tensor>>;
  // Runs the micro-batches' forward and backward exactly as the step did,
  // under no_sync, leaving each parameter's .grad the local gradient.
  using Recompute = std::function<void(const MicroBatches&)>;

  // `params`: the DDP wrapper's, in its order; `buffers`: the module's
  // (kept as they are across a replay); `generator`: the model's device's
  // default generator (dropout). Collectives run on `pg`.
  CorruptionChecks(ProcessGroup& pg, NamedTensors params, std::vector<at::Tensor> buffers,
                   at::Generator generator, CorruptionOptions options);
  ~CorruptionChecks();
  CorruptionChecks(const CorruptionChecks&) = delete;
  CorruptionChecks& operator=(const CorruptionChecks&) = delete;

  // Attach to DistributedDataParallel (and fully sharded parameters).
  std::shared_ptr<LocalGradObserver> observer() const;
  // Fault injection: sees each local gradient first (LOCKSTEP_FAULT=grad-flip).
  void set_injector(std::function<void(size_t, const at::Tensor&)> inject);

  // Before a step's first micro-batch; `step` is its 1-based number.
  // `scaling`: a GradScaler runs (its non-finite gradients are its own).
  void begin_step(int64_t step, bool scaling);
  bool replay_due() const;
  // After the step's exchange, before any weight changes. Collective.
  // `batches`: this rank's micro-batches of the step; `rng_state`: the
  // generator's state before the step's first forward.
  // `loss`: this rank's loss of the step (a non-finite one is divergence,
  // Note [Diverged training], not the screen's to name; undefined: finite).
  CorruptionFinding verdict(const MicroBatches& batches, const at::Tensor& rng_state,
                            const at::Tensor& loss, const Recompute& recompute);

 private:
  struct Recorder;
  CorruptionFinding screen(const at::Tensor& loss, std::vector<double>& totals);
  CorruptionFinding replay(const MicroBatches& batches, const at::Tensor& rng_state,
                           const Recompute& recompute);
  std::vector<std::string> recompute_digests(const MicroBatches& batches,
                                             const at::Tensor& rng_state,
                                             const Recompute& recompute);
  void locate(CorruptionFinding& finding);

  ProcessGroup& pg_;
  NamedTensors params_;
  std::vector<std::string> names_;
  std::vector<at::Tensor> buffers_;
  at::Generator generator_;
  CorruptionOptions options_;
  std::shared_ptr<Recorder> recorder_;
  int64_t step_ = 0;
  bool scaling_ = false;
  std::vector<std::vector<double>> history_;  // each rank's recent totals
};

}  // namespace lockstep
