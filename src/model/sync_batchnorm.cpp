#include "lockstep/model/sync_batchnorm.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/custom_class.h>
#include <torch/nn/modules/batchnorm.h>

#include <ostream>
#include <vector>

#include "lockstep/util/error.h"

namespace lockstep {

// Note [Synchronised batch normalisation]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// PyTorch's recipe (torch/nn/modules/_functions.py), on any device: ATen's
// batch_norm_stats, batch_norm_gather_stats_with_counts, batch_norm_elemt
// and batch_norm_backward_{reduce,elemt} have CUDA kernels only, in 1.13 as
// in 2.15, so the same figures come here from what every device has: the
// local statistics from var_mean, the normalisation and its backward from
// ATen's fused batch_norm and native_batch_norm_backward in their
// eval form (the global statistics given, held fixed), and only the
// cross-rank terms composed by hand; in float for half and bfloat16 inputs
// (double for double):
//   forward: each rank's per-channel mean and 1/sqrt(var + eps) (biased
//     variance) and its count n_r are all-gathered (one collective of
//     2C + 1 values; a rank with an empty batch sends n_r = 0); the global
//     mean is sum(n_r mean_r) / n and the variance
//     sum(n_r (var_r + (mean_r - mean)^2)) / n, var_r = 1/invstd_r^2 - eps;
//     the running statistics take the mean and the unbiased variance
//     (n / (n - 1)) with the momentum, identically on every rank;
//     y = (x - mean) * invstd * weight + bias.
//   backward: sum(dy) and sum(dy (x - mean)) per channel are all-reduced
//     (one collective of 2C values); the input's gradient is
//     (dy - sum(dy)/n - (x - mean) invstd^2 sum(dy (x - mean))/n) invstd w;
//     the weight's and bias's gradients are this rank's own sums (DDP
//     averages them with the other parameters' gradients).
// The combined statistics equal one process's BatchNorm over the
// concatenated batch up to float rounding (tests/ddp/
// test_sync_batchnorm.cpp); PyTorch's own SyncBatchNorm is the Python
// peer's reference (tests/python/sync_batchnorm_peer.py).
namespace {

struct SyncState : torch::CustomClassHolder {
  std::shared_ptr<StatsExchange> exchange;
  std::string path;
  at::Tensor running_mean, running_var;  // undefined: not tracked
  double eps = 1e-5;
  double momentum = 0.1;
  int64_t channels = 0;
  bool affine = true;
  at::Tensor total;  // the global count, a 0-d tensor of the statistics' dtype
};

at::ScalarType math_type(at::ScalarType t) {
  return t == at::kHalf || t == at::kBFloat16 ? at::kFloat : t;
}

// [C] -> [1, C, 1, ...] against `like`.
at::Tensor per_channel(const at::Tensor& v, const at::Tensor& like) {
  std::vector<int64_t> shape(static_cast<size_t>(like.dim()), 1);
  shape[1] = v.size(0);
  return v.view(shape);
}

std::vector<int64_t> reduced_dims(const at::Tensor& x) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  return dims;
}

struct Global {
  at::Tensor mean, var;  // biased
};

// The global mean and variance from every rank's, weighted by count; the
// running statistics updated.
Global combine(const at::Tensor& gathered, SyncState& s) {
  const int64_t c = s.channels;
  const at::Tensor means = gathered.narrow(1, 0, c);
  const at::Tensor invstds = gathered.narrow(1, c, c);
  const at::Tensor counts = gathered.narrow(1, 2 * c, 1);  // [W, 1]
  const at::Tensor present = counts > 0;
  s.total = counts.sum();
  if (s.total.device().is_cpu() && s.total.item<double>() < 2) {
    throw UsageError(s.path + ": expected more than 1 value per channel in training, over all " +
                     std::to_string(gathered.size(0)) + " ranks (got " +
                     std::to_string(s.total.item<double>()) + ")");
  }
  const at::Tensor vars =
      at::where(present, invstds.square().reciprocal() - s.eps, at::zeros_like(invstds));
  const at::Tensor mean = (counts * means).sum(0) / s.total;
  const at::Tensor var = (counts * (vars + (means - mean).square())).sum(0) / s.total;
  if (s.running_mean.defined()) {
    at::NoGradGuard no_grad;
    const at::Tensor unbiased = var * (s.total / (s.total - 1));
    s.running_mean.mul_(1 - s.momentum).add_(mean.to(s.running_mean.scalar_type()), s.momentum);
    s.running_var.mul_(1 - s.momentum).add_(unbiased.to(s.running_var.scalar_type()), s.momentum);
  }
  return {mean, var};
}

class SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& weight, const at::Tensor& bias,
                            c10::intrusive_ptr<SyncState> state) {
    const at::ScalarType type = math_type(input.scalar_type());
    const at::Tensor x = input.to(type);
    const int64_t c = state->channels;
    const int64_t count = input.numel() / c;
    at::Tensor local;
    if (count > 0) {
      const auto [var, mean] = at::var_mean(x, reduced_dims(x), /*unbiased=*/false);
      local = at::cat({mean, (var + state->eps).rsqrt(), at::full({1}, count, mean.options())});
    } else {
      local = at::zeros({2 * c + 1}, x.options());
    }
    const at::Tensor gathered =
        state->exchange->all_gather(local, state->path + "'s all-gather of batch statistics");
    const Global global = combine(gathered.to(type), *state);
    // Normalised with the global figures: ATen's fused kernel, given them
    // as the statistics to use.
    const at::Tensor w = state->affine ? weight.to(type) : at::Tensor();
    const at::Tensor b = state->affine ? bias.to(type) : at::Tensor();
    const at::Tensor y = at::batch_norm(x, w, b, global.mean, global.var, /*training=*/false, 0.0,
                                        state->eps, /*cudnn_enabled=*/false);
    ctx->save_for_backward({input, weight, global.mean, global.var});
    ctx->saved_data["state"] = at::IValue::make_capsule(state);
    return y.to(input.scalar_type());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto state =
        c10::static_intrusive_pointer_cast<SyncState>(ctx->saved_data["state"].toCapsule());
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &input = saved[0], &weight = saved[1], &mean = saved[2], &var = saved[3];
    const at::ScalarType type = mean.scalar_type();
    const int64_t c = state->channels;
    const at::Tensor x = input.to(type);
    const at::Tensor dy = grads[0].defined() ? grads[0].to(type) : at::zeros_like(x);
    const at::Tensor w = state->affine ? weight.to(type) : at::ones({c}, mean.options());
    const at::Tensor invstd = (var + state->eps).rsqrt();
    // One fused pass (ATen's backward with the statistics held fixed):
    // dy invstd w, sum(dy (x - mean)) invstd and sum(dy).
    at::Tensor local_grad = at::zeros_like(x), sum_dy = at::zeros({c}, mean.options()),
               sum_dy_xmu = at::zeros({c}, mean.options());
    if (x.numel() > 0) {
      const auto r = at::native_batch_norm_backward(dy, x, w, mean, var, {}, {}, /*train=*/false,
                                                    state->eps, {true, true, true});
      local_grad = std::get<0>(r);
      sum_dy = std::get<2>(r);
      sum_dy_xmu = std::get<1>(r) / invstd;
    }
    at::Tensor grad_input, grad_weight, grad_bias;
    if (state->affine) {
      grad_weight = (sum_dy_xmu * invstd).to(weight.scalar_type());
      grad_bias = sum_dy.to(weight.scalar_type());
    }
    if (ctx->needs_input_grad(0)) {
      at::Tensor sums = at::cat({sum_dy, sum_dy_xmu});
      state->exchange->all_reduce_sum(sums, state->path + "'s all-reduce of gradient sums");
      const at::Tensor mean_dy = sums.narrow(0, 0, c) / state->total;
      const at::Tensor mean_dy_xmu = sums.narrow(0, c, c) / state->total;
      // dy invstd w - invstd w mean_dy - (x - mean) invstd^3 w mean_dy_xmu,
      // the last two as x k + shift per channel.
      const at::Tensor k = -invstd.pow(3) * w * mean_dy_xmu;
      const at::Tensor shift = -invstd * w * mean_dy - mean * k;
      grad_input = local_grad.add_(at::addcmul(per_channel(shift, x), x, per_channel(k, x)));
      grad_input = grad_input.to(input.scalar_type());
    }
    return {grad_input, grad_weight, grad_bias, at::Tensor()};
  }
};

