// PowerSGD gradient compression (Vogels et al., NeurIPS 2019) as a comm
// hook, with the semantics and names of PyTorch's
// torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook:
//
//   for `start_iter` iterations: plain all-reduce (the buckets are rebuilt
//   after the first); then per bucket:
//   1. M += error (use_error_feedback); keep a copy of M;
//   2. each gradient viewed as a matrix [shape[0], rest] is compressed when
//      (n + m) * r * min_compression_rate < n * m, r = min(n, m, rank); the
//      others (biases, small matrices) are all-reduced as they are, batched;
//   3. Q: warm-started from the last iteration, or N(0, 1) from a generator
//      seeded as PyTorch seeds it (numpy's RandomState(random_seed)
//      .randint(1e9), then torch.manual_seed), orthogonalised;
//   4. P = M Q, all-reduced (in one exchange with the uncompressed ones),
//      orthogonalised; Q = M^T P, all-reduced, divided by the world size;
//   5. M = P Q^T; error = the copy - M.
//
// Exchange: step 4's first all-reduce starts during backward as the bucket
// fills (overlap kept); Q's all-reduces start when backward ends, after
// every bucket's first, so all ranks issue them in the same order.
// Deterministic: every rank draws the same Q, and the P and Q all-reduces
// give every rank the same bits, so the weights stay bit-identical.
//
// Differences from PyTorch, all deliberate: a column of zeros is left as
// zeros when orthogonalized with orthogonalization_epsilon 0 (PyTorch
// divides by a zero norm and gets NaN; its code means to recover zeros); an
// averaged Q that is not finite is dropped (drawn afresh next time) and a
// local error that is not finite is zeroed, so one overflowing step (fp16's
// GradScaler makes them on purpose) does not poison every later one; a
// channels_last gradient is compressed as its bucket slot, rows by its first
// dimension (PyTorch's view() would fail), a transposed one as a contiguous
// copy of its logical matrix.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "lockstep/ddp/comm_hooks.h"

namespace lockstep {

// PowerSgdOptions and powersgd_validate: ddp/ddp_options.h.

// Figures of the compression so far (PyTorch's compression_stats()).
struct PowerSgdStats {
  int64_t iter = 0;          // iterations seen (synchronised backwards)
  int64_t numel_before = 0;  // gradient elements offered to compression
  int64_t numel_after = 0;   // elements actually exchanged for them
};

class PowerSgdHook : public CommHook {
 public:
  explicit PowerSgdHook(PowerSgdOptions options);
  std::string name() const override { return "powersgd"; }
  HookWork run_bucket(ProcessGroup& pg, GradBucket& bucket) override;
  bool predivided() const override { return false; }
  // Refuses a second DistributedDataParallel (UsageError): the state is per bucket.
  void check_supported(ProcessGroup& pg) override;
  // iter, rank, rng (the MT19937 state), per bucket b: layout.b (its
  // parameters), error.b (this rank's), q.b.
  HookState state_dict() const override;
  void load_state_dict(const HookState& state, const std::string& source) override;
  bool state_per_rank(const std::string& key) const override { return key.rfind("error.", 0) == 0; }

  const PowerSgdOptions& options() const { return options_; }
  PowerSgdStats stats() const;

 private:
  HookWork run_plain(ProcessGroup& pg, GradBucket& bucket);
  HookWork run_compressed(ProcessGroup& pg, GradBucket& bucket);
  // run_compressed's phases, in order (powersgd.cpp).
  void match_layout(const GradBucket& bucket);
  at::Tensor add_error(size_t b, const at::Tensor& input);
  bool claim_q(size_t b, int64_t numel, const at::Tensor& like);
  void start_qs(std::vector<at::Tensor>& qs, bool randomize, at::ScalarType type);
  void keep_state(size_t b, const at::Tensor& input, const at::Tensor& input_cp, bool q_finite,
                  bool last);
  int64_t next_seed();            // numpy RandomState(random_seed).randint(1e9)
  void end_of_bucket(bool last);  // the last bucket of an iteration counts it

  PowerSgdOptions options_;
  mutable std::mutex mu_;
  int64_t iter_ = 0;
  bool attached_ = false;
  std::mt19937 engine_;                 // numpy's RandomState(random_seed): the same words
  std::map<size_t, at::Tensor> error_;  // per bucket
  std::map<size_t, at::Tensor> q_;      // per bucket: the Qs of its compressed gradients
  // Per bucket: its parameters when error_ and q_ were made. A bucket laid
  // out otherwise (a resumed DDP before its bucket rebuild) starts over.
  std::map<size_t, at::Tensor> layout_;
  std::map<size_t, bool> layout_loaded_;
  // Per bucket, reused across steps: the bucket after the error was added,
  // and the first exchange's buffer.
  std::map<size_t, at::Tensor> copy_, wire_;  // from a checkpoint: a mismatch is worth a warning
  PowerSgdStats stats_;
};

// numpy's RandomState(seed).randint(1_000_000_000) on `engine` seeded with
// seed (std::mt19937 and numpy's MT19937 seed and draw alike): 32-bit words
// masked to 30 bits, those above the bound rejected.
uint32_t numpy_randint_1e9(std::mt19937& engine);

// The orthogonalisation PyTorch's hook applies to a batch of matrices
// [b, n, r] in place: Gram-Schmidt for r <= 2 or 16-bit types, QR else.
void powersgd_orthogonalize(at::Tensor& matrices, double epsilon);

}  // namespace lockstep
