// The hierarchical backend: for ranks on several hosts, each host reduces
// through its shm backend, one leader per host (local rank 0) exchanges over
// Gloo, and each host broadcasts the result (Note [Hierarchical backend]).
#pragma once

#include "lockstep/distributed/torch_compat.h"
#include "lockstep/distributed/world.h"

namespace lockstep {

// `local`: the shm backend of this host's ranks (rank = local rank);
// `leaders`: Gloo among the hosts' local rank 0 (rank = node rank), null on
// the other ranks. Ranks must be numbered node * local size + local rank.
Ptr<C10dBackend> hier_backend_make(Ptr<C10dBackend> local, Ptr<C10dBackend> leaders,
                                   const WorldInfo& world, int nodes);

}  // namespace lockstep
