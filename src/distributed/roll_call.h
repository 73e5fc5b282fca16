// The roll call after a failed collective (Note [Roll call],
// include/lockstep/distributed/process_group.h): which ranks still answer
// through the job's store. Synchronous; ProcessGroup runs it on a helper
// thread with a bound of its own.
#pragma once

#include <chrono>
#include <string>

#include "lockstep/distributed/torch_compat.h"

namespace lockstep {

struct RollCallOptions {
  // How long each rank waits for the others' rollcall/<rank>.
  std::chrono::milliseconds grace{5000};
  // How long rank 0, which hosts the store under env rendezvous, stays after
  // its own answer for the ranks that answered to finish theirs.
  std::chrono::milliseconds linger{2000};
  // Between two polls of every rank's key.
  std::chrono::milliseconds poll{50};
};

// Sets rollcall/<rank>, polls every rank's key until all are there or
// `grace` has passed, sets rollcall/done/<rank> and, on rank 0, waits up to
// `linger` for the done keys of every rank that has answered by then. Returns the text
// appended to the collective's error, starting with "; ": the ranks that did
// not answer, or that every rank answered. Should the store fail after a
// complete poll, that poll's missing ranks are named (the host left); before
// one, the store's failure is. Throws nothing but what building its text can (out of memory).
std::string roll_call_answer(C10dStore& store, int rank, int size, const RollCallOptions& options);

}  // namespace lockstep
