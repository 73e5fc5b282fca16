// Replays files through the fuzz target's entry point, one line per file:
// "ok" (it loaded as a state dict or a tensor) or "refused: <the state-dict
// reader's DataError>", then the process's peak
// resident memory. Any other exception escapes and fails the run (exit 1);
// a crash ends it. tests/fuzz/replay.sh checks the lines.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "lockstep/io/state_dict.h"
#include "lockstep/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {
long peak_rss_kb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}
}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    std::stringstream buffer;
    buffer << in.rdbuf();
    const std::string bytes = buffer.str();
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    std::string verdict = "ok";
    try {
      lockstep::state_dict_from_bytes(bytes, argv[i]);
    } catch (const lockstep::DataError& e) {
      verdict = std::string("refused: ") + e.what();
      try {  // a file of one tensor (rng.pt) is valid too
        lockstep::tensor_from_bytes(bytes, argv[i]);
        verdict = "ok";
      } catch (const lockstep::DataError&) {
      }
    }
    std::printf("%s: %s; peak %ld kB\n", argv[i], verdict.c_str(), peak_rss_kb());
  }
  return 0;
}
