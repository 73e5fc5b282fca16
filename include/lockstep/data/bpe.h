// GPT-2's byte-level BPE tokenizer (Note [GPT-2 BPE], bpe.cpp): its
// pre-tokenizing pattern, byte-to-unicode map and merge ranks, read from
// the files GPT-2 ships (encoder.json and vocab.bpe), a tokenizer.json or
// tiktoken's ranks (gpt2.tiktoken). Any bytes encode
// (invalid UTF-8 included) and decode(encode(x)) == x.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace lockstep {

class Gpt2Bpe {
 public:
  // `where`: a folder with encoder.json and vocab.bpe (GPT-2's files), a
  // Hugging Face tokenizer.json of GPT-2's kind (BPE, ByteLevel without a
  // prefix space), a tiktoken rank file (.tiktoken: Note [Rank files],
  // vocab_files.cpp; pre-tokenized with GPT-2's pattern), or a folder
  // holding one of these; DataError naming the file
  // and entry for anything malformed (hostile-input hardened: sizes capped,
  // every token a string of the byte alphabet, ids dense and unique, every
  // merge's parts and result in the vocabulary).
  static Gpt2Bpe load(const std::string& where);

  // Token ids of `text` (any bytes). Thread-safe (each thread its own cache).
  std::vector<int32_t> encode(std::string_view text) const;
  // Appends to `out`.
  void encode_into(std::string_view text, std::vector<int32_t>& out) const;
  // The bytes of `ids`; DataError naming an id outside the vocabulary.
  std::string decode(const std::vector<int32_t>& ids) const;
  // The bytes of one token; DataError outside the vocabulary.
  const std::string& token_bytes(int64_t id) const;

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  // The id of "<|endoftext|>", or -1 when the vocabulary has none.
  int32_t end_of_text() const { return end_of_text_; }

 private:
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;                                   // id -> bytes
  std::unordered_map<std::string, int32_t> ids_;                      // bytes -> id
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (a, b) -> (rank, id of ab)
  int32_t byte_ids_[256] = {};
  int32_t end_of_text_ = -1;
  uint64_t serial_ = 0;  // each loaded vocabulary's own: the key of the piece caches
};

// The folder of a tokenizer name: "gpt2" is the vocabulary set-up installs
// beside the programs (share/lockstep/gpt2 next to the executable or in
// the prefix above it), anything else a folder. ConfigError when "gpt2" is
// not installed.
std::string bpe_vocab_folder(const std::string& tokenizer);

// GPT-2's pre-tokenization of `text`: the end offset of each piece, in
// order ('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// with JavaScript's classes; an invalid UTF-8 byte is a character of its
// own, neither letter, number nor space).
std::vector<size_t> gpt2_pieces(std::string_view text);

// Where `text` can be cut so that the two parts tokenize as the whole does:
// before an ASCII space, tab or line end (CR included) that follows a
// character other than a space (no piece spans that). Returns the
// first such cut at or after `from` (text.size() when none).
size_t gpt2_safe_cut(std::string_view text, size_t from);

}  // namespace lockstep
