#include "lockstep/check/fault.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <limits>
#include <sstream>

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include "lockstep/util/error.h"

namespace lockstep {

std::optional<Fault> fault_from_env(const EnvLookup& env, int world_size) {
  const auto value = env("LOCKSTEP_FAULT");
  if (!value || value->empty()) return std::nullopt;
  const std::string usage =
      " (expected crash|hang|exit|flip|grad-flip|act-flip:rank=R:step=S[:attempt=A][:bit=B])";
  std::stringstream parts(*value);
  Fault fault;
  std::string kind;
  std::getline(parts, kind, ':');
  const auto parsed = value_named(kFaultKindNames, kind);
  if (!parsed) {
    throw EnvError("LOCKSTEP_FAULT='" + *value + "': unknown kind '" + kind + "'" + usage);
  }
  fault.kind = *parsed;
  bool has_rank = false, has_step = false;
  for (std::string item; std::getline(parts, item, ':');) {
    const auto eq = item.find('=');
    char* end = nullptr;
    errno = 0;
    const long long number =
        eq == std::string::npos ? 0 : std::strtoll(item.c_str() + eq + 1, &end, 10);
    if (eq == std::string::npos || end == nullptr || end == item.c_str() + eq + 1 || *end != '\0' ||
        number < 0 || errno == ERANGE) {
      throw EnvError("LOCKSTEP_FAULT='" + *value + "': '" + item + "' is not key=number" + usage);
    }
    const std::string key = item.substr(0, eq);
    if (key != "step" && number > std::numeric_limits<int>::max())
      throw EnvError("LOCKSTEP_FAULT='" + *value + "': '" + item + "' is out of range" + usage);
    if (key == "rank") {
      fault.rank = static_cast<int>(number), has_rank = true;
    } else if (key == "step") {
      fault.step = number, has_step = true;
    } else if (key == "attempt") {
      fault.attempt = static_cast<int>(number);
    } else if (key == "bit") {
      if (number > 63)
        throw EnvError("LOCKSTEP_FAULT='" + *value + "': bit=" + std::to_string(number) +
                       " is out of range [0, 63]" + usage);
      fault.bit = static_cast<int>(number);
    } else {
      throw EnvError("LOCKSTEP_FAULT='" + *value + "': unknown key '" + key + "'" + usage);
    }
  }
  if (!has_rank || !has_step)
    throw EnvError("LOCKSTEP_FAULT='" + *value + "': needs rank= and step=" + usage);
  if (world_size > 0 && fault.rank >= world_size)
    throw EnvError("LOCKSTEP_FAULT='" + *value + "': rank=" + std::to_string(fault.rank) +
                   " is outside this job's " + std::to_string(world_size) +
                   " rank(s), so it would never fire");
  return fault;
}

void fault_maybe_fire(const std::optional<Fault>& fault, const WorldInfo& world, int64_t step,
                      const std::function<std::string()>& flip) {
  if (!fault || fault->in_step() || fault->rank != world.rank || fault->step != step) return;
  if (fault->attempt >= 0 && fault->attempt != world.restart_count) return;
  if (fault->kind == FaultKind::kFlip) {
    if (!flip) throw InternalError("LOCKSTEP_FAULT=flip: nothing to flip here");
    const std::string name = flip();
    spdlog::warn("LOCKSTEP_FAULT: flipped a bit of '{}' on rank {} after step {}", name, world.rank,
                 step);
    return;
  }
  spdlog::warn("LOCKSTEP_FAULT: injecting '{}' on rank {} after step {}",
               name_of(kFaultKindNames, fault->kind), world.rank, step);
  spdlog::default_logger()->flush();
  switch (fault->kind) {
    case FaultKind::kCrash:
      kill(getpid(), SIGKILL);
      break;
    case FaultKind::kHang:
      kill(getpid(), SIGSTOP);
      break;
    case FaultKind::kExit:
      std::_Exit(7);
    case FaultKind::kFlip:
    case FaultKind::kGradFlip:
    case FaultKind::kActFlip:
      break;
  }
}

void flip_one_element(const at::Tensor& t, int bit) {
  at::NoGradGuard no_grad;
  const int64_t width = 8 * static_cast<int64_t>(t.element_size());
  if (bit < 0) bit = t.scalar_type() == at::kBFloat16 ? 6 : t.scalar_type() == at::kHalf ? 9 : 22;
  const int64_t b = bit % width;
  at::Tensor first = t.detach().view(width == 64   ? at::kLong
                                     : width == 32 ? at::kInt
                                     : width == 16 ? at::kShort
                                                   : at::kByte);
  if (first.is_contiguous() && first.numel() > 0) {
    // The element of largest magnitude: a change that matters.
    const int64_t at = t.detach().reshape({-1}).abs().argmax().item<int64_t>();
    first = first.view({-1}).narrow(0, at, 1);
  } else {
    while (first.dim() > 0) first = first.select(0, 0);
  }
  // The mask as the element's signed type spells it (bit width-1 is its sign).
  const uint64_t mask = uint64_t{1} << b;
  const int64_t value = width == 64   ? static_cast<int64_t>(mask)
                        : width == 32 ? static_cast<int32_t>(static_cast<uint32_t>(mask))
                        : width == 16 ? static_cast<int16_t>(static_cast<uint16_t>(mask))
                                      : static_cast<int8_t>(static_cast<uint8_t>(mask));
  first.bitwise_xor_(value);
}

}  // namespace lockstep
