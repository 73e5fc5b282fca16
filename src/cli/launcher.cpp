// One attempt's state machine (start, relay, reap, stop, summary)
// over one worker table; the process tree and output queue are apart.
// lockstep-run's engine. One attempt:
//   1. start one worker per local rank (worker_process.h), each in its own
//      process group (so that stopping it also stops what it spawned), with
//      PDEATHSIG (so that a killed launcher never leaves workers behind) and
//      with the launch's id in LOCKSTEP_LAUNCH_ID (Note [Launch id],
//      process_tree.h);
//   2. relay each worker's stdout/stderr line by line, prefixed "[rankN]: ",
//      through the output queue: the loop never blocks on our own stdout
//      (Note [Output queue], output_queue.h);
//   3. on the first failure (non-zero exit or signal), SIGTERM the others,
//      SIGKILL what is left after the grace period, and report the first
//      failure as the root cause: later failures are usually its echoes
//      (peers losing their connection to the dead rank);
//   4. once every worker has ended, stop what they left behind: the launcher
//      is a child subreaper, so their orphans come to it (Note [Leftovers]).
// SIGINT/SIGTERM sent to the launcher are forwarded to every worker. Signals,
// reaping and timers are handled between polls that last at most 100 ms, and
// nothing in the loop blocks for longer: a worker's pipe is read only when
// poll says it has data, our output only queued.
// One engine, the workers' lifecycle, the relay and the
// failure summary acting on one worker table; the process tree, the output
// queue and process creation have their own files.
#include "launcher.h"

#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"
#include "lockstep/util/hex.h"
#include "output_queue.h"
#include "process_tree.h"
#include "progress_display.h"
#include "worker_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <string>
#include <vector>

namespace lockstep::launch {
namespace {

// The longest line relayed in one piece (Worker output without newlines).
constexpr size_t kMaxLine = 64 * 1024;
// Queued output above which the workers' pipes are no longer read.
constexpr size_t kMaxQueued = 1 << 20;

using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_signal = 0;
int g_wake[2] = {-1, -1};

void on_signal(int sig) {
  const int saved = errno;
  if (sig != SIGCHLD) g_signal = sig;
  const char byte = 0;
  (void)!write(g_wake[1], &byte, 1);
  errno = saved;
}

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

std::string format_s(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f s", s);
  return text;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* abbrev = sigabbrev_np(sig);
    return "was killed by signal " + std::to_string(sig) + " (SIG" + (abbrev ? abbrev : "?") + ")";
  }
  return "ended with status " + std::to_string(status);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// The launcher's own messages, in order with the relayed lines.
void say_to(OutputQueue& output, const std::string& text) {
  output.push(STDERR_FILENO, "lockstep-run: " + text + "\n");
}

struct Stream {
  int fd = -1;
  int to = STDOUT_FILENO;  // where the launcher relays it
  LineSplitter lines{kMaxLine};
};

struct Worker {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  bool running = false;
  bool stopped_by_us = false;
  int status = 0;
  double ended_s = 0;
  Stream streams[2];
  std::deque<std::string> tail;
  int log_fd = -1;
  // Its first error line (lockstep's "[time] [error] ..."): the worker's own
  // timestamp, and when it arrived here (Note [Root cause]).
  std::string first_error_stamp;
  double first_error_s = -1;
};

// Note [Root cause]
// ~~~~~~~~~~~~~~~~~
// The summary names one failure as the root cause, the others being its
// echoes. The first worker to exit is not always the first to fail: exiting
// takes LibTorch's teardown, and a consequence can exit sooner than its
// cause (two jobs on one port: job B's rank 0 cannot bind and reports
// "Address already in use", while its rank 1, connected to job A's store,
// fails the handshake and exits first). So among the failed workers the
// root cause is the one whose first error line is earliest: by the
// timestamp lockstep's log lines carry (the line that ends a process,
// "[error] lockstep <command>: ..."; one host, one clock, millisecond
// resolution; a tie goes to the lower rank, rank 0 hosting what the others
// need), else by when the line arrived; a worker that printed no error line
// (killed by a signal) falls back to the order of exits. When the first
// worker fails, the others that have printed their final error already
// are not sent SIGTERM: they are leaving, and their own exit codes are
// kept (the grace period's SIGKILL still bounds them).

class Attempt {
 public:
  Attempt(const LaunchOptions& options, int attempt, int master_port, Guardian& guardian,
          OutputQueue& output)
      : options_(options),
        attempt_(attempt),
        master_port_(master_port),
        guardian_(guardian),
        output_(output),
        sweep_(options.launch_id, guardian.pid(), options.grace_s),
        progress_(output, options.node_rank == 0) {}

