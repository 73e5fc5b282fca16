// The checkpoint folder's whole life in one place, in both
// forms (consolidated and sharded): writing it crash-safe, its MANIFEST, rotation,
// repair after a killed writer, and reading it back.
#include "lockstep/checkpoint/checkpoint.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <dirent.h>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "lockstep/checkpoint/sharded_checkpoint.h"
#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"
#include "lockstep/util/sha256.h"
#include "state_yaml.h"

namespace lockstep {
namespace {

const std::vector<std::string> kFiles{"model.pt", "optimizer.pt", "rng.pt", "state.yaml",
                                      "config.yaml"};
// Note [Sharded checkpoints]: the shard files and their index instead.
const std::vector<std::string> kShardedFiles{kShardIndexFile, "rng.pt", "state.yaml",
                                             "config.yaml"};
// A MANIFEST's lines: the files above and one shard per writing rank.
constexpr size_t kMaxManifestFiles = 70000;
constexpr int64_t kMaxManifestBytes = 8 << 20;

void fsync_path(const std::string& path, bool directory) {
  const int fd = open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) throw DataError("cannot open '" + path + "' to fsync: " + std::strerror(errno));
  const int rc = fsync(fd);
  close(fd);
  if (rc != 0) throw DataError("fsync '" + path + "': " + std::strerror(errno));
}

// Best effort: a folder that cannot be removed is left behind, not fatal.
void remove_tree(const std::string& path) {
  std::error_code ignored;
  std::filesystem::remove_all(path, ignored);
}

std::string folder_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  return name;
}

// Folders named exactly as folder_name() names them: "step_" and 8 or more
// digits. A user's step_best/ in the same place is not a checkpoint.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return found;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    const std::string digits = name.size() > 5 ? name.substr(5) : "";
    if (name.rfind("step_", 0) == 0 && digits.size() >= 8 && digits.size() <= 18 &&
        digits.find_first_not_of("0123456789") == std::string::npos) {
      found.emplace_back(std::atoll(digits.c_str()), dir + "/" + name);
    }
  }
  closedir(d);
  std::sort(found.begin(), found.end());
  return found;
}

// Whether `name` is a name folder_name() gives (a one-element list), for repair().
std::vector<std::pair<int64_t, std::string>> list_checkpoints_named(const std::string& name) {
  const std::string digits = name.size() > 5 ? name.substr(5) : "";
  if (name.rfind("step_", 0) == 0 && digits.size() >= 8 && digits.size() <= 18 &&
      digits.find_first_not_of("0123456789") == std::string::npos)
    return {{std::atoll(digits.c_str()), name}};
  return {};
}

}  // namespace

Checkpointer::Checkpointer(std::string run_dir, int64_t keep)
    : dir_(std::move(run_dir) + "/checkpoints"), keep_(keep) {}

// Note [Stateful parts]
// ~~~~~~~~~~~~~~~~~~~~~
// A checkpoint folder is a list of parts (train/stateful.h), each one file
// from a state dict: model.pt, optimizer.pt, rng.pt and, for a stateful
// comm hook, comm_hook.pt (run_stateful.cpp), as torchtitan's
// CheckpointManager composes MODEL, OPTIMIZER and the rest. save() writes
// whatever parts it is given (refusing a folder without the required
// three) and lists each in the MANIFEST; load() reads every .pt file the
// verified MANIFEST lists, by name (Loaded::part; the trainer asks only for
// its parts' files). A new part is a new Stateful in run_stateful_parts:
// nothing here changes. The loop's own
// scalars (position, schedule, the GradScaler, the watched metrics) stay
// in state.yaml, a file people read and Python's yaml loads. The trainer
// saves the parts in order on every rank (their state_dict may be
// collective) and restores them before DDP is built, whose broadcast then
// starts every rank alike, except a part that needs the DDP wrapper (the
// comm hook's per-bucket state), restored right after (trainer_resume.cpp).
// Each part's entries are freed once it has taken them.

// Note [Replacing a checkpoint folder]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// checkpoints/best (and a step folder saved twice) is replaced, not
// written in place. The new set is written whole into .tmp-<name>-<pid> and
// fsynced first; then, where the filesystem has it, renameat2's
// RENAME_EXCHANGE swaps the two folders in one step, so some <name>/
// always exists, and the old set (now under the temporary name) is
// removed. Elsewhere the old folder is moved aside to .old-<name>-<pid>
// and the new one renamed in: a kill between the two renames leaves no
// <name>/, and repair() (rank 0, at every start) puts it back: the
// .tmp-<name> whose MANIFEST verifies (complete: it was written whole
// before either rename), else the .old-<name>. repair() also removes the
// .tmp-* and .old-* folders of writers that are gone (their pid not alive
// on this host).

