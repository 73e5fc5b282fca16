// SHA-256 (OpenSSL EVP), streamed.
#pragma once

#include <cstddef>
#include <string>

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

}  // namespace lockstep
