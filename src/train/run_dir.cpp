#include "run_dir.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"

// Note [Run directories]
// ~~~~~~~~~~~~~~~~~~~~~~
// A run's results live in <run.dir>/<run.name>. Re-running into a name that
// another run used mixed the two: metrics.jsonl appended to (step 20
// twice), the new run's checkpoints rotated away at once by the old run's
// higher-numbered ones, and `checkpoint.resume: auto` then picking the old
// run's. So a fresh run (checkpoint.resume empty) claims the folder first:
// one that holds a checkpoint, metrics or TensorBoard events is refused
// (exit 2) with the three ways on: resume it, choose another run.name, or
// run.overwrite: true, which moves everything there into
// overwritten-<time>/ (kept, not deleted: an overwrite by mistake is
// recoverable). A run that resumes (a folder, or auto) continues in place;
// auto that finds no checkpoint starts fresh without the claim, since that
// is what an elastic restart before the first checkpoint does.

namespace lockstep {
namespace {

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

// Whether metrics.jsonl holds a step's record (a run that failed at start
// leaves only its config record: nothing of it to keep apart). Reads at
// most its first MiB.
bool has_step_records(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  std::string head(1 << 20, '\0');
  head.resize(std::fread(head.data(), 1, head.size(), f));
  std::fclose(f);
  return head.find("{\"step\": ") != std::string::npos;
}

bool is_results(const std::string& run_dir, const std::string& name) {
  if (name == "metrics.jsonl") return has_step_records(run_dir + "/" + name);
  if (name.rfind("events.out.tfevents", 0) == 0) return true;
  if (name == "checkpoints") {  // a checkpoint of lockstep's: best/ or step_*/ with a MANIFEST
    for (const auto& c : entries(run_dir + "/checkpoints"))
      if ((c == "best" || c.rfind("step_", 0) == 0) &&
          path_exists(run_dir + "/checkpoints/" + c + "/MANIFEST"))
        return true;
  }
  return false;
}

}  // namespace

std::string run_dir_claim(const std::string& run_dir, bool overwrite) {
  std::vector<std::string> found;
  for (const auto& name : entries(run_dir))
    if (is_results(run_dir, name)) found.push_back(name);
  if (found.empty()) return "";
  std::string list;
  for (const auto& f : found) list += (list.empty() ? "" : ", ") + f;
  if (!overwrite) {
    throw ConfigError("run directory '" + run_dir + "' holds another run's results (" + list +
                      "); a fresh run will not mix into them. Resume that run "
                      "(checkpoint.resume: auto), choose another run.name, or set "
                      "run.overwrite: true to move them into " +
                      run_dir + "/overwritten-<time>/");
  }
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &utc);
  std::string aside = run_dir + "/overwritten-" + stamp;
  for (int n = 2; path_exists(aside); ++n)
    aside = run_dir + "/overwritten-" + stamp + "-" + std::to_string(n);
  if (mkdir(aside.c_str(), 0755) != 0)
    throw StorageError("run.overwrite: cannot create '" + aside + "': " + std::strerror(errno));
  for (const auto& name : entries(run_dir)) {
    if (name.rfind("overwritten-", 0) == 0) continue;
    const std::string from = run_dir + "/" + name, to = aside + "/" + name;
    if (std::rename(from.c_str(), to.c_str()) != 0)
      throw StorageError("run.overwrite: cannot move '" + from + "' to '" + to +
                         "': " + std::strerror(errno));
  }
  return "run.overwrite: moved the earlier run's results (" + list + ") into " + aside;
}

}  // namespace lockstep
