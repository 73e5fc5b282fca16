#include "lockstep/train/precision.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/optim/optimizer.h>

#include <spdlog/spdlog.h>

#include <limits>

#include "lockstep/util/error.h"
#include "lockstep/util/text.h"
#include "lockstep/util/torch_compat.h"

namespace lockstep {
namespace amp {

AutocastGuard::AutocastGuard(at::DeviceType device, at::ScalarType dtype)
    : device_(device),
      previous_enabled_(autocast_is_enabled(device)),
      previous_dtype_(autocast_dtype(device)) {
  // As torch.autocast.__enter__: the nesting count decides when the cast
  // cache is dropped.
  autocast_set(device, true, dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  autocast_set(device_, previous_enabled_, previous_dtype_);
}

}  // namespace amp

at::ScalarType precision_dtype(Precision precision) {
  switch (precision) {
    case Precision::kBf16:
      return at::kBFloat16;
    case Precision::kFp16:
      return at::kHalf;
    case Precision::kFp32:
      break;
    case Precision::kAuto:
      throw InternalError(
          "precision_dtype: train.precision auto was not resolved (resolve_precision)");
  }
  return at::kFloat;
}

MixedPrecision::MixedPrecision(const TrainConfig& train, at::Device device, ProcessGroup* pg)
    : precision_(train.precision), device_(device.type()) {
  if (precision_ == Precision::kFp32) return;
  if (precision_ == Precision::kAuto)
    throw InternalError(
        "MixedPrecision: train.precision auto was not resolved (resolve_precision)");
  const std::string why = autocast_unsupported(device_, precision_dtype(precision_));
  if (!why.empty()) {
    throw ConfigError(std::string("train.precision: ") + name_of(kPrecisionNames, precision_) +
                      " on " + device.str() + ": " + why);
  }
  if (precision_ == Precision::kFp16) {
    amp::GradScalerOptions options;
    options.init_scale = train.loss_scale;
    options.growth_interval = train.loss_scale_growth_interval;
    configured_ = options;
    scaler_ = std::make_unique<amp::GradScaler>(options, pg);
  }
}

void MixedPrecision::run(const std::function<void()>& body) const {
  if (precision_ == Precision::kFp32) {
    body();
    return;
  }
  amp::AutocastGuard autocast(device_, precision_dtype(precision_));
  body();
}

void MixedPrecision::report(StepStats& stats) {
  if (!scaler_) return;
  stats.scaling = true;
  stats.loss_scale = scaler_->get_scale();
  stats.skipped = scaler_->last_step_skipped();
  skipped_in_a_row_ = stats.skipped ? skipped_in_a_row_ + 1 : 0;
  // The same scale on every rank (Note [Agreed found_inf]): all stop here.
  if (stats.loss_scale < std::numeric_limits<float>::min()) {
    throw TrainingError("training diverged: the last " + std::to_string(skipped_in_a_row_) +
                        " steps had inf/NaN gradients at every loss scale, down to " +
                        number_text(stats.loss_scale) +
                        " (train.precision: fp16); lower optim.lr, clip gradients "
                        "(train.clip_grad_norm), or try bf16");
  }
}

std::map<std::string, double> MixedPrecision::state_dict() const {
  return scaler_ ? scaler_->state_dict() : std::map<std::string, double>{};
}

void MixedPrecision::load_state_dict(const std::map<std::string, double>& state,
                                     const std::string& where) {
  if (!scaler_) return;  // a scaler's state in an fp32/bf16 run is not needed
  if (state.empty()) {
    spdlog::warn(
        "{}: no GradScaler state (written without train.precision: fp16): the scaler starts "
        "fresh at train.loss_scale {}",
        where, configured_.init_scale);
    return;
  }
  try {
    scaler_->load_state_dict(state);
  } catch (const DataError& e) {
    throw DataError(where + ": " + e.what());
  }
  const auto loaded = scaler_->state();
  if (loaded.growth_interval != configured_.growth_interval) {
    spdlog::warn(
        "{}: the GradScaler's growth interval {} comes from the checkpoint (the config says "
        "train.loss_scale_growth_interval {}), as PyTorch's load_state_dict does",
        where, loaded.growth_interval, configured_.growth_interval);
  }
}

}  // namespace lockstep
