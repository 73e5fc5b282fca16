// Random bytes from the kernel (getrandom), as lowercase hex: job secrets,
// segment names. Plain POSIX (the launcher uses it too).
#pragma once

#include <cstddef>
#include <string>

namespace lockstep {

// 2 x `bytes` hex digits. Throws SystemError when the kernel refuses.
std::string random_hex(std::size_t bytes);

}  // namespace lockstep
