// A launch's process tree (process_tree.h): the /proc scan, signals through
// pidfds, the sweep of leftovers and the guardian.
#include "process_tree.h"

#include "lockstep/util/error.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

namespace lockstep::launch {
namespace {

// An environment larger than this is read only this far.
constexpr std::size_t kMaxEnviron = 1 << 20;

struct ProcStat {
  char state = '?';
  pid_t ppid = 0;
  pid_t pgrp = 0;
  unsigned long long start_ticks = 0;
  std::string name;
};

// Reads up to `limit` bytes of a /proc file into `out`.
bool read_proc_file(const std::string& path, std::size_t limit, std::string& out) {
  out.clear();
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[16384];
  while (out.size() < limit) {
    const ssize_t n = read(fd, buf, std::min(sizeof buf, limit - out.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  close(fd);
  return true;
}

// /proc/<pid>/stat: "pid (comm) state ppid pgrp ... starttime(22nd) ...";
// comm may hold spaces and parentheses, so the fields start after the last ')'.
bool read_stat(pid_t pid, ProcStat& st) {
  std::string text;
  if (!read_proc_file("/proc/" + std::to_string(pid) + "/stat", 4096, text)) return false;
  const auto open_paren = text.find('(');
  const auto close_paren = text.rfind(')');
  if (open_paren == std::string::npos || close_paren == std::string::npos) return false;
  st.name = text.substr(open_paren + 1, close_paren - open_paren - 1);
  char state = '?';
  int ppid = 0, pgrp = 0;
  unsigned long long start = 0;
  // state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
  // utime stime cutime cstime priority nice threads itrealvalue starttime
  if (std::sscanf(text.c_str() + close_paren + 1,
                  " %c %d %d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
                  &state, &ppid, &pgrp, &start) != 4)
    return false;
  st.state = state;
  st.ppid = ppid;
  st.pgrp = pgrp;
  st.start_ticks = start;
  return true;
}

// The system call numbers are the same on every architecture (Linux 5.1
// and 5.3): old headers need not hide pidfds from a kernel that has them.
int pidfd_open(pid_t pid) {
#ifndef SYS_pidfd_open
  constexpr long SYS_pidfd_open = 434;
#endif
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
}

int pidfd_send_signal(int pidfd, int sig) {
#ifndef SYS_pidfd_send_signal
  constexpr long SYS_pidfd_send_signal = 424;
#endif
  return static_cast<int>(syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0));
}

std::string format_s(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f s", s);
  return text;
}

}  // namespace

bool environ_carries_launch_id(std::string_view env_block, std::string_view launch_id) {
  constexpr std::string_view kName = "LOCKSTEP_LAUNCH_ID=";
  if (launch_id.empty()) return false;
  for (std::size_t pos = 0; pos < env_block.size();) {
    std::size_t end = env_block.find('\0', pos);
    if (end == std::string_view::npos) end = env_block.size();
    const std::string_view entry = env_block.substr(pos, end - pos);
    if (entry.substr(0, kName.size()) == kName) {
      const std::string_view ids = entry.substr(kName.size());
      for (std::size_t begin = 0;;) {
        const std::size_t colon = ids.find(':', begin);
        if (ids.substr(begin, colon == std::string_view::npos ? colon : colon - begin) == launch_id)
          return true;
        if (colon == std::string_view::npos) break;
        begin = colon + 1;
      }
    }
    pos = end + 1;
  }
  return false;
}

std::vector<TreeProcess> tree_scan(const std::string& launch_id, pid_t spare) {
  std::vector<TreeProcess> found;
  DIR* dir = opendir("/proc");
  if (dir == nullptr) return found;
  const pid_t self = getpid();
  std::string env_block;
  while (const dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || pid <= 0 || pid == self || pid == spare) continue;
    ProcStat st;
    if (!read_stat(static_cast<pid_t>(pid), st) || st.state == 'Z' || st.state == 'X') continue;
    TreeProcess p;
    p.pid = static_cast<pid_t>(pid);
    p.pgrp = st.pgrp;
    p.start_ticks = st.start_ticks;
    p.name = st.name;
    p.carries_id =
        read_proc_file("/proc/" + std::to_string(pid) + "/environ", kMaxEnviron, env_block) &&
        environ_carries_launch_id(env_block, launch_id);
    if (p.carries_id || st.ppid == self) found.push_back(std::move(p));
  }
  closedir(dir);
  return found;
}

bool tree_signal(const TreeProcess& process, int sig) {
  // The pidfd pins the process found at `pid` now; if the start time below
  // still matches, /proc showed that very process, and the signal goes to it
  // or (when it has ended since) to nobody.
  const int fd = pidfd_open(process.pid);
  if (fd < 0 && errno == ESRCH) return false;  // ended
  ProcStat now;
  int rc = -1;
  if (read_stat(process.pid, now) && now.start_ticks == process.start_ticks) {
    // Without pidfds (Linux < 5.3) a tiny window remains between the check
    // and kill(): a pid reused within it would need a full wrap of the pids.
    rc = fd >= 0 ? pidfd_send_signal(fd, sig) : kill(process.pid, sig);
    if (rc != 0 && fd >= 0 && errno == ENOSYS) rc = kill(process.pid, sig);
  }
  if (fd >= 0) close(fd);
  return rc == 0;
}

std::string tree_describe(const std::vector<TreeProcess>& processes, std::size_t most) {
  std::string text;
  for (std::size_t k = 0; k < processes.size(); ++k) {
    if (k == most) return text + ", ...";
    text += (k > 0 ? ", " : "") + std::to_string(processes[k].pid) + " (" + processes[k].name + ")";
  }
  return text;
}

std::string LeftoverSweep::step(Clock::time_point now) {
  if (done_) return "";
  const std::vector<TreeProcess> left = tree_scan(launch_id_, spare_);
  if (left.empty()) {
    done_ = true;
    return "";
  }
  if (killing_) {
    for (const auto& p : left) tree_signal(p, SIGKILL);
    if (now < give_up_at_) return "";
    done_ = true;
    return std::to_string(left.size()) + " process(es) left behind survived SIGKILL for 5 s " +
           "(stuck in the kernel?): " + tree_describe(left) + "; giving up on them";
  }
  // The deadlines start with the first leftover found, whether or not it
  // could be signalled (one we may not signal must not stall the launcher).
  const bool first = kill_at_ == Clock::time_point::max();
  if (first) {
    kill_at_ =
        now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace_s_));
  }
  std::vector<TreeProcess> fresh;
  for (const auto& p : left) {
    if (terminated_.insert({p.pid, p.start_ticks}).second && tree_signal(p, SIGTERM))
      fresh.push_back(p);
  }
  std::string said;
  if (!fresh.empty()) {
    said = (first ? "the workers left " : "and ") + std::to_string(fresh.size()) +
           " process(es) behind: " + tree_describe(fresh) + ": SIGTERM" +
           (first ? ", then SIGKILL after " + format_s(grace_s_) : "");
  }
  if (now < kill_at_) return said;
  killing_ = true;
  give_up_at_ = now + std::chrono::seconds(5);
  for (const auto& p : left) tree_signal(p, SIGKILL);
  return said + (said.empty() ? "" : "\n") + "grace period of " + format_s(grace_s_) +
         " is over: SIGKILL to " + std::to_string(left.size()) +
         " process(es) left behind: " + tree_describe(left);
}

