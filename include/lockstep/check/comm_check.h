// The communication self-check (`lockstep check --comm`).
//
// For every case, every rank contributes values that identify it and compares
// the result with an answer it computes alone, in closed form (e.g. a SUM of
// (rank+1)*100 + i%7 over n ranks is 100*n(n+1)/2 + n*(i%7)). All values are
// small integers, exact in every dtype tested, so comparisons are exact.
// At the end the per-case verdicts of all ranks are all-gathered, so every
// rank holds the same report and exits alike.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/distributed/process_group.h"

namespace lockstep {

struct CommCheckOptions {
  // Element counts: one, an odd size, several MB.
  std::vector<int64_t> sizes{1, 1001, 1 << 20};
  // Fault injection, to show that the check can fail: this rank contributes
  // wrong values to every case (-1: none).
  int corrupt_rank = -1;
  // Where the tensors live; unset: the backend's device (CUDA for NCCL). Gloo
  // also reduces CUDA tensors (two ranks sharing one GPU, say).
  std::optional<at::Device> device;
};

struct CommCheckCase {
  std::string op;     // "allreduce sum", "broadcast root 1", "allgather", "barrier"
  std::string dtype;  // "float32", "float64", "int64", "-" for barrier
  int64_t numel = 0;
  double max_ms = 0;              // slowest rank's time for this case
  std::vector<int> failed_ranks;  // ranks whose result was wrong
};

struct CommCheckReport {
  int world_size = 1;
  std::string backend;
  std::string device = "cpu";  // where the tensors lived
  std::vector<CommCheckCase> cases;
  bool passed() const;
  std::string table() const;  // one row per case, then a summary line
};

// Runs every case on `pg`. Collective failures (a dead peer, a timeout)
// propagate as CommError; wrong results are recorded in the report.
CommCheckReport comm_check_run(ProcessGroup& pg, const CommCheckOptions& options);

}  // namespace lockstep
