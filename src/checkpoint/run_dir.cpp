#include "lockstep/checkpoint/run_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"

// Note [Run directories]
// ~~~~~~~~~~~~~~~~~~~~~~
// A run's results live in <run.dir>/<run.name>. Re-running into a name that
// another run used mixed the two: metrics.jsonl appended to (step 20
// twice), the new run's checkpoints rotated away at once by the old run's
// higher-numbered ones, and `checkpoint.resume: auto` then picking the old
// run's. So a fresh run (checkpoint.resume empty) claims the folder once it
// is assembled (a config error is reported as such first): one that holds
// results (a checkpoint with its MANIFEST, or metrics.jsonl with a step's
// record: a run that failed at start-up leaves none) is refused (exit 2)
// with the three ways on: resume it, choose another run.name, or
// run.overwrite: true, which moves lockstep's outputs there into
// overwritten-<time>/ (kept, not deleted: an overwrite by mistake is
// recoverable; the user's own files stay where they are). The claim is
// recorded (.lockstep-job: a digest of the job's secret or torchrun's run
// id), so that a restarted attempt of the same job (lockstep-run
// --max-restarts) without resume starts over, its earlier attempt moved
// aside, while another job is still refused. A run that resumes continues
// in place; resuming by name from an older checkpoint moves the later
// ones, an abandoned line of training, into superseded-<time>/.

// Note [One live job per run directory]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The claim above looks and then acts. Two jobs started together with one
// run.name (a sweep script, two terminals, the default name) both looked
// at an empty folder, both claimed it and trained into it: each rotated the
// other's checkpoints away and metrics.jsonl held both. So rank 0 first
// takes an exclusive flock(2) on <run_dir>/.lockstep-lock, without waiting,
// and holds it for the job's life; a second job finds it taken and stops
// with exit 2, naming the holder from the line the holder wrote into the
// file. The kernel drops the lock when the holder's process ends (a crash,
// SIGKILL, a lost node's process torn down), so a crashed job never blocks
// its own restart or resume: no stale lock file is ever trusted, its text
// is only read for the message, and to wait (at most 30 s) while a holder
// of this host that is gone or exiting still has the lock: the kernel
// drops it only once the last thread has finished (an fsync in flight
// can outlast a SIGKILL by seconds). The file is not an output (never moved by
// run.overwrite) and stays after the job.
// Several hosts on one shared filesystem: on NFS, Linux turns flock into a
// whole-file POSIX lock that the server arbitrates, so a job on another
// host is refused too (while the server's lock service works). A mount
// without locks (ENOLCK, EOPNOTSUPP: some FUSE and SMB mounts) gets a
// warning and the look-then-act claim alone.

namespace lockstep {
namespace {

constexpr const char* kLockFile = ".lockstep-lock";  // rank 0's flock, for the job's life
constexpr const char* kJobFile = ".lockstep-job";    // the job that claimed the folder

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

bool is_checkpoint(const std::string& dir, const std::string& name) {
  return (name == "best" || name.rfind("step_", 0) == 0) &&
         path_exists(dir + "/" + name + "/MANIFEST");
}

bool is_results(const std::string& run_dir, const std::string& name) {
  if (name == "metrics.jsonl") return has_step_records(run_dir + "/" + name);
  if (name == "checkpoints") {
    for (const auto& c : entries(run_dir + "/checkpoints"))
      if (is_checkpoint(run_dir + "/checkpoints", c)) return true;
  }
  return false;
}

// What lockstep writes into a run directory (and nothing of the user's).
bool is_output(const std::string& name) {
  const auto starts = [&](const char* p) { return name.rfind(p, 0) == 0; };
  return name == "checkpoints" || name == "metrics.jsonl" || name == "config.yaml" ||
         name == kJobFile || starts("events.out.tfevents") ||
         (starts("rank_") && name.size() > 4 && name.substr(name.size() - 4) == ".log") ||
         (starts("trace_rank") && name.size() > 5 && name.substr(name.size() - 5) == ".json");
}

std::string utc_stamp() {
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &utc);
  return stamp;
}

// A new folder <parent>/<prefix><time>[-n].
std::string new_aside(const std::string& parent, const std::string& prefix) {
  const std::string stamp = utc_stamp();
  std::string aside = parent + "/" + prefix + stamp;
  for (int n = 2; path_exists(aside); ++n)
    aside = parent + "/" + prefix + stamp + "-" + std::to_string(n);
  if (mkdir(aside.c_str(), 0755) != 0)
    throw StorageError("cannot create '" + aside + "': " + std::strerror(errno));
  return aside;
}

void move(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0)
    throw StorageError("cannot move '" + from + "' to '" + to + "': " + std::strerror(errno));
}

