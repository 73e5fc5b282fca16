// The communication self-check (lockstep check --comm) on 1-4 ranks (threads
// over a HashStore): it passes where the collectives work, and it fails,
// on every rank, where one rank contributes wrong values.
#include <ATen/ATen.h>
#include "support/catch.h"

#include "lockstep/check/comm_check.h"
#include "lockstep/util/error.h"
#include "support/thread_world.h"

using namespace lockstep;
using lockstep::testing::error_text;
using lockstep::testing::run_ranks;

namespace {
CommCheckOptions small_sizes() {
  CommCheckOptions options;
  options.sizes = {1, 1001, 65536};
  return options;
}
}  // namespace

TEST_CASE("comm check passes on 1, 2, 3 and 4 ranks, and every rank agrees", "[collectives]") {
  for (int n : {1, 2, 3, 4}) {
    DYNAMIC_SECTION("world size " << n) {
      const auto options = small_sizes();
      auto outcomes = run_ranks<CommCheckReport>(
          n, [&](ProcessGroup& pg) { return comm_check_run(pg, options); });
      // 5 ops x 3 dtypes x 3 sizes, broadcast from 1 or 2 roots x 3 sizes,
      // allgather x 3 sizes, barrier.
      const size_t expected_cases = 45 + (n > 1 ? 6 : 3) + 3 + 1;
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r << ": " << error_text(outcomes[r].error));
        REQUIRE_FALSE(outcomes[r].error);
        CHECK(outcomes[r].result.passed());
        CHECK(outcomes[r].result.cases.size() == expected_cases);
        CHECK(outcomes[r].result.world_size == n);
      }
    }
  }
}

TEST_CASE("comm check detects a rank that contributes wrong values, on every rank",
          "[collectives]") {
  auto options = small_sizes();
  options.corrupt_rank = 1;
  auto outcomes =
      run_ranks<CommCheckReport>(3, [&](ProcessGroup& pg) { return comm_check_run(pg, options); });
  for (int r = 0; r < 3; ++r) {
    REQUIRE_FALSE(outcomes[r].error);
    const auto& report = outcomes[r].result;
    CHECK_FALSE(report.passed());
    // A corrupted SUM is wrong everywhere; every rank sees every rank fail.
    CHECK(report.cases.front().op == "allreduce sum");
    CHECK(report.cases.front().failed_ranks == std::vector<int>{0, 1, 2});
    // Broadcast from root 0 never reads rank 1's values: it must still pass.
    bool saw_root0 = false;
    for (const auto& c : report.cases) {
      if (c.op == "broadcast root 0") {
        saw_root0 = true;
        CHECK(c.failed_ranks.empty());
      }
    }
    CHECK(saw_root0);
    CHECK(report.table().find("FAIL on rank 0, 1, 2") != std::string::npos);
  }
}
