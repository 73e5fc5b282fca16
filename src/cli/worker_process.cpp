// Starting one worker process (worker_process.h).
#include "worker_process.h"

#include "lockstep/util/error.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

namespace lockstep::launch {
namespace {

// What the child needs between fork and exec, built before the fork.
struct ExecPlan {
  std::vector<std::string> env_strings;
  std::vector<char*> argv, envp;
  std::string cannot_execute;  // "lockstep-run: cannot execute 'PROG': "
};

ExecPlan make_exec_plan(const std::vector<std::string>& command,
                        const std::vector<std::pair<std::string, std::string>>& env) {
  ExecPlan plan;
  std::set<std::string> names;
  for (const auto& [name, value] : env) names.insert(name);
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    if (names.count(entry.substr(0, entry.find('='))) == 0) plan.env_strings.push_back(entry);
  }
  for (const auto& [name, value] : env) plan.env_strings.push_back(name + "=" + value);
  for (auto& entry : plan.env_strings) plan.envp.push_back(entry.data());
  plan.envp.push_back(nullptr);
  for (const auto& arg : command) plan.argv.push_back(const_cast<char*>(arg.c_str()));
  plan.argv.push_back(nullptr);
  plan.cannot_execute = "lockstep-run: cannot execute '" + command.at(0) + "': ";
  return plan;
}

// In the forked child: async-signal-safe calls only.
[[noreturn]] void exec_child(const ExecPlan& plan, int out_fd, int err_fd, int keep_fd,
                             pid_t parent, const sigset_t& mask) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // the launcher died before prctl
  dup2(out_fd, STDOUT_FILENO);
  dup2(err_fd, STDERR_FILENO);
  if (keep_fd >= 0) fcntl(keep_fd, F_SETFD, 0);  // survives the exec, at its own number
  for (int sig : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE}) signal(sig, SIG_DFL);
  sigprocmask(SIG_SETMASK, &mask, nullptr);
  execvpe(plan.argv[0], plan.argv.data(), plan.envp.data());
  const char* why = strerrordesc_np(errno);  // no locale, no allocation
  (void)!write(STDERR_FILENO, plan.cannot_execute.data(), plan.cannot_execute.size());
  (void)!write(STDERR_FILENO, why, std::strlen(why));
  (void)!write(STDERR_FILENO, "\n", 1);
  _exit(127);
}

}  // namespace

pid_t worker_spawn(const std::vector<std::string>& command,
                   const std::vector<std::pair<std::string, std::string>>& env, int out_fd,
                   int err_fd, int keep_fd) {
  const ExecPlan plan = make_exec_plan(command, env);
  const pid_t parent = getpid();
  sigset_t all, previous;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, &previous);
  const pid_t pid = fork();
  if (pid == 0) exec_child(plan, out_fd, err_fd, keep_fd, parent, previous);  // never returns
  const int fork_errno = errno;
  sigprocmask(SIG_SETMASK, &previous, nullptr);
  if (pid < 0) throw SystemError(std::string("fork: ") + std::strerror(fork_errno));
  setpgid(pid, pid);  // also done in the child: whichever runs first wins the race
  return pid;
}

}  // namespace lockstep::launch
