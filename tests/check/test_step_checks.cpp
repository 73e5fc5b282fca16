// The every-step check's machinery: the xxh3 digest's definition against
// Debian's libxxhash, idle-thread hashing against hashing in place (the
// tensors changed after close(), a mismatch named from the digests kept),
// when StepChecks hands out each verdict, and cancelled jobs.
#include <ATen/ATen.h>
#include "support/catch.h"

#include <xxhash.h>

#include <cstring>

#include "check/idle_hasher.h"
#include "lockstep/check/step_checks.h"
#include "lockstep/util/error.h"
#include "support/thread_world.h"

using namespace lockstep;
using lockstep::testing::error_text;
using lockstep::testing::run_ranks;

namespace {

// 2.4 MB + 4 KB + 2.4 MB: over the idle thread's 1 MiB threshold.
std::vector<NamedTensor> big_tensors() {
  return {{"w1", at::arange(600000, at::kFloat) / 7},
          {"b1", at::arange(1000, at::kFloat) - 3},
          {"w2", at::arange(300000, at::kDouble) / 3}};
}

std::string libxxhash_128(const void* data, size_t size) {
  const XXH128_hash_t h = XXH3_128bits(data, size);
  std::string out(16, '\0');
  std::memcpy(out.data(), &h.high64, 8);
  std::memcpy(out.data() + 8, &h.low64, 8);
  return out;
}

}  // namespace

TEST_CASE("xxh3 digest: XXH3-128 over each tensor's XXH3-128, by libxxhash", "[fingerprint]") {
  const auto tensors = big_tensors();
  std::string per;
  for (const auto& t : tensors) per += libxxhash_128(t.tensor.data_ptr(), t.tensor.nbytes());
  CHECK(fingerprint_digest(tensors, DigestMode::kXxh3) == libxxhash_128(per.data(), per.size()));
  const auto each = fingerprint_per_tensor(tensors, DigestMode::kXxh3);
  REQUIRE(each.size() == 3);
  CHECK(each[1] == libxxhash_128(tensors[1].tensor.data_ptr(), tensors[1].tensor.nbytes()));
}

TEST_CASE("idle-thread hashing: the in-place digest, whatever the tensors do after close()",
          "[fingerprint]") {
  struct Seen {
    bool idle_small = true, idle_big = false;
    std::string healthy_digest, expected_digest;
    bool healthy = false;
    ConsistencyReport broken;
    size_t hashed = 0;
  };
  auto outcomes = run_ranks<Seen>(2, [](ProcessGroup& pg) {
    Seen seen;
    // Under 1 MiB: hashed in place even when the idle thread is asked for.
    PendingCheck small(pg, {{"s", at::ones({100})}}, DigestMode::kXxh3, 1,
                       CheckHashing::kIdleThread);
    seen.idle_small = small.verdict_can_wait();
    small.finish();

    auto tensors = big_tensors();
    seen.expected_digest = hex_of(fingerprint_digest(tensors, DigestMode::kXxh3));
    PendingCheck healthy(pg, tensors, DigestMode::kXxh3, 2, CheckHashing::kIdleThread);
    seen.idle_big = healthy.verdict_can_wait();
    healthy.close();
    for (auto& t : tensors) t.tensor.add_(1);  // the optimizer step, after close()
    const auto report = healthy.finish();
    seen.healthy = report.consistent;
    seen.healthy_digest = report.digest_hex;
    seen.hashed = healthy.hashed_bytes();

    // Rank 1's 'w2' differs at the check; after close() it is put back, so
    // only the digests kept can still name it.
    if (pg.rank() == 1) tensors[2].tensor[5] += 1;
    PendingCheck broken(pg, tensors, DigestMode::kXxh3, 3, CheckHashing::kIdleThread);
    broken.close();
    if (pg.rank() == 1) tensors[2].tensor[5] -= 1;
    seen.broken = broken.finish();
    return seen;
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << error_text(outcomes[r].error));
    REQUIRE_FALSE(outcomes[r].error);
    const auto& s = outcomes[r].result;
    CHECK_FALSE(s.idle_small);
    CHECK(s.idle_big);
    CHECK(s.healthy);
    CHECK(s.healthy_digest == s.expected_digest);
    CHECK(s.hashed == 600000 * 4 + 1000 * 4 + 300000 * 8);
    CHECK_FALSE(s.broken.consistent);
    CHECK(s.broken.step == 3);
    CHECK(s.broken.first_tensor == "w2");
    CHECK(s.broken.groups == std::vector<std::vector<int>>{{0}, {1}});
  }
}

