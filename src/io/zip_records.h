// The records of a torch.save zip archive, read from its central directory
// before anything is decompressed or allocated (torch_pickle.cpp uses it to
// refuse what PyTorch never writes: compressed records, which could expand a
// small file into gigabytes, and sizes that point outside the file).
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace lockstep {

struct ZipRecord {
  uint64_t size = 0;    // bytes, stored (uncompressed) in the archive
  uint64_t offset = 0;  // of its local header
};

// Records by name without the archive's top folder ("data.pkl", "data/0").
// Throws DataError naming `name` when `bytes` is not a zip archive, an entry
// is compressed, or an entry lies outside the file.
std::map<std::string, ZipRecord> zip_records(const std::string& bytes, const std::string& name);

}  // namespace lockstep