bool is_batchnorm(const torch::nn::Module& m) {
  return m.as<torch::nn::BatchNorm1dImpl>() != nullptr ||
         m.as<torch::nn::BatchNorm2dImpl>() != nullptr ||
         m.as<torch::nn::BatchNorm3dImpl>() != nullptr;
}

template <typename Impl>
std::shared_ptr<SyncBatchNormImpl> from(const Impl& bn) {
  const auto& o = bn.options;
  SyncBatchNormOptions options(o.num_features());
  options.eps = o.eps();
  options.momentum = o.momentum() ? std::optional<double>(*o.momentum()) : std::nullopt;
  options.affine = o.affine();
  options.track_running_stats = o.track_running_stats();
  auto sync = std::make_shared<SyncBatchNormImpl>(options);
  at::NoGradGuard no_grad;
  const auto copy = [](at::Tensor& to, const at::Tensor& from) {
    if (to.defined() && from.defined()) to.copy_(from);
  };
  copy(sync->weight, bn.weight);
  copy(sync->bias, bn.bias);
  copy(sync->running_mean, bn.running_mean);
  copy(sync->running_var, bn.running_var);
  copy(sync->num_batches_tracked, bn.num_batches_tracked);
  sync->train(bn.is_training());
  // The old layer's device, dtype and frozen parameters.
  const at::Tensor& like = bn.weight.defined() ? bn.weight : bn.running_mean;
  if (like.defined()) sync->to(like.device(), like.scalar_type());
  if (bn.weight.defined()) {
    sync->weight.set_requires_grad(bn.weight.requires_grad());
    sync->bias.set_requires_grad(bn.bias.requires_grad());
  }
  return sync;
}

