// The silent-corruption checks' verdicts (check/corruption.h) on figures
// written out by hand; the checks on real runs are tests/multiproc/corruption.sh.
#include <cmath>
#include <limits>

#include "lockstep/check/corruption.h"
#include "support/catch.h"

using namespace lockstep;
using lockstep::testing::Contains;

namespace {
const std::vector<std::string> kNames{"a", "b", "c"};
const double kInf = std::numeric_limits<double>::infinity();
}  // namespace

TEST_CASE("screen: a non-finite rank among finite ones is named, with its parameter",
          "[corruption]") {
  const auto f = screen_verdict({{1, 2, 2}, {1, kInf, 2}, {1, 2, 2}}, {0, 0, 0}, false, 10, kNames);
  CHECK(f.rank == 1);
  CHECK(f.parameter == "b");
  CHECK(f.check == "grad_screen");
  // Every rank non-finite: divergence, not one rank's corruption.
  CHECK(screen_verdict({{kInf, 1, 1}, {1, std::nan(""), 1}}, {0, 0}, false, 10, kNames).rank == -1);
  // A GradScaler's overflow on one rank is its business.
  CHECK(screen_verdict({{1, 2, 2}, {1, kInf, 2}}, {0, 0}, true, 10, kNames).rank == -1);
}

TEST_CASE("screen: a total over 10x the others' median and its own recent maximum is named",
          "[corruption]") {
  // Totals: rank 0 sqrt(1+4+4) = 3, rank 1 3, rank 2 sqrt(1+1e4+4) ~ 100.02.
  const std::vector<std::vector<double>> norms{{1, 2, 2}, {1, 2, 2}, {1, 100, 2}};
  auto f = screen_verdict(norms, {3, 3, 3}, false, 10, kNames);
  CHECK(f.rank == 2);
  CHECK(f.parameter == "b");  // 100 / 2: the largest ratio to the others' median
  CHECK_THAT(f.detail, Contains("33.34x the other ranks' median 3 and 33.34x its own"));
  // Its own recent steps were as large: not an outlier for it.
  CHECK(screen_verdict(norms, {3, 3, 20}, false, 10, kNames).rank == -1);
  // No history of its own yet (a run's first steps): never named by size.
  CHECK(screen_verdict(norms, {0, 0, 0}, false, 10, kNames).rank == -1);
  // 9.9x: under the threshold; 10.1x over it.
  CHECK(screen_verdict({{3, 0, 0}, {29.7, 0, 0}}, {1, 1}, false, 10, kNames).rank == -1);
  CHECK(screen_verdict({{3, 0, 0}, {30.3, 0, 0}}, {1, 1}, false, 10, kNames).rank == 1);
  // A parameter without a gradient (negative) counts as none.
  CHECK(screen_verdict({{3, -1, 0}, {3, -1, 0}}, {1, 1}, false, 10, kNames).rank == -1);
}

TEST_CASE("replay: the owner whose result no recomputation reproduces is named, else the replayer",
          "[corruption]") {
  using D = std::vector<std::vector<std::string>>;
  const D own{{"x0", "y0", "z0"}, {"x1", "y1", "z1"}, {"x2", "y2", "z2"}};
  // replayed[r] is rank r's replay of rank r+1's batch.
  D replayed{{"x1", "y1", "z1"}, {"x2", "y2", "z2"}, {"x0", "y0", "z0"}};
  CHECK(replay_verdict(own, replayed, {}, kNames).rank == -1);
  // Rank 2's own result differs in 'b' from rank 1's replay of it.
  replayed[1] = {"x2", "Y2", "z2"};
  auto f = replay_verdict(own, replayed, {}, kNames);
  CHECK((f.rank == 2 && f.other == 1 && f.parameter == "b"));
  // Every rank recomputes rank 2's batch: they reproduce the replay: rank 2 is wrong.
  f = replay_verdict(own, replayed, {{"x2", "Y2", "z2"}, {"x2", "Y2", "z2"}, {"x2", "Y2", "z2"}},
                     kNames);
  CHECK((f.rank == 2 && f.other == -1));
  // They reproduce rank 2's own result: the replayer, rank 1, is wrong.
  f = replay_verdict(own, replayed, {own[2], own[2], {"x2", "Y2", "z2"}}, kNames);
  CHECK((f.rank == 1 && f.other == -1));
  // Two ranks, each reproducing itself: both named, which cannot be told.
  const D own2{{"a0"}, {"a1"}}, rep2{{"A1"}, {"a0"}};
  f = replay_verdict(own2, rep2, {{"a1"}, {"A1"}}, {"a"});
  CHECK((f.rank == 1 && f.other == 0));
  CHECK_THAT(f.detail, Contains("cannot be told with 2 ranks"));
  // No recomputation reproduces either: not deterministic, said so.
  f = replay_verdict(own2, rep2, {{"b1"}, {"c1"}}, {"a"});
  CHECK_THAT(f.detail, Contains("not deterministic"));
}
