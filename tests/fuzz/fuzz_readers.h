// The reader fuzz targets' entries (fuzz_readers.cpp): each reads `bytes`
// as its format and says "ok" or "refused: <the DataError>"; any other
// exception escapes, and a reader that breaks its own contract aborts.
#pragma once

#include <string>

namespace lockstep::fuzz {

std::string read_vocab(const std::string& bytes);
std::string read_safetensors(const std::string& bytes);
std::string read_shard_index(const std::string& bytes);
std::string read_token_file(const std::string& bytes);
std::string read_progress(const std::string& bytes);

}  // namespace lockstep::fuzz
