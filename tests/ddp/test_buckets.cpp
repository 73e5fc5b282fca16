// bucket_assign: caps, the small first bucket, dtype separation, oversized
// parameters, and deterministic ordering.
#include "support/catch.h"

#include "lockstep/ddp/buckets.h"

using lockstep::bucket_assign;
using lockstep::BucketCaps;
using lockstep::BucketInput;
using Buckets = std::vector<std::vector<size_t>>;

TEST_CASE("buckets close once they reach the cap - the first cap is smaller", "[buckets]") {
  const std::vector<BucketInput> in(6, BucketInput{100, 0});
  CHECK(bucket_assign(in, BucketCaps{100, 250}) == Buckets{{0}, {1, 2, 3}, {4, 5}});
  CHECK(bucket_assign(in, BucketCaps{1000, 1000}) == Buckets{{0, 1, 2, 3, 4, 5}});
  CHECK(bucket_assign(in, BucketCaps{0, 0}) == Buckets{{0}, {1}, {2}, {3}, {4}, {5}});
}

TEST_CASE("a parameter larger than the cap gets its own bucket or closes the open one",
          "[buckets]") {
  const std::vector<BucketInput> in{{10, 0}, {500, 0}, {10, 0}, {10, 0}};
  CHECK(bucket_assign(in, BucketCaps{100, 100}) == Buckets{{0, 1}, {2, 3}});
  const std::vector<BucketInput> alone{{500, 0}, {10, 0}};
  CHECK(bucket_assign(alone, BucketCaps{100, 100}) == Buckets{{0}, {1}});
}

TEST_CASE("one dtype/device per bucket - buckets ordered by first index", "[buckets]") {
  const std::vector<BucketInput> in{{40, 1}, {40, 2}, {40, 1}, {40, 2}, {40, 1}};
  const auto buckets = bucket_assign(in, BucketCaps{80, 1000});
  CHECK(buckets == Buckets{{0, 2}, {1, 3}, {4}});
  // Every key's first bucket uses the first cap.
  for (const auto& b : buckets) {
    for (size_t i : b) CHECK(in[i].type_key == in[b.front()].type_key);
  }
}

TEST_CASE("the same inputs always give the same layout", "[buckets]") {
  std::vector<BucketInput> in;
  for (size_t i = 0; i < 50; ++i) in.push_back({(i * 37) % 300 + 1, static_cast<int64_t>(i % 3)});
  CHECK(bucket_assign(in, BucketCaps{200, 700}) == bucket_assign(in, BucketCaps{200, 700}));
  size_t total = 0;
  for (const auto& b : bucket_assign(in, BucketCaps{200, 700})) total += b.size();
  CHECK(total == in.size());
  CHECK(bucket_assign({}, BucketCaps{}).empty());
}
