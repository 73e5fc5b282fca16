// The Python peer the unit tests compare against: Debian's python3 (with
// python3-torch), or the platform's own when LOCKSTEP_PYTHON names it
// (scripts/test.sh sets it for pip's torch).
#pragma once

#include <cstdlib>
#include <string>

namespace lockstep::testing {

inline std::string python_peer() {
  const char* python = std::getenv("LOCKSTEP_PYTHON");
  return python != nullptr && *python != '\0' ? python : "/usr/bin/python3";
}

}  // namespace lockstep::testing
