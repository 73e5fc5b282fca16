// checkpoint.format: sharded (Note [Sharded checkpoints],
// sharded_checkpoint.cpp): every rank writes the entries it owns to its own
// shard file in the checkpoint's staging folder, rank 0 merges the ranks'
// parts into metadata.txt and publishes the folder (Checkpointer::save);
// loading reads only the byte ranges a rank needs, at any world size and
// optim.zero. checkpoint.async: the same write on a background thread.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/distributed/process_group.h"
#include "lockstep/io/shard_index.h"
#include "lockstep/io/state_dict.h"

namespace lockstep {

// One rank's entries, each named "<part file>/<entry>".
using ShardPieces = std::vector<std::pair<std::string, at::Tensor>>;

// Writes `pieces` to <staging>/shard_<rank>.bin and this rank's part of the
// index to <staging>/.part-<rank> (both fsynced; the part last, so that it
// means "done"). On failure a <staging>/.failed-<rank> holds the words
// (best effort) and the error is rethrown.
void write_rank_shard(const std::string& staging, int rank, int64_t zero, int64_t step,
                      const ShardPieces& pieces);

// Rank 0: every rank's part (waiting up to `wait` for them to appear; a
// .failed-<r> ends the wait with rank r's words) merged into one index in
// `order`'s order (entries it does not name last, in part order); the
// parts are removed. DataError naming the ranks whose part never came,
// or at once when `cancelled` turns true (the process is ending).
ShardIndex merge_shard_parts(const std::string& staging, int world, int64_t zero, int64_t step,
                             const std::vector<std::string>& order, std::chrono::seconds wait,
                             const std::atomic<bool>* cancelled = nullptr);

// Collective: the shard files' SHA-256s against the index (which the
// verified MANIFEST vouches for), each file hashed by one rank (r, r + M,
// ...); every rank throws the same DataError naming the first bad file.
void verify_shards(ProcessGroup& pg, const std::string& folder, const ShardIndex& index);

// Collective: the entries of `part` ("model.pt") that this rank needs, by
// their names without the part's prefix. `every`: every entry, each read
// by one rank (balanced by bytes) and broadcast from it; otherwise the
// entries `reads` accepts, read by this rank alone. Failures agreed.
StateDict read_sharded_part(ProcessGroup& pg, const std::string& folder, const ShardIndex& index,
                            const std::string& part, bool every,
                            const std::function<bool(const std::string&)>& reads);

// One process: every entry of `part` (consolidate, eval, export, generate).
StateDict read_whole_part(const std::string& folder, const ShardIndex& index,
                          const std::string& part);

// checkpoint.async: one save in flight on a background thread.
class BackgroundSave {
 public:
  BackgroundSave() = default;
  ~BackgroundSave();  // cancels a wait for other ranks, then joins
  BackgroundSave(const BackgroundSave&) = delete;
  BackgroundSave& operator=(const BackgroundSave&) = delete;
  bool in_flight() const { return thread_.joinable(); }
  // Runs `job` on a thread; the previous one must have been waited for.
  void start(std::function<void()> job);
  // Waits for the job in flight; returns its error's words ("" when it
  // succeeded or none was in flight) and the seconds waited.
  std::string wait(double* waited_seconds = nullptr);
  const std::atomic<bool>* cancelled() const { return &cancel_; }
  // When the last job ended (valid after wait()).
  std::chrono::steady_clock::time_point finished() const { return finished_; }

 private:
  std::chrono::steady_clock::time_point finished_;
  std::atomic<bool> cancel_{false};
  std::thread thread_;
  std::string problem_;
};

}  // namespace lockstep
