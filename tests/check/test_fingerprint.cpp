// Fingerprints: stability, one-bit sensitivity, SHA-256 parity with Python's
// hashlib, and the cross-rank check naming step, tensor and ranks, with each
// policy.
#include <ATen/ATen.h>
#include <torch/nn.h>
#include "support/catch.h"

#include <cstdio>

#include "lockstep/check/fingerprint.h"
#include "lockstep/util/error.h"
#include "support/thread_world.h"

using namespace lockstep;
using lockstep::testing::Contains;
using lockstep::testing::error_text;
using lockstep::testing::run_ranks;

namespace {
std::vector<NamedTensor> sample_tensors() {
  return {{"a", at::arange(12, at::kFloat).reshape({3, 4}) / 7},
          {"b", at::arange(5, at::kDouble)},
          {"c", at::arange(6, at::kLong) - 3},
          {"d", at::arange(4, at::kFloat).to(at::kHalf)}};
}
}  // namespace

TEST_CASE("digests are stable and change with any flipped bit", "[fingerprint]") {
  for (auto mode : {DigestMode::kXxh3, DigestMode::kChecksum, DigestMode::kSha256}) {
    DYNAMIC_SECTION(digest_mode_name(mode)) {
      auto tensors = sample_tensors();
      const auto base = fingerprint_digest(tensors, mode);
      CHECK(base == fingerprint_digest(sample_tensors(), mode));
      for (size_t t = 0; t < tensors.size(); ++t) {
        for (int bit : {0, 7, 13}) {
          auto copy = sample_tensors();
          auto& target = copy[t].tensor;
          // Flip one bit of element 1's first byte (bit%8) or a later byte.
          auto bytes = target.view({-1}).view(at::kByte);
          const int64_t byte = target.element_size() + bit / 8;
          bytes[byte] = bytes[byte].item<uint8_t>() ^ static_cast<uint8_t>(1u << (bit % 8));
          CHECK(fingerprint_digest(copy, mode) != base);
        }
      }
      // Order matters: the same tensors in another order differ.
      auto swapped = sample_tensors();
      std::swap(swapped[0], swapped[1]);
      CHECK(fingerprint_digest(swapped, mode) != base);
    }
  }
}

TEST_CASE("sha256 mode equals Python's hashlib over the same tensors", "[fingerprint]") {
  const std::vector<NamedTensor> tensors{{"w", at::arange(20, at::kFloat).reshape({4, 5}) / 3},
                                         {"b", at::arange(5, at::kFloat) - 2}};
  const std::string script =
      "import hashlib, torch; h = hashlib.sha256(); "
      "[h.update(p.detach().numpy().tobytes()) for p in "
      "[torch.arange(20, dtype=torch.float32).reshape(4, 5) / 3, "
      "torch.arange(5, dtype=torch.float32) - 2]]; print(h.hexdigest())";
  FILE* pipe = popen(("/usr/bin/python3 -c \"" + script + "\"").c_str(), "r");
  REQUIRE(pipe != nullptr);
  char line[128] = {0};
  REQUIRE(fgets(line, sizeof line, pipe) != nullptr);
  REQUIRE(pclose(pipe) == 0);
  std::string python(line);
  python.erase(python.find_last_not_of("\n") + 1);
  CHECK(to_hex(fingerprint_digest(tensors, DigestMode::kSha256)) == python);
}

TEST_CASE("the cross-rank check names step, tensor and ranks - policies", "[fingerprint]") {
  for (int n : {2, 3}) {
    DYNAMIC_SECTION(n << " ranks") {
      struct Seen {
        ConsistencyReport healthy, broken;
        std::string abort_error;
        bool warn_returned = false;
        bool resynced = false;
      };
      auto outcomes = run_ranks<Seen>(n, [&](ProcessGroup& pg) {
        Seen seen;
        auto tensors = sample_tensors();
        seen.healthy = fingerprint_check(pg, tensors, DigestMode::kAuto, 4);
        if (pg.rank() == n - 1) tensors[1].tensor[2] += 1e-12;  // perturb 'b' on the last rank
        seen.broken = fingerprint_check(pg, tensors, DigestMode::kAuto, 5);
        try {
          fingerprint_enforce(pg, seen.broken, CheckPolicy::kAbort, tensors);
        } catch (const ConsistencyError& e) {
          seen.abort_error = e.what();
        }
        fingerprint_enforce(pg, seen.broken, CheckPolicy::kWarn, tensors);
        seen.warn_returned = true;
        fingerprint_enforce(pg, seen.broken, CheckPolicy::kResync, tensors);
        seen.resynced = fingerprint_check(pg, tensors, DigestMode::kAuto, 5).consistent;
        return seen;
      });
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r << ": " << error_text(outcomes[r].error));
        REQUIRE_FALSE(outcomes[r].error);
        const auto& s = outcomes[r].result;
        CHECK(s.healthy.consistent);
        CHECK_FALSE(s.broken.consistent);
        CHECK(s.broken.first_tensor == "b");
        std::vector<int> healthy_ranks;
        for (int k = 0; k < n - 1; ++k) healthy_ranks.push_back(k);
        CHECK(s.broken.groups == std::vector<std::vector<int>>{healthy_ranks, {n - 1}});
        CHECK_THAT(s.abort_error, Contains("after step 5: first differing tensor 'b'"));
        CHECK_THAT(s.abort_error, Contains("rank(s) " + std::to_string(n - 1) + " hold"));
        CHECK(s.warn_returned);
        CHECK(s.resynced);
      }
    }
  }
}
