// Bucket assignment: which parameters share a flat all-reduce buffer.
// A pure function of sizes, type keys and caps (no tensors, no process group),
// so that it is unit-tested alone and, being deterministic, gives the same
// layout on every rank (a different layout would mismatch collectives).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "lockstep/ddp/ddp_options.h"

namespace lockstep {

struct BucketInput {
  size_t bytes = 0;      // the gradient's size in bytes
  int64_t type_key = 0;  // dtype and device: a bucket holds one key only
};

struct BucketCaps {
  size_t first_bytes = kFirstBucketCapBytes;  // the first bucket of each key: small, so
                                              // the first all-reduce starts early
  size_t bytes = kBucketCapBytes;             // every later bucket
};

// Groups `inputs` (in the order gradients are expected to be ready: reverse
// registration order) into buckets. Per type key, parameters are added to an
// open bucket which closes once it holds >= its cap (a parameter larger than
// the cap therefore gets a bucket of its own, or closes the current one).
// Returns buckets as lists of indices into `inputs`, ordered by their first
// index; within a bucket, indices keep their input order.
std::vector<std::vector<size_t>> bucket_assign(const std::vector<BucketInput>& inputs,
                                               const BucketCaps& caps);

}  // namespace lockstep
