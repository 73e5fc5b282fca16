// Collectives on 1-4 ranks (threads over a HashStore): AVG emulation, bad
// roots, collective timeouts, the desync debugging mode.
#include <ATen/ATen.h>
#include "support/catch.h"

#include <chrono>
#include <thread>

#include "lockstep/distributed/agree.h"
#include "lockstep/distributed/process_group.h"
#include "lockstep/util/error.h"
#include "support/thread_world.h"

using namespace lockstep;
using lockstep::testing::error_text;
using lockstep::testing::run_ranks;

TEST_CASE("AVG is emulated on Gloo, truncating integers", "[collectives]") {
  auto outcomes = run_ranks<std::vector<double>>(2, [](ProcessGroup& pg) {
    auto f = at::full({3}, pg.rank() == 0 ? 1.0 : 2.0, at::kDouble);
    pg.allreduce(f, ReduceKind::kAvg);
    auto i = at::full({3}, pg.rank() == 0 ? 1 : 2, at::kLong);
    pg.allreduce(i, ReduceKind::kAvg);
    return std::vector<double>{f[0].item<double>(), static_cast<double>(i[0].item<int64_t>())};
  });
  for (const auto& o : outcomes) {
    REQUIRE_FALSE(o.error);
    CHECK(o.result == std::vector<double>{1.5, 1.0});
  }
}

TEST_CASE("async AVG on Gloo and bad broadcast roots are errors, not hangs", "[collectives]") {
  auto outcomes = run_ranks<std::string>(2, [](ProcessGroup& pg) {
    std::string errors;
    auto t = at::ones({4});
    try {
      pg.allreduce_async(t, ReduceKind::kAvg);
    } catch (const CommError& e) {
      errors += std::string(e.what()) + "\n";
    }
    try {
      pg.broadcast(t, 2);
    } catch (const CommError& e) {
      errors += e.what();
    }
    return errors;
  });
  for (int r = 0; r < 2; ++r) {
    REQUIRE_FALSE(outcomes[r].error);
    CHECK_THAT(outcomes[r].result, lockstep::testing::Contains("AVG is not native"));
    CHECK_THAT(outcomes[r].result, lockstep::testing::Contains("root 2 is outside [0, 2)"));
    CHECK_THAT(outcomes[r].result, lockstep::testing::Contains("rank " + std::to_string(r)));
  }
}

TEST_CASE("a collective that a peer misses fails after the timeout, naming op and rank",
          "[collectives]") {
  auto outcomes = run_ranks<double>(
      2,
      [](ProcessGroup& pg) {
        if (pg.rank() == 1) {
          // Alive but absent: never joins the all-reduce.
          std::this_thread::sleep_for(std::chrono::seconds(8));
          return 0.0;
        }
        auto t = at::ones({16});
        pg.allreduce(t, ReduceKind::kSum);
        return -1.0;  // not reached when the timeout works
      },
      // The group's set-up runs under this timeout too (Gloo's connect):
      // 3 s, not 1, so a loaded machine does not fail it there first.
      std::chrono::milliseconds(3000));
  REQUIRE(outcomes[0].error);
  const std::string what = error_text(outcomes[0].error);
  CHECK_THAT(what, lockstep::testing::Contains("rank 0: allreduce(sum) #0"));
  CHECK_THAT(what, lockstep::testing::Contains("failed"));
}

namespace {
struct DebugCollectives {
  DebugCollectives() { setenv("LOCKSTEP_DEBUG_COLLECTIVES", "1", 1); }
  ~DebugCollectives() { unsetenv("LOCKSTEP_DEBUG_COLLECTIVES"); }
};
}  // namespace

