#include "lockstep/ddp/buckets.h"

#include <algorithm>
#include <map>

namespace lockstep {

std::vector<std::vector<size_t>> bucket_assign(const std::vector<BucketInput>& inputs,
                                               const BucketCaps& caps) {
  struct Open {
    std::vector<size_t> indices;
    size_t bytes = 0;
    bool closed_one = false;  // has this key already closed its first bucket?
  };
  std::map<int64_t, Open> open;
  std::vector<std::vector<size_t>> buckets;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Open& bucket = open[inputs[i].type_key];
    bucket.indices.push_back(i);
    bucket.bytes += inputs[i].bytes;
    const size_t cap = bucket.closed_one ? caps.bytes : caps.first_bytes;
    if (bucket.bytes >= cap) {
      buckets.push_back(std::move(bucket.indices));
      bucket.indices.clear();
      bucket.bytes = 0;
      bucket.closed_one = true;
    }
  }
  for (auto& [key, bucket] : open) {
    if (!bucket.indices.empty()) buckets.push_back(std::move(bucket.indices));
  }
  std::sort(buckets.begin(), buckets.end(),
            [](const auto& a, const auto& b) { return a.front() < b.front(); });
  return buckets;
}

}  // namespace lockstep
