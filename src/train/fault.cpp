#include "lockstep/train/fault.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <limits>
#include <sstream>

#include <spdlog/spdlog.h>

#include "lockstep/util/error.h"

namespace lockstep {

std::optional<Fault> fault_from_env(const EnvLookup& env, int world_size) {
  const auto value = env("LOCKSTEP_FAULT");
  if (!value || value->empty()) return std::nullopt;
  const std::string usage = " (expected crash|hang|exit|flip:rank=R:step=S[:attempt=A])";
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
  if (!fault || fault->rank != world.rank || fault->step != step) return;
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
      break;
  }
}

}  // namespace lockstep
