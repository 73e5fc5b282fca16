#include "lockstep/optim/grad_scaler.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/optim/optimizer.h>

#include <cmath>
#include <limits>

#include "lockstep/distributed/process_group.h"
#include "lockstep/util/error.h"
#include "lockstep/util/text.h"

namespace lockstep::amp {
namespace detail {
namespace {

bool has_kernel(const char* op, c10::DeviceType device) {
  const auto handle = c10::Dispatcher::singleton().findSchema({op, ""});
  if (!handle) return false;
  const auto key = device == c10::DeviceType::CUDA ? c10::DispatchKey::CUDA : c10::DispatchKey::CPU;
  return handle->hasKernelForDispatchKey(key);
}

}  // namespace

bool aten_has_amp_kernels(c10::DeviceType device) {
  if (device != c10::DeviceType::CPU && device != c10::DeviceType::CUDA) return false;
  const bool cuda = device == c10::DeviceType::CUDA;
  static const bool cpu_has =
      has_kernel("aten::_amp_update_scale_", c10::DeviceType::CPU) &&
      has_kernel("aten::_amp_foreach_non_finite_check_and_unscale_", c10::DeviceType::CPU);
  static const bool cuda_has =
      has_kernel("aten::_amp_update_scale_", c10::DeviceType::CUDA) &&
      has_kernel("aten::_amp_foreach_non_finite_check_and_unscale_", c10::DeviceType::CUDA);
  return cuda ? cuda_has : cpu_has;
}

void non_finite_check_and_unscale(const std::vector<at::Tensor>& grads, at::Tensor& found_inf,
                                  const at::Tensor& inv_scale, bool use_aten) {
  if (grads.empty()) return;
  if (use_aten && aten_has_amp_kernels(found_inf.device().type())) {
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
    return;
  }
  // The kernels: found_inf is set to 1 (not added to) when any element is
  // inf or NaN; every gradient is multiplied by inv_scale in its dtype's
  // math type (float x float for float32), unless inv_scale is exactly 1.
  const bool multiply = inv_scale.item<float>() != 1.0f;
  for (const auto& g : grads) {
    if (!at::isfinite(g).all().item<bool>()) found_inf.fill_(1.0);
    if (multiply) g.mul_(inv_scale);
  }
}

void update_scale(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                  double growth_factor, double backoff_factor, int64_t growth_interval,
                  bool use_aten) {
  if (use_aten && aten_has_amp_kernels(scale.device().type())) {
    at::_amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                           growth_interval);
    return;
  }
  // The kernel, line for line: float scale times a double factor, rounded
  // back to float; growth only when the grown scale is finite.
  float s = scale.item<float>();
  int32_t tracker = growth_tracker.item<int32_t>();
  if (found_inf.item<float>() != 0.0f) {
    s = static_cast<float>(static_cast<double>(s) * backoff_factor);
    tracker = 0;
  } else {
    const int32_t successful = tracker + 1;
    if (successful == static_cast<int32_t>(growth_interval)) {
      const auto grown = static_cast<float>(static_cast<double>(s) * growth_factor);
      if (std::isfinite(grown)) s = grown;
      tracker = 0;
    } else {
      tracker = successful;
    }
  }
  scale.fill_(s);
  growth_tracker.fill_(tracker);
}

}  // namespace detail

namespace {

void check_options(const GradScalerOptions& o, const std::string& where) {
  if (!(o.growth_factor > 1.0 && o.growth_factor <= 65536.0)) {
    throw ConfigError(where + "growth_factor " + number_text(o.growth_factor) +
                      " must be in (1, 65536]");
  }
  if (!(o.backoff_factor >= 1.0 / 65536.0 && o.backoff_factor < 1.0)) {
    throw ConfigError(where + "backoff_factor " + number_text(o.backoff_factor) +
                      " must be in [1/65536, 1)");
  }
  if (o.growth_interval < 1 || o.growth_interval > std::numeric_limits<int32_t>::max()) {
    throw ConfigError(where + "growth_interval " + std::to_string(o.growth_interval) +
                      " must be in [1, 2^31)");
  }
  // In double first: a value outside float32's normal range would round to
  // 0, a subnormal (whose reciprocal is inf: inf x 0 = NaN gradients that
  // no inf check sees) or inf.
  if (!(o.init_scale >= std::numeric_limits<float>::min() &&
        o.init_scale <= std::numeric_limits<float>::max())) {
    throw ConfigError(where + "scale " + number_text(o.init_scale) +
                      " must be a normal positive float32 (1.2e-38 to 3.4e38)");
  }
}

std::vector<at::Tensor> gradients_of(torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> grads;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      const auto& g = p.grad();
      if (!g.defined()) continue;
      if (g.scalar_type() == at::kHalf) {
        // PyTorch: "Attempting to unscale FP16 gradients." Master weights
        // and their gradients stay float32 under autocast.
        throw ConfigError(
            "GradScaler: a parameter has float16 gradients; keep the model's weights in float32 "
            "(autocast casts them for the forward)");
      }
      grads.push_back(g.is_sparse() ? g._values() : g);
    }
  }
  return grads;
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options, ProcessGroup* pg) : options_(options), pg_(pg) {
  if (options_.enabled) check_options(options_, "GradScaler: ");
}

void GradScaler::lazy_init(const at::Device& device) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  scale_ = at::full({}, options_.init_scale, f32);
  growth_tracker_ = at::full({}, init_growth_tracker_, f32.dtype(at::kInt));
}