  // Returns 0, or the exit code the launcher should end with.
  int run() {
    start_ = Clock::now();
    if (!options_.log_dir.empty()) {
      make_directories(options_.log_dir + "/attempt_" + std::to_string(attempt_));
    }
    for (int local = 0; local < options_.nproc_per_node; ++local) spawn(local);
    loop();
    return summarize();
  }

  bool interrupted() const { return interrupted_by_ != 0; }

 private:
  double elapsed_s() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  void say(const std::string& text) { emit(STDERR_FILENO, "lockstep-run: " + text + "\n"); }

  // Our output, above the live progress line when one is drawn.
  void emit(int fd, const std::string& text) { progress_.emit(fd, text); }

  void spawn(int local) {
    Worker w;
    w.local_rank = local;
    w.rank = options_.node_rank * options_.nproc_per_node + local;
    int pipes[2][2];
    for (auto& p : pipes) {
      if (pipe2(p, O_CLOEXEC) != 0) throw SystemError(std::string("pipe: ") + std::strerror(errno));
    }
    if (!options_.log_dir.empty()) {
      const std::string path = options_.log_dir + "/attempt_" + std::to_string(attempt_) +
                               "/rank_" + std::to_string(w.rank) + ".log";
      w.log_fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (w.log_fd < 0) throw SystemError("cannot open '" + path + "': " + std::strerror(errno));
    }
    auto env = worker_environment(options_, w.rank, w.local_rank, master_port_, attempt_);
    if (options_.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr)
      env.emplace_back("OMP_NUM_THREADS", "1");
    // Note [Progress line]: rank 0 gets the pipe of its records; a variable
    // in our own environment is not the others'.
    const int progress = w.rank == 0 ? progress_.open_pipe() : -1;
    env.emplace_back(kProgressFdEnv, progress >= 0 ? std::to_string(progress) : "");
    const pid_t pid = worker_spawn(options_.command, env, pipes[0][1], pipes[1][1], progress);
    if (progress >= 0) close(progress);
    guardian_.watch(pid);
    w.pid = pid;
    w.running = true;
    for (int s = 0; s < 2; ++s) {
      close(pipes[s][1]);
      w.streams[s].fd = pipes[s][0];
      w.streams[s].to = s == 0 ? STDOUT_FILENO : STDERR_FILENO;
    }
    workers_.push_back(std::move(w));
  }

