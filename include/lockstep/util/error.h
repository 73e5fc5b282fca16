// lockstep's one exception hierarchy. Library code throws these; only main()
// and the launcher turn them into exit codes (util/exit_codes.h).
#pragma once

#include <stdexcept>
#include <string>

namespace lockstep {

// Base of every error lockstep raises on purpose.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A bad value in the environment (RANK=abc, MASTER_PORT missing, ...).
class EnvError : public Error {
 public:
  using Error::Error;
};

// A bad configuration or command-line value.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// Bad data: a missing or unreadable file, a malformed row, a label out of
// range, an empty dataset. Messages name the file (and line).
class DataError : public Error {
 public:
  using Error::Error;
};

// A file could not be written: a full disk (ENOSPC), a quota, no
// permission. The message names the path and the errno. Exit 2, as the
// environment is the user's input; reported as "cannot write: ".
class StorageError : public DataError {
 public:
  using DataError::DataError;
};

// Ranks that should hold identical state do not (weights diverged).
class ConsistencyError : public Error {
 public:
  using Error::Error;
};

// A rank computed a wrong local gradient (check.grad_screen,
// check.replay_every): silent data corruption in its core, memory or GPU,
// found before its gradient changed any weight; every rank throws it alike,
// naming that rank. Exit 6.
class CorruptionError : public Error {
 public:
  using Error::Error;
};

// Training itself failed, every rank alike: the loss diverged (fp16's loss
// scale fell to nothing with every gradient inf/NaN). Exit 1.
class TrainingError : public Error {
 public:
  using Error::Error;
};

// Stopped by SIGINT/SIGTERM after saving what had to be saved; main()
// exits with 128 + signal, as a shell would report it.
class Interrupted : public Error {
 public:
  Interrupted(const std::string& what, int signal) : Error(what), signal(signal) {}
  int signal;
};

// The program uses lockstep in a way that cannot work: a model bug, not a
// failure of the network (two gradients for one parameter in one backward,
// a parameter that got no gradient, a sparse gradient). Exit 2, like other
// bad input: the model and the program are the user's input.
class UsageError : public Error {
 public:
  using Error::Error;
};

// An operating-system call failed for reasons outside lockstep (fork, pipe,
// socket, getrandom): resources, limits, permissions.
class SystemError : public Error {
 public:
  using Error::Error;
};

// One of lockstep's own invariants does not hold: a bug in lockstep. The
// message carries the values that broke it. Exit 4.
class InternalError : public Error {
 public:
  using Error::Error;
};

// An allocation failed: this rank's memory ran out (a cap such as
// prlimit --as or a cgroup, or a full machine). Exit 5.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

// A collective or rendezvous failed (peer gone, mismatch, unsupported op).
class CommError : public Error {
 public:
  using Error::Error;
};

// A rendezvous or collective did not finish within its configured timeout.
class TimeoutError : public CommError {
 public:
  using CommError::CommError;
};

}  // namespace lockstep

namespace lockstep {

// e.what(), without the C++ backtrace that LibTorch's c10::Error appends:
// the message a user needs is the first line, not 20 frames.
std::string what_of(const std::exception& e);

// Whether `e` says an allocation failed: std::bad_alloc, LibTorch's "can't
// allocate memory" or a device's "out of memory", an OutOfMemoryError.
bool is_out_of_memory(const std::exception& e);

}  // namespace lockstep
