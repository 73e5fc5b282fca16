// The output queue and its writer threads (Note [Output queue]).
#include "output_queue.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace lockstep::launch {
namespace {

// Pieces queued together go out in one write of up to this.
constexpr std::size_t kBatch = 64 * 1024;

void write_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // our own stdout is gone: nothing better to do
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace

// One lock for both lanes: the byte count and the limit are shared.
struct OutputQueue::State {
  struct Lane {
    std::deque<std::string> pieces;
    std::size_t bytes = 0;  // queued or being written
    std::condition_variable queued;
  };
  std::mutex mutex;
  std::condition_variable written;  // wait_written()/finish() wait for empty lanes
  Lane lanes[2];                    // stdout, stderr
  std::size_t limit = 0;
  int wake_fd = -1;
  bool wake_wanted = false;  // full() said yes since the last wake
  bool ending = false;       // no more text: the writers exit once empty

  std::size_t bytes() const { return lanes[0].bytes + lanes[1].bytes; }

  void writer_loop(int index, int fd) {
    Lane& lane = lanes[index];
    std::unique_lock<std::mutex> lock(mutex);
    while (true) {
      lane.queued.wait(lock, [&] { return ending || !lane.pieces.empty(); });
      if (lane.pieces.empty()) return;  // ending, all written
      std::string batch;
      while (!lane.pieces.empty() &&
             (batch.empty() || batch.size() + lane.pieces.front().size() <= kBatch)) {
        batch += lane.pieces.front();
        lane.pieces.pop_front();
      }
      lock.unlock();
      write_all(fd, batch);
      lock.lock();
      lane.bytes -= batch.size();
      if (wake_wanted && bytes() < limit / 2) {
        wake_wanted = false;
        const char byte = 0;
        (void)!::write(wake_fd, &byte, 1);
      }
      if (lane.bytes == 0) written.notify_all();
    }
  }
};

OutputQueue::OutputQueue(int wake_fd, std::size_t limit) : state_(std::make_shared<State>()) {
  state_->wake_fd = wake_fd;
  state_->limit = limit;
  // Signals are the main loop's: the writers only write.
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &previous);
  for (int index : {0, 1}) {
    std::thread([state = state_, index] {
      state->writer_loop(index, index == 0 ? STDOUT_FILENO : STDERR_FILENO);
    }).detach();
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

OutputQueue::~OutputQueue() {
  finish(Clock::now() + std::chrono::seconds(1));
}

void OutputQueue::push(int fd, std::string text) {
  if (text.empty()) return;
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->ending) return;
  State::Lane& lane = state_->lanes[fd == STDERR_FILENO ? 1 : 0];
  lane.bytes += text.size();
  lane.pieces.push_back(std::move(text));
  lane.queued.notify_one();
}

bool OutputQueue::full() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  const bool over = state_->bytes() > state_->limit;
  if (over) state_->wake_wanted = true;
  return over;
}

bool OutputQueue::wait_written(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(state_->mutex);
  return state_->written.wait_until(lock, deadline, [&] { return state_->bytes() == 0; });
}

std::size_t OutputQueue::finish(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(state_->mutex);
  if (state_->ending) return 0;
  state_->ending = true;
  for (auto& lane : state_->lanes) lane.queued.notify_one();
  state_->written.wait_until(lock, deadline, [&] { return state_->bytes() == 0; });
  // A writer still blocked in write() exits once it returns; it is detached,
  // and the state outlives us through its own reference.
  std::size_t dropped = 0;
  for (auto& lane : state_->lanes) {
    std::size_t lane_dropped = 0;
    for (const auto& piece : lane.pieces) lane_dropped += piece.size();
    lane.bytes -= lane_dropped;
    lane.pieces.clear();
    dropped += lane_dropped;
  }
  return dropped;
}

}  // namespace lockstep::launch
