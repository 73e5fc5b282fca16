// Objects whose destruction peers would notice, held back while an error
// unwinds until the error has been reported (Note [Report before teardown]).
#pragma once

#include <memory>

namespace lockstep {

// Note [Report before teardown]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A rank that fails on its own unwinds its stack before run_guarded prints
// the error: destroying the process group and the store on the way closes
// the sockets and shm segment its peers use. A peer then fails at once
// ("communication failed", exit 3), and its error line can carry an earlier
// timestamp than the cause's, which lockstep-run would name the root cause
// (docs/launcher.md), exiting 3 instead of the cause's code. So
// Distributed's destructor, when it runs during unwinding, hands its process
// group and store to keep_until_reported; run_guarded releases them right
// after printing the error, and init_distributed before it meets a new world
// (a program that catches the error and starts over); what is still held
// at the program's exit is released then.

// Holds `object` until release_kept() (or the program's exit). Thread-safe;
// one list per process: a release on any thread releases everything held
// (a process holds one world, as lockstep's programs do).
void keep_until_reported(std::shared_ptr<void> object);

// Destroys what keep_until_reported holds, in the order it was handed in.
void release_kept();

}  // namespace lockstep
