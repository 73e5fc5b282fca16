// Byte-level BPE tokenizers (Note [Byte-level BPE], bpe.cpp): GPT-2's and
// Llama 3's (tiktoken's cl100k_base pattern), each a pre-tokenizing pattern
// (Note [Pre-tokenizers], pretokenize.cpp), GPT-2's byte-to-unicode map and
// merge ranks, read from the files they ship: GPT-2's encoder.json and
// vocab.bpe, a Hugging Face tokenizer.json, or a tiktoken rank file
// (gpt2.tiktoken, Llama 3's tokenizer.model). Any bytes encode (invalid
// UTF-8 included) and decode(encode(x)) == x.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace lockstep {

// The pattern that cuts text into pieces before merging.
enum class BpePattern {
  kGpt2,    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kLlama3,  // Llama 3's and cl100k_base's: (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|...
};

struct VocabSource;  // vocab_files.h, private to the data layer

class BpeTokenizer {
 public:
  // `where`: a folder with encoder.json and vocab.bpe (GPT-2's files), a
  // Hugging Face tokenizer.json of the byte-level BPE kind (GPT-2's, or
  // Llama 3's Split pattern before a ByteLevel without its own regex), a
  // tiktoken rank file (Note [Rank files], vocab_files.cpp: GPT-2's ranks,
  // Llama 3's tokenizer.model), or a folder holding one of these;
  // DataError naming the file and entry for anything malformed or of
  // another kind (hostile-input hardened: sizes capped, every token a
  // string of the byte alphabet, ids dense and unique, every merge's parts
  // and result in the vocabulary).
  static BpeTokenizer load(const std::string& where);

  // Token ids of `text` (any bytes), special tokens' names encoded as the
  // text they are (tiktoken's encode_ordinary). Thread-safe (each thread
  // its own cache).
  std::vector<int32_t> encode(std::string_view text) const;
  // Appends to `out`.
  void encode_into(std::string_view text, std::vector<int32_t>& out) const;
  // Token ids of `text` with the special tokens' names in it as their ids
  // (tiktoken's encode(allowed_special="all"), Hugging Face's added tokens
  // matched exactly): at each place the longest name wins, the text between
  // is encoded as encode() encodes it. For chat templates
  // (<|start_header_id|>user<|end_header_id|>...).
  std::vector<int32_t> encode_with_specials(std::string_view text) const;
  // The special tokens' names (added tokens, a rank file's known ones).
  std::vector<std::string> special_names() const;
  // The bytes of `ids` (a special token as its name); DataError naming an
  // id outside the vocabulary.
  std::string decode(const std::vector<int32_t>& ids) const;
  // The bytes of one token; DataError outside the vocabulary.
  const std::string& token_bytes(int64_t id) const;

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  // The id of "<|endoftext|>" (GPT-2's), else of "<|end_of_text|>" (Llama
  // 3's), or -1 when the vocabulary has neither.
  int32_t end_of_text() const { return end_of_text_; }
  BpePattern pattern() const { return pattern_; }
  // Where `text` can be cut at or after `from` so that the two parts
  // encode as the whole does (bpe_safe_cut).
  size_t safe_cut(std::string_view text, size_t from) const;

 private:
  void load_merges(const VocabSource& src);
  void index_specials();
  int32_t special_at(std::string_view text, size_t i) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_short(std::vector<int32_t>& sym) const;
  void merge_long(std::vector<int32_t>& sym, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;               // id -> bytes
  std::unordered_map<std::string, int32_t> ids_;  // bytes -> id
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>>
      merges_;                 // (a, b) -> (priority, id of ab)
  std::vector<char> special_;  // per id: a special token (never a piece's whole-token match)
  std::unordered_map<uint32_t, std::vector<int32_t>> specials_by_prefix_;  // index_specials()
  std::vector<char> special_first_;  // per byte: some special name starts with it
  int32_t byte_ids_[256] = {};
  int32_t end_of_text_ = -1;
  BpePattern pattern_ = BpePattern::kGpt2;
  bool whole_pieces_ = false;  // a piece that is a token is that token (tiktoken, ignore_merges)
  uint64_t serial_ = 0;        // each loaded vocabulary's own: the key of the piece caches
};

// The name lockstep's BPE had while it read GPT-2's kind only.
using Gpt2Bpe = BpeTokenizer;

// The folder of a tokenizer name: "gpt2" is the vocabulary set-up installs
// beside the programs (share/lockstep/gpt2 next to the executable or in
// the prefix above it), anything else a folder or file. ConfigError when
// "gpt2" is not installed.
std::string bpe_vocab_folder(const std::string& tokenizer);

// The pre-tokenization of `text`: the end offset of each piece, in order
// (an invalid UTF-8 byte is a character of its own, neither letter,
// number nor space).
std::vector<size_t> bpe_pieces(std::string_view text, BpePattern pattern);
std::vector<size_t> gpt2_pieces(std::string_view text);

// Where `text` can be cut so that the two parts tokenize as the whole does:
// before an ASCII space, tab, vertical tab or form feed (and for GPT-2's
// pattern a line end, CR included) that follows a character other than a
// space, or (Llama 3's pattern) after a line end that a character other
// than a space follows (no piece spans either). Returns the first such cut at or after `from`
// (text.size() when none).
size_t bpe_safe_cut(std::string_view text, size_t from, BpePattern pattern);
size_t gpt2_safe_cut(std::string_view text, size_t from);

}  // namespace lockstep