std::shared_ptr<SyncBatchNormImpl> converted(const torch::nn::Module& m) {
  if (const auto* b = m.as<torch::nn::BatchNorm1dImpl>()) return from(*b);
  if (const auto* b = m.as<torch::nn::BatchNorm2dImpl>()) return from(*b);
  return from(*m.as<torch::nn::BatchNorm3dImpl>());
}

// Pass 1: the BatchNorms something besides the registry holds. The
// registry and `children` (a copy) hold one reference each.
void find_held(const torch::nn::Module& m, const std::string& prefix,
               std::vector<std::string>& held) {
  const auto children = m.named_children();
  for (const auto& item : children) {
    const std::string path = prefix.empty() ? item.key() : prefix + "." + item.key();
    if (is_batchnorm(*item.value())) {
      if (item.value().use_count() > 2) held.push_back(path);
    } else {
      find_held(*item.value(), path, held);
    }
  }
}

// Every rank's layers, in order: their paths and channels, hashed (FNV-1a).
uint64_t layout_hash(const torch::nn::Module& m, const std::string& prefix, uint64_t h) {
  const auto mix = [&h](const std::string& text) {
    for (unsigned char ch : text) h = (h ^ ch) * 1099511628211ULL;
  };
  if (const auto* sync = m.as<SyncBatchNormImpl>())
    mix(prefix + ":" + std::to_string(sync->options.num_features) + ";");
  for (const auto& item : m.named_children())
    h = layout_hash(*item.value(), prefix.empty() ? item.key() : prefix + "." + item.key(), h);
  return h;
}

// The ranks must hold the same SyncBatchNorm layers with the same channels:
// each forward all-gathers 2C + 1 values per layer, and rows of other
// lengths are not caught by every backend (shm would read a longer row's
// prefix, Gloo aborts). One all-gather of the layout's hash, once.
void agree_on_layers(const torch::nn::Module& module,
                     const std::shared_ptr<StatsExchange>& exchange) {
  if (!exchange || exchange->size() < 2) return;
  const uint64_t h = layout_hash(module, "", 1469598103934665603ULL);
  const at::Tensor mine =
      at::tensor({static_cast<double>(h >> 32), static_cast<double>(h & 0xffffffffULL),
                  static_cast<double>(count_sync_batchnorm(module))},
                 at::kDouble);
  const at::Tensor all = exchange->all_gather(mine, "convert_sync_batchnorm's check of the layers");
  for (int64_t r = 1; r < all.size(0); ++r) {
    if (!all[r].equal(all[0]))
      throw UsageError("convert_sync_batchnorm: rank " + std::to_string(r) + " holds other " +
                       "SyncBatchNorm layers than rank 0 (" +
                       std::to_string(static_cast<int64_t>(all[r][2].item<double>())) +
                       " against " +
                       std::to_string(static_cast<int64_t>(all[0][2].item<double>())) +
                       ", or other paths or channels): every rank must convert the same model");
  }
}

// Pass 2: replace and attach.
void convert_tree(torch::nn::Module& m, const std::string& prefix,
                  const std::shared_ptr<StatsExchange>& exchange) {
  const auto children = m.named_children();
  for (const auto& item : children) {
    const std::string path = prefix.empty() ? item.key() : prefix + "." + item.key();
    if (is_batchnorm(*item.value())) {
      auto sync = converted(*item.value());
      sync->set_exchange(exchange);
      sync->set_path(path);
      m.replace_module(item.key(), sync);
    } else if (auto* sync = item.value()->as<SyncBatchNormImpl>()) {
      sync->set_exchange(exchange);
      sync->set_path(path);
    } else {
      convert_tree(*item.value(), path, exchange);
    }
  }
}

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(SyncBatchNormOptions options_) : options(options_) {
  if (options.num_features <= 0)
    throw UsageError("SyncBatchNorm: num_features must be positive, got " +
                     std::to_string(options.num_features));
  reset();
}

