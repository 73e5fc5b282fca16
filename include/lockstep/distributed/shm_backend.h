// The shared-memory backend: collectives among ranks of one host through a
// segment in /dev/shm instead of TCP loopback (Note [Shared-memory backend],
// src/distributed/shm_backend.cpp). A c10d backend like Gloo's, so the
// Reducer's asynchronous bucket all-reduces work unchanged.
#pragma once

#include <chrono>
#include <cstddef>

#include "lockstep/distributed/shm_options.h"
#include "lockstep/distributed/torch_compat.h"
#include "lockstep/distributed/world.h"

namespace lockstep {

// Every rank must call it; `store` is the process group's (prefixed) store.
// Throws ConfigError when the ranks are not all on this host, CommError
// when the segment cannot be made or a rank never maps it.
Ptr<C10dBackend> shm_backend_create(const Ptr<C10dStore>& store, const WorldInfo& world,
                                    const ShmOptions& options);

// Whether every rank runs on this host (boot id and host name compared
// through `store`); every rank must call it.
bool all_ranks_on_one_host(C10dStore& store, const WorldInfo& world,
                           std::chrono::milliseconds timeout);

}  // namespace lockstep
