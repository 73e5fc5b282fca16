// A stateful comm hook's state (PowerSGD's error buffers and Qs) in a
// checkpoint: every rank's, gathered to all (rank 0 writes it), keys
// "rank<r>.<key>"; and back, each rank taking its own.
#pragma once

#include <string>

#include "lockstep/ddp/comm_hooks.h"
#include "lockstep/distributed/process_group.h"
#include "lockstep/train/state_dict.h"

namespace lockstep {

// Collective. Empty when the hook keeps no state. Throws CommError when the
// ranks' states differ in their keys or shapes (they never should).
StateDict hook_state_gather(ProcessGroup& pg, const CommHook& hook);

// `saved` from a checkpoint (`source` names it for messages); `world_size`:
// the ranks that wrote it. A stateful hook without saved state, or saved by
// another world size, starts over with a warning; state saved by a hook
// that is no longer used is ignored.
void hook_state_restore(CommHook* hook, const StateDict& saved, int rank, int64_t world_size,
                        int64_t saved_world_size, const std::string& source);

}  // namespace lockstep
