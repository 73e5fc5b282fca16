// Byte-level BPE, run: the byte map, the vocabulary's checks and the two
// merge paths; the vocabulary files are read in vocab_files.cpp, the
// pre-tokenizers are in pretokenize.cpp.
#include "lockstep/data/bpe.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <queue>
#include <tuple>
#include <unordered_set>

#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"
#include "lockstep/util/utf8.h"
#include "pretokenize.h"
#include "vocab_files.h"

// Note [Byte-level BPE]
// ~~~~~~~~~~~~~~~~~~~~~
// GPT-2's tokenizer (openai/gpt-2 encoder.py), tiktoken's and Hugging Face's
// byte-level BPE, in three steps:
// 1. Pre-tokenize: a pattern cuts the text into pieces; BPE never merges
//    across them (Note [Pre-tokenizers]: GPT-2's or Llama 3's).
// 2. Each piece's bytes are symbols (the vocabulary has all 256); the
//    adjacent pair of the lowest priority is merged, the leftmost first,
//    one pair at a time, until no pair merges: Hugging Face's BPE (priority:
//    the merge's place in the list) and tiktoken's (priority: the rank of
//    the joined token, every split of a token into two tokens a merge).
//    For GPT-2's own files, where each token is made by one merge and so
//    new pairs rank after the merge that made them, that is encoder.py's
//    "merge every occurrence of the best bigram, left to right". A rank
//    file (tiktoken) or a tokenizer.json with ignore_merges first looks the
//    whole piece up: a piece that is a token is that token. Short pieces
//    use the quadratic loop; long ones (a megabyte of digits is one GPT-2
//    piece) a heap: O(n log n).
// 3. The vocabulary's strings are bytes under GPT-2's byte-to-unicode map
//    (printable bytes as themselves, the others shifted to U+0100...): they
//    are stored as the bytes they stand for. Special tokens (<|endoftext|>,
//    Llama 3's <|begin_of_text|>...) are in the vocabulary as their names:
//    decode gives the name; encode reads the name as ordinary text, as
//    tiktoken's encode_ordinary does (text never injects a control token).

