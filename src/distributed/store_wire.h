// The wire format of lockstep's rendezvous store (Note [Job store]):
// framing, opcodes and the bounded reader both ends use. No sockets here.
//
// Hello (client -> server, once): "LKSTORE1", u16 secret length, secret.
// Answer: one byte, kHelloAccepted or kHelloRefused (then the server closes).
// Request: u32 length, u8 op, fields. Reply: u32 length, u8 status, fields.
// Integers little-endian; byte strings as u32 length + bytes.
#pragma once

#include <netdb.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

namespace lockstep::store_wire {

constexpr std::string_view kMagic = "LKSTORE1";
constexpr std::size_t kMinSecret = 16;
constexpr std::size_t kMaxSecret = 256;
constexpr std::size_t kMaxHello = 8 + 2 + kMaxSecret;
constexpr char kHelloAccepted = 'K';
constexpr char kHelloRefused = 'X';
constexpr std::size_t kMaxKey = 4096;
constexpr std::size_t kMaxKeysPerRequest = 65536;

enum class Op : std::uint8_t {
  kSet = 1,
  kGet = 2,
  kAdd = 3,
  kCompareSet = 4,
  kCheck = 5,
  kDelete = 6,
  kNumKeys = 7,
  kWait = 8,
};

enum class Status : std::uint8_t {
  kOk = 0,
  kTimeout = 1,  // a wait whose keys did not all appear in time
  kMissing = 2,  // a get of a key that does not exist
  kError = 3,    // the request was refused; a message follows
};

// A truncated or oversized field.
class WireError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Writer {
 public:
  void u8(std::uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void i64(std::int64_t v) {
    const auto u = static_cast<std::uint64_t>(v);
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  }
  void bytes(std::string_view v) {
    u32(static_cast<std::uint32_t>(v.size()));
    out_.append(v.data(), v.size());
  }
  // The body prefixed with its length, ready to send.
  std::string frame() const {
    Writer w;
    w.u32(static_cast<std::uint32_t>(out_.size()));
    return w.out_ + out_;
  }

 private:
  std::string out_;
};

// Reads fields from one frame body; every read checks what is left.
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  std::uint8_t u8() { return static_cast<std::uint8_t>(take(1)[0]); }
  std::uint32_t u32() {
    const auto b = take(4);
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= std::uint32_t(static_cast<unsigned char>(b[i])) << (8 * i);
    return v;
  }
  std::int64_t i64() {
    const auto b = take(8);
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= std::uint64_t(static_cast<unsigned char>(b[i])) << (8 * i);
    return static_cast<std::int64_t>(v);
  }
  std::string bytes(std::size_t max) {
    const std::uint32_t n = u32();
    if (n > max)
      throw WireError("field of " + std::to_string(n) + " bytes (limit " + std::to_string(max) +
                      ")");
    return std::string(take(n));
  }

 private:
  std::string_view take(std::size_t n) {
    if (in_.size() - pos_ < n) throw WireError("truncated frame");
    const auto v = in_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  std::string_view in_;
  std::size_t pos_ = 0;
};

inline std::uint32_t read_u32(const char* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::uint32_t(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

// The TCP addresses of host:port (numeric port), both ends' one lookup.
// Returns null and sets `error` when the host cannot be resolved.
using Addresses = std::unique_ptr<addrinfo, decltype(&freeaddrinfo)>;
inline Addresses resolve_tcp(const std::string& host, int port, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    error = gai_strerror(rc);
    return Addresses(nullptr, freeaddrinfo);
  }
  return Addresses(found, freeaddrinfo);
}

inline std::string hello(std::string_view secret) {
  std::string out(kMagic);
  out.push_back(static_cast<char>(secret.size() & 0xff));
  out.push_back(static_cast<char>((secret.size() >> 8) & 0xff));
  out.append(secret.data(), secret.size());
  return out;
}

}  // namespace lockstep::store_wire