// The first 128 bytes of a regular file ("" for anything else: a FIFO or a
// device planted there must not block or feed the caller).
std::string read_small(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return "";
  struct stat st {};
  char buf[128];
  ssize_t n = 0;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) n = pread(fd, buf, sizeof buf, 0);
  ::close(fd);
  return std::string(buf, n > 0 ? static_cast<size_t>(n) : 0);
}

std::string host_name() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) return "?";
  return host;
}

// The holder's line, read through this descriptor (never reopened).
std::string holder_line(int fd) {
  char text[256] = {};
  const ssize_t n = pread(fd, text, sizeof text - 1, 0);
  std::string line(text, n > 0 ? static_cast<size_t>(n) : 0);
  return line.substr(0, line.find('\n'));
}

// Whether the holder named in the lock file is a process of this host that
// is gone or exiting: its lock then outlives it only while its last
// threads finish (an fsync in flight can take seconds after a SIGKILL).
bool holder_exiting(int fd) {
  const std::string line = holder_line(fd);
  const auto host_at = line.find("host "), pid_at = line.find(", pid ");
  if (host_at != 0 || pid_at == std::string::npos) return false;
  if (line.substr(5, pid_at - 5) != host_name()) return false;
  const long pid = std::atol(line.c_str() + pid_at + 6);
  if (pid <= 0) return false;
  if (kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  // An exiting process has given up its memory, and with it its command line.
  return read_small("/proc/" + std::to_string(pid) + "/cmdline").empty();
}

// flock without waiting; when a dying holder still has it, up to 30 s for
// the kernel to finish its exit. 0, or flock's errno when it stays taken.
int lock_or_wait_for_exiting_holder(int fd) {
  for (int tries = 0;; ++tries) {
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) return 0;
    const int error = errno;
    if (error != EWOULDBLOCK || tries >= 300 || !holder_exiting(fd)) return error;
    usleep(100 * 1000);
  }
}

}  // namespace

std::string run_dir_holder(const std::string& job) {
  return "host " + host_name() + ", pid " + std::to_string(getpid()) +
         (job.empty() ? "" : ", job " + job) + ", since " + utc_stamp() + " UTC";
}

