// Fuzz target for the state-dict reader (Note [Untrusted state dicts],
// src/io/torch_pickle.cpp), libFuzzer style. Every input must either
// load or be refused with DataError; anything else (another exception, a
// crash, a sanitizer report, a timeout) is a finding.
//   built with clang -fsanitize=fuzzer,address,undefined by tests/fuzz/run.sh;
//   replayed over the corpus by replay_main.cpp in the normal suite.
#include <cstddef>
#include <cstdint>
#include <string>

#include "lockstep/io/state_dict.h"
#include "lockstep/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    lockstep::state_dict_from_bytes(bytes, "input");
  } catch (const lockstep::DataError&) {
  }
  try {
    lockstep::tensor_from_bytes(bytes, "input");
  } catch (const lockstep::DataError&) {
  }
  return 0;
}
