// The live progress line (Note [Progress line], progress.cpp): rank 0's
// records over a side channel, and the line drawn from them with a rate and
// an ETA. Torch-free: lockstep-run draws it, and so does rank 0 itself when
// it owns a terminal (torchrun, srun).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>

namespace lockstep {

// The environment variable lockstep-run sets for rank 0: the number of the
// pipe it reads progress records from.
inline constexpr const char* kProgressFdEnv = "LOCKSTEP_PROGRESS_FD";

struct ProgressRecord {
  int64_t step = 0;   // optimizer steps done
  int64_t total = 0;  // the steps the run will take (train.max_steps or the epochs')
  int64_t epoch = 1;  // 1-based
  double loss = -1;   // the last interval's mean loss; < 0: none yet
  double units = 0;   // samples (or tokens) the job has trained in this process
  bool tokens = false;
};

// "progress step=150 total=500 epoch=1 loss=1.2345 units=245760 unit=tokens\n"
std::string progress_record_line(const ProgressRecord& record);
// The record in `line` (without its newline); nullopt for anything else:
// unknown or repeated keys, a number out of range, step > total, a line
// over 256 bytes. The channel is a pipe from our own worker, but read as
// hostile all the same.
std::optional<ProgressRecord> parse_progress_record(std::string_view line);

// "0:07", "12:34", "1:02:03".
std::string duration_text(double seconds);

// The line: "[######....] step 150/500 30% | ETA 0:28 | 0:12 elapsed |
// loss 1.2345 | 27.1k tokens/s | epoch 1", the bar only where the terminal
// has room, the tail cut on a narrow one. Rate and ETA come from the
// records of the last ~10 s (so a resumed run, or a slow first step, does
// not skew them).
class ProgressView {
 public:
  void update(const ProgressRecord& record, double now_s);
  bool empty() const { return !last_; }
  // At most `columns` - 1 characters (no wrap: \r redraws one line).
  std::string render(int columns, double now_s) const;

 private:
  struct Point {
    double t;
    int64_t step;
    double units;
  };
  std::optional<ProgressRecord> last_;
  std::deque<Point> window_;
  double start_s_ = -1;
};

}  // namespace lockstep