TEST_CASE("StepChecks: in place the verdict comes one update later, idle two", "[fingerprint]") {
  struct Seen {
    std::vector<int64_t> in_place, idle;  // steps of the reports, -1 marks a before_update()
  };
  auto outcomes = run_ranks<Seen>(2, [](ProcessGroup& pg) {
    Seen seen;
    auto tensors = big_tensors();
    for (auto hashing : {CheckHashing::kInPlace, CheckHashing::kIdleThread}) {
      auto& out = hashing == CheckHashing::kInPlace ? seen.in_place : seen.idle;
      StepChecks checks(pg, DigestMode::kXxh3, hashing);
      for (int64_t step = 1; step <= 3; ++step) {
        checks.start(tensors, step);
        out.push_back(-1);
        for (const auto& r : checks.before_update()) out.push_back(r.consistent ? r.step : -100);
        for (auto& t : tensors) t.tensor.mul_(0.5);  // the update
      }
      out.push_back(-2);  // drain
      for (const auto& r : checks.drain()) out.push_back(r.consistent ? r.step : -100);
    }
    return seen;
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << error_text(outcomes[r].error));
    REQUIRE_FALSE(outcomes[r].error);
    CHECK(outcomes[r].result.in_place == std::vector<int64_t>{-1, 1, -1, 2, -1, 3, -2});
    CHECK(outcomes[r].result.idle == std::vector<int64_t>{-1, -1, 1, -1, 2, -2, 3});
  }
}

TEST_CASE("idle hasher: a cancelled job is refused, the next one hashes", "[fingerprint]") {
  auto& hasher = IdleHasher::instance();
  const auto tensors = big_tensors();
  const uint64_t first = hasher.start({tensors[0].tensor});
  const uint64_t second = hasher.start({tensors[2].tensor, tensors[1].tensor});
  CHECK_THROWS_AS(hasher.finish(first), InternalError);
  size_t idle = 0;
  const auto digests = hasher.finish(second, &idle);
  REQUIRE(digests.size() == 2);
  CHECK(digests[0] == libxxhash_128(tensors[2].tensor.data_ptr(), tensors[2].tensor.nbytes()));
  CHECK(digests[1] == libxxhash_128(tensors[1].tensor.data_ptr(), tensors[1].tensor.nbytes()));
  CHECK(idle <= tensors[2].tensor.nbytes() + tensors[1].tensor.nbytes());
  const uint64_t third = hasher.start({tensors[1].tensor});
  hasher.cancel(third);
  CHECK_THROWS_AS(hasher.finish(third), InternalError);
}

TEST_CASE("StepChecks: two starts without an update in between lose no verdict", "[fingerprint]") {
  auto outcomes = run_ranks<std::vector<int64_t>>(2, [](ProcessGroup& pg) {
    std::vector<int64_t> steps;
    auto tensors = big_tensors();
    for (auto hashing : {CheckHashing::kInPlace, CheckHashing::kIdleThread}) {
      StepChecks checks(pg, DigestMode::kXxh3, hashing);
      checks.start(tensors, 1);
      checks.start(tensors, 2);
      for (const auto& r : checks.before_update()) steps.push_back(r.consistent ? r.step : -100);
      steps.push_back(-2);  // drain
      for (const auto& r : checks.drain()) steps.push_back(r.consistent ? r.step : -100);
      steps.push_back(-3);  // next hashing
    }
    return steps;
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << error_text(outcomes[r].error));
    REQUIRE_FALSE(outcomes[r].error);
    CHECK(outcomes[r].result == std::vector<int64_t>{1, 2, -2, -3, 1, -2, 2, -3});
  }
}
