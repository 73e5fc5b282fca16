// Coalesced broadcast: many tensors in a few collectives. Tensors are grouped
// by dtype and device (in order), each group flattened into one buffer of at
// most `cap_bytes` (a tensor larger than the cap travels alone), broadcast,
// and copied back. Used for DDP's initial sync and buffer broadcasts.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "lockstep/distributed/process_group.h"

namespace lockstep {

void broadcast_coalesced(ProcessGroup& pg, const std::vector<at::Tensor>& tensors, int root,
                         size_t cap_bytes = 256u << 20);

}  // namespace lockstep