namespace lockstep {
namespace {

// GPT-2's byte-to-unicode map: byte -> code point.
uint32_t byte_char(int byte) {
  if ((byte >= 33 && byte <= 126) || (byte >= 161 && byte <= 172) || (byte >= 174 && byte <= 255))
    return static_cast<uint32_t>(byte);
  int n = 0;
  for (int b = 0; b < byte; ++b)
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) ++n;
  return static_cast<uint32_t>(256 + n);
}

// A vocabulary string (UTF-8 of byte-map characters) as the bytes it
// stands for; false when a character is outside the map.
bool unmap_bytes(std::string_view text, const std::unordered_map<uint32_t, char>& byte_of,
                 std::string& out) {
  out.clear();
  for (size_t i = 0; i < text.size();) {
    const Utf8Char c = utf8_char_at(text, i);
    const auto it = byte_of.find(c.cp);
    if (it == byte_of.end()) return false;
    out.push_back(it->second);
    i += c.len;
  }
  return true;
}

constexpr size_t kShortPiece = 64;  // symbols: below, the quadratic loop
constexpr size_t kCacheEntries = 1 << 18;
constexpr size_t kCachedPieceBytes = 64;

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

std::string gpt2_spelling(std::string_view bytes) {
  std::string out;
  for (const char c : bytes) append_utf8(byte_char(static_cast<unsigned char>(c)), out);
  return out;
}

namespace {

// GPT-2's byte-to-unicode map inverted: code point -> byte.
std::unordered_map<uint32_t, char> byte_map() {
  std::unordered_map<uint32_t, char> byte_of;
  for (int b = 0; b < 256; ++b) byte_of[byte_char(b)] = static_cast<char>(b);
  return byte_of;
}

// The tokens of `src` as bytes, with their checks.
void load_tokens(const VocabSource& src, std::vector<std::string>& tokens,
                 std::unordered_map<std::string, int32_t>& ids) {
  const std::string& file = src.vocab_file;
  if (static_cast<int64_t>(src.tokens.size()) > kMaxVocab)
    throw DataError(file + ": more than " + std::to_string(kMaxVocab) + " tokens");
  if (src.tokens.size() < 256) throw DataError(file + ": fewer than 256 tokens");
  tokens.assign(src.tokens.size(), std::string());
  std::vector<char> seen(src.tokens.size(), 0);
  const auto byte_of = byte_map();
  std::string bytes;
  for (auto& [id, token] : src.tokens) {
    if (!unmap_bytes(token, byte_of, bytes))
      throw DataError(file + ": token '" + token.substr(0, 40) +
                      "' has a character outside GPT-2's byte alphabet (not a byte-level BPE "
                      "vocabulary?)");
    if (id >= static_cast<int64_t>(src.tokens.size()) || seen[static_cast<size_t>(id)] != 0)
      throw DataError(file + ": token id " + std::to_string(id) + " is " +
                      (id >= static_cast<int64_t>(src.tokens.size())
                           ? "outside [0, " + std::to_string(src.tokens.size()) + ")"
                           : std::string("given twice")));
    seen[static_cast<size_t>(id)] = 1;
    if (!ids.emplace(bytes, static_cast<int32_t>(id)).second)
      throw DataError(file + ": two ids for the token '" + token.substr(0, 40) + "'");
    tokens[static_cast<size_t>(id)] = bytes;
  }
}

}  // namespace

BpeTokenizer BpeTokenizer::load(const std::string& where) {
  const VocabSource src = vocab_read(where);
  BpeTokenizer bpe;
  load_tokens(src, bpe.tokens_, bpe.ids_);
  for (int b = 0; b < 256; ++b) {
    const auto it = bpe.ids_.find(std::string(1, static_cast<char>(b)));
    if (it == bpe.ids_.end())
      throw DataError(src.vocab_file + ": no token for byte " + std::to_string(b) +
                      " (a byte-level vocabulary has all 256)");
    bpe.byte_ids_[b] = it->second;
  }
  bpe.special_.assign(bpe.tokens_.size(), 0);
  for (const int64_t id : src.special_ids) bpe.special_[static_cast<size_t>(id)] = 1;
  for (const char* name : {"<|end_of_text|>", "<|endoftext|>"})
    if (const auto it = bpe.ids_.find(name); it != bpe.ids_.end()) bpe.end_of_text_ = it->second;
  bpe.pattern_ = src.pattern;
  bpe.whole_pieces_ = src.whole_pieces;
  bpe.load_merges(src);
  static std::atomic<uint64_t> serial{0};
  bpe.serial_ = ++serial;
  bpe.index_specials();
  return bpe;
}

void BpeTokenizer::load_merges(const VocabSource& src) {
  const auto byte_of = byte_map();
  std::string a, b;
  std::unordered_set<int32_t> made;
  for (size_t k = 0; k < src.merges.size(); ++k) {
    const auto where_ = src.merges_file + (src.merges_by_line ? " line " : " merge ") +
                        std::to_string(src.merge_lines[k]);
    if (!unmap_bytes(src.merges[k].first, byte_of, a) ||
        !unmap_bytes(src.merges[k].second, byte_of, b))
      throw DataError(where_ + ": a character outside GPT-2's byte alphabet");
    const auto ia = ids_.find(a), ib = ids_.find(b), iab = ids_.find(a + b);
    if (ia == ids_.end() || ib == ids_.end() || iab == ids_.end())
      throw DataError(where_ + ": the merge's parts or result are not in " + src.vocab_file);
    const auto priority = src.priority_by_result ? iab->second : static_cast<int32_t>(k);
    if (!merges_.emplace(pair_key(ia->second, ib->second), std::make_pair(priority, iab->second))
             .second)
      throw DataError(where_ + ": the same pair is merged twice");
    // GPT-2's own files are read as encoder.py reads them, which equals
    // merging one pair at a time when each token is made by one merge.
    if (src.merges_by_line && !made.insert(iab->second).second)
      throw DataError(where_ + ": its result is made by an earlier merge too");
  }
  if (merges_.empty()) throw DataError(src.merges_file + ": no merges");
}

// The lowest-priority pair, leftmost first, merged one at a time.
void BpeTokenizer::merge_short(std::vector<int32_t>& sym) const {
  for (;;) {
    const std::pair<int32_t, int32_t>* best = nullptr;
    size_t at = 0;
    for (size_t k = 0; k + 1 < sym.size(); ++k) {
      const auto it = merges_.find(pair_key(sym[k], sym[k + 1]));
      if (it != merges_.end() && (best == nullptr || it->second.first < best->first))
        best = &it->second, at = k;
    }
    if (best == nullptr) return;
    sym[at] = best->second;
    sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
}

// The same order from a heap of (priority, position): O(n log n).
void BpeTokenizer::merge_long(std::vector<int32_t>& sym, std::vector<int32_t>& out) const {
  const auto rank_of = [&](int32_t x, int32_t y) -> const std::pair<int32_t, int32_t>* {
    const auto it = merges_.find(pair_key(x, y));
    return it == merges_.end() ? nullptr : &it->second;
  };
  const size_t n = sym.size();
  std::vector<size_t> prev(n), next(n);
  std::vector<char> alive(n, 1);
  for (size_t k = 0; k < n; ++k)
    prev[k] = k - 1, next[k] = k + 1;                           // prev[0], next[n-1]: out of range
  using Entry = std::tuple<int32_t, size_t, int32_t, int32_t>;  // priority, left, left id, right id
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  const auto push = [&](size_t left) {
    if (left >= n || next[left] >= n) return;
    if (const auto* m = rank_of(sym[left], sym[next[left]]))
      heap.emplace(m->first, left, sym[left], sym[next[left]]);
  };
  for (size_t k = 0; k + 1 < n; ++k) push(k);
  while (!heap.empty()) {
    const auto [rank, left, x, y] = heap.top();
    heap.pop();
    if (!alive[left] || next[left] >= n || sym[left] != x || sym[next[left]] != y) continue;
    const size_t right = next[left];
    sym[left] = rank_of(x, y)->second;
    alive[right] = 0;
    next[left] = next[right];
    if (next[right] < n) prev[next[right]] = left;
    if (prev[left] < n) push(prev[left]);
    push(left);
  }
  for (size_t k = 0; k < n; k = next[k]) out.push_back(sym[k]);
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (whole_pieces_) {
    const auto it = ids_.find(std::string(piece));
    if (it != ids_.end() && special_[static_cast<size_t>(it->second)] == 0) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> sym(piece.size());
  for (size_t k = 0; k < piece.size(); ++k)
    sym[k] = byte_ids_[static_cast<unsigned char>(piece[k])];
  if (sym.size() > kShortPiece) return merge_long(sym, out);
  merge_short(sym);
  out.insert(out.end(), sym.begin(), sym.end());
}

void BpeTokenizer::encode_into(std::string_view text, std::vector<int32_t>& out) const {
  struct Cache {
    uint64_t owner = 0;  // the vocabulary's serial: a new one at the same address is another
    std::unordered_map<std::string, std::vector<int32_t>> pieces;
  };
  thread_local Cache cache;
  if (cache.owner != serial_) {
    cache.pieces.clear();
    cache.owner = serial_;
  }
  size_t start = 0;
  for (const size_t end : bpe_pieces(text, pattern_)) {
    const std::string_view piece = text.substr(start, end - start);
    start = end;
    if (piece.size() > kCachedPieceBytes) {
      encode_piece(piece, out);
      continue;
    }
    std::string key(piece);
    const auto it = cache.pieces.find(key);
    if (it != cache.pieces.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      continue;
    }
    const size_t before = out.size();
    encode_piece(piece, out);
    if (cache.pieces.size() >= kCacheEntries) cache.pieces.clear();
    cache.pieces.emplace(
        std::move(key),
        std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(before), out.end()));
  }
}

size_t BpeTokenizer::safe_cut(std::string_view text, size_t from) const {
  return bpe_safe_cut(text, from, pattern_);
}

// Special ids by their names' first two bytes (a one-byte name under its
// byte | 0x10000), longest first: text is scanned once, and at each place
// only the names that start as it does are compared.
namespace {

uint32_t special_key(std::string_view name) {
  const auto b = [&](size_t k) {
    return static_cast<uint32_t>(static_cast<unsigned char>(name[k]));
  };
  return name.size() == 1 ? b(0) | 0x10000u : (b(0) << 8) | b(1);
}

}  // namespace

void BpeTokenizer::index_specials() {
  specials_by_prefix_.clear();
  special_first_.assign(256, 0);
  for (size_t id = 0; id < special_.size(); ++id) {
    if (special_[id] == 0 || tokens_[id].empty()) continue;
    specials_by_prefix_[special_key(tokens_[id])].push_back(static_cast<int32_t>(id));
    special_first_[static_cast<unsigned char>(tokens_[id][0])] = 1;
  }
  for (auto& [key, ids] : specials_by_prefix_)
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
      return tokens_[static_cast<size_t>(a)].size() > tokens_[static_cast<size_t>(b)].size();
    });
}