std::string Checkpointer::staging_folder(int64_t step, bool best, long writer_pid) const {
  return dir_ + "/.tmp-" + (best ? std::string("best") : folder_name(step)) + "-" +
         std::to_string(writer_pid);
}

void Checkpointer::create_staging(const std::string& staging, int64_t step, bool best) {
  for (const std::string& path : {dir_, staging}) {
    if (path == staging) remove_tree(staging);
    if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
      const int err = errno;
      const auto previous = best ? std::optional<std::string>() : newest();
      throw StorageError(std::string(best ? "best checkpoint" : "checkpoint") + " of step " +
                         std::to_string(step) + " not written (" +
                         (previous ? "the previous one, " + *previous + ", is intact"
                                   : std::string("no earlier checkpoint exists")) +
                         "): cannot create '" + path + "': " + std::strerror(err));
    }
  }
}

void Checkpointer::discard_staging(const std::string& staging) {
  remove_tree(staging);
}

void Checkpointer::write_consolidated(const std::string& out, const TrainerState& state,
                                      const std::vector<SavedPart>& parts,
                                      const std::string& config_yaml) {
  if (path_exists(out)) throw DataError("'" + out + "' exists; consolidate writes a new folder");
  const std::string tmp = out + ".tmp-" + std::to_string(getpid());
  remove_tree(tmp);
  if (mkdir(tmp.c_str(), 0755) != 0)
    throw StorageError("cannot create '" + tmp + "': " + std::strerror(errno));
  try {
    write_folder(tmp, state, parts, config_yaml, "", nullptr);
    if (rename(tmp.c_str(), out.c_str()) != 0)
      throw StorageError("cannot rename '" + tmp + "' to '" + out + "': " + std::strerror(errno));
  } catch (...) {
    remove_tree(tmp);
    throw;
  }
}

std::string Checkpointer::save(const TrainerState& state, const std::vector<SavedPart>& parts,
                               const std::string& config_yaml, const std::string& best_yaml,
                               const ShardIndex* shards, const std::string& staging) {
  const bool best = !best_yaml.empty();
  const std::string name = best ? "best" : folder_name(state.step);
  // What a failure leaves, said truthfully (Note [Failed checkpoint]).
  const auto kept = [&] {
    std::optional<std::string> previous = newest();
    if (best) previous = path_exists(dir_ + "/best/MANIFEST") ? dir_ + "/best" : std::string();
    return previous && !previous->empty() ? "the previous one, " + *previous + ", is intact"
                                          : std::string("no earlier checkpoint exists");
  };
  const auto failed = [&](const std::string& why, bool storage, bool memory = false) {
    const std::string what = std::string(best ? "best checkpoint" : "checkpoint") + " of step " +
                             std::to_string(state.step) + " not written (" + kept() + "): " + why;
    if (memory) throw OutOfMemoryError(what);
    if (storage) throw StorageError(what);
    throw DataError(what);
  };
  if (mkdir(dir_.c_str(), 0755) != 0 && errno != EEXIST) {
    const int err = errno;
    failed("cannot create '" + dir_ + "': " + std::strerror(err), true);
  }
  const std::string tmp =
      shards != nullptr ? staging : dir_ + "/.tmp-" + name + "-" + std::to_string(getpid());
  if (shards == nullptr) {
    remove_tree(tmp);
    if (mkdir(tmp.c_str(), 0755) != 0) {
      const int err = errno;
      failed("cannot create '" + tmp + "': " + std::strerror(err), true);
    }
  }
  try {
    write_folder(tmp, state, parts, config_yaml, best_yaml, shards);
  } catch (const std::exception& e) {
    // Note [Failed checkpoint]: nothing half-written stays behind, and the
    // previous checkpoint was never touched.
    remove_tree(tmp);
    failed(is_out_of_memory(e) ? "an allocation failed: " + what_of(e) : what_of(e),
           dynamic_cast<const StorageError*>(&e) != nullptr, is_out_of_memory(e));
  }

  const std::string final_path = dir_ + "/" + name;
  // Note [Replacing a checkpoint folder].
  if (renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE) == 0) {
    fsync_path(dir_, true);
    remove_tree(tmp);  // the old set, under the temporary name now
  } else {
    const std::string old = dir_ + "/.old-" + name + "-" + std::to_string(getpid());
    remove_tree(old);
    const bool had_old = rename(final_path.c_str(), old.c_str()) == 0;
    if (rename(tmp.c_str(), final_path.c_str()) != 0) {
      const int err = errno;
      remove_tree(tmp);
      if (had_old) (void)rename(old.c_str(), final_path.c_str());
      failed("cannot rename '" + tmp + "' to '" + final_path + "': " + std::strerror(err), false);
    }
    fsync_path(dir_, true);
    if (had_old) remove_tree(old);
  }
  if (!best) rotate(final_path);
  return final_path;
}

