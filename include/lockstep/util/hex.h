// Bytes as lowercase hex (digests, secrets, segment names): the one encoder;
// and random bytes from the kernel (getrandom) as hex. Plain POSIX: part of
// lockstep's Torch-free base, which the launcher links too.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace lockstep {

// 2 x bytes.size() hex digits.
std::string hex_of(std::string_view bytes);

// 2 x `bytes` hex digits of kernel randomness. Throws SystemError when the
// kernel refuses.
std::string random_hex(std::size_t bytes);

// `bytes` raw bytes of kernel randomness (nonces). Throws like random_hex.
std::string random_bytes(std::size_t bytes);

}  // namespace lockstep
