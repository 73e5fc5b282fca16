// The run directory's ownership: a fresh run never mixes into another run's
// results, and a run resumed from an older checkpoint leaves the later ones
// of the abandoned line aside (Note [Run directories]).
#pragma once

#include <cstdint>
#include <string>

namespace lockstep {

// Rank 0, once the run is assembled, for a fresh run (no
// checkpoint.resume). When `run_dir` holds another run's results (a
// checkpoint of lockstep's, or metrics.jsonl with a step's record): an
// earlier attempt of this same job (`job`, non-empty, matches the one the
// folder was claimed for) or `overwrite` (run.overwrite) moves lockstep's
// outputs there (checkpoints/, metrics.jsonl, TensorBoard events,
// config.yaml, rank logs, traces) into <run_dir>/overwritten-<UTC time>/;
// otherwise ConfigError naming them and the ways on. Then records `job` as
// the folder's claimant. Returns what it moved, a line ("" if nothing).
std::string run_dir_claim(const std::string& run_dir, bool overwrite, const std::string& job);

// Rank 0, for a run resumed from a named checkpoint at `step`: moves the
// checkpoints of that run directory past `step` into
// <run_dir>/superseded-<UTC time>/, so that rotation does not remove the
// resumed run's own checkpoints in their favour and `resume: auto` does not
// return to them. Returns what it moved, a line ("" if nothing).
std::string run_dir_set_aside_after(const std::string& run_dir, int64_t step);

// Note [One live job per run directory]: rank 0's hold on <run_dir>, an
// exclusive flock on <run_dir>/.lockstep-lock that the kernel drops when
// the process ends however it ends. Taken before anything in the folder is
// read or changed; held until destroyed.
class RunDirLock {
 public:
  RunDirLock() = default;
  // ConfigError (exit 2) when a live job holds the folder, naming it (what
  // it wrote into the lock file: host, pid, job, start time). A filesystem
  // without locks (some FUSE and SMB mounts) gives an unlocked RunDirLock
  // and `warning` says so. `holder` is this job's line for the file.
  static RunDirLock acquire(const std::string& run_dir, const std::string& holder,
                            std::string* warning);
  ~RunDirLock();
  RunDirLock(RunDirLock&& other) noexcept;
  RunDirLock& operator=(RunDirLock&& other) noexcept;
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;
  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// This process's line for the lock file: "host H, pid P, job J, since T".
std::string run_dir_holder(const std::string& job);

}  // namespace lockstep
