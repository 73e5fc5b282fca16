// Fingerprints: stability, one-bit sensitivity, SHA-256 parity with Python's
// hashlib, every XXH3 kernel against Debian's libxxhash, and the cross-rank check naming step,
// tensor and ranks, with each policy.
#include <ATen/ATen.h>
#include <torch/nn.h>
#include "support/catch.h"
#include "support/python_peer.h"

#include <xxhash.h>

#include <cstdio>
#include <cstring>

#include "check/xxh3.h"
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
  FILE* pipe = popen((lockstep::testing::python_peer() + " -c \"" + script + "\"").c_str(), "r");
  REQUIRE(pipe != nullptr);
  char line[128] = {0};
  REQUIRE(fgets(line, sizeof line, pipe) != nullptr);
  REQUIRE(pclose(pipe) == 0);
  std::string python(line);
  python.erase(python.find_last_not_of("\n") + 1);
  CHECK(hex_of(fingerprint_digest(tensors, DigestMode::kSha256)) == python);
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

TEST_CASE("every XXH3 kernel equals Debian's libxxhash, however the bytes are split",
          "[fingerprint]") {
  using lockstep::detail::Xxh3Kernel;
  std::vector<unsigned char> bytes(3 << 20);
  uint64_t x = 0x9e3779b97f4a7c15ULL;
  for (auto& b : bytes) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = static_cast<unsigned char>(x);
  }
  const auto widest = lockstep::detail::xxh3_widest_kernel();
  // Sizes around XXH3's 16/128/240-byte paths, its 1,024-byte stripes' block
  // and its 256-byte internal buffer, split into one, two or many pieces.
  for (size_t size :
       {size_t{0}, size_t{1}, size_t{16}, size_t{17}, size_t{128}, size_t{129}, size_t{240},
        size_t{241}, size_t{1024}, size_t{1025}, size_t{4099}, size_t{65536 + 7}, bytes.size()}) {
    for (size_t pieces : {size_t{1}, size_t{2}, size_t{7}}) {
      lockstep::detail::Xxh3Chunks chunks;
      XXH3_state_t* state = XXH3_createState();
      XXH3_128bits_reset(state);
      for (size_t p = 0; p < pieces; ++p) {
        const size_t begin = size * p / pieces, end = size * (p + 1) / pieces;
        chunks.emplace_back(bytes.data() + begin, end - begin);
        XXH3_128bits_update(state, bytes.data() + begin, end - begin);
      }
      const XXH128_hash_t h = XXH3_128bits_digest(state);
      XXH3_freeState(state);
      std::string expected(16, '\0');
      std::memcpy(expected.data(), &h.high64, 8);
      std::memcpy(expected.data() + 8, &h.low64, 8);
      INFO(size << " bytes in " << pieces << " pieces");
      CHECK(lockstep::detail::xxh3_128_generic(chunks) == expected);
      if (widest != Xxh3Kernel::kGeneric)
        CHECK(lockstep::detail::xxh3_128_avx2(chunks) == expected);
      if (widest == Xxh3Kernel::kAvx512)
        CHECK(lockstep::detail::xxh3_128_avx512(chunks) == expected);
      CHECK(xxh3_128(chunks) == expected);
      Xxh3Stream stream;  // the same pieces fed one by one
      for (const auto& [data, n] : chunks) stream.update(data, n);
      CHECK(stream.digest() == expected);
    }
  }
}

TEST_CASE("check_weights: one call passes equal modules and names a differing one",
          "[fingerprint]") {
  std::vector<torch::nn::Linear> nets;
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(5);
    nets.push_back(torch::nn::Linear(4, 3));
  }
  auto equal = run_ranks<bool>(
      2, [&](ProcessGroup& pg) { return check_weights(pg, *nets[pg.rank()], 7).consistent; });
  for (const auto& o : equal) {
    REQUIRE(error_text(o.error) == "");
    CHECK(o.result);
  }
  {
    torch::NoGradGuard no_grad;
    nets[1]->bias[2].add_(1e-6);  // one element on rank 1
  }
  auto differ = run_ranks<bool>(
      2, [&](ProcessGroup& pg) { return check_weights(pg, *nets[pg.rank()], 8).consistent; });
  for (const auto& o : differ) {
    CHECK_THAT(error_text(o.error), Contains("after step 8: first differing tensor 'bias'"));
  }
  WeightCheckOptions warn;
  warn.policy = CheckPolicy::kWarn;
  auto warned = run_ranks<bool>(
      2, [&](ProcessGroup& pg) { return check_weights(pg, *nets[pg.rank()], 9, warn).consistent; });
  for (const auto& o : warned) {
    REQUIRE(error_text(o.error) == "");
    CHECK_FALSE(o.result);
  }
}