std::vector<std::string> BpeTokenizer::special_names() const {
  std::vector<std::string> names;
  for (size_t id = 0; id < special_.size(); ++id)
    if (special_[id] != 0) names.push_back(tokens_[id]);
  return names;
}

// The longest special name at `i` of `text`: its id, or -1.
int32_t BpeTokenizer::special_at(std::string_view text, size_t i) const {
  if (special_first_[static_cast<unsigned char>(text[i])] == 0) return -1;
  for (const uint32_t key : {i + 1 < text.size() ? special_key(text.substr(i, 2)) : 0xFFFFFFFFu,
                             special_key(text.substr(i, 1))}) {
    const auto it = specials_by_prefix_.find(key);
    if (it == specials_by_prefix_.end()) continue;
    for (const int32_t id : it->second) {
      const std::string& name = tokens_[static_cast<size_t>(id)];
      if (text.compare(i, name.size(), name) == 0) return id;
    }
  }
  return -1;
}

std::vector<int32_t> BpeTokenizer::encode_with_specials(std::string_view text) const {
  std::vector<int32_t> out;
  size_t start = 0;
  for (size_t i = 0; i < text.size();) {
    const int32_t id = special_at(text, i);
    if (id < 0) {
      ++i;
      continue;
    }
    encode_into(text.substr(start, i - start), out);
    out.push_back(id);
    i = start = i + tokens_[static_cast<size_t>(id)].size();
  }
  encode_into(text.substr(start), out);
  return out;
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  encode_into(text, out);
  return out;
}

