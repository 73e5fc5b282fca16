// train.precision in the one step: autocast around the forward and the
// loss, and with fp16 the GradScaler around the backward and the update.
//
// Note [Mixed precision]: as PyTorch's AMP recipe. The weights, their
// gradients and the optimizer state stay float32 ("master weights"):
// autocast casts weights and activations to bf16/fp16 inside the ops on its
// lower-precision list (matmul, linear, conv, attention) and keeps the rest
// (softmax, losses, norms) in float32; backward runs outside autocast and
// returns float32 gradients to the float32 leaves, so DDP's hooks, buckets
// and comm hooks see what they see in fp32 training.
//   bf16: autocast only. bfloat16 has float32's exponent range: gradients
//     neither overflow nor underflow more than in fp32, no loss scaling.
//   fp16: autocast and the GradScaler (optim/grad_scaler.h): the loss is
//     multiplied by the scale before every micro-batch's backward (no_sync
//     ones included), the gradients are unscaled once, after the exchange and
//     before clipping, and a step whose gradients hold an inf/NaN on any rank
//     is skipped by every rank (Note [Agreed found_inf]). An fp16/bf16 comm
//     hook compresses the scaled gradients, as PyTorch's does: an overflow
//     there is an inf that the scaler catches.
// The scaler's state is saved in every checkpoint (state.yaml, `scaler:`)
// and restored on resume, so a resumed run continues with the same scale.
// A run whose scale falls below float32's smallest normal number (every
// step's gradients inf/NaN at every scale: the run diverged) stops with an
// error rather than step on NaN gradients.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "lockstep/config/config.h"
#include "lockstep/optim/grad_scaler.h"
#include "lockstep/train/step.h"

namespace lockstep {

class ProcessGroup;

namespace amp {

// Autocast on this thread while alive, as `with torch.autocast(device,
// dtype)`: restores what was there before; the cache of cast weights lives
// as long as the outermost region (cleared when it ends).
class AutocastGuard {
 public:
  AutocastGuard(at::DeviceType device, at::ScalarType dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  at::DeviceType device_;
  bool previous_enabled_;
  at::ScalarType previous_dtype_;
};

}  // namespace amp

// Note [Precision that knows the CPU] (precision_choice.cpp): the speeds of
// a start-up probe, and what they decide for train.precision.
struct PrecisionProbe {
  double fp32_gflops = 0;
  double low_gflops = 0;  // bf16's (fp16's when fp16 was asked for)
  int64_t n = 0;          // the n x n x n products timed
};
struct PrecisionVerdict {
  Precision chosen = Precision::kFp32;
  std::string message;  // "" when there is nothing to say
  bool warn = false;    // the asked-for precision is slower than fp32
};
// auto picks bf16 from this speed-up of its products over fp32's.
inline constexpr double kAutoBf16Speedup = 1.2;
// Pure: what `asked` becomes on a CPU that measured `probe`; `flags` names
// the CPU's native low-precision flags ("" none), for the message.
PrecisionVerdict precision_verdict(Precision asked, const PrecisionProbe& probe,
                                   const std::string& flags);
// The CPU's native bf16 (or fp16) flags from /proc/cpuinfo, e.g.
// "avx512_bf16 amx_bf16"; "" when none or unreadable.
std::string cpu_low_precision_flags(Precision precision);
// Collective: on the CPU, with train.precision bf16, fp16 or auto, rank 0
// times fp32 against the lower precision (~0.1 s) and every rank learns
// the verdict: `config.train.precision` becomes the precision to run (auto
// resolved), and rank 0 logs the message (a warning when slower). On CUDA
// auto becomes bf16. fp32 costs nothing.
void resolve_precision(Config& config, at::Device device, ProcessGroup& pg);

// The autocast dtype of a precision (fp32: none, kFloat).
at::ScalarType precision_dtype(Precision precision);

class MixedPrecision {
 public:
  // Throws ConfigError naming train.precision where this LibTorch cannot
  // autocast to the dtype on `device` (fp16 on the CPU before 2.4).
  // `pg`: the scaler's found_inf is agreed across its ranks.
  MixedPrecision(const TrainConfig& train, at::Device device, ProcessGroup* pg);

  // The scaler's figures added to a step's (fp16): its scale, whether the
  // step was skipped; throws TrainingError once the scale has underflowed.
  // (plug_step_hooks sets the step's hooks from this class's parts.)
  void report(StepStats& stats);
  // Runs `body` under this precision's autocast (evaluation).
  void run(const std::function<void()>& body) const;

  Precision precision() const { return precision_; }
  bool scaling() const { return scaler_ != nullptr; }
  amp::GradScaler* scaler() { return scaler_.get(); }

  // The scaler's state_dict (empty without a scaler), for checkpoints.
  std::map<std::string, double> state_dict() const;
  // Throws DataError when a scaler's state is malformed (`where` names the
  // file); an empty state (a checkpoint written without fp16) leaves the
  // scaler fresh, with a warning.
  void load_state_dict(const std::map<std::string, double>& state, const std::string& where);

 private:
  Precision precision_;
  at::DeviceType device_;
  std::unique_ptr<amp::GradScaler> scaler_;
  amp::GradScalerOptions configured_;  // the config's, for the resume's warning
  int64_t skipped_in_a_row_ = 0;
};

}  // namespace lockstep
