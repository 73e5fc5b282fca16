// `lockstep checkpoint consolidate DIR --out OUT`: a checkpoint (sharded or
// not) as today's consolidated folder: model.pt and optimizer.pt that
// torch.load opens, rng.pt, state.yaml, config.yaml and a MANIFEST; lockstep
// resumes from it too. `lockstep checkpoint info DIR`: its tensors, shapes,
// shards, sizes and the writer's world size, stage and step
// (docs/checkpoints.md).
#include <cstdio>

#include "common.h"
#include "lockstep/checkpoint/checkpoint.h"
#include "lockstep/cli/generate.h"
#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"
#include "lockstep/util/names.h"

namespace lockstep::cli {
namespace {

constexpr const char* kUsage =
    "usage: lockstep checkpoint consolidate DIR --out OUT\n"
    "       lockstep checkpoint info DIR\n"
    "\n"
    "DIR: a checkpoint folder, or a run folder (its newest checkpoint).\n"
    "consolidate  writes OUT (a new folder): model.pt and optimizer.pt as torch.load opens\n"
    "             them, with rng.pt, state.yaml, config.yaml and a MANIFEST (lockstep resumes\n"
    "             from it); every file of DIR is verified against its MANIFEST first\n"
    "info         the format, the writer's world size, optim.zero and step, the files and\n"
    "             every tensor (dtype, shape, file, byte range)\n";

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t d = 0; d < shape.size(); ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "]";
}

double mib(uint64_t bytes) {
  return static_cast<double>(bytes) / (1 << 20);
}

int consolidate(const std::string& path, const std::string& out) {
  const std::string folder = checkpoint_folder(path);
  const Checkpointer::Loaded loaded = Checkpointer::load(folder, nullptr);
  std::vector<SavedPart> parts;
  for (const char* file : {"model.pt", "optimizer.pt", "rng.pt", "comm_hook.pt"}) {
    const auto found = loaded.parts.find(file);
    if (found != loaded.parts.end()) parts.push_back({file, found->second});
  }
  Checkpointer::write_consolidated(out, loaded.state, parts,
                                   read_regular_file(folder + "/config.yaml", 16u << 20));
  std::printf("%s: step %lld (%s, written by %lld rank(s), optim.zero %lld) -> %s\n",
              folder.c_str(), static_cast<long long>(loaded.state.step),
              loaded.shards ? "sharded" : "consolidated",
              static_cast<long long>(loaded.state.world_size),
              static_cast<long long>(loaded.state.zero), out.c_str());
  return kExitOk;
}

int info(const std::string& path) {
  const std::string folder = checkpoint_folder(path);
  // The small files verified; a sharded checkpoint's shards checked for
  // their listed sizes (their SHA-256s: consolidate or a resume).
  const Checkpointer::Loaded loaded =
      Checkpointer::load(folder, nullptr, {"rng.pt"}, /*read_shards=*/false);
  const auto& st = loaded.state;
  std::printf("checkpoint %s\nformat %s\nstep %lld (epoch %lld, micro-batch %lld)\n",
              folder.c_str(), loaded.shards ? "sharded" : "consolidated",
              static_cast<long long>(st.step), static_cast<long long>(st.epoch + 1),
              static_cast<long long>(st.batch_in_epoch));
  std::printf("written by %lld rank(s), optim.zero %lld, model %s\n",
              static_cast<long long>(st.world_size), static_cast<long long>(st.zero),
              st.model.c_str());
  if (loaded.shards) {
    const ShardIndex& index = *loaded.shards;
    uint64_t total = 0;
    std::printf("files (%zu shards):\n", index.files.size());
    for (const auto& f : index.files) {
      std::printf("  %s  %.2f MiB  sha256 %s\n", f.name.c_str(), mib(f.size), f.sha256.c_str());
      total += f.size;
    }
    std::printf("tensors (%zu, %.2f MiB in shards):\n", index.entries.size(), mib(total));
    for (const auto& e : index.entries)
      std::printf("  %s  %s  %s  %s  bytes %llu..%llu\n", e.name.c_str(), shard_dtype_name(e.dtype),
                  shape_text(e.shape).c_str(), index.files[e.file].name.c_str(),
                  static_cast<unsigned long long>(e.offset),
                  static_cast<unsigned long long>(e.offset + e.bytes));
    return kExitOk;
  }
  for (const char* file : {"model.pt", "optimizer.pt"}) {
    const StateDict entries = state_dict_load_file(folder + "/" + file);
    uint64_t total = 0;
    for (const auto& [name, t] : entries) total += t.nbytes();
    std::printf("%s (%zu tensors, %.2f MiB):\n", file, entries.size(), mib(total));
    for (const auto& [name, t] : entries)
      std::printf("  %s/%s  %s  %s\n", file, name.c_str(), shard_dtype_name(t.scalar_type()),
                  shape_text(t.sizes().vec()).c_str());
  }
  return kExitOk;
}

}  // namespace

int cmd_checkpoint(int argc, char** argv) {
  return run_guarded("checkpoint", [&] {
    const std::string what = argc >= 2 ? argv[1] : "";
    if (what == "--help" || what == "-h") {
      std::fputs(kUsage, stdout);
      return kExitOk;
    }
    if (what == "info") {
      if (argc != 3) throw ConfigError("checkpoint info takes one folder\n" + std::string(kUsage));
      return info(argv[2]);
    }
    if (what == "consolidate") {
      std::string dir, out;
      for (int i = 2; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--out" && i + 1 < argc) {
          out = argv[++i];
        } else if (a.rfind("--out=", 0) == 0) {
          out = a.substr(6);
        } else if (!a.empty() && a[0] != '-' && dir.empty()) {
          dir = a;
        } else {
          throw ConfigError("checkpoint consolidate: unexpected '" + shown_name(a) + "'\n" +
                            std::string(kUsage));
        }
      }
      if (dir.empty() || out.empty())
        throw ConfigError("checkpoint consolidate needs DIR and --out OUT\n" + std::string(kUsage));
      return consolidate(dir, out);
    }
    throw ConfigError("checkpoint: '" + shown_name(what) + "' is not one of consolidate, info\n" +
                      std::string(kUsage));
  });
}

}  // namespace lockstep::cli
