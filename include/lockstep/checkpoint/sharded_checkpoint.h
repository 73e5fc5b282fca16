// checkpoint.format: sharded (Note [Sharded checkpoints],
// sharded_checkpoint.cpp): every rank writes the entries it owns to its own
// shard file in the checkpoint's staging folder, rank 0 merges the ranks'
// parts into metadata.txt and publishes the folder (Checkpointer::save);
// loading reads only the byte ranges a rank needs, at any world size and
// optim.zero. checkpoint.async: the same write on a background thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
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

// checkpoint.async's host buffer: one anonymous mapping with transparent
// huge pages asked for (a 2 MiB page faulted in where 512 would be), kept
// for the run and reused save to save. std::bad_alloc when it cannot be had.
class HostArena {
 public:
  HostArena() = default;
  ~HostArena();
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;
  // At least `bytes`, mapped afresh only when the last mapping is smaller.
  char* reserve(size_t bytes);

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
};

// checkpoint.async: one save in flight on a background thread, at
// SCHED_IDLE priority (Note [Sharded checkpoints]).
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
  // Ends the job's waits for other ranks (merge_shard_parts).
  void cancel() { cancel_ = true; }
  // The job says its own shard is written (or failed); wait_written()
  // blocks until it has said so or ended, and tells which.
  void mark_written(bool ok);
  bool wait_written();
  // When the last job ended (valid after wait()).
  std::chrono::steady_clock::time_point finished() const { return finished_; }

 private:
  std::chrono::steady_clock::time_point finished_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int written_ = 0;  // 0: not yet, 1: written, -1: failed
  bool ended_ = false;
  std::atomic<bool> cancel_{false};
  std::thread thread_;
  std::string problem_;
};

}  // namespace lockstep
