#include "stop_signals.h"

#include <atomic>

namespace lockstep {
namespace {

std::atomic<int> g_stop_signal{0};

void on_stop_signal(int sig) {
  g_stop_signal = sig;
}

}  // namespace

StopSignals::StopSignals(bool enabled) : enabled_(enabled) {
  if (!enabled_) return;
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, &old_int_);
  sigaction(SIGTERM, &action, &old_term_);
}

StopSignals::~StopSignals() {
  if (!enabled_) return;
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
}

int stop_signal_received() {
  return g_stop_signal.load();
}

}  // namespace lockstep