at::Tensor GradScaler::scale(const at::Tensor& outputs) {
  if (!options_.enabled) return outputs;
  if (!scale_.defined()) lazy_init(outputs.device());
  return outputs * scale_.to(outputs.device(), /*non_blocking=*/true);
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) return;
  if (!scale_.defined()) {
    throw InternalError(
        "GradScaler: unscale_ before scale(); scale the loss first "
        "(scaler.scale(loss).backward())");
  }
  const Stage stage = stages_.count(&optimizer) ? stages_[&optimizer] : Stage::kReady;
  if (stage == Stage::kUnscaled) {
    throw InternalError(
        "GradScaler: unscale_() has already been called on this optimizer since the last "
        "update()");
  }
  if (stage == Stage::kStepped)
    throw InternalError("GradScaler: unscale_() is being called after step()");
  // As PyTorch: the reciprocal in double, rounded to float once.
  const auto inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  auto found_inf = at::zeros({}, scale_.options());
  detail::non_finite_check_and_unscale(gradients_of(optimizer), found_inf, inv_scale);
  if (pg_ != nullptr && pg_->size() > 1) {  // Note [Agreed found_inf]
    auto agreed = found_inf.reshape({1}).to(pg_->device());
    pg_->allreduce(agreed, ReduceKind::kMax);
    found_inf.copy_(agreed.reshape({}));
  }
  found_inf_[&optimizer] = found_inf;
  stages_[&optimizer] = Stage::kUnscaled;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  if (!scale_.defined()) {
    throw InternalError("GradScaler: step before scale(); scale the loss first");
  }
  const Stage stage = stages_.count(&optimizer) ? stages_[&optimizer] : Stage::kReady;
  if (stage == Stage::kStepped) {
    throw InternalError("GradScaler: step() has already been called since the last update()");
  }
  if (stage == Stage::kReady) unscale_(optimizer);
  const bool finite = found_inf_.at(&optimizer).item<float>() == 0.0f;
  if (finite) optimizer.step();
  stages_[&optimizer] = Stage::kStepped;
  return finite;
}

void GradScaler::update(std::optional<double> new_scale) {
  if (!options_.enabled) return;
  if (!scale_.defined()) throw InternalError("GradScaler: update before scale()");
  if (new_scale) {
    GradScalerOptions check = options_;
    check.init_scale = *new_scale;
    check_options(check, "GradScaler::update: new ");
    scale_.fill_(*new_scale);
    last_skipped_ = false;
  } else {
    if (found_inf_.empty()) {
      throw InternalError("GradScaler: update() with no inf checks recorded (no unscale_/step)");
    }
    auto combined = at::zeros({}, scale_.options());
    for (const auto& [optimizer, found] : found_inf_) combined += found.to(scale_.device());
    last_skipped_ = combined.item<float>() != 0.0f;
    detail::update_scale(scale_, growth_tracker_, combined, options_.growth_factor,
                         options_.backoff_factor, options_.growth_interval);
  }
  stages_.clear();
  found_inf_.clear();
}

double GradScaler::get_scale() const {
  if (!options_.enabled) return 1.0;
  return scale_.defined() ? scale_.item<float>() : options_.init_scale;
}

int64_t GradScaler::growth_tracker() const {
  if (!options_.enabled) return 0;
  return growth_tracker_.defined() ? growth_tracker_.item<int32_t>() : init_growth_tracker_;
}

GradScalerState GradScaler::state() const {
  GradScalerState s;
  s.scale = get_scale();
  s.growth_factor = options_.growth_factor;
  s.backoff_factor = options_.backoff_factor;
  s.growth_interval = options_.growth_interval;
  s.growth_tracker = growth_tracker();
  return s;
}

std::map<std::string, double> GradScaler::state_dict() const {
  if (!options_.enabled) return {};
  const auto s = state();
  return {{"scale", s.scale},
          {"growth_factor", s.growth_factor},
          {"backoff_factor", s.backoff_factor},
          {"growth_interval", static_cast<double>(s.growth_interval)},
          {"_growth_tracker", static_cast<double>(s.growth_tracker)}};
}

void GradScaler::load_state_dict(const std::map<std::string, double>& state) {
  if (!options_.enabled) return;
  if (state.empty()) {
    throw DataError(
        "GradScaler: the state is empty, possibly because it was saved from a disabled scaler");
  }
  const auto get = [&](const char* key) {
    const auto it = state.find(key);
    if (it == state.end()) throw DataError(std::string("GradScaler state: no key '") + key + "'");
    return it->second;
  };
  GradScalerOptions loaded = options_;
  loaded.init_scale = get("scale");
  loaded.growth_factor = get("growth_factor");
  loaded.backoff_factor = get("backoff_factor");
  const double interval = get("growth_interval"), tracker = get("_growth_tracker");
  if (interval != std::floor(interval) || tracker != std::floor(tracker) || tracker < 0 ||
      !(interval >= 1 && interval < 2147483648.0) || tracker >= interval) {
    throw DataError("GradScaler state: growth_interval " + number_text(interval) +
                    " and _growth_tracker " + number_text(tracker) +
                    " must be integers with 0 <= _growth_tracker < growth_interval");
  }
  loaded.growth_interval = static_cast<int64_t>(interval);
  try {
    check_options(loaded, "GradScaler state: ");
  } catch (const ConfigError& e) {
    throw DataError(e.what());
  }
  options_ = loaded;
  init_growth_tracker_ = static_cast<int64_t>(tracker);
  if (scale_.defined()) {
    scale_.fill_(loaded.init_scale);
    growth_tracker_.fill_(init_growth_tracker_);
  }
}

}  // namespace lockstep::amp