Guardian::Guardian(const std::string& launch_id) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) throw SystemError(std::string("pipe: ") + std::strerror(errno));
  pid_ = fork();
  if (pid_ < 0) {
    const int err = errno;
    close(p[0]);
    close(p[1]);
    throw SystemError(std::string("fork: ") + std::strerror(err));
  }
  if (pid_ == 0) {
    close(p[1]);
    watch_loop(p[0], launch_id);
  }
  close(p[0]);
  fd_ = p[1];
}

Guardian::~Guardian() {
  if (fd_ >= 0) close(fd_);  // not released: the guardian stops the launch
}

void Guardian::release() {
  if (fd_ < 0) return;
  send(0);
  close(fd_);
  fd_ = -1;
  if (pid_ <= 0) return;
  // It leaves at once on the 0; one that does not within 5 s (stopped,
  // stuck) is killed rather than waited for: the launcher never hangs here.
  for (int waited_ms = 0; waited_ms < 5000; waited_ms += 10) {
    const pid_t done = waitpid(pid_, nullptr, WNOHANG);
    if (done == pid_ || (done < 0 && errno != EINTR)) return;
    usleep(10 * 1000);
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);  // SIGKILL ends even a stopped process
}

void Guardian::send(int32_t value) {
  if (fd_ >= 0) (void)!::write(fd_, &value, sizeof value);  // 4 bytes: atomic on a pipe
}

void Guardian::watch_loop(int fd, const std::string& launch_id) {
  // Terminal signals are for the launcher, which forwards them.
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE}) signal(sig, SIG_IGN);
  // Hold none of the launcher's terminals or pipes: whoever waits for the
  // launcher's output to end must not wait for us.
  const int null = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null >= 0) {
    for (int std_fd : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO}) dup2(null, std_fd);
  }
  std::set<pid_t> live;  // the current attempt's worker groups
  int32_t value = 0;
  while (true) {
    const ssize_t n = ::read(fd, &value, sizeof value);
    if (n < 0 && errno == EINTR) continue;
    if (n != sizeof value) break;  // EOF: the launcher is gone
    if (value == 0) _exit(0);      // released
    if (value > 0) live.insert(value);
    if (value < 0) live.erase(-value);
  }
  // Rounds until nothing is found: a process may fork while we kill.
  for (int round = 0; round < 100; ++round) {
    const std::vector<TreeProcess> found = tree_scan(launch_id, /*spare=*/-1);
    if (found.empty()) break;
    for (const auto& p : found) {
      if (!tree_signal(p, SIGKILL)) continue;
      // p was alive in its group just now: the group is still ours.
      if (p.carries_id && live.erase(p.pgrp) > 0) kill(-p.pgrp, SIGKILL);
    }
    usleep(10 * 1000);
  }
  _exit(0);
}

}  // namespace lockstep::launch
