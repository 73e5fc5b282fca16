#include "lockstep/checkpoint/sharded_checkpoint.h"

#include <ATen/ATen.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>

#include "lockstep/distributed/agree.h"
#include "lockstep/distributed/coalesced.h"
#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"

namespace lockstep {

// Note [Sharded checkpoints]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// checkpoint.format: sharded writes the model and the optimizer state as
// every rank's shard file instead of rank 0's model.pt and optimizer.pt
// (docs/checkpoints.md). Who writes what is a fixed rule (run_stateful.cpp):
// a parameter and its optimizer state go to the parameter's ZeRO owner (at
// optim.zero 0 to the owner optim.zero 1 would give it: the sorted-greedy
// partition, so every rank writes about 1/N), buffers to the rank with the
// fewest bytes so far. Under optim.zero 3 the owners write their own
// weights: nothing is gathered. rng.pt, comm_hook.pt and the YAML stay rank
// 0's (a few KB per rank).
//
// Saving: rank 0 makes the staging folder .tmp-<name>-<rank 0's pid>; each
// rank streams its entries into shard_<rank>.bin (SHA-256 taken on the
// way out, nothing read back), fsyncs it, then writes .part-<rank> (its
// entries and the file's size and digest) and fsyncs that: a part means its
// shard is whole. Rank 0 merges the parts into metadata.txt, writes its own
// files and a MANIFEST listing every file with its SHA-256, fsyncs the
// folder and renames it into place (Checkpointer::save): the checkpoint
// exists whole or not at all; a kill -9 of any process at any moment
// leaves a .tmp- folder that resume never picks and the next start removes.
// Synchronously the ranks agree after writing (a failure anywhere is every
// rank's, handled as checkpoint.on_error says). With checkpoint.async the
// step's only pause is the copy of each rank's entries to host memory; the
// write runs on a thread (BackgroundSave), rank 0's thread waits for every
// part (or a .failed-<rank>) and publishes; the outcome is agreed at the
// next save or at the end, which wait for it (one save in flight; a wait
// is logged). All ranks write into one folder: ranks on several hosts need
// a filesystem they share (as torch.distributed.checkpoint does).
//
// Loading at any world size M and any stage: every rank reads metadata.txt
// (checked against the files' sizes), the shard files' SHA-256s are
// checked with each file hashed by one rank, then each part is read: the
// weights (every rank needs them before DDP's broadcast) and a plain
// optimizer's state are read one entry by one rank, balanced by bytes, and
// broadcast from it; a ZeroOptimizer's state is read by each owner for its
// own parameters alone. No rank reads the whole checkpoint when M > 1.
namespace {

std::string part_path(const std::string& staging, const char* kind, int rank) {
  return staging + "/." + kind + "-" + std::to_string(rank);
}

int64_t order_key(const std::vector<std::string>& order, const std::map<std::string, int64_t>& at,
                  const std::string& name) {
  const auto slash = name.find(".pt/");
  const std::string part = name.substr(0, slash + 3), entry = name.substr(slash + 4);
  const int64_t base = part == "model.pt" ? 0 : part == "optimizer.pt" ? 1 : 2;
  std::string key = entry;
  if (base == 1) key = entry.substr(0, entry.rfind('.'));  // "<param>.<field>"
  const auto found = at.find(std::string(base == 0 ? "m:" : "p:") + key);
  const int64_t index = found == at.end() ? static_cast<int64_t>(order.size()) : found->second;
  return base * (int64_t{1} << 40) + index;
}

}  // namespace

void write_rank_shard(const std::string& staging, int rank, int64_t zero, int64_t step,
                      const ShardPieces& pieces) {
  try {
    ShardIndex part;
    part.world_size = 1;
    part.zero = zero;
    part.step = step;
    ShardWriter writer(staging + "/" + shard_file_name(rank));
    for (const auto& [name, t] : pieces) part.entries.push_back(writer.append(name, t));
    part.files.push_back(writer.finish());
    // Renamed into place whole: rank 0 parses a part as soon as it exists.
    write_file_replacing(part_path(staging, "part", rank), part.to_text());
  } catch (const std::exception& e) {
    try {
      write_file_replacing(part_path(staging, "failed", rank), what_of(e).substr(0, 2000));
    } catch (...) {
      // best effort: rank 0's wait names the rank whose part never came
    }
    throw;
  }
}

ShardIndex merge_shard_parts(const std::string& staging, int world, int64_t zero, int64_t step,
                             const std::vector<std::string>& order, std::chrono::seconds wait,
                             const std::atomic<bool>* cancelled) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  std::vector<bool> have(static_cast<size_t>(world), false);
  for (;;) {
    int missing = 0;
    for (int r = 0; r < world; ++r) {
      if (have[static_cast<size_t>(r)]) continue;
      if (path_exists(part_path(staging, "failed", r))) {
        std::string words;
        try {
          words = read_regular_file(part_path(staging, "failed", r), 4096);
        } catch (const DataError&) {
          words = "(its message could not be read)";
        }
        throw DataError("rank " + std::to_string(r) + " could not write its shard: " + words);
      }
      if (path_exists(part_path(staging, "part", r))) {
        have[static_cast<size_t>(r)] = true;
      } else {
        ++missing;
      }
    }
    if (missing == 0) break;
    if (cancelled != nullptr && cancelled->load())
      throw DataError("the save was abandoned: this process is ending");
    if (std::chrono::steady_clock::now() > deadline) {
      std::string ranks;
      for (int r = 0; r < world; ++r)
        if (!have[static_cast<size_t>(r)]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      throw DataError("the shards of rank(s) " + ranks + " did not appear in '" + staging +
                      "' within " + std::to_string(wait.count()) +
                      " s (ranks on several hosts need a run directory on a filesystem they "
                      "share)");
    }
    usleep(20000);
  }
  std::map<std::string, int64_t> at;
  for (size_t i = 0; i < order.size(); ++i) at.emplace(order[i], static_cast<int64_t>(i));
  ShardIndex index;
  index.world_size = world;
  index.zero = zero;
  index.step = step;
  std::vector<std::pair<int64_t, ShardEntry>> all;
  for (int r = 0; r < world; ++r) {
    const std::string path = part_path(staging, "part", r);
    ShardIndex part = ShardIndex::parse(read_regular_file(path, 64u << 20), path);
    if (part.files.size() != 1 || part.files[0].name != shard_file_name(r))
      throw DataError(path + ": not rank " + std::to_string(r) + "'s part");
    for (auto& e : part.entries) {
      e.file = static_cast<size_t>(r);
      all.emplace_back(order_key(order, at, e.name), std::move(e));
    }
    index.files.push_back(part.files[0]);
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [key, e] : all) index.entries.push_back(std::move(e));
  // What a reader would refuse is refused now, not published: the merged
  // index read back as a resume reads it (names twice, limits).
  const std::string text = index.to_text();
  if (text.size() > (64u << 20))
    throw DataError("the index of " + std::to_string(index.entries.size()) +
                    " tensors is over the 64 MiB a reader takes");
  ShardIndex::parse(text, staging + "/" + kShardIndexFile);
  for (int r = 0; r < world; ++r) std::remove(part_path(staging, "part", r).c_str());
  return index;
}

void verify_shards(ProcessGroup& pg, const std::string& folder, const ShardIndex& index) {
  agree_on_failure(pg, [&] {
    index.check_files(folder);
    for (size_t i = static_cast<size_t>(pg.rank()); i < index.files.size();
         i += static_cast<size_t>(pg.size())) {
      const auto& f = index.files[i];
      if (sha256_file_hex(folder + "/" + f.name) != f.sha256)
        throw DataError("checkpoint '" + folder + "': " + f.name +
                        "'s SHA-256 does not match its MANIFEST (truncated or modified); refusing "
                        "to load it. Resume from an older checkpoint with checkpoint.resume: "
                        "<folder>");
    }
  });
}

StateDict read_sharded_part(ProcessGroup& pg, const std::string& folder, const ShardIndex& index,
                            const std::string& part, bool every,
                            const std::function<bool(const std::string&)>& reads) {
  const auto entries = index.part(part);
  const size_t prefix = part.size() + 1;
  StateDict out;
  if (!every) {
    agree_on_failure(pg, [&] {
      for (const ShardEntry* e : entries) {
        const std::string name = e->name.substr(prefix);
        if (reads(name)) out.emplace_back(name, shard_read(folder, index, *e));
      }
    });
    return out;
  }
  // Readers balanced by bytes, the same on every rank (the index is).
  const int world = pg.size();
  std::vector<uint64_t> load(static_cast<size_t>(world), 0);
  std::vector<int> reader(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto least = std::min_element(load.begin(), load.end()) - load.begin();
    reader[i] = static_cast<int>(least);
    load[static_cast<size_t>(least)] += entries[i]->bytes + 64;
  }
  std::vector<at::Tensor> tensors(entries.size());
  agree_on_failure(pg, [&] {
    for (size_t i = 0; i < entries.size(); ++i)
      if (reader[i] == pg.rank()) tensors[i] = shard_read(folder, index, *entries[i]);
  });
  const auto device = pg.device();
  for (int r = 0; r < world; ++r) {
    std::vector<at::Tensor> group;
    std::vector<size_t> which;
    for (size_t i = 0; i < entries.size(); ++i) {
      if (reader[i] != r || entries[i]->bytes == 0) continue;
      if (reader[i] != pg.rank())
        tensors[i] = at::empty(entries[i]->shape, at::TensorOptions().dtype(entries[i]->dtype));
      // Broadcast as bytes: bool and every dtype travel alike.
      group.push_back(tensors[i].to(device).view({-1}).view(at::kByte));
      which.push_back(i);
    }
    if (group.empty()) continue;
    broadcast_coalesced(pg, group, r);
    if (device.is_cpu()) continue;
    for (size_t k = 0; k < which.size(); ++k)
      tensors[which[k]].view({-1}).view(at::kByte).copy_(group[k].cpu());
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!tensors[i].defined())
      tensors[i] = at::empty(entries[i]->shape, at::TensorOptions().dtype(entries[i]->dtype));
    out.emplace_back(entries[i]->name.substr(prefix), tensors[i]);
  }
  return out;
}

