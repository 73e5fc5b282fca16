// Rendezvous: connect to the job's key-value store and wait for every rank.
//
// World size 1: an in-memory c10d::HashStore, no network.
// Otherwise rank 0 hosts lockstep's own store (StoreServer, Note [Job store])
// at MASTER_ADDR:MASTER_PORT, bound to the one address store_listen_host
// picks, and every rank (rank 0 too) is a JobStore client that presents
// LOCKSTEP_STORE_SECRET. Under torchrun (TORCHELASTIC_USE_AGENT_STORE=True)
// the agent already hosts a c10d::TCPStore: every rank is then its client
// and, like PyTorch's own workers, prefixes its keys with
// /worker/attempt_<restart count>. That store is torchrun's, with its
// properties (every interface, no secret).
#pragma once

#include <chrono>

#include "lockstep/distributed/torch_compat.h"
#include "lockstep/distributed/world.h"
#include "lockstep/util/timeouts.h"

namespace lockstep {

struct RendezvousOptions {
  // How long to wait for the store to be reachable and for every rank to
  // arrive. A rank that has not arrived by then is named in the error.
  std::chrono::milliseconds timeout{kCollectiveTimeout};
};

// The address rank 0's store listens on: MASTER_ADDR's loopback address for a
// job whose ranks all share one host, MASTER_ADDR's own address otherwise.
// Throws EnvError when MASTER_ADDR cannot be resolved, or is a loopback
// address while the job spans several hosts (other hosts could not reach it).
std::string store_listen_host(const WorldInfo& world);

// Connects and waits until every rank has connected. Throws TimeoutError
// naming host:port (store unreachable) or the missing ranks.
Ptr<C10dStore> rendezvous_connect(const WorldInfo& world, const RendezvousOptions& options);

}  // namespace lockstep
