// Fuzz targets for the readers of untrusted bytes added after the state-dict
// reader, libFuzzer style, one entry per reader:
//   vocab        a tiktoken rank file (after a first line "#tiktoken"),
//                GPT-2's encoder.json + vocab.bpe (the input split at its
//                first NUL), or a tokenizer.json (no NUL), through
//                BpeTokenizer::load, then a round trip of a short text
//   safetensors  a safetensors file through safetensors_load
//   shard_index  a sharded checkpoint's metadata.txt through ShardIndex::parse
//   token_file   a token file's header and tokens through TokenFile::open
//   progress     progress records (one per line) through parse_progress_record
// Every input must be read or refused with DataError; anything else (another
// exception, a crash, a sanitizer report, a timeout) is a finding. Each
// entry returns its verdict for the replay ("ok" or "refused: <why>").
// Built with clang -fsanitize=fuzzer,address,undefined by tests/fuzz/run.sh
// with fuzz_entry.cpp choosing the entry; replayed over the corpus by
// replay_readers.cpp in the normal suite.
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "fuzz_readers.h"
#include "lockstep/data/bpe.h"
#include "lockstep/data/tokens.h"
#include "lockstep/io/safetensors.h"
#include "lockstep/io/shard_index.h"
#include "lockstep/util/error.h"
#include "lockstep/util/progress.h"

namespace lockstep::fuzz {
namespace {

// A private folder for the files a reader must open by path (removed at exit).
const std::string& scratch() {
  static const std::string dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/lockstep-fuzz-XXXXXX";
    std::vector<char> name(pattern.begin(), pattern.end());
    name.push_back('\0');
    if (mkdtemp(name.data()) == nullptr) std::abort();
    std::string made(name.data());
    static const std::string removed = made;
    std::atexit([] { (void)std::system(("rm -rf '" + removed + "'").c_str()); });
    return made;
  }();
  return dir;
}

std::string put(const std::string& name, const std::string& bytes) {
  const std::string path = scratch() + "/" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<long>(bytes.size()));
  return path;
}

template <typename Read>
std::string verdict(Read read) {
  try {
    read();
    return "ok";
  } catch (const DataError& e) {
    return std::string("refused: ") + e.what();
  }
}

}  // namespace

std::string read_vocab(const std::string& bytes) {
  return verdict([&] {
    const size_t nul = bytes.find('\0');
    const std::string rank_head = "#tiktoken\n";
    std::string where;
    if (bytes.rfind(rank_head, 0) == 0) {
      where = put("input.tiktoken", bytes.substr(rank_head.size()));
    } else if (nul == std::string::npos) {
      where = put("tokenizer.json", bytes);
    } else {
      const std::string folder = scratch() + "/gpt2";
      (void)std::system(("mkdir -p '" + folder + "'").c_str());
      put("gpt2/encoder.json", bytes.substr(0, nul));
      put("gpt2/vocab.bpe", bytes.substr(nul + 1));
      where = folder;
    }
    const BpeTokenizer bpe = BpeTokenizer::load(where);
    const std::string text = "Hello, world! It's 2026.\n\xc3\xa9\xff";
    if (bpe.decode(bpe.encode(text)) != text) std::abort();  // a reader that loads must work
  });
}

std::string read_safetensors(const std::string& bytes) {
  return verdict([&] {
    std::map<std::string, std::string> metadata;
    (void)safetensors_load(put("input.safetensors", bytes), &metadata);
  });
}

std::string read_shard_index(const std::string& bytes) {
  return verdict([&] {
    const ShardIndex index = ShardIndex::parse(bytes, "metadata.txt");
    // What parses writes back as the same index.
    if (ShardIndex::parse(index.to_text(), "again").to_text() != index.to_text()) std::abort();
  });
}

std::string read_token_file(const std::string& bytes) {
  return verdict([&] {
    const auto file = TokenFile::open(put("input.bin", bytes), TokenFormat::kUint16);
    int64_t first[4] = {};
    const int64_t n = std::min<int64_t>(4, file->size());
    file->read(0, n, first);
    file->read(file->size() - n, n, first);
  });
}

std::string read_progress(const std::string& bytes) {
  size_t start = 0, read = 0, lines = 0;
  while (start <= bytes.size()) {
    size_t end = bytes.find('\n', start);
    if (end == std::string::npos) end = bytes.size();
    ++lines;
    if (const auto record =
            parse_progress_record(std::string_view(bytes).substr(start, end - start))) {
      ++read;
      // What parses writes back and parses the same.
      std::string line = progress_record_line(*record);
      line.pop_back();
      const auto again = parse_progress_record(line);
      if (!again || again->step != record->step || again->total != record->total) std::abort();
    }
    start = end + 1;
  }
  return read == lines ? "ok"
                       : "refused: " + std::to_string(lines - read) + " of " +
                             std::to_string(lines) + " lines are no progress record";
}

}  // namespace lockstep::fuzz