RunDirLock RunDirLock::acquire(const std::string& run_dir, const std::string& holder,
                               std::string* warning) {
  const std::string path = run_dir + "/" + kLockFile;
  RunDirLock lock;
  // No following a link, no blocking on a FIFO planted there: a regular
  // file or a refusal.
  lock.fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (lock.fd_ < 0 && errno == ELOOP)
    throw ConfigError("run directory '" + run_dir + "': its lock file '" + path +
                      "' is a symbolic link; lockstep does not follow it (remove it)");
  if (lock.fd_ < 0)
    throw ConfigError("run directory '" + run_dir + "': cannot open its lock file '" + path +
                      "': " + std::strerror(errno));
  struct stat st {};
  if (fstat(lock.fd_, &st) != 0 || !S_ISREG(st.st_mode))
    throw ConfigError("run directory '" + run_dir + "': its lock file '" + path +
                      "' is not a regular file (remove it)");
  if (const int error = lock_or_wait_for_exiting_holder(lock.fd_); error != 0) {
    if (error == EWOULDBLOCK) {
      const std::string line = holder_line(lock.fd_);
      throw ConfigError("run directory '" + run_dir + "' is in use by a live job (" +
                        (line.empty() ? std::string("its holder has not said who it is") : line) +
                        "); two jobs in one run directory would overwrite each other's "
                        "checkpoints. Wait for it, stop it, or choose another run.name");
    }
    if (warning != nullptr)
      *warning = "run directory '" + run_dir +
                 "': its filesystem takes no locks (flock: " + std::strerror(error) +
                 "), so a second job started into it at the same time is not refused";
    return RunDirLock();  // closes the file: unlocked
  }
  const std::string line = holder + "\n";
  if (ftruncate(lock.fd_, 0) != 0 ||
      pwrite(lock.fd_, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size())) {
    // The lock holds regardless; only a second job's message is poorer.
    if (warning != nullptr)
      *warning = "run directory '" + run_dir + "': cannot write the holder into '" + path +
                 "': " + std::strerror(errno);
  }
  return lock;
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);
}

RunDirLock::RunDirLock(RunDirLock&& other) noexcept : fd_(other.fd_) {
  other.fd_ = -1;
}

RunDirLock& RunDirLock::operator=(RunDirLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

std::string run_dir_claim(const std::string& run_dir, bool overwrite, const std::string& job) {
  std::vector<std::string> found;
  for (const auto& name : entries(run_dir))
    if (is_results(run_dir, name)) found.push_back(name);
  std::string moved;
  if (!found.empty()) {
    std::string list;
    for (const auto& f : found) list += (list.empty() ? "" : ", ") + f;
    const bool same_job = !job.empty() && read_small(run_dir + "/" + kJobFile) == job + "\n";
    if (!overwrite && !same_job) {
      throw ConfigError("run directory '" + run_dir + "' holds another run's results (" + list +
                        "); a fresh run will not mix into them. Resume that run "
                        "(checkpoint.resume: auto), choose another run.name, or set "
                        "run.overwrite: true to move them into " +
                        run_dir + "/overwritten-<time>/");
    }
    const std::string aside = new_aside(run_dir, "overwritten-");
    for (const auto& name : entries(run_dir))
      if (is_output(name)) move(run_dir + "/" + name, aside + "/" + name);
    moved = (same_job && !overwrite
                 ? "an earlier attempt of this job left results (" + list +
                       "), and this attempt has no checkpoint.resume: it starts over from step "
                       "0 (checkpoint.resume: auto would continue from the last checkpoint); "
                       "they are moved into " +
                       aside
                 : "run.overwrite: moved the earlier run's results (" + list + ") into " + aside);
  }
  if (!job.empty()) write_file(run_dir + "/" + kJobFile, job + "\n");
  return moved;
}

std::string run_dir_set_aside_after(const std::string& run_dir, int64_t step) {
  const std::string dir = run_dir + "/checkpoints";
  std::vector<std::string> later;
  for (const auto& name : entries(dir)) {
    const std::string digits = name.size() > 5 ? name.substr(5) : "";
    if (name.rfind("step_", 0) != 0 || digits.size() < 8 || digits.size() > 18 ||
        digits.find_first_not_of("0123456789") != std::string::npos || !is_checkpoint(dir, name))
      continue;
    if (std::atoll(digits.c_str()) > step) later.push_back(name);
  }
  if (later.empty()) return "";
  const std::string aside = new_aside(run_dir, "superseded-");
  for (const auto& name : later) move(dir + "/" + name, aside + "/" + name);
  return "resumed from step " + std::to_string(step) + ": the " + std::to_string(later.size()) +
         " later checkpoint(s) of this run (" + later.front() + " to " + later.back() +
         ", an abandoned line of training) are moved into " + aside +
         ", so that rotation and checkpoint.resume: auto keep to this one";
}

}  // namespace lockstep
