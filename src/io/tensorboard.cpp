#include "lockstep/io/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <spdlog/spdlog.h>

#include "lockstep/util/error.h"

namespace lockstep {
namespace {

// The reflected Castagnoli polynomial.
constexpr uint32_t kCastagnoli = 0x82f63b78u;

std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kCastagnoli : c >> 1;
    table[i] = c;
  }
  return table;
}

// Protocol-buffer wire format: what the few messages need.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_tag(std::string& out, int field, int wire) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire));
}
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}
template <typename T>
void put_fixed(std::string& out, int field, T value) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  put_tag(out, field, sizeof(T) == 8 ? 1 : 5);
  char raw[sizeof(T)];
  std::memcpy(raw, &value, sizeof(T));  // little-endian hosts (x86-64, aarch64)
  out.append(raw, sizeof(T));
}

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string event(int64_t step, const std::string& summary_value) {
  std::string e;
  put_fixed(e, 1, wall_time());
  put_tag(e, 2, 0);
  put_varint(e, static_cast<uint64_t>(step));
  std::string summary;
  put_bytes(summary, 1, summary_value);
  put_bytes(e, 5, summary);
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  static const auto table = crc_table();
  uint32_t c = 0xffffffffu;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t crc32c_masked(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

EventWriter::EventWriter(const std::string& dir) {
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(wall_time())) + "." +
          host + "." + std::to_string(getpid());
  file_ = std::fopen(path_.c_str(), "wb");
  if (file_ == nullptr) {
    throw DataError("log.tensorboard: cannot create '" + path_ + "': " + std::strerror(errno));
  }
  std::string e;
  put_fixed(e, 1, wall_time());
  put_tag(e, 2, 0);
  put_varint(e, 0);
  put_bytes(e, 3, "brain.Event:2");
  record(e);
  flush();
}

EventWriter::~EventWriter() {
  if (file_ == nullptr) return;
  flush();
  std::fclose(file_);
}

void EventWriter::record(const std::string& data) {
  if (failed_) return;
  std::string r;
  const uint64_t length = data.size();
  char head[8];
  std::memcpy(head, &length, 8);
  r.append(head, 8);
  const uint32_t head_crc = crc32c_masked(head, 8);
  r.append(reinterpret_cast<const char*>(&head_crc), 4);
  r += data;
  const uint32_t data_crc = crc32c_masked(data.data(), data.size());
  r.append(reinterpret_cast<const char*>(&data_crc), 4);
  if (std::fwrite(r.data(), 1, r.size(), file_) != r.size()) {
    failed_ = true;
    spdlog::warn("log.tensorboard: writing {} failed ({}); no more events are written", path_,
                 std::strerror(errno));
  }
}

void EventWriter::scalar(const std::string& tag, double value, int64_t step) {
  std::string v;
  put_bytes(v, 1, tag);
  put_fixed(v, 2, static_cast<float>(value));
  record(event(step, v));
}

void EventWriter::text(const std::string& tag, const std::string& text, int64_t step) {
  std::string plugin;
  put_bytes(plugin, 1, "text");
  std::string metadata;
  put_bytes(metadata, 1, plugin);
  std::string dim;
  put_tag(dim, 1, 0);
  put_varint(dim, 1);
  std::string shape;
  put_bytes(shape, 2, dim);
  std::string tensor;
  put_tag(tensor, 1, 0);
  put_varint(tensor, 7);  // DT_STRING
  put_bytes(tensor, 2, shape);
  put_bytes(tensor, 8, text);
  std::string v;
  put_bytes(v, 1, tag);
  put_bytes(v, 8, tensor);
  put_bytes(v, 9, metadata);
  record(event(step, v));
}

void EventWriter::flush() {
  if (file_ == nullptr || failed_) return;
  if (std::fflush(file_) != 0) {
    failed_ = true;
    spdlog::warn("log.tensorboard: writing {} failed ({}); no more events are written", path_,
                 std::strerror(errno));
  }
}

}  // namespace lockstep
