// ZeRO-2's comm hook (ddp/zero_grad_hook.h): the reduce-scatter of each
// bucket to its parameters' owners.
#include "lockstep/zero/zero_grad_hook.h"

#include <ATen/ATen.h>

#include <spdlog/spdlog.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/util/error.h"

namespace lockstep {

namespace {

class ZeroGradHook : public CommHook {
 public:
  ZeroGradHook(std::vector<int> owners, int rank) : owners_(std::move(owners)), rank_(rank) {}
  std::string name() const override { return "zero2 reduce-scatter"; }

  HookWork run_bucket(ProcessGroup& pg, GradBucket& bucket) override {
    if (!pg.reduce_scatter_native()) {
      // No reduce-scatter here (LibTorch 1's Gloo, the hierarchical
      // backend): the all-reduce of the bucket as it is, the exchange of
      // optim.zero 0 bit for bit; the owners keep their part.
      if (!said_) {
        said_ = true;
        spdlog::info(
            "optim.zero: 2: the {} backend has no reduce-scatter here: each bucket is "
            "all-reduced (the traffic of optim.zero 0), the gradients still sharded",
            pg.backend().getBackendName());
      }
      return {pg.allreduce_async(bucket.buffer, ReduceKind::kSum), nullptr, nullptr,
              static_cast<int64_t>(bucket.buffer.nbytes())};
    }
    const int world = pg.size();
    Packing& pack = packing(bucket, world);
    if (!pack.scatter) {
      // One owner holds most of the bucket (a large parameter alone in
      // it): the padded reduce-scatter would move more than the all-reduce.
      return {pg.allreduce_async(bucket.buffer, ReduceKind::kSum), nullptr, nullptr,
              static_cast<int64_t>(bucket.buffer.nbytes())};
    }
    at::NoGradGuard no_grad;
    pack.input.zero_();
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      const int64_t n = bucket.gradients[j].numel();
      pack.input.narrow(0, pack.at[j], n).copy_(bucket.buffer.narrow(0, bucket.offsets[j], n));
    }
    auto scattering = std::make_shared<ProcessGroup::Scattering>(
        pg.reduce_scatter_async(pack.output, pack.input));
    ProcessGroup* group = &pg;
    at::Tensor buffer = bucket.buffer;
    auto places = pack.mine;  // (offset in the bucket, offset in my chunk, count)
    HookWork work;
    work.work = scattering->work;
    work.bytes = static_cast<int64_t>(pack.input.nbytes());
    at::Tensor output = pack.output;
    work.finish = [group, scattering, buffer, places, output]() mutable {
      scattering->work = {};  // the Reducer waited for it
      group->wait(*scattering, "reduce_scatter");
      for (const auto& [at_bucket, at_chunk, n] : places)
        buffer.narrow(0, at_bucket, n).copy_(output.narrow(0, at_chunk, n));
    };
    return work;
  }

 private:
  struct Packing {
    std::vector<int64_t> params, offsets;  // the bucket it was made for
    bool scatter = true;                   // false: the bucket is all-reduced
    at::Tensor input, output;
    std::vector<int64_t> at;  // each gradient's place in `input`
    std::vector<std::tuple<int64_t, int64_t, int64_t>> mine;
  };

  Packing& packing(const GradBucket& bucket, int world) {
    // DDP rebuilds its buckets once, in the order gradients arrived: a
    // bucket of the same index may then hold other parameters.
    auto it = packings_.find(bucket.index);
    if (it != packings_.end() && it->second.params == bucket.params &&
        it->second.offsets == bucket.offsets)
      return it->second;
    Packing p;
    p.params = bucket.params;
    p.offsets = bucket.offsets;
    std::vector<int64_t> fill(static_cast<size_t>(world), 0);
    for (size_t j = 0; j < bucket.params.size(); ++j)
      fill[static_cast<size_t>(owners_.at(static_cast<size_t>(bucket.params[j])))] +=
          bucket.gradients[j].numel();
    const int64_t chunk = std::max<int64_t>(1, *std::max_element(fill.begin(), fill.end()));
    std::fill(fill.begin(), fill.end(), 0);
    const int me = rank_;
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      const int owner = owners_.at(static_cast<size_t>(bucket.params[j]));
      const int64_t n = bucket.gradients[j].numel();
      p.at.push_back(owner * chunk + fill[static_cast<size_t>(owner)]);
      if (owner == me) p.mine.emplace_back(bucket.offsets[j], fill[static_cast<size_t>(owner)], n);
      fill[static_cast<size_t>(owner)] += n;
    }
    // A reduce-scatter moves (world - 1) / world of its padded input per
    // rank, an all-reduce 2 (world - 1) / world of the bucket, and the
    // packed input is one more buffer of that size: scatter only when the
    // padding adds at most a quarter (the owners' shares nearly even).
    p.scatter = chunk * world * 4 <= bucket.buffer.numel() * 5;
    if (p.scatter) {
      p.input = at::zeros({chunk * world}, bucket.buffer.options());
      p.output = at::empty({chunk}, bucket.buffer.options());
    }
    return packings_[bucket.index] = std::move(p);
  }
  std::vector<int> owners_;
  int rank_;
  bool said_ = false;
  std::map<size_t, Packing> packings_;
};

}  // namespace

std::shared_ptr<CommHook> zero_grad_hook(std::vector<int> owners, int rank) {
  return std::make_shared<ZeroGradHook>(std::move(owners), rank);
}

}  // namespace lockstep
