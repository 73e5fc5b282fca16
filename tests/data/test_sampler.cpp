// DistributedSampler: index-for-index parity with PyTorch's (run live through
// Debian's python3-torch), shard properties, epochs and seeds, bad input.
#include "support/catch.h"

#include <cstdio>
#include <set>
#include <sstream>

#include "lockstep/data/sampler.h"
#include "lockstep/util/error.h"
#include "support/python_peer.h"

using lockstep::DistributedSampler;
using lockstep::SamplerOptions;

TEST_CASE("indices equal torch.utils.data.DistributedSampler's over a grid", "[sampler]") {
  const std::string command =
      lockstep::testing::python_peer() + " " LOCKSTEP_SOURCE_DIR "/scripts/sampler_reference.py";
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string output;
  char buffer[1 << 16];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) output.append(buffer, n);
  const int status = pclose(pipe);
  INFO("reference: " << command);
  REQUIRE(status == 0);

  std::istringstream lines(output);
  std::string line;
  int cases = 0, mismatches = 0;
  while (std::getline(lines, line)) {
    std::istringstream in(line);
    int64_t length, epoch;
    int replicas, rank, shuffle, drop_last;
    uint64_t seed;
    std::string colon;
    in >> length >> replicas >> rank >> shuffle >> seed >> epoch >> drop_last >> colon;
    std::vector<int64_t> want;
    for (int64_t i; in >> i;) want.push_back(i);
    DistributedSampler sampler(length,
                               SamplerOptions{replicas, rank, shuffle != 0, seed, drop_last != 0});
    sampler.set_epoch(epoch);
    const auto got = sampler.indices();
    ++cases;
    if (got != want) {
      ++mismatches;
      if (mismatches <= 3) FAIL_CHECK("mismatch for: " << line.substr(0, line.find(':')));
    }
    CHECK(static_cast<int64_t>(got.size()) == sampler.num_samples());
  }
  CHECK(cases == 3888);
  CHECK(mismatches == 0);
}

TEST_CASE("shards of one epoch are disjoint (drop_last) or cover every index (padding)",
          "[sampler]") {
  for (int64_t length : {10, 11, 3}) {
    for (bool drop_last : {false, true}) {
      const int replicas = 4;
      std::multiset<int64_t> seen;
      for (int r = 0; r < replicas; ++r) {
        DistributedSampler s(length, SamplerOptions{replicas, r, true, 7, drop_last});
        for (int64_t i : s.indices()) seen.insert(i);
      }
      std::set<int64_t> distinct(seen.begin(), seen.end());
      if (drop_last) {
        CHECK(distinct.size() == seen.size());  // disjoint
        CHECK(seen.size() == static_cast<size_t>(length / replicas * replicas));
      } else {
        CHECK(distinct.size() == static_cast<size_t>(length));  // every index
        CHECK(seen.size() % replicas == 0);
      }
    }
  }
}

TEST_CASE("different epochs give different orders - the same seed the same order", "[sampler]") {
  DistributedSampler a(100, SamplerOptions{2, 0, true, 3, false});
  DistributedSampler b(100, SamplerOptions{2, 0, true, 3, false});
  const auto epoch0 = a.indices();
  CHECK(epoch0 == b.indices());
  a.set_epoch(1);
  CHECK(a.indices() != epoch0);
  DistributedSampler other_seed(100, SamplerOptions{2, 0, true, 4, false});
  CHECK(other_seed.indices() != epoch0);
  DistributedSampler ordered(5, SamplerOptions{2, 1, false, 0, false});
  CHECK(ordered.indices() == std::vector<int64_t>{1, 3, 0});
}

TEST_CASE("a rank outside num_replicas is a clear error", "[sampler]") {
  REQUIRE_THROWS_WITH(DistributedSampler(10, SamplerOptions{2, 2, true, 0, false}),
                      lockstep::testing::Contains("rank 2 is outside [0, 2)"));
  REQUIRE_THROWS_AS(DistributedSampler(10, SamplerOptions{0, 0, true, 0, false}),
                    lockstep::ConfigError);
}

TEST_CASE("a sampler without the world is refused, not a copy of rank 0's shard", "[sampler]") {
  // DistributedSampler(n, {}) on two ranks once gave both the same indices.
  REQUIRE_THROWS_WITH(DistributedSampler(10, {}),
                      lockstep::testing::Contains("num_replicas and rank are not set"));
  SamplerOptions only_size;
  only_size.num_replicas = 2;
  REQUIRE_THROWS_WITH(DistributedSampler(10, only_size),
                      lockstep::testing::Contains("SamplerOptions{dist.size(), dist.rank()"));
}
