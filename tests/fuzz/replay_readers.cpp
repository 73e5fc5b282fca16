// Replays files through one reader fuzz target (fuzz_readers.h), one line
// per file: "<file>: ok|refused: <why>; peak <kB> kB", the peak being the
// process's resident peak after that file (so a corpus is replayed from its
// smallest file up). Any other exception escapes and fails the run (exit
// 1); a crash ends it. tests/fuzz/replay_readers.sh checks the lines.
//   replay_readers TARGET FILE...   TARGET: vocab | safetensors |
//                                   shard_index | token_file | progress
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "fuzz_readers.h"

namespace {

long peak_rss_kb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  using Entry = std::string (*)(const std::string&);
  const std::map<std::string, Entry> targets{
      {"vocab", lockstep::fuzz::read_vocab},
      {"safetensors", lockstep::fuzz::read_safetensors},
      {"shard_index", lockstep::fuzz::read_shard_index},
      {"token_file", lockstep::fuzz::read_token_file},
      {"progress", lockstep::fuzz::read_progress},
  };
  const auto target = argc > 1 ? targets.find(argv[1]) : targets.end();
  if (target == targets.end()) {
    std::fprintf(
        stderr,
        "usage: replay_readers vocab|safetensors|shard_index|token_file|progress FILE...\n");
    return 2;
  }
  for (int i = 2; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    std::stringstream buffer;
    buffer << in.rdbuf();
    const std::string verdict = target->second(buffer.str());
    std::printf("%s: %s; peak %ld kB\n", argv[i], verdict.c_str(), peak_rss_kb());
    std::fflush(stdout);
  }
  return 0;
}