  void relay_line(Worker& w, int s, const std::string& line) {
    emit(w.streams[s].to, "[rank" + std::to_string(w.rank) + "]: " + line + "\n");
    if (w.log_fd >= 0) {
      const std::string text = line + "\n";
      for (size_t done = 0; done < text.size();) {  // a file: never blocks for long
        const ssize_t n = write(w.log_fd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        done += static_cast<size_t>(n);
      }
    }
    w.tail.push_back(line);
    if (static_cast<int>(w.tail.size()) > options_.tail_lines) w.tail.pop_front();
    // The error that ends a lockstep process (run_guarded's "lockstep
    // <command>: ..."), not one it reports and goes on from (check.policy
    // warn, a checkpoint that could not be written under on_error: warn).
    if (w.first_error_s < 0 && line.find("] [error] lockstep ") != std::string::npos) {
      w.first_error_s = elapsed_s();
      // "[2026-12-02 05:23:52.123] [error] ...": the stamp sorts as text.
      if (line.size() > 25 && line[0] == '[' && line[24] == ']')
        w.first_error_stamp = line.substr(1, 23);
    }
  }

  // Note [Root cause]: the failed worker whose first error came first
  // (one we stopped counts only if its error arrived before we stopped it).
  int root_cause() const {
    int root = first_failed_;
    const auto failed = [&](const Worker& w) {
      if (w.stopped_by_us && !(w.first_error_s >= 0 && w.first_error_s <= stop_began_s_))
        return false;
      return !(WIFEXITED(w.status) && WEXITSTATUS(w.status) == 0);
    };
    const auto earlier = [](const Worker& a, const Worker& b) {
      if (!a.first_error_stamp.empty() && !b.first_error_stamp.empty()) {
        if (a.first_error_stamp != b.first_error_stamp)
          return a.first_error_stamp < b.first_error_stamp;
        return a.rank < b.rank;
      }
      return a.first_error_s < b.first_error_s;
    };
    if (root < 0 || workers_[static_cast<size_t>(root)].first_error_s < 0) return root;
    for (size_t i = 0; i < workers_.size(); ++i) {
      const Worker& w = workers_[i];
      if (w.first_error_s < 0 || !failed(w)) continue;
      if (earlier(w, workers_[static_cast<size_t>(root)])) root = static_cast<int>(i);
    }
    return root;
  }

  // Reads what is available; relays complete lines. Closes the stream at EOF.
  void read_stream(Worker& w, int s) {
    Stream& st = w.streams[s];
    char buf[65536];
    const ssize_t n = read(st.fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    last_output_ = Clock::now();
    if (n <= 0) {
      for (const auto& line : st.lines.finish()) relay_line(w, s, line);
      close(st.fd);
      st.fd = -1;
      return;
    }
    for (const auto& line : st.lines.feed(buf, static_cast<size_t>(n))) relay_line(w, s, line);
  }

  // Only workers not reaped yet: their group ids are still theirs.
  // `spare_exiting`: leave out workers whose final error line has arrived:
  // they are leaving on their own, and their own exit code is the truth
  // (Note [Root cause]); the grace period's SIGKILL still reaches them.
  void signal_running(int sig, bool spare_exiting = false) {
    for (auto& w : workers_) {
      if (!w.running) continue;
      if (spare_exiting && w.first_error_s >= 0) continue;
      kill(-w.pid, sig);
      if (sig == SIGTERM || sig == SIGKILL) w.stopped_by_us = true;
    }
  }

  void begin_stop(int sig, bool spare_exiting = false) {
    signal_running(sig, spare_exiting);
    if (!stopping_) {
      kill_deadline_ = Clock::now() + seconds(options_.grace_s);
      stop_began_s_ = elapsed_s();
    }
    stopping_ = true;
  }

  Worker* worker_of(pid_t pid) {
    for (auto& w : workers_)
      if (w.pid == pid && w.running) return &w;
    return nullptr;
  }

  // Reaps every child that has exited: workers, and the orphans adopted as
  // subreaper. Each exit is seen first without reaping (WNOWAIT), so that a
  // worker's group can be killed and the guardian told while the zombie still
  // holds the pid (Note [Guardian]); the guardian, also a child, is reaped
  // only if it died, and then knowingly.
  void reap() {
    while (true) {
      siginfo_t info{};
      if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) return;
      const pid_t pid = info.si_pid;
      Worker* w = worker_of(pid);
      if (w != nullptr) {
        kill(-pid, SIGKILL);  // anything the worker spawned in its group goes with it
        guardian_.forget(pid);
      } else if (pid == guardian_.pid()) {
        guardian_.lost();
        say("the guardian process (pid " + std::to_string(pid) +
            ") ended: a kill -9 of lockstep-run would now leave the workers' children behind");
      }
      int status = 0;
      if (waitpid(pid, &status, 0) != pid) return;
      if (w != nullptr) worker_ended(*w, status);
    }
  }

  void worker_ended(Worker& w, int status) {
    w.running = false;
    w.status = status;
    w.ended_s = elapsed_s();
    const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (!failed || first_failed_ >= 0 || w.stopped_by_us || interrupted_by_ != 0) return;
    first_failed_ = static_cast<int>(&w - workers_.data());
    int others = 0;
    for (const auto& o : workers_) others += o.running ? 1 : 0;
    say("rank " + std::to_string(w.rank) + " " + describe_status(status) + " after " +
        format_s(w.ended_s) +
        (others > 0 ? "; stopping the other " + std::to_string(others) + " worker(s)" : ""));
    begin_stop(SIGTERM, /*spare_exiting=*/true);
  }

  bool any_running() const {
    for (const auto& w : workers_)
      if (w.running) return true;
    return false;
  }

  // One poll of at most 100 ms: the wake pipe (signals, children, room in the
  // output queue) and, unless the queue is full, the workers' pipes.
  void poll_once() {
    std::vector<pollfd> fds{{g_wake[0], POLLIN, 0}, {progress_.read_fd(), POLLIN, 0}};
    std::vector<std::pair<Worker*, int>> owners{{nullptr, 0}, {nullptr, 0}};
    if (output_.full()) {
      last_output_ = Clock::now();  // waiting for our reader, not for the workers
    } else {
      for (auto& w : workers_) {
        for (int s = 0; s < 2; ++s) {
          if (w.streams[s].fd < 0) continue;
          fds.push_back({w.streams[s].fd, POLLIN, 0});
          owners.emplace_back(&w, s);
        }
      }
    }
    if (poll(fds.data(), fds.size(), 100) <= 0) return;
    if (fds[0].revents != 0) {
      char drain[64];
      while (read(g_wake[0], drain, sizeof drain) > 0) {
      }
    }
    if (fds[1].revents != 0 && progress_.read_fd() >= 0)
      progress_.read(elapsed_s());  // poll skips -1
    for (size_t k = 2; k < fds.size(); ++k) {
      if (fds[k].revents != 0) read_stream(*owners[k].first, owners[k].second);
    }
  }

  void handle_signal() {
    if (g_signal == 0 || interrupted_by_ != 0) return;
    interrupted_by_ = g_signal;
    say(std::string("received SIG") + sigabbrev_np(interrupted_by_) +
        ": forwarding it to every worker");
    begin_stop(interrupted_by_);
  }

  void enforce_grace() {
    if (!stopping_ || Clock::now() < kill_deadline_) return;
    if (any_running()) {
      say("grace period of " + format_s(options_.grace_s) + " is over: SIGKILL");
      signal_running(SIGKILL);
    }
    kill_deadline_ = Clock::time_point::max();
  }

  // Once the workers are gone: stops their leftovers, then waits for the
  // pipes to close. True when the attempt is over.
  bool wind_down() {
    if (!sweep_.done()) {
      const auto now = Clock::now();
      if (now - last_sweep_ < std::chrono::milliseconds(50)) return false;
      last_sweep_ = now;
      const std::string said = sweep_.step(now);
      if (!said.empty()) say(said);
      if (!sweep_.done()) return false;
      last_output_ = Clock::now();
    }
    bool open = false;
    for (const auto& w : workers_)
      for (const auto& st : w.streams) open = open || st.fd >= 0;
    if (!open) return true;
    // Every process of the launch is gone, yet a pipe is open: a process we
    // could not find holds it (Note [Launch id]). Stop listening once it has
    // been silent for 2 s; at once if a signal asks us to end and our own
    // reader is stalled (what is in the pipes could not be written anyway).
    const bool stalled = interrupted_by_ != 0 && output_.full();
    if (!stalled && Clock::now() - last_output_ < std::chrono::seconds(2)) return false;
    for (auto& w : workers_)
      for (auto& st : w.streams)
        if (st.fd >= 0) close(st.fd), st.fd = -1;
    return true;
  }

  void loop() {
    while (true) {
      poll_once();
      progress_.tick(elapsed_s());
      handle_signal();
      reap();
      enforce_grace();
      if (!any_running() && wind_down()) break;
    }
    for (auto& w : workers_) {
      if (w.log_fd >= 0) close(w.log_fd);
    }
    progress_.end(elapsed_s());
  }

  int summarize() {
    if (interrupted_by_ != 0) return 128 + interrupted_by_;
    if (first_failed_ < 0) {
      // Nobody failed first, yet someone may still have failed (e.g. both
      // failed in the same instant while we were stopping): check all.
      for (const auto& w : workers_) {
        if (!(WIFEXITED(w.status) && WEXITSTATUS(w.status) == 0)) return exit_code_of(w.status);
      }
      return 0;
    }
    const Worker& first = workers_[static_cast<size_t>(root_cause())];
    // A root cause we stopped on its way out has no exit code of its own:
    // the code is that of the first worker that ended by itself.
    const bool stopped = first.stopped_by_us && WIFSIGNALED(first.status);
    const int code = exit_code_of(stopped ? workers_[first_failed_].status : first.status);
    std::string text =
        "FAILED (attempt " + std::to_string(attempt_ + 1) + " of " +
        std::to_string(options_.max_restarts + 1) + "): root cause: rank " +
        std::to_string(first.rank) + " (local rank " + std::to_string(first.local_rank) + ", pid " +
        std::to_string(first.pid) + ") " +
        (stopped ? "failed first (its error below), then was stopped by lockstep-run"
                 : describe_status(first.status) + " after " + format_s(first.ended_s));
    text += "\n  last " + std::to_string(first.tail.size()) + " line(s) of rank " +
            std::to_string(first.rank) + ":";
    for (const auto& line : first.tail) text += "\n    " + line;
    for (const auto& w : workers_) {
      if (&w == &first) continue;
      text += "\n  rank " + std::to_string(w.rank) + ": " +
              (w.stopped_by_us && WIFSIGNALED(w.status) ? "stopped by lockstep-run (" : "") +
              describe_status(w.status) + (w.stopped_by_us && WIFSIGNALED(w.status) ? ")" : "");
    }
    say(text);
    return code == 0 ? 1 : code;
  }

  const LaunchOptions& options_;
  const int attempt_;
  const int master_port_;
  Guardian& guardian_;
  OutputQueue& output_;
  LeftoverSweep sweep_;
  Clock::time_point start_;
  Clock::time_point last_output_ = Clock::now();  // the pipes last gave something
  Clock::time_point last_sweep_{};
  std::vector<Worker> workers_;
  ProgressDisplay progress_;  // Note [Progress line]
  int first_failed_ = -1;
  double stop_began_s_ = 1e300;  // when the first failure made us stop the others
  int interrupted_by_ = 0;
  bool stopping_ = false;
  Clock::time_point kill_deadline_ = Clock::time_point::max();
};

void install_signal_handlers() {
  if (pipe2(g_wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw SystemError(std::string("pipe: ") + std::strerror(errno));
  }
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGCHLD}) sigaction(sig, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

}  // namespace

void launch_validate(const LaunchOptions& o) {
  auto bad = [](const std::string& what) { throw ConfigError(what); };
  if (o.nproc_per_node < 1)
    bad("--nproc-per-node=" + std::to_string(o.nproc_per_node) + " must be >= 1");
  if (o.nnodes < 1) bad("--nnodes=" + std::to_string(o.nnodes) + " must be >= 1");
  if (o.node_rank < 0 || o.node_rank >= o.nnodes) {
    bad("--node-rank=" + std::to_string(o.node_rank) +
        " must be in [0, --nnodes=" + std::to_string(o.nnodes) + ")");
  }
  if (o.master_port < 0 || o.master_port > 65535) {
    bad("--master-port=" + std::to_string(o.master_port) + " must be in [0, 65535]");
  }
  if (o.master_port == 0 && o.nnodes > 1) {
    bad("--master-port=0 (pick a free port) only works with --nnodes=1: the other nodes could "
        "not learn the port; pass the same --master-port to every node");
  }
  if (o.max_restarts < 0) bad("--max-restarts=" + std::to_string(o.max_restarts) + " must be >= 0");
  if (!(o.grace_s >= 0 && o.grace_s <= 86400)) {
    bad("--grace-s=" + std::to_string(o.grace_s) + " must be in [0, 86400] seconds");
  }
  if (o.nnodes > 1 && o.store_secret.empty()) {
    bad("--nnodes=" + std::to_string(o.nnodes) +
        " needs LOCKSTEP_STORE_SECRET in the environment, the same on every node: rank 0's store "
        "admits only the job's ranks (e.g. export LOCKSTEP_STORE_SECRET=$(openssl rand -hex 32) "
        "and pass "
        "it to each node)");
  }
  if (o.command.empty()) bad("no program given: lockstep-run [options] PROGRAM [ARGS...]");
}

std::string launch_make_secret() {
  return random_hex(32);
}

std::vector<std::pair<std::string, std::string>> worker_environment(const LaunchOptions& options,
                                                                    int rank, int local_rank,
                                                                    int master_port, int attempt) {
  const int world = options.nnodes * options.nproc_per_node;
  std::vector<std::pair<std::string, std::string>> env;
  auto set = [&env](const char* name, const std::string& value) { env.emplace_back(name, value); };
  // torchrun's worker contract (torch.distributed.elastic.agent).
  set("RANK", std::to_string(rank));
  set("WORLD_SIZE", std::to_string(world));
  set("LOCAL_RANK", std::to_string(local_rank));
  set("LOCAL_WORLD_SIZE", std::to_string(options.nproc_per_node));
  set("GROUP_RANK", std::to_string(options.node_rank));
  set("GROUP_WORLD_SIZE", std::to_string(options.nnodes));
  set("ROLE_RANK", std::to_string(rank));
  set("ROLE_WORLD_SIZE", std::to_string(world));
  set("ROLE_NAME", "default");
  set("MASTER_ADDR", options.master_addr);
  set("MASTER_PORT", std::to_string(master_port));
  set("TORCHELASTIC_RESTART_COUNT", std::to_string(attempt));
  set("TORCHELASTIC_MAX_RESTARTS", std::to_string(options.max_restarts));
  set("TORCHELASTIC_RUN_ID", "none");
  // Rank 0 hosts the store (no agent store here), and admits only the job.
  set("TORCHELASTIC_USE_AGENT_STORE", "False");
  set("LOCKSTEP_STORE_SECRET", options.store_secret);
  // The launcher starts every line with "[rankN]: ": logs need no second tag.
  set("LOCKSTEP_LINES_TAGGED", "1");
  // Marks the launch's processes, wherever they wander (Note [Launch id]).
  set("LOCKSTEP_LAUNCH_ID", options.enclosing_launch_ids.empty()
                                ? options.launch_id
                                : options.enclosing_launch_ids + ":" + options.launch_id);
  return env;
}

std::vector<std::string> LineSplitter::feed(const char* data, std::size_t size) {
  std::vector<std::string> lines;
  partial_.append(data, size);
  std::size_t begin = 0;
  for (std::size_t nl; (nl = partial_.find('\n', begin)) != std::string::npos; begin = nl + 1)
    lines.push_back(partial_.substr(begin, nl - begin));
  partial_.erase(0, begin);
  while (partial_.size() >= max_line_) {
    lines.push_back(partial_.substr(0, max_line_));
    partial_.erase(0, max_line_);
  }
  return lines;
}

std::vector<std::string> LineSplitter::finish() {
  std::vector<std::string> lines;
  if (!partial_.empty()) lines.push_back(std::move(partial_));
  partial_.clear();
  return lines;
}

int launch_free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw SystemError(std::string("socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    throw SystemError("cannot pick a free port: " + why);
  }
  close(fd);
  return ntohs(addr.sin_port);
}

int launch_run(const LaunchOptions& given) {
  launch_validate(given);
  LaunchOptions options = given;
  if (options.launch_id.empty()) options.launch_id = random_hex(16);  // Note [Launch id]
  install_signal_handlers();
  // The launch's orphans (a worker's daemon, a double fork) come to us, not
  // to init, and are stopped with the attempt (Note [Leftovers]).
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  Guardian guardian(options.launch_id);       // Note [Guardian]; forked before any thread
  OutputQueue output(g_wake[1], kMaxQueued);  // Note [Output queue]
  if (options.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    say_to(output, "OMP_NUM_THREADS is unset: setting it to 1 for each of the " +
                       std::to_string(options.nproc_per_node) + " workers (set it to tune)");
  }
  int code = 0;
  bool interrupted = false;
  for (int attempt = 0; attempt <= options.max_restarts; ++attempt) {
    // A fresh port per attempt when auto-picked: the last one may linger.
    const int port = options.master_port == 0 ? launch_free_port() : options.master_port;
    Attempt run(options, attempt, port, guardian, output);
    code = run.run();
    interrupted = run.interrupted();
    if (code == 0 || interrupted) break;
    if (attempt < options.max_restarts) {
      say_to(output, "restarting the worker group (restart " + std::to_string(attempt + 1) +
                         " of " + std::to_string(options.max_restarts) + ")");
    }
  }
  guardian.release();  // nothing of the launch is left to guard
  // All of our output is written, however long our reader takes, as any
  // program's would; but after a signal, or when one comes meanwhile, for at
  // most the grace period more: then what is left is dropped.
  while (!interrupted && g_signal == 0 &&
         !output.wait_written(Clock::now() + std::chrono::milliseconds(100))) {
  }
  output.finish(Clock::now() + seconds(options.grace_s));
  return code;
}

}  // namespace lockstep::launch