TEST_CASE("LOCKSTEP_DEBUG_COLLECTIVES reports mismatched collectives instead of hanging",
          "[collectives][desync]") {
  DebugCollectives debug;
  SECTION("same collectives: no error") {
    auto outcomes = run_ranks<double>(3, [](ProcessGroup& pg) {
      auto t = at::ones({4});
      for (int i = 0; i < 3; ++i) pg.allreduce(t, ReduceKind::kSum);
      pg.broadcast(t, 1);
      pg.barrier();
      return t[0].item<double>();
    });
    for (const auto& o : outcomes) {
      REQUIRE_FALSE(o.error);
      CHECK(o.result == 27.0);
    }
  }
  SECTION("different shapes and ops are named, on every rank") {
    auto outcomes = run_ranks<int>(2, [](ProcessGroup& pg) {
      auto t = at::ones({pg.rank() == 0 ? 4 : 5});
      pg.allreduce(t, ReduceKind::kSum);
      return 0;
    });
    for (int r = 0; r < 2; ++r) {
      REQUIRE(outcomes[r].error);
      CHECK_THAT(error_text(outcomes[r].error),
                 lockstep::testing::Contains("collective #0 differs across ranks"));
      CHECK_THAT(error_text(outcomes[r].error),
                 lockstep::testing::Contains("allreduce(sum) Float[4]"));
      CHECK_THAT(error_text(outcomes[r].error),
                 lockstep::testing::Contains("allreduce(sum) Float[5]"));
    }
  }
  SECTION("a rank that skips a collective is named after the timeout") {
    auto outcomes = run_ranks<int>(
        2,
        [](ProcessGroup& pg) {
          auto t = at::ones({2});
          if (pg.rank() == 0) pg.allreduce(t, ReduceKind::kSum);
          return 0;
        },
        std::chrono::milliseconds(3000));  // set-up included: see above
    REQUIRE(outcomes[0].error);
    CHECK_THAT(error_text(outcomes[0].error),
               lockstep::testing::Contains("rank 0: collective #0 (allreduce(sum) Float[2])"));
    CHECK_THAT(error_text(outcomes[0].error),
               lockstep::testing::Contains("rank(s) 1 did not issue it within 3.000 s"));
    CHECK_FALSE(outcomes[1].error);
  }
}

TEST_CASE(
    "agree_on_failure: a failure on one rank is every rank's, same class and words, and none "
    "means nobody throws",
    "[collectives]") {
  // 3 ranks; rank `bad` (or none: -1) throws a DataError, rank 2 a
  // c10::Error-like std::runtime_error when `also_internal`.
  struct Seen {
    std::string kind, what;
  };
  const auto run = [](int bad, bool also_internal) {
    return run_ranks<Seen>(3, [=](ProcessGroup& pg) {
      Seen seen;
      try {
        agree_on_failure(pg, [&] {
          if (pg.rank() == bad) throw DataError("optimizer.pt: entry 'w.exp_avg' is not finite");
          if (also_internal && pg.rank() == 2) throw std::runtime_error("bad_alloc-ish");
        });
        seen.kind = "none";
      } catch (const DataError& e) {
        seen = {"data", e.what()};
      } catch (const InternalError& e) {
        seen = {"internal", e.what()};
      } catch (const std::runtime_error& e) {
        seen = {"runtime", e.what()};
      }
      return seen;
    });
  };
  for (const auto& o : run(-1, false)) CHECK(o.result.kind == "none");
  const auto one = run(1, false);
  for (int r = 0; r < 3; ++r) {
    REQUIRE(error_text(one[r].error) == "");
    CHECK(one[r].result.kind == "data");
  }
  CHECK(one[1].result.what == "optimizer.pt: entry 'w.exp_avg' is not finite");
  CHECK(one[0].result.what == "rank 1: optimizer.pt: entry 'w.exp_avg' is not finite");
  CHECK(one[2].result.what == one[0].result.what);
  // Two ranks fail: the lowest one's error is everyone's (rank 2 keeps its own).
  const auto two = run(1, true);
  CHECK(two[0].result.what == "rank 1: optimizer.pt: entry 'w.exp_avg' is not finite");
  CHECK(two[2].result.kind == "data");
  // Not a lockstep::Error: InternalError on the others, the original on its rank.
  const auto internal = run(-1, true);
  CHECK(internal[0].result.kind == "internal");
  CHECK(internal[0].result.what == "rank 2: bad_alloc-ish");
  CHECK(internal[2].result.kind == "runtime");
}

TEST_CASE(
    "rank0_outcome: an exception that is not a lockstep::Error on rank 0 reaches every rank at "
    "once",
    "[collectives]") {
  const auto start = std::chrono::steady_clock::now();
  const auto outcomes = run_ranks<std::string>(
      2,
      [](ProcessGroup& pg) {
        try {
          rank0_outcome(pg, [] { throw std::bad_alloc(); });
        } catch (const InternalError& e) {
          return std::string("internal: ") + e.what();
        } catch (const std::bad_alloc&) {
          return std::string("bad_alloc");
        }
        return std::string("returned");
      },
      std::chrono::seconds(20));
  CHECK(outcomes[0].result == "bad_alloc");
  CHECK(outcomes[1].result == "internal: rank 0: std::bad_alloc");
  // Before, rank 1 waited for the collective timeout (20 s here).
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  const auto verdict = run_ranks<std::string>(
      2, [](ProcessGroup& pg) { return rank0_outcome(pg, [] { throw ConfigError("no room"); }); });
  CHECK(verdict[1].result == "no room");
}
