// Buckets in shared memory (Note [Buckets in shared memory],
// shm_backend.cpp): all-reduces of tensors made by bucket_zeros run in
// place and give the same bits as the same values through the segment, for
// every op and dtype, whole or as a slice, on 2 and 3 ranks; a scaled sum
// gives the bits of a multiply and then the sum; any mix (a private tensor,
// another offset, a scaled and an unscaled rank) falls back through the
// segment and still sums right; each copy is unmapped when its tensor goes;
// the line kernel that reduces into every copy (or into other outputs)
// gives the bits of the plain kernel at every alignment and length, for 1
// to 4 copies.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include "support/catch.h"

#include <atomic>
#include <fstream>
#include <string>

#include "distributed/shm_reduce.h"
#include "lockstep/distributed/shm_backend.h"
#include "lockstep/util/error.h"
#include "support/thread_world.h"

using namespace lockstep;
using lockstep::testing::error_text;
using lockstep::testing::run_ranks;

namespace {

const auto kShm = BackendKind::kShm;
const auto kTimeout = std::chrono::seconds(60);

// Rank r's values: random, so that rounding shows (a generator of its own
// per call: the ranks are threads, and the global one is shared).
at::Tensor random_values(int rank, int64_t n, at::ScalarType dtype) {
  auto generator = at::detail::createCPUGenerator(1000 + rank);
  const auto v = at::randn({n}, generator, at::TensorOptions(at::kDouble)) * 100;
  return at::isIntegralType(dtype, false) ? v.round().to(dtype) : v.to(dtype);
}

// Mappings of lockstep's shared files in this process (deleted names).
int shared_mappings() {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);)
    if (line.find("/dev/shm/lockstep-") != std::string::npos) ++n;
  return n;
}

template <typename F>
void expect_all_ranks(int n, F body) {
  auto outcomes = run_ranks<std::string>(n, body, kTimeout, kShm);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << error_text(outcomes[r].error));
    REQUIRE_FALSE(outcomes[r].error);
    CHECK(outcomes[r].result == "");
  }
}

}  // namespace

TEST_CASE("shm buckets: in place, the same bits as through the segment, every op and dtype",
          "[shm][buckets]") {
  const std::vector<at::ScalarType> dtypes{at::kFloat, at::kDouble, at::kHalf, at::kBFloat16,
                                           at::kInt,   at::kLong,   at::kChar, at::kByte};
  const std::vector<ReduceKind> ops{ReduceKind::kSum, ReduceKind::kAvg, ReduceKind::kMin,
                                    ReduceKind::kMax, ReduceKind::kProduct};
  for (int n : {2, 3}) {
    DYNAMIC_SECTION(n << " ranks") {
      const int before = shared_mappings();
      expect_all_ranks(n, [&](ProcessGroup& pg) {
        std::string wrong;
        int64_t expected_in_place = 0;
        for (auto dtype : dtypes) {
          // 70001 elements: more than one segment chunk, not a multiple of n.
          const int64_t numel = 70001;
          auto bucket = pg.bucket_zeros(numel, at::TensorOptions(dtype));
          if (!at::equal(bucket, at::zeros({numel}, dtype))) wrong += "bucket not zeros; ";
          for (auto op : ops) {
            if (op == ReduceKind::kProduct && (dtype == at::kHalf || dtype == at::kBFloat16))
              continue;  // 16-bit products of these values overflow: nothing left to compare
            auto mine = random_values(pg.rank(), numel, dtype);
            bucket.copy_(mine);
            auto reference = mine.clone();
            pg.allreduce(bucket, op);
            ++expected_in_place;
            pg.allreduce(reference, op);  // private memory: through the segment
            if (!at::equal(bucket, reference))
              wrong += std::string(c10::toString(dtype)) + " " + reduce_kind_name(op) + "; ";
            // A slice (contiguous, at an offset, odd length): in place too.
            auto slice = bucket.narrow(0, 5, 1001);
            slice.copy_(mine.narrow(0, 5, 1001));
            auto slice_reference = mine.narrow(0, 5, 1001).clone();
            pg.allreduce(slice, op);
            ++expected_in_place;
            pg.allreduce(slice_reference, op);
            if (!at::equal(slice, slice_reference))
              wrong += std::string("slice ") + c10::toString(dtype) + "; ";
          }
        }
        // The float sum against the closed form (double sums, rounded once
        // per step as the ranks' order does): within a few ulps.
        auto bucket = pg.bucket_zeros(4096, at::TensorOptions(at::kFloat));
        bucket.copy_(random_values(pg.rank(), 4096, at::kFloat));
        pg.allreduce(bucket, ReduceKind::kSum);
        ++expected_in_place;
        auto want = at::zeros({4096}, at::kDouble);
        for (int r = 0; r < pg.size(); ++r)
          want += random_values(r, 4096, at::kFloat).to(at::kDouble);
        if (!at::allclose(bucket.to(at::kDouble), want, 1e-6, 1e-4)) wrong += "closed form; ";
        const int64_t done = shm_in_place_count(pg.backend());
        if (done != expected_in_place)
          wrong += "in place " + std::to_string(done) + " of " + std::to_string(expected_in_place) +
                   "; ";
        return wrong;
      });
      // Every copy of every bucket (each rank maps all n) is unmapped.
      CHECK(shared_mappings() == before);
    }
  }
}

