// SyncBatchNorm's exchange (model/sync_batchnorm.h) over a process group:
// its all-gather and all-reduce, with the layer named in a failure (a rank
// in eval mode while another trains, a rank that left the job).
//
//   lockstep::convert_sync_batchnorm(model, lockstep::batch_stats_exchange(pg));
#pragma once

#include <memory>

#include "lockstep/distributed/process_group.h"
#include "lockstep/util/stats_exchange.h"

namespace lockstep {

std::shared_ptr<StatsExchange> batch_stats_exchange(std::shared_ptr<ProcessGroup> pg);

}  // namespace lockstep
