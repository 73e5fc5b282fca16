// ZeRO-2's gradient exchange as a DDP comm hook (optim/zero.h, Note [ZeRO]):
// each bucket reduce-scattered to the ranks that own its parameters.
#pragma once

#include <memory>
#include <vector>

#include "lockstep/ddp/comm_hooks.h"

namespace lockstep {

// Stage 2's comm hook: the bucket (pre-divided, as for the all-reduce) is
// packed into one chunk per owner, reduce-scattered, and each owner's
// reduced values are put back in its parameters' places in the bucket; the
// other places keep local values, which ZeroOptimizer::
// release_unowned_grads() drops after backward.
std::shared_ptr<CommHook> zero_grad_hook(std::vector<int> owners, int rank);

}  // namespace lockstep