TEST_CASE("shm buckets: a scaled sum is the bits of a multiply and then the sum",
          "[shm][buckets]") {
  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16}) {
    DYNAMIC_SECTION(c10::toString(dtype)) {
      expect_all_ranks(3, [&](ProcessGroup& pg) {
        std::string wrong;
        const double scale = 1.0 / 3;  // not exact: the rounding of each product shows
        auto mine = random_values(pg.rank(), 50000, dtype);
        auto bucket = pg.bucket_zeros(50000, at::TensorOptions(dtype));
        bucket.copy_(mine);
        pg.wait(pg.allreduce_scaled_async(bucket, scale), "scaled");
        auto reference = mine.clone();
        reference.mul_(scale);
        pg.allreduce(reference, ReduceKind::kSum);
        if (!at::equal(bucket, reference)) wrong += "in place differs from mul_ then sum; ";
        // Private memory: the multiply, then through the segment.
        auto plain = mine.clone();
        pg.wait(pg.allreduce_scaled_async(plain, scale), "scaled");
        if (!at::equal(plain, reference)) wrong += "private differs; ";
        // Summing products in another order would differ somewhere.
        auto other = at::zeros_like(mine, at::kDouble);
        for (int r = pg.size() - 1; r >= 0; --r)
          other += (random_values(r, 50000, dtype) * scale).to(at::kDouble);
        if (dtype == at::kFloat && at::equal(other.to(dtype), reference))
          wrong += "the order does not show: the test cannot tell; ";
        // bfloat16: multiplied first, then in place unscaled; the others scaled in place.
        if (shm_in_place_count(pg.backend()) != 1) wrong += "in-place count; ";
        return wrong;
      });
    }
  }
}

TEST_CASE("shm buckets: a mix falls back through the segment on every rank, and sums right",
          "[shm][buckets]") {
  expect_all_ranks(3, [&](ProcessGroup& pg) {
    std::string wrong;
    const int64_t numel = 30000;
    auto bucket = pg.bucket_zeros(numel, at::TensorOptions(at::kFloat));
    auto want = [&](int64_t from, int64_t len, double scale) {
      auto sum = at::zeros({len}, at::kFloat);
      for (int r = 0; r < pg.size(); ++r) {
        auto v = random_values(r, numel, at::kFloat).narrow(0, from, len).clone();
        if (scale != 1.0) v.mul_(scale);
        sum += v;  // rank order, as shm sums
      }
      return sum;
    };
    auto mine = random_values(pg.rank(), numel, at::kFloat);
    // 1. Rank 1 all-reduces a private tensor, the others their buckets.
    at::Tensor t = pg.rank() == 1 ? mine.clone() : bucket;
    t.copy_(mine);
    pg.allreduce(t, ReduceKind::kSum);
    if (!at::equal(t, want(0, numel, 1.0))) wrong += "private among buckets; ";
    // 2. Each rank a slice at its own offset: the same length, elsewhere.
    const int64_t off = 8 * pg.rank(), len = 20000;
    bucket.copy_(mine);
    auto slice = bucket.narrow(0, off, len);
    pg.allreduce(slice, ReduceKind::kSum);
    auto sum = at::zeros({len}, at::kFloat);
    for (int r = 0; r < pg.size(); ++r)
      sum += random_values(r, numel, at::kFloat).narrow(0, 8 * r, len);
    if (!at::equal(slice, sum)) wrong += "slices at other offsets; ";
    // 3. Rank 2 sums its bucket scaled by 1/2 the plain way (mul_ first), the
    //    others in place (scaled): every rank multiplies once.
    bucket.copy_(mine);
    if (pg.rank() == 2) {
      bucket.mul_(0.5);
      pg.allreduce(bucket, ReduceKind::kSum);
    } else {
      pg.wait(pg.allreduce_scaled_async(bucket, 0.5), "scaled");
    }
    if (!at::equal(bucket, want(0, numel, 0.5))) wrong += "scaled among unscaled; ";
    // None of the three ran in place; the next, alike everywhere, does.
    if (shm_in_place_count(pg.backend()) != 0) wrong += "a mix ran in place; ";
    bucket.copy_(mine);
    pg.allreduce(bucket, ReduceKind::kSum);
    if (!at::equal(bucket, want(0, numel, 1.0))) wrong += "after the mixes; ";
    if (shm_in_place_count(pg.backend()) != 1) wrong += "not in place after the mixes; ";
    return wrong;
  });
}