namespace {

// ".tmp-<name>-<pid>" or ".old-<name>-<pid>": the name and the pid.
bool parse_aside(const std::string& entry, std::string& kind, std::string& name, long& pid) {
  if (entry.rfind(".tmp-", 0) != 0 && entry.rfind(".old-", 0) != 0) return false;
  kind = entry.substr(1, 3);
  const auto dash = entry.rfind('-');
  if (dash <= 5 || dash + 1 >= entry.size()) return false;
  const std::string digits = entry.substr(dash + 1);
  if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos)
    return false;
  name = entry.substr(5, dash - 5);
  pid = std::atol(digits.c_str());
  return true;
}

bool alive(long pid) {
  return pid == static_cast<long>(getpid())
             ? false
             : (kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

}  // namespace

std::vector<std::string> Checkpointer::repair() {
  std::vector<std::string> done;
  DIR* d = opendir(dir_.c_str());
  if (d == nullptr) return done;
  struct Aside {
    std::string kind, name, path;
  };
  std::vector<Aside> stale;
  while (dirent* e = readdir(d)) {
    std::string kind, name;
    long pid = 0;
    if (parse_aside(e->d_name, kind, name, pid) && !alive(pid))
      stale.push_back({kind, name, dir_ + "/" + e->d_name});
  }
  closedir(d);
  // A folder lost between the two renames: the complete new set, else the old one.
  for (const char* prefer : {"tmp", "old"}) {
    for (auto& a : stale) {
      if (a.kind != prefer || path_exists(dir_ + "/" + a.name)) continue;
      if (a.name != "best" && list_checkpoints_named(a.name).empty()) continue;
      try {
        verify(a.path);
      } catch (const DataError&) {
        continue;  // incomplete: not a checkpoint to restore
      }
      if (rename(a.path.c_str(), (dir_ + "/" + a.name).c_str()) == 0) {
        done.push_back("restored " + dir_ + "/" + a.name + " from " + a.path);
        a.path.clear();
      }
    }
  }
  for (const auto& a : stale) {
    if (a.path.empty()) continue;
    remove_tree(a.path);
    done.push_back("removed " + a.path + " (left by a writer that is gone)");
  }
  if (!done.empty()) fsync_path(dir_, true);
  return done;
}

void Checkpointer::write_folder(const std::string& tmp, const TrainerState& state,
                                const std::vector<SavedPart>& parts, const std::string& config_yaml,
                                const std::string& best_yaml, const ShardIndex* shards) {
  std::vector<std::string> files{"state.yaml", "config.yaml"};
  std::string manifest;  // the shard files' digests, taken as they were written
  if (shards != nullptr) {
    write_file(tmp + "/" + kShardIndexFile, shards->to_text());
    files.push_back(kShardIndexFile);
    for (const auto& f : shards->files) manifest += f.sha256 + "  " + f.name + "\n";
  }
  for (const auto& part : parts) {
    const std::string path = tmp + "/" + part.file;
    if (part.entries.size() == 1 && part.entries[0].first.empty()) {
      const auto bytes = torch::pickle_save(c10::IValue(part.entries[0].second.contiguous()));
      write_file(path, std::string(bytes.begin(), bytes.end()));
    } else {
      state_dict_save_file(part.entries, path);
    }
    files.push_back(part.file);
  }
  for (const auto& required : shards != nullptr ? kShardedFiles : kFiles) {
    if (std::find(files.begin(), files.end(), required) == files.end())
      throw InternalError("checkpoint without " + required);
  }
  write_file(tmp + "/state.yaml", state_yaml_text(state));
  write_file(tmp + "/config.yaml", config_yaml);
  if (!best_yaml.empty()) {
    write_file(tmp + "/best.yaml", best_yaml);
    files.push_back("best.yaml");
  }
  for (const auto& file : files) manifest += sha256_file_hex(tmp + "/" + file) + "  " + file + "\n";
  write_file(tmp + "/MANIFEST", manifest);
  fsync_path(tmp, true);
}

void Checkpointer::rotate(const std::string& just_written) {
  // Rotation removes only what is ours: our folder names, with our MANIFEST;
  // never the checkpoint just written, even when older-numbered folders of
  // another run sort after it.
  auto all = list_checkpoints(dir_);
  for (size_t i = 0; i + static_cast<size_t>(keep_) < all.size(); ++i) {
    if (all[i].second == just_written) continue;
    struct stat manifest {};
    if (stat((all[i].second + "/MANIFEST").c_str(), &manifest) == 0 && S_ISREG(manifest.st_mode)) {
      remove_tree(all[i].second);
    }
  }
}

std::optional<std::string> Checkpointer::newest() const {
  const auto all = list_checkpoints(dir_);
  if (all.empty()) return std::nullopt;
  return all.back().second;
}

void Checkpointer::verify(const std::string& folder, bool shards) {
  if (!path_exists(folder + "/MANIFEST")) {
    throw DataError("checkpoint '" + folder + "' has no MANIFEST (incomplete or not a checkpoint)");
  }
  // A regular file of at most 8 MiB (a line of 64 + 2 + a name for each
  // file, a shard per rank among them), read whole first: a FIFO, a device
  // or a giant file is refused unread.
  struct stat st {};
  if (stat((folder + "/MANIFEST").c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
      st.st_size > kMaxManifestBytes) {
    throw DataError("checkpoint '" + folder + "': MANIFEST is " + std::to_string(st.st_size) +
                    " bytes, over the 8 MiB a MANIFEST can need");
  }
  std::istringstream manifest(read_regular_file(folder + "/MANIFEST"));
  std::map<std::string, std::string> expected;
  std::string hash, file;
  while (manifest >> hash >> file) {
    // A MANIFEST lists each of a handful of files once, with a SHA-256.
    if (expected.size() >= kMaxManifestFiles || hash.size() != 64 ||
        hash.find_first_not_of("0123456789abcdef") != std::string::npos) {
      throw DataError("checkpoint '" + folder +
                      "': MANIFEST is malformed (a line is not "
                      "'<64 hex digits>  <file>', or it lists over 70000 files)");
    }
    if (!expected.emplace(file, hash).second) {
      throw DataError("checkpoint '" + folder + "': MANIFEST lists '" + file.substr(0, 64) +
                      "' twice");
    }
  }
  const bool sharded = expected.count(kShardIndexFile) != 0;
  // One form or the other: a sharded folder's weights are in its shards alone.
  for (const char* consolidated : {"model.pt", "optimizer.pt"})
    if (sharded && expected.count(consolidated) != 0)
      throw DataError("checkpoint '" + folder + "': MANIFEST lists both " + kShardIndexFile +
                      " and " + consolidated + " (a sharded checkpoint holds no " + consolidated +
                      ")");
  for (const auto& f : sharded ? kShardedFiles : kFiles) {
    if (expected.find(f) == expected.end())
      throw DataError("checkpoint '" + folder + "': MANIFEST does not list " + f);
  }
  // Every file listed is checked (best.yaml too); names are plain file
  // names of this folder, never paths.
  for (const auto& [f, digest] : expected) {
    if (f.empty() || f.size() > 64 ||
        f.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") !=
            std::string::npos ||
        f[0] == '.') {
      throw DataError("checkpoint '" + folder + "': MANIFEST lists '" + f.substr(0, 64) +
                      "', which is no file name of a checkpoint");
    }
    // A shard file: hashed by load() when it reads from it, or by the
    // resuming ranks (each file on one).
    if (!shards && f.rfind("shard_", 0) == 0) continue;
    std::string actual;
    try {
      actual = sha256_file_hex(folder + "/" + f);
    } catch (const DataError&) {
      throw DataError("checkpoint '" + folder + "': " + f + " is missing");
    }
    if (actual != digest) {
      throw DataError(
          "checkpoint '" + folder + "': " + f +
          "'s SHA-256 does not match its MANIFEST (truncated or modified); refusing "
          "to load it. Resume from an older checkpoint with checkpoint.resume: <folder>");
    }
  }
}

const StateDict& Checkpointer::Loaded::part(const std::string& file) const {
  static const StateDict kNone;
  const auto found = parts.find(file);
  return found == parts.end() ? kNone : found->second;
}

at::Tensor Checkpointer::Loaded::rng_states() const {
  const StateDict& rng = part("rng.pt");
  return rng.size() == 1 ? rng[0].second : at::Tensor();
}

Checkpointer::Loaded Checkpointer::load(const std::string& folder, torch::optim::Optimizer* legacy,
                                        const std::vector<std::string>& files, bool read_shards) {
  verify(folder, /*shards=*/false);
  Loaded loaded;
  loaded.folder = folder;
  try {
    loaded.state = state_yaml_read(YAML::LoadFile(folder + "/state.yaml"));
  } catch (const YAML::Exception& e) {
    throw DataError(folder + "/state.yaml: " + e.what() + " (" + state_yaml_keys() + ")");
  }
  // Note [Stateful parts]: every .pt file the (verified) MANIFEST lists.
  std::istringstream manifest(read_regular_file(folder + "/MANIFEST"));
  std::map<std::string, std::string> listed;
  std::string hash, file;
  while (manifest >> hash >> file) listed[file] = hash;
  if (listed.count(kShardIndexFile) != 0) {
    // Note [Sharded checkpoints]: the index, held against the MANIFEST and
    // the files' sizes before anything is read from them.
    const std::string path = folder + "/" + kShardIndexFile;
    loaded.shards = ShardIndex::parse(read_regular_file(path, 64u << 20), path);
    for (const auto& f : loaded.shards->files) {
      const auto in = listed.find(f.name);
      if (in == listed.end() || in->second != f.sha256)
        throw DataError(path + ": " + f.name + " is not in the MANIFEST with the same SHA-256");
    }
    for (const auto& [name, digest] : listed) {
      const bool indexed = std::any_of(loaded.shards->files.begin(), loaded.shards->files.end(),
                                       [&](const ShardFile& f) { return f.name == name; });
      if (name.rfind("shard_", 0) == 0 && !indexed)
        throw DataError(path + ": the MANIFEST lists " + name + ", the index does not");
    }
    if (loaded.shards->world_size != static_cast<int64_t>(loaded.shards->files.size()) ||
        loaded.shards->world_size != loaded.state.world_size)
      throw DataError(path + ": world_size " + std::to_string(loaded.shards->world_size) + ", " +
                      std::to_string(loaded.shards->files.size()) +
                      " shard files and state.yaml's world_size " +
                      std::to_string(loaded.state.world_size) + " differ (one shard per rank)");
    loaded.shards->check_files(folder);
    // The parts asked for, from the shards that hold them, each shard
    // verified against the MANIFEST first (eval reads no optimizer shard).
    std::vector<std::string> wanted;
    for (const char* part : {"model.pt", "optimizer.pt"})
      if (read_shards &&
          (files.empty() || std::find(files.begin(), files.end(), part) != files.end()))
        wanted.push_back(part);
    std::set<size_t> holding;
    for (const auto& part : wanted)
      for (const ShardEntry* e : loaded.shards->part(part)) holding.insert(e->file);
    for (const size_t i : holding) {
      const ShardFile& f = loaded.shards->files[i];
      if (sha256_file_hex(folder + "/" + f.name) != f.sha256)
        throw DataError("checkpoint '" + folder + "': " + f.name +
                        "'s SHA-256 does not match its MANIFEST (truncated or modified); refusing "
                        "to load it");
    }
    for (const auto& part : wanted)
      loaded.parts[part] = read_whole_part(folder, *loaded.shards, part);
  }
  std::istringstream listing(read_regular_file(folder + "/MANIFEST"));
  while (listing >> hash >> file) {
    if (file.size() < 4 || file.compare(file.size() - 3, 3, ".pt") != 0) continue;
    if (!files.empty() && std::find(files.begin(), files.end(), file) == files.end()) continue;
    if (file == "optimizer.pt") continue;  // below: an older lockstep's archive, perhaps
    if (file == "rng.pt") {
      loaded.parts[file] = {
          {"", tensor_from_bytes(read_regular_file(folder + "/" + file), folder + "/" + file)}};
    } else {
      loaded.parts[file] = state_dict_load_file(folder + "/" + file);
    }
  }
  if (loaded.shards) return loaded;
  if (!files.empty() && std::find(files.begin(), files.end(), "optimizer.pt") == files.end())
    return loaded;
  const std::string path = folder + "/optimizer.pt";
  try {
    loaded.parts["optimizer.pt"] = state_dict_load_file(path);
  } catch (const DataError& named) {
    // Before ZeRO: LibTorch's optimizer archive (a TorchScript zip).
    if (legacy == nullptr) {
      throw DataError(std::string(named.what()) +
                      " (an optimizer archive of an older lockstep resumes only with optim.zero: "
                      "0 on the world size that wrote it)");
    }
    try {
      torch::serialize::InputArchive archive;
      archive.load_from(path);
      legacy->load(archive);
      loaded.legacy_optimizer = true;
    } catch (const std::exception& e) {
      throw DataError(path + ": not this optimizer's state (" + what_of(e).substr(0, 200) + "; " +
                      what_of(named).substr(0, 200) + ")");
    }
  }
  return loaded;
}

}  // namespace lockstep
