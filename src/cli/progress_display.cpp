#include "progress_display.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "lockstep/util/error.h"

namespace lockstep::launch {

namespace {
int terminal_columns() {
  struct winsize size {};
  return ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0 ? size.ws_col : 80;
}
}  // namespace

ProgressDisplay::ProgressDisplay(OutputQueue& output, bool hosts_rank0) : output_(output) {
  drawing_ = hosts_rank0 && isatty(STDOUT_FILENO) != 0;
  struct stat out {
  }, err{};
  merge_stderr_ = drawing_ && isatty(STDERR_FILENO) != 0 && fstat(STDOUT_FILENO, &out) == 0 &&
                  fstat(STDERR_FILENO, &err) == 0 && out.st_rdev == err.st_rdev;
}

ProgressDisplay::~ProgressDisplay() {
  if (fd_ >= 0) close(fd_);
}

int ProgressDisplay::open_pipe() {
  if (!drawing_) return -1;
  int ends[2];
  if (pipe2(ends, O_CLOEXEC) != 0) throw SystemError(std::string("pipe: ") + std::strerror(errno));
  fcntl(ends[0], F_SETFL, fcntl(ends[0], F_GETFL) | O_NONBLOCK);
  if (fd_ >= 0) close(fd_);
  fd_ = ends[0];
  return ends[1];
}

void ProgressDisplay::emit(int fd, const std::string& text) {
  if (status_.empty() || (fd == STDERR_FILENO && !merge_stderr_)) {
    output_.push(fd, text);
    return;
  }
  output_.push(STDOUT_FILENO, "\r\033[K" + text + status_);
}

void ProgressDisplay::read(double now_s) {
  char buf[4096];
  const ssize_t n = ::read(fd_, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    close(fd_);
    fd_ = -1;
    return;
  }
  bool any = false;
  for (const auto& line : lines_.feed(buf, static_cast<size_t>(n))) {
    if (const auto record = parse_progress_record(line)) {  // anything else is ignored
      view_.update(*record, now_s);
      any = true;
      done_ = record->step >= record->total;
    }
  }
  if (!any || (Clock::now() - last_drawn_ < std::chrono::milliseconds(100) && !done_)) return;
  redraw(now_s);
}

void ProgressDisplay::tick(double now_s) {
  if (!status_.empty() && Clock::now() - last_drawn_ > std::chrono::seconds(1)) redraw(now_s);
}

void ProgressDisplay::redraw(double now_s) {
  if (view_.empty() || output_.full()) return;  // a stalled reader: the queue must not grow
  last_drawn_ = Clock::now();
  status_ = view_.render(terminal_columns(), now_s);
  output_.push(STDOUT_FILENO, "\r\033[K" + status_);
}

void ProgressDisplay::end(double now_s) {
  if (fd_ >= 0) close(fd_), fd_ = -1;
  if (!status_.empty())  // the latest record, not the last one drawn
    output_.push(STDOUT_FILENO, "\r\033[K" + view_.render(terminal_columns(), now_s) + "\n");
  status_.clear();
}

}  // namespace lockstep::launch
