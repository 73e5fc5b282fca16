#include "lockstep/distributed/coalesced.h"

#include <ATen/ATen.h>

#include <map>

namespace lockstep {

void broadcast_coalesced(ProcessGroup& pg, const std::vector<at::Tensor>& tensors, int root,
                         size_t cap_bytes) {
  if (pg.size() == 1 || tensors.empty()) return;
  at::NoGradGuard no_grad;
  // Group indices by (dtype, device), keeping first-seen order: identical on
  // every rank because the tensor lists are (checked to be) identical.
  std::vector<std::vector<size_t>> groups;
  std::map<std::pair<int, std::string>, size_t> group_of;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto key =
        std::make_pair(static_cast<int>(tensors[i].scalar_type()), tensors[i].device().str());
    auto it = group_of.find(key);
    if (it == group_of.end()) {
      it = group_of.emplace(key, groups.size()).first;
      groups.emplace_back();
    }
    groups[it->second].push_back(i);
  }
  for (const auto& group : groups) {
    size_t begin = 0;
    while (begin < group.size()) {
      size_t end = begin;
      size_t bytes = 0;
      while (end < group.size() &&
             (end == begin || bytes + tensors[group[end]].nbytes() <= cap_bytes)) {
        bytes += tensors[group[end]].nbytes();
        ++end;
      }
      std::vector<at::Tensor> flat_parts;
      for (size_t k = begin; k < end; ++k) flat_parts.push_back(tensors[group[k]].reshape({-1}));
      auto flat = at::cat(flat_parts);
      pg.broadcast(flat, root);
      int64_t offset = 0;
      for (size_t k = begin; k < end; ++k) {
        at::Tensor t = tensors[group[k]];
        t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
        offset += t.numel();
      }
      begin = end;
    }
  }
}

}  // namespace lockstep
