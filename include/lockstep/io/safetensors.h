// safetensors (Hugging Face's tensor file): an 8-byte little-endian header
// length, a JSON header {name: {dtype, shape, data_offsets}, __metadata__},
// then the tensors' bytes. Read as hostile (Note [Untrusted safetensors],
// safetensors.cpp); written so that Hugging Face's `safetensors` loads it.
#pragma once

#include <map>
#include <string>

#include "lockstep/io/state_dict.h"

namespace lockstep {

// The file's tensors in the header's order of offsets, on the CPU, each
// owning its memory. Throws DataError naming the file and the entry: a
// header length past the file or over 100 MB, JSON that is not an object
// of entries, an unknown dtype, a shape whose bytes overflow or differ from
// its offsets, offsets outside the data or overlapping another entry's.
StateDict safetensors_load(const std::string& path,
                           std::map<std::string, std::string>* metadata = nullptr);

// Writes `state` (contiguous little-endian bytes, in its order) with
// `metadata` as __metadata__; the header padded with spaces to a multiple
// of 8 bytes, as the reference writer does. Through a temporary file and a
// rename: a failure leaves no half-written file.
void safetensors_save(const StateDict& state, const std::string& path,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace lockstep
