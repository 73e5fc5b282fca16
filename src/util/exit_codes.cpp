#include "lockstep/util/exit_codes.h"

#include <spdlog/spdlog.h>
#include <cxxopts.hpp>

#include <cstdio>

#include "lockstep/util/error.h"
#include "lockstep/util/kept_until_reported.h"

namespace lockstep {
namespace {
constexpr const char* kMemoryHint =
    " (this rank's memory ran out: shard the weights with optim.zero 3, recompute activations "
    "with model.activation_checkpointing, or lower data.batch_size; docs/zero.md)";

int guarded(const std::string& command, const std::function<int()>& body) {
  auto report = [&](const char* kind, const std::string& what) {
    if (spdlog::default_logger()->name() == "lockstep") {
      spdlog::error("lockstep {}: {}{}", command, kind, what);
    } else {
      std::fprintf(stderr, "lockstep %s: %s%s\n", command.c_str(), kind, what.c_str());
    }
  };
  try {
    return body();
  } catch (const cxxopts::exceptions::exception& e) {
    report("bad option: ", e.what());
    return kExitBadInput;
  } catch (const ConfigError& e) {
    report("", e.what());
    return kExitBadInput;
  } catch (const Interrupted& e) {
    report("", e.what());
    return 128 + e.signal;
  } catch (const StorageError& e) {
    report("cannot write: ", e.what());
    return kExitBadInput;
  } catch (const DataError& e) {
    report("bad data: ", e.what());
    return kExitBadInput;
  } catch (const ConsistencyError& e) {
    report("consistency check failed: ", e.what());
    return kExitCheckFailed;
  } catch (const CorruptionError& e) {
    report("silent data corruption: ", e.what());
    return kExitCorruption;
  } catch (const TrainingError& e) {
    report("", e.what());
    return kExitCheckFailed;
  } catch (const EnvError& e) {
    report("bad environment: ", e.what());
    return kExitBadInput;
  } catch (const UsageError& e) {
    report("usage error: ", e.what());
    return kExitBadInput;
  } catch (const CommError& e) {
    report("communication failed: ", e.what());
    return kExitCommFailed;
  } catch (const SystemError& e) {
    report("system error: ", e.what());
    return kExitInternal;
  } catch (const InternalError& e) {
    report("internal error: ", e.what());
    return kExitInternal;
  } catch (const OutOfMemoryError& e) {
    report("out of memory: ", std::string(e.what()) + kMemoryHint);
    return kExitOutOfMemory;
  } catch (const std::exception& e) {
    if (is_out_of_memory(e)) {
      const std::string text = what_of(e);
      report("out of memory: ", text.substr(0, text.find('\n')) + kMemoryHint);
      return kExitOutOfMemory;
    }
    report("internal error: ", what_of(e));
    return kExitInternal;
  }
}

}  // namespace

int run_guarded(const std::string& command, const std::function<int()>& body) {
  const int code = guarded(command, body);
  release_kept();  // after the error's line (Note [Report before teardown])
  return code;
}

}  // namespace lockstep
