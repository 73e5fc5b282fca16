// What synchronised batch normalisation (model/sync_batchnorm.h) needs from
// the ranks, as an interface: the model layer knows no process group.
// ddp/batch_stats_exchange.h makes one from a ProcessGroup.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace lockstep {

class StatsExchange {
 public:
  virtual ~StatsExchange() = default;
  virtual int size() const = 0;
  // Every rank's `local` (a 1-d tensor of the same length on every rank),
  // stacked in rank order: [size(), local.numel()]. `what` names the
  // caller for an error (a rank that never joins, another length).
  virtual at::Tensor all_gather(const at::Tensor& local, const std::string& what) = 0;
  // In place: the sum over the ranks.
  virtual void all_reduce_sum(at::Tensor& tensor, const std::string& what) = 0;
};

}  // namespace lockstep
