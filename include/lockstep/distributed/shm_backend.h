// The shared-memory backend: collectives among ranks of one host through a
// segment in /dev/shm instead of TCP loopback (Note [Shared-memory backend],
// src/distributed/shm_backend.cpp). A c10d backend like Gloo's, so the
// Reducer's asynchronous bucket all-reduces work unchanged.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "lockstep/distributed/shm_options.h"
#include "lockstep/distributed/torch_compat.h"
#include "lockstep/distributed/world.h"

namespace lockstep {

// Every rank must call it; `store` is the process group's (prefixed) store.
// Throws ConfigError when the ranks are not all on this host, CommError
// when the segment cannot be made or a rank never maps it.
Ptr<C10dBackend> shm_backend_create(const Ptr<C10dStore>& store, const WorldInfo& world,
                                    const ShmOptions& options);

// Zeros in memory that every rank of an shm backend maps, for a tensor
// all-reduced again and again (DDP's buckets): its all-reduces read the
// others' copies in place and write the result into each, nothing copied
// through the segment (Note [Buckets in shared memory]). Every rank calls
// it alike (same numel and dtype, same order among its collectives); a rank
// not `willing` votes for private memory. An undefined tensor, with the
// reason in `why`, where not every rank could or would make and map its copy
// (e.g. /dev/shm too small), or `backend` is not shm. Throws CommError when
// the collective itself fails (a peer died, the timeout).
at::Tensor shm_shared_zeros(C10dBackend& backend, int64_t numel, const at::TensorOptions& options,
                            bool willing, std::string* why);

// A SUM all-reduce of each rank's `tensor` times `scale`: the bits of
// tensor.mul_(scale) and then the all-reduce. For a float32/float64 tensor
// in a shared buffer the scale is applied inside the in-place reduction (no
// pass of its own). nullptr when `backend` is not shm.
Ptr<C10dWork> shm_allreduce_scaled(C10dBackend& backend, at::Tensor& tensor, double scale);

// How many all-reduces `backend` (shm) ran in place so far; 0 for others.
int64_t shm_in_place_count(C10dBackend& backend);

// Of `backend`'s (shm) collectives through the segment that choose their
// stores (Note [Choosing the stores], src/distributed/shm_store_choice.cpp):
// how many wrote with streaming stores, and how many were timed for the
// choice (LOCKSTEP_SHM_STREAMING=auto, 64 KiB and more). Zeros for others.
struct ShmStoreCounts {
  int64_t streamed = 0;
  int64_t measured = 0;
};
ShmStoreCounts shm_store_counts(C10dBackend& backend);

// How many times a rank of `backend` (shm) found a rank it waited for last
// seen on its own CPU, and slept at once instead of spinning (Note [A peer
// on the same core], src/distributed/shm_segment.cpp). 0 for others.
int64_t shm_shared_core_waits(C10dBackend& backend);

// Copies `bytes` from `from` to `to` with streaming (non-temporal) stores,
// as the backend writes what its peers read (Note [Streaming into the
// slots], src/distributed/shm_reduce.cpp). False, with nothing copied,
// where this build has no such stores (no SSE2). `bench allreduce` times it
// beside an ordinary tensor copy (plain stores, which read each destination
// line before writing it): the larger of the two is the copy limit.
bool shm_copy_streaming(void* to, const void* from, std::size_t bytes);

// Whether every rank runs on this host (boot id and host name compared
// through `store`); every rank must call it.
bool all_ranks_on_one_host(C10dStore& store, const WorldInfo& world,
                           std::chrono::milliseconds timeout);

}  // namespace lockstep
