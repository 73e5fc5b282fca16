// A stateful comm hook's state (PowerSGD's error buffers and Qs) in a
// checkpoint: every rank's, gathered to rank 0, which writes it, keys
// "rank<r>.<key>", with DDP's bucket order ("ddp.bucket_order": the state
// is per bucket); and back, each rank taking its own.
#pragma once

#include <string>

#include "lockstep/ddp/ddp.h"
#include "lockstep/io/state_dict.h"

namespace lockstep {

// Collective. On rank 0 the entries to save (empty when the hook keeps no
// state); empty on the other ranks, which hold one entry of every rank at a
// time while it is gathered. Throws CommError when the ranks' states
// differ in their entries or sizes (they never should).
StateDict hook_state_gather(ProcessGroup& pg, const CommHook& hook, const DdpCore& ddp);

// `saved` from a checkpoint (`source` names it for messages), written by
// `saved_world_size` ranks. Every rank checks every rank's entries (so a
// bad file fails every rank alike) and that the entries the hook shares
// across ranks are equal, restores its own state, then DDP's bucket order.
// A stateful hook without saved state starts over with a warning; state
// saved by a hook that is no longer used is ignored.
void hook_state_restore(CommHook* hook, DdpCore& ddp, const StateDict& saved, int rank,
                        int64_t world_size, int64_t saved_world_size, const std::string& source);

}  // namespace lockstep