TEST_CASE("shm buckets: a rank's mappings go with its tensor, which may outlive the backend",
          "[shm][buckets]") {
  const int n = 3;
  const int before = shared_mappings();
  std::atomic<int> segments{-1}, with_buckets{-1}, after_free{-1};
  auto outcomes = run_ranks<at::Tensor>(
      n,
      [&](ProcessGroup& pg) {
        // The ranks are threads of this process: each maps all n copies
        // (and its segment, named alike).
        pg.barrier();
        if (pg.rank() == 0) segments = shared_mappings();
        pg.barrier();
        auto freed = pg.bucket_zeros(1000, at::TensorOptions(at::kFloat));
        auto kept = pg.bucket_zeros(2000, at::TensorOptions(at::kFloat));
        kept.fill_(pg.rank() + 1);
        pg.allreduce(kept, ReduceKind::kSum);
        pg.barrier();
        if (pg.rank() == 0) with_buckets = shared_mappings();
        pg.barrier();
        freed = at::Tensor();
        pg.barrier();
        if (pg.rank() == 0) after_free = shared_mappings();
        pg.barrier();
        return kept;  // outlives this rank's backend
      },
      kTimeout, kShm);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << error_text(outcomes[r].error));
    REQUIRE_FALSE(outcomes[r].error);
  }
  CHECK(with_buckets.load() == segments.load() + 2 * n * n);
  CHECK(after_free.load() == segments.load() + n * n);  // the freed tensors' mappings went
  // The backends are gone; the kept tensors are plain memory, readable and writable.
  CHECK(shared_mappings() == before + n * n);
  for (int r = 0; r < n; ++r) {
    CHECK(at::equal(outcomes[r].result, at::full({2000}, 6.0f)));
    outcomes[r].result.add_(1);
    CHECK(outcomes[r].result.sum().item<double>() == 7.0 * 2000);
  }
  for (auto& o : outcomes) o.result = at::Tensor();
  CHECK(shared_mappings() == before);
}

TEST_CASE("shm buckets: ranks that scale differently sum through the segment, each its own",
          "[shm][buckets]") {
  expect_all_ranks(3, [&](ProcessGroup& pg) {
    std::string wrong;
    auto bucket = pg.bucket_zeros(10000, at::TensorOptions(at::kFloat));
    bucket.copy_(random_values(pg.rank(), 10000, at::kFloat));
    // A weight per rank (its share of a batch, say): 1/2, 1/3, 1/4.
    pg.wait(pg.allreduce_scaled_async(bucket, 1.0 / (pg.rank() + 2)), "scaled");
    auto want = at::zeros({10000}, at::kFloat);
    for (int r = 0; r < pg.size(); ++r)
      want += random_values(r, 10000, at::kFloat).mul_(1.0 / (r + 2));
    if (!at::equal(bucket, want)) wrong += "not each rank's own scale; ";
    if (shm_in_place_count(pg.backend()) != 0) wrong += "ran in place; ";
    return wrong;
  });
}

