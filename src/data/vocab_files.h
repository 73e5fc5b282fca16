// The vocabulary files a byte-level BPE tokenizer (data/bpe.h) is read
// from, as hostile input: GPT-2's encoder.json and vocab.bpe, a Hugging
// Face tokenizer.json of GPT-2's or Llama 3's kind, and tiktoken's rank
// files (.tiktoken or Llama 3's tokenizer.model: "<base64 token> <rank>"
// per line). Private to the data layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lockstep/data/bpe.h"

namespace lockstep {

constexpr size_t kMaxVocabFileBytes = size_t{64} << 20;
// Note [Bounded JSON]: 16 bytes a value, so at most 48 MB of nodes
// whatever a hostile file holds (GPT-2's tokenizer.json has ~150,000
// values, Llama 3's ~1.1 million).
constexpr size_t kMaxJsonValues = 3000000;
constexpr int64_t kMaxVocab = int64_t{1} << 20;  // GPT-2 has 50,257; Llama 3 128,256

// A vocabulary as its files give it: (id, token in GPT-2's byte-map
// spelling) and the merges, (left, right) in rank order, with where each
// came from.
struct VocabSource {
  std::string vocab_file, merges_file;
  std::vector<std::pair<int64_t, std::string>> tokens;
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<size_t> merge_lines;  // for messages: the line (vocab.bpe) or index
  bool merges_by_line = false;      // merge_lines are vocab.bpe's lines, not indices
  BpePattern pattern = BpePattern::kGpt2;
  bool whole_pieces = false;        // a piece that is a token is that token (Note [Byte-level BPE])
  bool priority_by_result = false;  // a merge's priority is its result's id (a rank file's rank)
  std::vector<int64_t> special_ids;  // added or special tokens: never a piece's whole-token match
};

// Llama 3's pre-tokenizing pattern as tokenizer.json and Meta's
// tokenizer.py write it.
extern const char* const kLlama3Pattern;

// The vocabulary at `where`: a rank file (.tiktoken, or a file named
// tokenizer.model), a tokenizer.json file, or a folder holding
// encoder.json and vocab.bpe, else tokenizer.json, else one *.tiktoken or
// tokenizer.model file. DataError naming the file for anything malformed.
VocabSource vocab_read(const std::string& where);

// `bytes` in GPT-2's byte-to-unicode spelling, as its files write tokens
// (bpe.cpp).
std::string gpt2_spelling(std::string_view bytes);

}  // namespace lockstep
