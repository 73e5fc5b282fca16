#include "hook_state.h"

#include <ATen/ATen.h>

#include <spdlog/spdlog.h>

#include "lockstep/util/error.h"

namespace lockstep {

StateDict hook_state_gather(ProcessGroup& pg, const CommHook& hook) {
  const HookState mine = hook.state_dict();
  // Agree on the entries first (count, then each one's size): a rank whose
  // state differs must fail here, not pair the wrong tensors.
  auto shape = at::zeros({static_cast<int64_t>(mine.size()) + 1}, at::kLong);
  shape[0] = static_cast<int64_t>(mine.size());
  for (size_t i = 0; i < mine.size(); ++i)
    shape[static_cast<int64_t>(i) + 1] = mine[i].second.numel();
  const auto count = at::full({1}, static_cast<int64_t>(mine.size()), at::kLong).to(pg.device());
  for (const auto& c : pg.allgather(count)) {
    if (c.item<int64_t>() != static_cast<int64_t>(mine.size())) {
      throw CommError(
          "the comm hook's state differs across ranks in its entries; cannot checkpoint it");
    }
  }
  for (const auto& s : pg.allgather(shape.to(pg.device()))) {
    if (!s.cpu().equal(shape)) {
      throw CommError(
          "the comm hook's state differs across ranks in its sizes; cannot checkpoint it");
    }
  }
  StateDict all;
  std::vector<StateDict> per_rank(static_cast<size_t>(pg.size()));
  for (const auto& [key, t] : mine) {
    const auto gathered = pg.allgather(t.contiguous().to(pg.device()));
    for (size_t r = 0; r < gathered.size(); ++r) {
      per_rank[r].emplace_back("rank" + std::to_string(r) + "." + key, gathered[r].cpu());
    }
  }
  for (auto& rank : per_rank) {
    for (auto& entry : rank) all.push_back(std::move(entry));
  }
  return all;
}

void hook_state_restore(CommHook* hook, const StateDict& saved, int rank, int64_t world_size,
                        int64_t saved_world_size, const std::string& source) {
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
  const std::string prefix = "rank" + std::to_string(rank) + ".";
  HookState mine;
  for (const auto& [key, t] : saved) {
    if (key.compare(0, prefix.size(), prefix) == 0) mine.emplace_back(key.substr(prefix.size()), t);
  }
  if (mine.empty()) throw DataError(source + ": no entry for rank " + std::to_string(rank));
  hook->load_state_dict(mine, source);
}

}  // namespace lockstep
