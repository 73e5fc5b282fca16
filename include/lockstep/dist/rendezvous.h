// Rendezvous: connect to the job's key-value store and wait for every rank.
//
// World size 1: an in-memory c10d::HashStore, no network.
// Otherwise a c10d::TCPStore at MASTER_ADDR:MASTER_PORT. Rank 0 hosts it,
// except under torchrun (TORCHELASTIC_USE_AGENT_STORE=True) where the agent
// already hosts it; every rank is then a client and, like PyTorch's own
// workers, prefixes its keys with /worker/attempt_<restart count>.
#pragma once

#include <chrono>

#include "lockstep/dist/torch_compat.h"
#include "lockstep/dist/world.h"

namespace lockstep {

struct RendezvousOptions {
  // How long to wait for the store to be reachable and for every rank to
  // arrive. A rank that has not arrived by then is named in the error.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

// Connects and waits until every rank has connected. Throws TimeoutError
// naming host:port (store unreachable) or the missing ranks.
Ptr<C10dStore> rendezvous_connect(const WorldInfo& world, const RendezvousOptions& options);

}  // namespace lockstep
