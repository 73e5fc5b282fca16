#include "lockstep/checkpoint/hook_state.h"

#include <ATen/ATen.h>

#include <spdlog/spdlog.h>

#include <map>

#include "lockstep/util/error.h"

namespace lockstep {

StateDict hook_state_gather(ProcessGroup& pg, const CommHook& hook, const DdpCore& ddp) {
  HookState mine = hook.state_dict();
  // Agree on the entries first (count, then each one's size): a rank whose
  // state differs must fail here, not pair the wrong tensors; counted even
  // when empty, so no rank leaves while another goes on.
  const auto count = at::full({1}, static_cast<int64_t>(mine.size()), at::kLong);
  for (const auto& c : pg.allgather(count.to(pg.device()))) {
    if (c.cpu().item<int64_t>() != static_cast<int64_t>(mine.size())) {
      throw CommError(
          "the comm hook's state differs across ranks in its entries; cannot checkpoint it");
    }
  }
  if (mine.empty()) return {};
  auto sizes = at::empty({static_cast<int64_t>(mine.size())}, at::kLong);
  for (size_t i = 0; i < mine.size(); ++i) sizes[static_cast<int64_t>(i)] = mine[i].second.numel();
  for (const auto& s : pg.allgather(sizes.to(pg.device()))) {
    if (!s.cpu().equal(sizes)) {
      throw CommError(
          "the comm hook's state differs across ranks in its sizes; cannot checkpoint it");
    }
  }
  const bool keep = pg.rank() == 0;
  std::vector<StateDict> per_rank(static_cast<size_t>(pg.size()));
  for (const auto& [key, t] : mine) {
    if (t.numel() == 0) {  // nothing to exchange (and Gloo cannot all-gather it)
      if (keep) {
        for (auto& rank : per_rank) rank.emplace_back(key, t.cpu());
      }
      continue;
    }
    auto gathered = pg.allgather(t.contiguous().to(pg.device()));
    if (!keep) continue;  // one entry of every rank at a time, then dropped
    for (size_t r = 0; r < gathered.size(); ++r) per_rank[r].emplace_back(key, gathered[r].cpu());
  }
  StateDict all;
  if (!keep) return all;
  if (const Reducer* reducer = ddp.reducer()) {
    // Before the one-time rebuild there is none to keep: a resume rebuilds.
    const auto order = reducer->bucket_order();
    if (!order.empty()) all.emplace_back("ddp.bucket_order", at::tensor(order, at::kLong));
  }
  for (size_t r = 0; r < per_rank.size(); ++r) {
    for (auto& [key, t] : per_rank[r]) all.emplace_back("rank" + std::to_string(r) + "." + key, t);
  }
  return all;
}

void hook_state_restore(CommHook* hook, DdpCore& ddp, const StateDict& saved, int rank,
                        int64_t world_size, int64_t saved_world_size, const std::string& source) {
  const bool stateful = hook != nullptr && !hook->state_dict().empty();
  if (!stateful) {
    if (!saved.empty()) {
      spdlog::info("{}: holds a comm hook's state; this run's ddp.comm_hook keeps none: ignored",
                   source);
    }
    return;
  }
  if (saved.empty() || saved_world_size != world_size) {
    spdlog::warn("{}: no comm hook state for {} rank(s): comm hook '{}' starts over", source,
                 world_size, hook->name());
    return;
  }
  std::vector<HookState> per_rank(static_cast<size_t>(world_size));
  at::Tensor order;
  for (const auto& [key, t] : saved) {
    if (key == "ddp.bucket_order") {
      if (t.dim() != 1 || t.scalar_type() != at::kLong) {
        throw DataError(source + ": 'ddp.bucket_order' is not a 1-D int64 tensor");
      }
      order = t;
      continue;
    }
    const auto dot = key.find('.');
    const std::string who = key.substr(0, dot);
    int64_t r = -1;
    if (dot != std::string::npos && who.size() > 4 && who.size() <= 10 &&
        who.compare(0, 4, "rank") == 0 &&
        who.find_first_not_of("0123456789", 4) == std::string::npos) {
      r = std::stoll(who.substr(4));
    }
    if (r < 0 || r >= world_size) {
      throw DataError(source + ": '" + key.substr(0, 64) + "' names no rank of " +
                      std::to_string(world_size));
    }
    per_rank[static_cast<size_t>(r)].emplace_back(key.substr(dot + 1), t);
  }
  // What every rank must share (PowerSGD: iter, Q, layouts) is present for
  // every rank and equal.
  std::map<std::string, at::Tensor> shared;
  for (size_t r = 0; r < per_rank.size(); ++r) {
    if (per_rank[r].empty()) throw DataError(source + ": no entry for rank " + std::to_string(r));
    size_t shared_here = 0;
    for (const auto& [key, t] : per_rank[r]) {
      if (hook->state_per_rank(key)) continue;
      ++shared_here;
      auto [it, fresh] = shared.emplace(key, t);
      if (r > 0 && fresh) {
        throw DataError(source + ": rank " + std::to_string(r) + " has '" + key.substr(0, 64) +
                        "', rank 0 has not; it must be the same on every rank");
      }
      // Compared bit for bit: a NaN equal on every rank is the same value
      // here (and refused for what it is by Checkpointer::check_values).
      const auto bits = [](const at::Tensor& x) {
        return x.contiguous().reshape({-1}).view(at::kByte);
      };
      if (!fresh &&
          !(it->second.sizes() == t.sizes() && it->second.scalar_type() == t.scalar_type() &&
            bits(it->second).equal(bits(t)))) {
        throw DataError(source + ": '" + key.substr(0, 64) + "' differs between rank 0 and rank " +
                        std::to_string(r) + "; it must be the same on every rank");
      }
    }
    if (shared_here != shared.size()) {
      throw DataError(source + ": rank " + std::to_string(r) + " lacks entries rank 0 has (" +
                      std::to_string(shared_here) + " of " + std::to_string(shared.size()) +
                      " shared ones); they must be the same on every rank");
    }
  }
  // Every rank's entries are checked here, its own last, so a bad file
  // fails every rank alike instead of one rank while the others wait.
  for (size_t r = 0; r < per_rank.size(); ++r) {
    if (static_cast<int>(r) != rank) hook->load_state_dict(per_rank[r], source);
  }
  hook->load_state_dict(per_rank[static_cast<size_t>(rank)], source);
  if (order.defined()) {
    const auto o = order.contiguous();
    try {
      ddp.restore_bucket_order(
          std::vector<int64_t>(o.data_ptr<int64_t>(), o.data_ptr<int64_t>() + o.numel()));
    } catch (const DataError& e) {
      throw DataError(source + ": 'ddp.bucket_order': " + e.what());
    }
  }
}

}  // namespace lockstep
