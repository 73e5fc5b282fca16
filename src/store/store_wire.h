// The wire format of lockstep's rendezvous store (Note [Job store]):
// the handshake, framing, opcodes and the bounded reader both ends use. No
// sockets here.
//
// Handshake (Note [Store handshake]), mutual, the secret never sent:
//   client: "LKSTORE2", client nonce (32 bytes)
//   server: "LKSTORE2", flags (u8: kHasSecret), server nonce (32 bytes),
//           server proof = HMAC-SHA256(secret, "server" nonces)
//   client: client proof = HMAC-SHA256(secret, "client" nonces)
//   server: one byte, kHelloAccepted or kHelloRefused (then it closes).
// A server too busy with unauthenticated connections answers kHelloBusy
// instead of its hello and closes: the client tries again.
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

#include "lockstep/util/sha256.h"

namespace lockstep::store_wire {

constexpr std::string_view kMagic = "LKSTORE2";
constexpr std::size_t kMaxSecret = 256;
constexpr std::size_t kNonce = 32;
constexpr std::size_t kProof = 32;  // HMAC-SHA256
constexpr std::size_t kClientHello = 8 + kNonce;
constexpr std::size_t kServerHello = 8 + 1 + kNonce + kProof;
constexpr std::uint8_t kHasSecret = 1;
constexpr char kHelloAccepted = 'K';
constexpr char kHelloRefused = 'X';
constexpr char kHelloBusy = 'B';
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

// What each side proves: HMAC-SHA256 under the secret of its role and both
// nonces, so a proof answers one handshake only and neither side's proof
// can be replayed as the other's.
inline std::string proof(std::string_view secret, std::string_view role,
                         std::string_view client_nonce, std::string_view server_nonce) {
  std::string message = "lockstep store ";
  message.append(role.data(), role.size());
  message.append(client_nonce.data(), client_nonce.size());
  message.append(server_nonce.data(), server_nonce.size());
  return hmac_sha256(secret, message);
}
inline std::string server_proof(std::string_view secret, std::string_view nc, std::string_view ns) {
  return proof(secret, "server", nc, ns);
}
inline std::string client_proof(std::string_view secret, std::string_view nc, std::string_view ns) {
  return proof(secret, "client", nc, ns);
}

}  // namespace lockstep::store_wire
