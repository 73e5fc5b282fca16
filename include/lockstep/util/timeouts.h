// The distributed layer's default timeouts, declared once: the process
// group, init_distributed, the store, the shm backend, the config's dist
// section and the command line take them from here. Plain data.
#pragma once

#include <chrono>

namespace lockstep {

// A collective that a peer misses fails after this long, instead of hanging.
inline constexpr std::chrono::seconds kCollectiveTimeout{300};
// To reach the store, and for every rank to arrive.
inline constexpr std::chrono::seconds kRendezvousTimeout{300};

}  // namespace lockstep
