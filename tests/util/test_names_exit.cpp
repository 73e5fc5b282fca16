// The name tables (every enum's names parse back to it, errors list them)
// and the one mapping from lockstep's exceptions to exit codes.
#include "support/catch.h"

#include <cxxopts.hpp>

#include <set>

#include "lockstep/check/check_kinds.h"
#include "lockstep/check/fault.h"
#include "lockstep/config/config.h"
#include "lockstep/ddp/ddp_options.h"
#include "lockstep/distributed/backend_kind.h"
#include "lockstep/train/check_run.h"
#include "lockstep/util/error.h"
#include "lockstep/util/exit_codes.h"
#include "lockstep/util/text.h"

using namespace lockstep;
using lockstep::testing::Contains;

namespace {

template <typename E, std::size_t N>
void round_trips(const NameTable<E, N>& table) {
  std::set<std::string> seen;
  for (const auto& entry : table) {
    INFO(entry.name);
    CHECK(seen.insert(entry.name).second);  // names are unique
    CHECK(parse_named(table, entry.name, "key") == entry.value);
    CHECK(std::string(name_of(table, entry.value)) == entry.name);
  }
}

}  // namespace

TEST_CASE("every name table parses its names back and lists them on a miss", "[names]") {
  round_trips(kBackendKindNames);
  round_trips(kDigestModeNames);
  round_trips(kCheckPolicyNames);
  round_trips(kCommHookKindNames);
  round_trips(kCheckFaultNames);
  round_trips(kFaultKindNames);
  round_trips(kDatasetKindNames);
  round_trips(kOptimizerKindNames);
  round_trips(kScheduleNames);
  round_trips(kOnCheckpointErrorNames);
  round_trips(kProgressNames);
  REQUIRE_THROWS_WITH(parse_named(kCommHookKindNames, "fp8", "ddp.comm_hook"),
                      Contains("ddp.comm_hook: 'fp8' is not one of allreduce, fp16, bf16"));
  REQUIRE_THROWS_AS(parse_named(kBackendKindNames, "Gloo", "--backend"), ConfigError);
}

TEST_CASE("numbers print as the shortest text that reads back the same", "[names]") {
  CHECK(number_text(0.1) == "0.1");
  CHECK(number_text(25) == "25");
  CHECK(number_text(300) == "300");
  CHECK(number_text(-2) == "-2");
  CHECK(number_text(1e15) == "1e+15");
  CHECK(number_text(1e-8) == "1e-08");
  CHECK(number_text(0.30000000000000004) == "0.30000000000000004");
  CHECK(std::stod(number_text(2.0 / 3.0)) == 2.0 / 3.0);
}

TEST_CASE("each exception tier maps to its exit code", "[exit]") {
  auto code = [](auto thrower) {
    return run_guarded("test", [&]() -> int {
      thrower();
      return 0;
    });
  };
  CHECK(code([] {}) == kExitOk);
  CHECK(code([] { throw ConfigError("x"); }) == kExitBadInput);
  CHECK(code([] { throw DataError("x"); }) == kExitBadInput);
  CHECK(code([] { throw EnvError("x"); }) == kExitBadInput);
  CHECK(code([] { throw UsageError("x"); }) == kExitBadInput);
  CHECK(code([] { throw ConsistencyError("x"); }) == kExitCheckFailed);
  CHECK(code([] { throw CorruptionError("x"); }) == kExitCorruption);
  CHECK(code([] { throw CommError("x"); }) == kExitCommFailed);
  CHECK(code([] { throw TimeoutError("x"); }) == kExitCommFailed);
  CHECK(code([] { throw InternalError("x"); }) == kExitInternal);
  CHECK(code([] { throw SystemError("x"); }) == kExitInternal);
  CHECK(code([] { throw std::runtime_error("x"); }) == kExitInternal);
  CHECK(code([] { throw Interrupted("x", 15); }) == 128 + 15);
  CHECK(code([] {
          cxxopts::Options options("t");
          options.add_options()("n", "", cxxopts::value<int>());
          const char* argv[] = {"t", "--n", "many"};
          options.parse(3, const_cast<char**>(argv));
        }) == kExitBadInput);
}
