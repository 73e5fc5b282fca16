// SHA-256 (OpenSSL EVP), streamed; HMAC-SHA256 for the store's handshake.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace lockstep {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t size);
  std::string finish();  // 32 raw bytes

 private:
  void* ctx_;
};

std::string sha256_hex(const std::string& bytes);
// A regular file's SHA-256 (hex), read in 1 MiB pieces: memory does not
// grow with the file. DataError naming the path when it cannot be read.
std::string sha256_file_hex(const std::string& path);

// HMAC-SHA256 of `data` under `key` (RFC 2104): 32 raw bytes.
std::string hmac_sha256(std::string_view key, std::string_view data);

// Equal length and bytes, in time that depends only on the lengths.
bool equal_in_constant_time(std::string_view a, std::string_view b);

}  // namespace lockstep
