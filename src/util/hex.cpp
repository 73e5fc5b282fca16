#include "lockstep/util/hex.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include "lockstep/util/error.h"

namespace lockstep {

std::string hex_of(std::string_view bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes.size());
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::string random_hex(std::size_t bytes) {
  return hex_of(random_bytes(bytes));
}

std::string random_bytes(std::size_t bytes) {
  std::string raw(bytes, '\0');
  std::size_t got = 0;
  while (got < bytes) {
    const ssize_t n = getrandom(raw.data() + got, bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw SystemError(std::string("getrandom: ") + std::strerror(errno));
    got += static_cast<std::size_t>(n);
  }
  return raw;
}

}  // namespace lockstep
