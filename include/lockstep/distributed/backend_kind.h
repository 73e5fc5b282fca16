// Which process group backend: the enum and its one name table, apart from
// process_group.h so that plain-data headers (the config) need no c10d.
#pragma once

#include "lockstep/util/names.h"

namespace lockstep {

// kAuto: shm when every rank shares one host; hierarchical (shm inside each
// host, Gloo between them) when several hosts hold the same number of ranks
// each; Gloo otherwise (CPU tensors; NCCL is chosen by name).
// ProcessGroup::kind() tells what auto became.
enum class BackendKind { kAuto, kGloo, kShm, kHier, kNccl, kMpi };
inline constexpr NameTable<BackendKind, 6> kBackendKindNames{{{BackendKind::kAuto, "auto"},
                                                              {BackendKind::kGloo, "gloo"},
                                                              {BackendKind::kShm, "shm"},
                                                              {BackendKind::kHier, "hierarchical"},
                                                              {BackendKind::kNccl, "nccl"},
                                                              {BackendKind::kMpi, "mpi"}}};

}  // namespace lockstep