StateDict read_whole_part(const std::string& folder, const ShardIndex& index,
                          const std::string& part) {
  StateDict out;
  const size_t prefix = part.size() + 1;
  for (const ShardEntry* e : index.part(part))
    out.emplace_back(e->name.substr(prefix), shard_read(folder, index, *e));
  return out;
}

HostArena::~HostArena() {
  if (data_ != nullptr) munmap(data_, size_);
}

char* HostArena::reserve(size_t bytes) {
  if (bytes <= size_ && data_ != nullptr) return data_;
  if (data_ != nullptr) munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t size = std::max(kHuge, (bytes + kHuge - 1) / kHuge * kHuge);
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  (void)madvise(p, size, MADV_HUGEPAGE);  // best effort
  data_ = static_cast<char*>(p);
  size_ = size;
  return data_;
}

BackgroundSave::~BackgroundSave() {
  cancel_ = true;
  if (thread_.joinable()) thread_.join();
}

void BackgroundSave::start(std::function<void()> job) {
  if (thread_.joinable()) throw InternalError("a background save started while one is in flight");
  problem_.clear();
  cancel_ = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    written_ = 0;
    ended_ = false;
  }
  thread_ = std::thread([this, job = std::move(job)] {
    // Best effort: on the cycles training leaves (a rank per core has
    // them while it waits for gradients); where SCHED_IDLE is refused the
    // write competes with the step at normal priority.
    sched_param param{};
    param.sched_priority = 0;
    pthread_setschedparam(pthread_self(), SCHED_IDLE, &param);
    try {
      job();
    } catch (const std::exception& e) {
      problem_ = what_of(e);
      if (problem_.empty()) problem_ = "the background save failed";
    } catch (...) {
      problem_ = "the background save failed (an unknown exception)";
    }
    finished_ = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lock(mutex_);
    ended_ = true;
    changed_.notify_all();
  });
}

void BackgroundSave::mark_written(bool ok) {
  std::lock_guard<std::mutex> lock(mutex_);
  written_ = ok ? 1 : -1;
  changed_.notify_all();
}

bool BackgroundSave::wait_written() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return written_ != 0 || ended_ || !thread_.joinable(); });
  return written_ == 1;
}

std::string BackgroundSave::wait(double* waited_seconds) {
  const auto start = std::chrono::steady_clock::now();
  if (thread_.joinable()) thread_.join();
  if (waited_seconds != nullptr)
    *waited_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::string problem = std::move(problem_);
  problem_.clear();
  return problem;
}

}  // namespace lockstep
