// The ring all-reduce built from send/recv: exact on closed-form inputs for
// 1-4 ranks and sizes smaller than, equal to and not divisible by the rank
// count; equal (to float tolerance) to the backend's all-reduce on random data.
#include <ATen/ATen.h>
#include "support/catch.h"

#include "lockstep/distributed/ring_allreduce.h"
#include "support/thread_world.h"

using namespace lockstep;
using lockstep::testing::error_text;
using lockstep::testing::run_ranks;

TEST_CASE("ring all-reduce equals the closed-form sum", "[ring]") {
  for (int n : {1, 2, 3, 4}) {
    for (int64_t numel : {1, 3, 4, 7, 1000, 65537}) {
      DYNAMIC_SECTION(n << " ranks, " << numel << " elements") {
        // The ring is built from send/recv: Gloo's (shm has no point to point).
        auto outcomes = run_ranks<bool>(
            n,
            [&](ProcessGroup& pg) {
              const auto i = at::arange(numel, at::kDouble);
              auto t = ((pg.rank() + 1) * 100 + i.remainder(7)).to(at::kFloat);
              ring_allreduce(pg, t);
              const auto want = (100.0 * n * (n + 1) / 2 + n * i.remainder(7)).to(at::kFloat);
              return at::equal(t, want);
            },
            std::chrono::seconds(60), BackendKind::kGloo);
        for (int r = 0; r < n; ++r) {
          INFO("rank " << r << ": " << error_text(outcomes[r].error));
          REQUIRE_FALSE(outcomes[r].error);
          CHECK(outcomes[r].result);
        }
      }
    }
  }
}

TEST_CASE("ring all-reduce matches the backend's on random data", "[ring]") {
  auto outcomes = run_ranks<bool>(
      3,
      [](ProcessGroup& pg) {
        auto gen = at::detail::createCPUGenerator(100 + pg.rank());
        auto mine = at::randn({10001}, gen, at::kFloat);
        auto ring = mine.clone();
        auto backend = mine.clone();
        ring_allreduce(pg, ring);
        pg.allreduce(backend, ReduceKind::kSum);
        return at::allclose(ring, backend, 1e-5, 1e-6);
      },
      std::chrono::seconds(60), BackendKind::kGloo);
  for (const auto& o : outcomes) {
    REQUIRE_FALSE(o.error);
    CHECK(o.result);
  }
}
