// checkpoint.on_signal: while a StopSignals is alive, SIGINT and SIGTERM are
// only recorded; the training loop asks stop_signal_received() at each step
// boundary, where it is safe to agree on a checkpoint and stop.
#pragma once

#include <csignal>

namespace lockstep {

class StopSignals {
 public:
  explicit StopSignals(bool enabled);  // disabled: the default handlers stay
  ~StopSignals();                      // restores the previous handlers
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  bool enabled_;
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

// The last signal recorded (SIGINT or SIGTERM), or 0.
int stop_signal_received();

}  // namespace lockstep