void SyncBatchNormImpl::reset() {
  const int64_t c = options.num_features;
  if (options.affine) {
    weight = register_parameter("weight", at::ones({c}));
    bias = register_parameter("bias", at::zeros({c}));
  } else {
    weight = register_parameter("weight", at::Tensor(), /*requires_grad=*/false);
    bias = register_parameter("bias", at::Tensor(), /*requires_grad=*/false);
  }
  if (options.track_running_stats) {
    running_mean = register_buffer("running_mean", at::zeros({c}));
    running_var = register_buffer("running_var", at::ones({c}));
    num_batches_tracked = register_buffer("num_batches_tracked", at::tensor(0, at::kLong));
  } else {
    running_mean = register_buffer("running_mean", at::Tensor());
    running_var = register_buffer("running_var", at::Tensor());
    num_batches_tracked = register_buffer("num_batches_tracked", at::Tensor());
  }
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "lockstep::SyncBatchNorm(" << options.num_features << ", eps=" << options.eps
         << ", momentum=";
  if (options.momentum) {
    stream << *options.momentum;
  } else {
    stream << "None";
  }
  stream << ", affine=" << std::boolalpha << options.affine
         << ", track_running_stats=" << options.track_running_stats << ")";
}

at::Tensor SyncBatchNormImpl::forward(const at::Tensor& input) {
  if (input.dim() < 2)
    throw UsageError(path_ + ": expected an input [N, C, ...] of at least 2 dimensions, got " +
                     std::to_string(input.dim()));
  if (input.size(1) != options.num_features)
    throw UsageError(path_ + ": the input has " + std::to_string(input.size(1)) +
                     " channels, the layer " + std::to_string(options.num_features));
  // torch::nn::BatchNorm's rule for the factor, and the buffers' update.
  double factor = options.momentum.value_or(0.0);
  if (is_training() && options.track_running_stats) {
    num_batches_tracked.add_(1);
    if (!options.momentum) factor = 1.0 / num_batches_tracked.item<double>();
  }
  const bool batch_stats = is_training() || !options.track_running_stats;
  const bool sync = is_training() && exchange_ && exchange_->size() > 1;
  if (!sync) {
    if (batch_stats && input.numel() / input.size(1) == 1)
      throw UsageError(path_ + ": expected more than 1 value per channel in training, got input " +
                       "of shape " + c10::str(input.sizes()));
    return at::batch_norm(input, weight, bias, running_mean, running_var, batch_stats, factor,
                          options.eps, at::globalContext().userEnabledCuDNN());
  }
  auto state = c10::make_intrusive<SyncState>();
  state->exchange = exchange_;
  state->path = path_;
  state->running_mean = running_mean;
  state->running_var = running_var;
  state->eps = options.eps;
  state->momentum = factor;
  state->channels = options.num_features;
  // A Function takes no undefined tensor (LibTorch 2's VariableInfo): with
  // affine off, ones and zeros, whose gradients go nowhere.
  if (!weight.defined()) {
    state->affine = false;
    const at::Tensor one = at::ones({options.num_features}, input.options());
    return SyncBatchNormFunction::apply(input, one, at::zeros_like(one), state);
  }
  return SyncBatchNormFunction::apply(input, weight, bias, state);
}

std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(
    const std::shared_ptr<torch::nn::Module>& module,
    const std::shared_ptr<StatsExchange>& exchange) {
  if (!module) throw UsageError("convert_sync_batchnorm: no module");
  if (is_batchnorm(*module)) {
    auto sync = converted(*module);
    sync->set_exchange(exchange);
    agree_on_layers(*sync, exchange);
    return sync;
  }
  if (auto* sync = module->as<SyncBatchNormImpl>()) {
    sync->set_exchange(exchange);
    agree_on_layers(*module, exchange);
    return module;
  }
  std::vector<std::string> held;
  find_held(*module, "", held);
  if (!held.empty()) {
    std::string list;
    for (size_t i = 0; i < held.size() && i < 5; ++i) list += (i ? ", " : "") + held[i];
    if (held.size() > 5) list += " and " + std::to_string(held.size() - 5) + " more";
    throw UsageError(
        "convert_sync_batchnorm: " + std::to_string(held.size()) +
        " BatchNorm layer(s) are held outside the module registry (" + list +
        "): a typed member (torch::nn::BatchNorm2d), a Sequential or a ModuleList would go on "
        "calling the old layer; declare them as lockstep::SyncBatchNorm (the same options and "
        "state dict names); nothing was converted");
  }
  convert_tree(*module, "", exchange);
  agree_on_layers(*module, exchange);
  return module;
}

int64_t count_sync_batchnorm(const torch::nn::Module& module) {
  int64_t n = module.as<SyncBatchNormImpl>() != nullptr ? 1 : 0;
  for (const auto& child : module.children()) n += count_sync_batchnorm(*child);
  return n;
}

}  // namespace lockstep
