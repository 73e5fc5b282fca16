#include "zip_records.h"

#include <cstring>

#include "lockstep/util/error.h"

namespace lockstep {
namespace {

uint64_t le(const std::string& b, uint64_t at, int n) {
  uint64_t v = 0;
  for (int k = n - 1; k >= 0; --k) v = (v << 8) | static_cast<uint8_t>(b[at + k]);
  return v;
}

}  // namespace

std::map<std::string, ZipRecord> zip_records(const std::string& bytes, const std::string& name) {
  auto fail = [&](const std::string& why) -> void {
    throw DataError(name + ": not a torch.save archive (" + why + ")");
  };
  const uint64_t n = bytes.size();
  // End of central directory: 22 bytes plus a comment of up to 65535.
  uint64_t eocd = UINT64_MAX;
  for (uint64_t at = n >= 22 ? n - 22 : UINT64_MAX; at != UINT64_MAX && n - at <= 22 + 65535;
       --at) {
    if (le(bytes, at, 4) == 0x06054b50) {
      eocd = at;
      break;
    }
    if (at == 0) break;
  }
  if (eocd == UINT64_MAX) fail("no zip directory");
  uint64_t entries = le(bytes, eocd + 10, 2);
  uint64_t dir_size = le(bytes, eocd + 12, 4);
  uint64_t dir_at = le(bytes, eocd + 16, 4);
  if (entries == 0xFFFF || dir_size == 0xFFFFFFFF || dir_at == 0xFFFFFFFF) {
    // Zip64: its end record's locator sits right before the classic one.
    if (eocd < 20 || n < 56 || le(bytes, eocd - 20, 4) != 0x07064b50) fail("bad zip64 locator");
    const uint64_t z = le(bytes, eocd - 20 + 8, 8);
    if (z > n - 56 || le(bytes, z, 4) != 0x06064b50) fail("bad zip64 directory");
    entries = le(bytes, z + 32, 8);
    dir_size = le(bytes, z + 40, 8);
    dir_at = le(bytes, z + 48, 8);
  }
  if (dir_at > n || dir_size > n - dir_at || entries > dir_size / 46 + 1) fail("bad directory");
  std::map<std::string, ZipRecord> records;
  uint64_t at = dir_at;
  for (uint64_t e = 0; e < entries; ++e) {
    if (at + 46 > dir_at + dir_size || le(bytes, at, 4) != 0x02014b50) fail("bad directory entry");
    const uint64_t method = le(bytes, at + 10, 2);
    uint64_t compressed = le(bytes, at + 20, 4);
    uint64_t size = le(bytes, at + 24, 4);
    const uint64_t name_len = le(bytes, at + 28, 2);
    const uint64_t extra_len = le(bytes, at + 30, 2);
    const uint64_t comment_len = le(bytes, at + 32, 2);
    uint64_t local = le(bytes, at + 42, 4);
    const uint64_t end = at + 46 + name_len + extra_len + comment_len;
    if (end > dir_at + dir_size) fail("bad directory entry");
    std::string record = bytes.substr(at + 46, name_len);
    // Zip64 extended information: 8-byte fields for those that overflowed.
    for (uint64_t x = at + 46 + name_len; x + 4 <= at + 46 + name_len + extra_len;) {
      const uint64_t id = le(bytes, x, 2), len = le(bytes, x + 2, 2);
      uint64_t f = x + 4;
      if (f + len > at + 46 + name_len + extra_len) fail("bad extra field");
      if (id == 1) {
        auto take = [&](uint64_t& v) {
          if (v != 0xFFFFFFFF) return;
          if (f + 8 > x + 4 + len) fail("bad zip64 field");
          v = le(bytes, f, 8);
          f += 8;
        };
        take(size);
        take(compressed);
        take(local);
      }
      x += 4 + len;
    }
    if (method != 0 || compressed != size) {
      fail("record '" + record + "' is compressed; torch.save stores records uncompressed");
    }
    if (local > n || size > n - local) fail("record '" + record + "' lies outside the file");
    const auto slash = record.find('/');
    records[slash == std::string::npos ? record : record.substr(slash + 1)] = {size, local};
    at = end;
  }
  return records;
}

}  // namespace lockstep