TEST_CASE("shm buckets: the line kernel's bits are the segment kernel's at every offset and length",
          "[shm][buckets]") {
  // In one process: n copies at the same offset in their buffers (as every
  // rank's copy of a bucket is), reduced in place by shm_reduce_copies,
  // against shm_reduce into a separate output from the same inputs.
  const std::vector<at::ScalarType> dtypes{at::kFloat, at::kDouble, at::kHalf, at::kBFloat16,
                                           at::kInt,   at::kLong,   at::kChar, at::kByte};
  const std::vector<ShmOp> ops{ShmOp::kSum, ShmOp::kAvg, ShmOp::kMin, ShmOp::kMax, ShmOp::kProduct};
  std::string wrong;
  int compared = 0;
  for (auto dtype : dtypes) {
    const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
    for (int n = 1; n <= 4; ++n) {
      for (int64_t offset : {int64_t{0}, int64_t{1}, 64 / elem - 1, 64 / elem + 3}) {
        for (int64_t len : {0, 1, 7, 16, 17, 63, 64, 65, 1000, 4099}) {
          std::vector<at::Tensor> inputs, buffers;
          std::vector<const void*> in_ptrs;
          std::vector<void*> copy_ptrs;
          for (int r = 0; r < n; ++r) {
            inputs.push_back(random_values(r, len, dtype));
            buffers.push_back(at::zeros({offset + len + 64}, dtype));
            buffers.back().narrow(0, offset, len).copy_(inputs.back());
            in_ptrs.push_back(inputs.back().data_ptr());
            copy_ptrs.push_back(static_cast<char*>(buffers.back().data_ptr()) + offset * elem);
          }
          const bool scalable = dtype == at::kFloat || dtype == at::kDouble;
          for (auto op : ops) {
            if (op == ShmOp::kProduct && (dtype == at::kHalf || dtype == at::kBFloat16)) continue;
            for (double scale : {1.0, 1.0 / 3}) {
              if (scale != 1.0 && (op != ShmOp::kSum || !scalable)) continue;
              // A scale: each input multiplied by ATen, then the plain sum.
              auto want = at::empty({len}, dtype);
              std::vector<at::Tensor> scaled;
              std::vector<const void*> want_inputs = in_ptrs;
              if (scale != 1.0) {
                for (int r = 0; r < n; ++r) {
                  scaled.push_back(inputs[r].mul(scale));
                  want_inputs[r] = scaled.back().data_ptr();
                }
              }
              shm_reduce(want.data_ptr(), want_inputs.data(), n, len, dtype, op);
              // Into two outputs, one of them an input (as the segment's
              // reduction writes the shared result and the rank's tensor).
              for (int r = 0; r < n; ++r) buffers[r].narrow(0, offset, len).copy_(inputs[r]);
              auto other = at::zeros({offset + len}, dtype);
              std::vector<const void*> segment_inputs(copy_ptrs.begin(), copy_ptrs.end());
              void* outputs[2] = {static_cast<char*>(other.data_ptr()) + offset * elem,
                                  copy_ptrs[n - 1]};
              shm_reduce_lines({segment_inputs.data(), n, outputs, 2}, len, dtype, op, scale);
              if (!at::equal(other.narrow(0, offset, len), want) ||
                  !at::equal(buffers[n - 1].narrow(0, offset, len), want))
                wrong += std::string("two outputs ") + c10::toString(dtype) + " n " +
                         std::to_string(n) + " len " + std::to_string(len) + "; ";
              for (int r = 0; r < n; ++r) buffers[r].narrow(0, offset, len).copy_(inputs[r]);
              shm_reduce_copies(copy_ptrs.data(), n, len, dtype, op, scale);
              ++compared;
              for (int r = 0; r < n; ++r) {
                // The range holds the result; the elements around it are untouched.
                const bool same =
                    at::equal(buffers[r].narrow(0, offset, len), want) &&
                    at::equal(buffers[r].narrow(0, 0, offset), at::zeros({offset}, dtype)) &&
                    at::equal(buffers[r].narrow(0, offset + len, 64), at::zeros({64}, dtype));
                if (!same)
                  wrong += std::string(c10::toString(dtype)) + " n " + std::to_string(n) +
                           " offset " + std::to_string(offset) + " len " + std::to_string(len) +
                           " op " + std::to_string(static_cast<int>(op)) + " scale " +
                           std::to_string(scale) + " copy " + std::to_string(r) + "; ";
              }
            }
          }
        }
      }
    }
  }
  CHECK(wrong == "");
  CHECK(compared == 4 * 4 * 10 * (2 * 6 + 2 * 4 + 4 * 5));  // n, offsets, lengths; ops per dtype
  // A scale on another op, or on a dtype without a scaled sum, is refused.
  auto t = at::zeros({4}, at::kHalf);
  void* p = t.data_ptr();
  CHECK_THROWS_AS(shm_reduce_copies(&p, 1, 4, at::kHalf, ShmOp::kSum, 0.5), CommError);
}
