// lockstep-run's live progress line (Note [Progress line], util/progress.h):
// rank 0's pipe read, the line drawn at the bottom of the terminal, and the
// relayed output printed above it. Never blocks: the pipe is non-blocking
// and every write goes through the output queue. No LibTorch.
#pragma once

#include <chrono>
#include <string>

#include "launcher.h"
#include "lockstep/util/progress.h"
#include "output_queue.h"

namespace lockstep::launch {

class ProgressDisplay {
 public:
  using Clock = std::chrono::steady_clock;
  // Draws when this node hosts rank 0 and our stdout is a terminal; stderr
  // joins the line's writer when it is the same terminal.
  ProgressDisplay(OutputQueue& output, bool hosts_rank0);
  ~ProgressDisplay();
  ProgressDisplay(const ProgressDisplay&) = delete;
  ProgressDisplay& operator=(const ProgressDisplay&) = delete;

  // For rank 0's spawn: the pipe's write end to keep open across exec
  // (-1: none), set in LOCKSTEP_PROGRESS_FD; the caller closes it after the
  // fork. "" in that variable for every other worker.
  int open_pipe();
  int read_fd() const { return fd_; }
  // `text` (whole lines) for `fd`, above the line when one is drawn.
  void emit(int fd, const std::string& text);
  // The pipe is readable; `now_s`: the launcher's clock.
  void read(double now_s);
  // Once a second between records (the elapsed time moves on).
  void tick(double now_s);
  // The attempt's end: the line from the latest record stays, and a newline.
  void end(double now_s);

 private:
  void redraw(double now_s);

  OutputQueue& output_;
  bool drawing_ = false, merge_stderr_ = false, done_ = false;
  int fd_ = -1;
  LineSplitter lines_{1024};
  ProgressView view_;
  std::string status_;
  Clock::time_point last_drawn_{};
};

}  // namespace lockstep::launch
