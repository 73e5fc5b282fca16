// The run directory's ownership: a fresh run never mixes into another run's
// results (Note [Run directories]).
#pragma once

#include <string>
#include <vector>

namespace lockstep {

// Rank 0, before anything is written into `run_dir` (which exists). For a
// fresh run (no checkpoint.resume): when the folder holds another run's
// results (checkpoints/ with a checkpoint in it, metrics.jsonl, TensorBoard
// event files), throws ConfigError naming them and the ways on, unless
// `overwrite` (run.overwrite), which moves everything in it into
// <run_dir>/overwritten-<UTC time>/ first. Returns what it moved, a line.
std::string run_dir_claim(const std::string& run_dir, bool overwrite);

}  // namespace lockstep
