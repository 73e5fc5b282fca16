// A loaded checkpoint's values read as hostile (Note [Checkpoint values]):
// its MANIFEST proves the files are the ones written, not that what was
// written is worth training on.
#include <ATen/ATen.h>

#include <cmath>
#include <set>
#include <string>

#include "lockstep/checkpoint/checkpoint.h"
#include "lockstep/util/error.h"
#include "lockstep/util/text.h"

// Note [Checkpoint values]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A NaN in optimizer.pt's exp_avg, or in one rank's PowerSGD error, trains
// on silently: the loss reads nan from the first step, every later
// checkpoint holds NaN weights, and checkpoint.keep pushes the good ones
// out. So before training starts every rank checks every floating tensor of
// optimizer.pt and comm_hook.pt, and model.pt's parameters (a buffer may
// hold -inf, a mask's, but never NaN, and a normalisation's running
// statistics are finite, running_var >= 0), whatever it owns (under ZeRO the
// verdict must be the same on every rank, and the trainer agrees on it,
// agree_on_failure) for:
//   - finiteness (no NaN, no inf);
//   - the ranges a value has by construction: a second moment (exp_avg_sq,
//     max_exp_avg_sq) is never negative, a step count is a non-negative
//     whole number; a first moment, a momentum buffer and a comm hook's
//     error and Q are gradients' size, so their square stays finite in
//     float32: |x| <= 1.8e19 (1e38 there is a planted value: training that
//     produced it would have overflowed first);
//   - rng.pt: uint8, one row per rank of the writer, each the size of this
//     LibTorch's CPU generator state.
// The GradScaler's state is range-checked where it is read
// (GradScaler::load_state_dict). The first bad entry is a DataError naming
// the file, the entry and the value.

namespace lockstep {
namespace {

constexpr double kSquareFinite = 1.8e19;  // sqrt(FLT_MAX) = 1.84e19

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The first element of `t` (flattened) where `bad` holds, as "index i (value v)".
std::string first_bad(const at::Tensor& t, const at::Tensor& bad) {
  const auto where = bad.reshape({-1}).nonzero();
  const int64_t i = where[0][0].item<int64_t>();
  return "element " + std::to_string(i) + " is " +
         number_text(t.reshape({-1})[i].to(at::kDouble).item<double>());
}

// A buffer of model.pt: a mask may hold -inf, but nothing holds NaN, and
// a normalisation's running statistics are finite (running_var >= 0).
void check_buffer(const std::string& file, const std::string& name, const at::Tensor& tensor) {
  if (!tensor.defined() || tensor.numel() == 0 || !at::isFloatingType(tensor.scalar_type())) return;
  const auto t = tensor.detach().to(at::kCPU);
  const auto fail = [&](const std::string& rule, const at::Tensor& bad) {
    throw DataError(file + ": buffer '" + name.substr(0, 200) + "' " + rule + ": " +
                    first_bad(t, bad) + " (a corrupt or hand-edited checkpoint)");
  };
  const auto nan = t.isnan();
  if (nan.any().item<bool>()) fail("holds NaN", nan);
  const bool running = ends_with(name, "running_mean") || ends_with(name, "running_var");
  if (!running) return;
  const auto inf = t.isinf();
  if (inf.any().item<bool>()) fail("is a running statistic and must be finite", inf);
  if (ends_with(name, "running_var")) {
    const auto negative = t < 0;
    if (negative.any().item<bool>()) fail("is a variance and cannot be negative", negative);
  }
}

void check_entry(const std::string& file, const std::string& name, const at::Tensor& tensor,
                 bool moments_bounded) {
  if (!tensor.defined() || tensor.numel() == 0) return;
  if (!at::isFloatingType(tensor.scalar_type())) return;
  const auto t = tensor.detach().to(at::kCPU);
  const auto fail = [&](const std::string& rule, const at::Tensor& bad) {
    throw DataError(file + ": entry '" + name.substr(0, 200) + "' " + rule + ": " +
                    first_bad(t, bad) +
                    " (a corrupt or hand-edited checkpoint; resume from an older one with "
                    "checkpoint.resume: <folder>)");
  };
  const auto nonfinite = t.isfinite().logical_not();
  if (nonfinite.any().item<bool>()) fail("is not finite", nonfinite);
  if (ends_with(name, "exp_avg_sq")) {  // exp_avg_sq and max_exp_avg_sq
    const auto negative = t < 0;
    if (negative.any().item<bool>()) fail("is a second moment and cannot be negative", negative);
  } else if (ends_with(name, ".step")) {
    const auto bad = (t < 0).logical_or(t != t.floor());
    if (bad.any().item<bool>()) fail("is a step count: a whole number >= 0", bad);
  } else if (moments_bounded) {
    const auto huge = t.abs().to(at::kDouble) > kSquareFinite;
    if (huge.any().item<bool>())
      fail("is out of range (|x| <= 1.8e19, the largest whose square float32 holds)", huge);
  }
}

}  // namespace

void Checkpointer::check_model_values(const StateDict& model,
                                      const std::set<std::string>& parameters,
                                      const std::string& file) {
  for (const auto& [name, t] : model) {
    if (parameters.count(name)) {
      check_entry(file, name, t, false);
    } else {
      check_buffer(file, name, t);
    }
  }
}

void Checkpointer::check_values(const Loaded& loaded, const std::set<std::string>& parameters,
                                int64_t generator_bytes) {
  const std::string& folder = loaded.folder;
  check_model_values(loaded.part("model.pt"), parameters, folder + "/model.pt");
  for (const auto& [name, t] : loaded.part("optimizer.pt"))
    check_entry(folder + "/optimizer.pt", name, t, true);
  for (const auto& [name, t] : loaded.part("comm_hook.pt"))
    check_entry(folder + "/comm_hook.pt", name, t, true);
  const at::Tensor rng = loaded.rng_states();
  const std::string where = folder + "/rng.pt";
  if (!rng.defined() || rng.scalar_type() != at::kByte || rng.dim() != 2) {
    throw DataError(where + ": not a [ranks, state bytes] uint8 tensor (" +
                    (rng.defined() ? std::string(rng.toString()) + " of " +
                                         std::to_string(rng.dim()) + " dimensions"
                                   : std::string("nothing")) +
                    ")");
  }
  if (rng.size(0) != loaded.state.world_size || rng.size(1) != generator_bytes) {
    throw DataError(where + ": holds " + std::to_string(rng.size(0)) + " generator state(s) of " +
                    std::to_string(rng.size(1)) + " bytes; the " +
                    std::to_string(loaded.state.world_size) +
                    " rank(s) that wrote it (state.yaml world_size) need one each, of " +
                    std::to_string(generator_bytes) + " bytes (this LibTorch's CPU generator)");
  }
}

}  // namespace lockstep
