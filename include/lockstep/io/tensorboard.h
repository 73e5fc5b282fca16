// TensorBoard event files, written natively: no protobuf or TensorFlow
// library, the few messages encoded by hand (Note [Event files]).
//
// Note [Event files]: an events.out.tfevents.<time>.<host> file is a
// TFRecord stream. Each record is
//   uint64 length (little-endian), uint32 masked CRC-32C of those 8 bytes,
//   length bytes of data, uint32 masked CRC-32C of the data,
// where masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 (TensorFlow's
// record_io). The data is a serialised tensorflow.Event:
//   1 wall_time double (fixed64), 2 step int64 (varint),
//   3 file_version string ("brain.Event:2", the first record),
//   5 summary Summary { repeated 1 Value { 1 tag string,
//       2 simple_value float (fixed32),             a scalar
//       9 metadata SummaryMetadata { 1 plugin_data { 1 plugin_name "text" } },
//       8 tensor TensorProto { 1 dtype DT_STRING = 7, 2 tensor_shape
//         { 2 dim { 1 size 1 } }, 8 string_val bytes } } }   a text
// A dozen fields of a stable format do not justify a protobuf dependency
// (Debian has libprotobuf, but not TensorBoard's .proto files, and their
// generated code would need protoc at build time); the suite decodes the
// files with an independent reader (tests/python/tfevents.py).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace lockstep {

// CRC-32C (Castagnoli), and TFRecord's masking of it.
uint32_t crc32c(const void* data, size_t size);
uint32_t crc32c_masked(const void* data, size_t size);

class EventWriter {
 public:
  // Creates <dir>/events.out.tfevents.<unix time>.<host>.<pid> and writes
  // the version record. Throws DataError naming the file when it cannot.
  explicit EventWriter(const std::string& dir);
  ~EventWriter();  // flushes
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  void scalar(const std::string& tag, double value, int64_t step);
  void text(const std::string& tag, const std::string& text, int64_t step);
  // To the kernel (fflush); failures are reported once, never thrown: the
  // run goes on without its event file.
  void flush();
  const std::string& path() const { return path_; }

 private:
  void record(const std::string& event);

  std::string path_;
  std::FILE* file_ = nullptr;
  bool failed_ = false;
};

}  // namespace lockstep
