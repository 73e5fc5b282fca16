// The launcher's own output (relayed worker lines and its messages) goes
// through this queue to stdout and stderr, each written by a thread of its
// own. No LibTorch.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

namespace lockstep::launch {

// Note [Output queue]: a write to our stdout blocks while its reader does not
// read (a full pipe, a paused terminal). Were the launcher's main loop to make
// that write, a stalled reader would stall everything behind it: forwarding
// SIGTERM, reaping, the grace period's SIGKILL. So the main loop only appends
// to this queue, which never blocks, and two writer threads, one per
// descriptor, make the blocking writes, each in order; a stalled stdout does
// not hold back stderr (the order between the two streams is kept no more
// than between any two pipes). Above `limit` queued bytes full() says so, and
// the main loop stops reading the workers' pipes (backpressure: the workers
// then block on their own writes, as under a slow terminal) but goes on
// handling signals and children. When the queue falls under half the limit a
// writer writes a byte to `wake_fd` so that the main loop reads again at once.
// A writer blocked on a reader that never reads cannot be stopped; when the
// launcher must end anyway, finish() stops waiting at its deadline, drops what
// is left and leaves that thread blocked until the process exits (the state
// is shared with it, so nothing it touches is freed under it).
class OutputQueue {
 public:
  using Clock = std::chrono::steady_clock;
  // Starts the writer threads, with every signal blocked in them.
  OutputQueue(int wake_fd, std::size_t limit);
  // finish() with a deadline of 1 s if it was not called (an exception).
  // The writers are detached: one blocked on a stalled reader ends with the
  // process.
  ~OutputQueue();
  OutputQueue(const OutputQueue&) = delete;
  OutputQueue& operator=(const OutputQueue&) = delete;

  // Appends `text` for `fd` (STDOUT_FILENO or STDERR_FILENO). Never blocks.
  void push(int fd, std::string text);
  // More than `limit` bytes wait: stop reading the workers.
  bool full();
  // Waits until everything queued so far is written, or until `deadline`;
  // returns whether it was all written.
  bool wait_written(Clock::time_point deadline);
  // wait_written(deadline), then stops the writer, dropping what is left.
  // Returns the bytes dropped. The queue takes no more text after it.
  std::size_t finish(Clock::time_point deadline);

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace lockstep::launch