const std::string& BpeTokenizer::token_bytes(int64_t id) const {
  if (id < 0 || id >= vocab_size())
    throw DataError("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                    std::to_string(vocab_size()) + ")");
  return tokens_[static_cast<size_t>(id)];
}

std::string bpe_vocab_folder(const std::string& tokenizer) {
  if (tokenizer != "gpt2") return tokenizer;
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (const auto& candidate : {exe.parent_path() / "share/lockstep/gpt2",
                                  exe.parent_path().parent_path() / "share/lockstep/gpt2"}) {
      if (std::filesystem::exists(candidate / "gpt2.tiktoken", ec) ||
          std::filesystem::exists(candidate / "encoder.json", ec))
        return candidate.string();
    }
  }
  throw ConfigError(
      "the tokenizer gpt2 is not installed beside this program (share/lockstep/gpt2: "
      "scripts/setup.sh installs GPT-2's ranks, gpt2.tiktoken, from the PyPI package "
      "openai-whisper); give --vocab a .tiktoken file, a tokenizer.json, or a folder with "
      "encoder.json and vocab.bpe instead");
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size())
      throw DataError("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                      std::to_string(vocab_size()) + ")");
    out += tokens_[static_cast<size_t>(id)];
  }
  return out;
}

}  // namespace lockstep
