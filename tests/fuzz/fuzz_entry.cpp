// libFuzzer's entry for one reader target of fuzz_readers.cpp, chosen at
// compile time (-DLOCKSTEP_FUZZ_ENTRY=read_vocab, ...) by tests/fuzz/run.sh.
// Torch-free and tiny, so that each target costs one quick compile.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_readers.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)lockstep::fuzz::LOCKSTEP_FUZZ_ENTRY(std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}
