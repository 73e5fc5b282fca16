// lockstep::amp::GradScaler: PyTorch's torch.amp.GradScaler for LibTorch,
// with one addition for data parallelism (Note [Agreed found_inf]).
//
//   scaler.scale(loss).backward();   // every micro-batch
//   scaler.unscale_(optimizer);      // optional: before clipping
//   scaler.step(optimizer);          // skipped when a gradient is inf/NaN
//   scaler.update();                 // backoff, or growth after
//                                    // growth_interval clean steps
//
// Same names, defaults, order rules (unscale_ twice, or after step, throws)
// and state_dict keys as torch.amp.GradScaler. The arithmetic runs through
// ATen's _amp_foreach_non_finite_check_and_unscale_ and _amp_update_scale_
// where this LibTorch has kernels for the device (CUDA; CPU from 2.3), and
// through a fallback with exactly their semantics where it has not (1.13 on
// the CPU): amp::detail below, checked against the ATen ops in the suite.
//
// Note [Agreed found_inf]: after DDP's all-reduce every rank holds the same
// gradients, so a single-process scaler sees the same inf on every rank...
// unless a gradient is not synchronised (a parameter outside DDP, a rank's
// own fault, a sharded gradient). Then one rank skips its step and backs
// off its scale while another steps: the ranks diverge silently, and every
// later step widens the gap. With a process group, unscale_ takes the MAX
// of found_inf over the ranks (one 4-byte all-reduce per step), so every
// rank skips the same steps and keeps the same scale.
//
// Contract: one thread; with a process group, unscale_ (and step, which
// calls it) is a collective that every rank calls at the same step.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace torch::optim {
class Optimizer;
}

#include "lockstep/optim/optim_config.h"

namespace lockstep {
class ProcessGroup;
}

namespace lockstep::amp {

struct GradScalerOptions {
  double init_scale = kLossScaleDefault;  // 2^16, PyTorch's
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = kLossScaleGrowthIntervalDefault;
  bool enabled = true;
};

// torch.amp.GradScaler.state_dict(), key for key.
struct GradScalerState {
  double scale = GradScalerOptions{}.init_scale;
  double growth_factor = GradScalerOptions{}.growth_factor;
  double backoff_factor = GradScalerOptions{}.backoff_factor;
  int64_t growth_interval = GradScalerOptions{}.growth_interval;
  int64_t growth_tracker = 0;  // "_growth_tracker": clean steps since the last change
};

class GradScaler {
 public:
  // `pg`: found_inf is agreed across its ranks (Note [Agreed found_inf]);
  // nullptr: this process alone, as PyTorch's. Throws ConfigError for a
  // growth_factor outside (1, 65536], a backoff_factor outside [1/65536, 1),
  // a growth_interval < 1 or a scale that is no normal positive float32.
  // (PyTorch asserts only factor > 1 and < 1; the bounds keep a scale from
  // reaching 0 or inf by a tampered checkpoint.)
  explicit GradScaler(GradScalerOptions options = {}, ProcessGroup* pg = nullptr);

  // outputs x scale (a float32 scalar tensor created on outputs' device on
  // first use); outputs unchanged when disabled.
  at::Tensor scale(const at::Tensor& outputs);
  // Divides the optimizer's gradients by the scale and records whether any
  // is inf or NaN (agreed across ranks). Throws InternalError when called
  // twice since update() or after step().
  void unscale_(torch::optim::Optimizer& optimizer);
  // unscale_ unless done, then optimizer.step() unless a gradient was not
  // finite. Returns whether the optimizer stepped.
  bool step(torch::optim::Optimizer& optimizer);
  // The scale for the next iteration: x backoff_factor when a step found an
  // inf/NaN, x growth_factor after growth_interval clean steps in a row
  // (never to inf). `new_scale` sets it instead.
  void update(std::optional<double> new_scale = std::nullopt);

  double get_scale() const;  // 1.0 when disabled
  int64_t growth_tracker() const;
  bool is_enabled() const { return options_.enabled; }
  // Whether the last update() followed a skipped step.
  bool last_step_skipped() const { return last_skipped_; }

  // PyTorch's keys; empty when disabled. load_state_dict throws DataError
  // for a missing key or a value outside the constructor's limits.
  std::map<std::string, double> state_dict() const;
  void load_state_dict(const std::map<std::string, double>& state);
  GradScalerState state() const;

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  void lazy_init(const at::Device& device);

  GradScalerOptions options_;
  ProcessGroup* pg_;
  at::Tensor scale_;           // float32, shape []
  at::Tensor growth_tracker_;  // int32, shape []
  int64_t init_growth_tracker_ = 0;
  std::map<const torch::optim::Optimizer*, Stage> stages_;
  std::map<const torch::optim::Optimizer*, at::Tensor> found_inf_;  // float32, shape []
  bool last_skipped_ = false;
};

namespace detail {
// ATen's two AMP kernels, with the semantics of their CUDA and CPU kernels,
// in plain ATen calls. `use_aten` picks the real ops where the LibTorch has
// a kernel for the tensors' device (the default, as the scaler does).
void non_finite_check_and_unscale(const std::vector<at::Tensor>& grads, at::Tensor& found_inf,
                                  const at::Tensor& inv_scale, bool use_aten = true);
void update_scale(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                  double growth_factor, double backoff_factor, int64_t growth_interval,
                  bool use_aten = true);
// Whether ATen has the kernels for `device` in this LibTorch.
bool aten_has_amp_kernels(c10::DeviceType device);
}  // namespace detail

}  // namespace lockstep::amp
