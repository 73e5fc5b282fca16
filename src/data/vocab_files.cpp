#include "vocab_files.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"
#include "lockstep/util/json.h"
#include "lockstep/util/sha256.h"

namespace lockstep {
namespace {

// Each merge makes a token no other merge makes, so a vocabulary has fewer
// merges than tokens, and no more than kMaxVocab tokens: refused as soon as
// a file says more, before they are held (Note [Bounded JSON]).
void check_counts(const VocabSource& src) {
  if (static_cast<int64_t>(src.tokens.size()) > kMaxVocab)
    throw DataError(src.vocab_file + ": more than " + std::to_string(kMaxVocab) + " tokens");
  if (src.merges.size() > src.tokens.size())
    throw DataError(src.merges_file + ": more merges than the " +
                    std::to_string(src.tokens.size()) + " tokens of " + src.vocab_file +
                    " (each merge makes a token of its own)");
}

int64_t token_id(JsonValue v, const std::string& file, std::string_view token) {
  if (!v.whole() || v.number() >= static_cast<double>(kMaxVocab))
    throw DataError(file + ": the id of token '" + std::string(token.substr(0, 40)) +
                    "' is not a whole number below " + std::to_string(kMaxVocab));
  return static_cast<int64_t>(v.number());
}

// GPT-2's encoder.json and vocab.bpe.
VocabSource read_gpt2_files(const std::string& folder) {
  VocabSource src;
  src.vocab_file = folder + "/encoder.json";
  src.merges_file = folder + "/vocab.bpe";
  src.merges_by_line = true;
  {
    // Note [Bounded JSON]: the document and the text go before the merges come in.
    const JsonDocument encoder(read_regular_file(src.vocab_file, kMaxVocabFileBytes),
                               src.vocab_file, kMaxJsonValues);
    if (!encoder.root().is(JsonKind::kObject))
      throw DataError(src.vocab_file + ": not a JSON object of token -> id");
    for (const JsonValue id : encoder.root()) {
      src.tokens.emplace_back(token_id(id, src.vocab_file, id.key()), std::string(id.key()));
      check_counts(src);
    }
  }
  const std::string merges = read_regular_file(src.merges_file, kMaxVocabFileBytes);
  size_t line_no = 0;
  for (size_t at = 0; at < merges.size();) {
    size_t end = merges.find('\n', at);
    if (end == std::string::npos) end = merges.size();
    std::string_view line(merges.data() + at, end - at);
    at = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.rfind("#", 0) == 0)) continue;
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 >= line.size() ||
        line.find(' ', space + 1) != std::string_view::npos)
      throw DataError(src.merges_file + " line " + std::to_string(line_no) +
                      ": not two tokens separated by one space");
    src.merges.emplace_back(std::string(line.substr(0, space)),
                            std::string(line.substr(space + 1)));
    src.merge_lines.push_back(line_no);
    check_counts(src);
  }
  return src;
}

bool type_is(JsonValue v, std::string_view type) {
  return v.get("type").text() == type;
}

// The ByteLevel pre-tokenizer, alone or in a Sequence (missing if neither);
// anything beside it in a Sequence is refused by name.
JsonValue byte_level_of(JsonValue pre, const std::string& path) {
  if (type_is(pre, "ByteLevel")) return pre;
  if (!type_is(pre, "Sequence")) return JsonValue();
  JsonValue byte_level;
  for (const JsonValue p : pre.get("pretokenizers"))
    if (type_is(p, "ByteLevel")) byte_level = p;
  if (byte_level.missing()) return byte_level;
  for (const JsonValue p : pre.get("pretokenizers"))
    if (!type_is(p, "ByteLevel"))
      throw DataError(path + ": pre_tokenizer holds another pre-tokenizer beside ByteLevel");
  return byte_level;
}

// Whatever would change the ids is refused by name: lockstep reads GPT-2's
// kind only.
void check_gpt2_kind(JsonValue root, JsonValue model, JsonValue byte_level,
                     const std::string& path) {
  const auto is_null_or_empty = [](JsonValue v) {
    return v.is(JsonKind::kNull) || (v.is(JsonKind::kString) && v.text().empty()) ||
           (v.is(JsonKind::kBool) && !v.boolean());
  };
  if (!is_null_or_empty(root.get("normalizer")))
    throw DataError(path + ": normalizer is set; GPT-2's tokenizer has none");
  for (const char* field :
       {"continuing_subword_prefix", "end_of_word_suffix", "dropout", "ignore_merges"})
    if (!is_null_or_empty(model.get(field)))
      throw DataError(path + ": model." + field + " is set; GPT-2's BPE has none");
  if (byte_level.get("add_prefix_space").boolean())
    throw DataError(path + ": pre_tokenizer.add_prefix_space is true; GPT-2's is false");
  const JsonValue regex = byte_level.get("use_regex");
  if (regex.is(JsonKind::kBool) && !regex.boolean())
    throw DataError(path + ": pre_tokenizer.use_regex is false; GPT-2's pattern is used");
}

void read_merges(JsonValue merges, const std::string& path, VocabSource& src) {
  size_t k = 0;
  for (const JsonValue m : merges) {
    const std::string_view text = m.text();
    const size_t space = text.find(' ');
    if (m.is(JsonKind::kString)) {
      if (space == std::string_view::npos || space == 0 || space + 1 >= text.size() ||
          text.find(' ', space + 1) != std::string_view::npos)
        throw DataError(path + ": merge " + std::to_string(k) + " is not two tokens and a space");
      src.merges.emplace_back(std::string(text.substr(0, space)),
                              std::string(text.substr(space + 1)));
    } else if (m.is(JsonKind::kArray) && m.size() == 2 && m.at(0).is(JsonKind::kString) &&
               m.at(1).is(JsonKind::kString)) {
      src.merges.emplace_back(std::string(m.at(0).text()), std::string(m.at(1).text()));
    } else {
      throw DataError(path + ": merge " + std::to_string(k) + " is neither \"a b\" nor [a, b]");
    }
    src.merge_lines.push_back(k++);
    check_counts(src);
  }
}

// A Hugging Face tokenizer.json of GPT-2's kind: model.type BPE with its
// vocab and merges ("a b" or ["a", "b"]), a ByteLevel pre-tokenizer with
// GPT-2's pattern and no prefix space; added tokens (<|endoftext|>) join
// the vocabulary.
VocabSource read_tokenizer_json(const std::string& path) {
  VocabSource src;
  src.vocab_file = src.merges_file = path;
  const JsonDocument doc(read_regular_file(path, kMaxVocabFileBytes), path, kMaxJsonValues);
  const JsonValue root = doc.root();
  const JsonValue model = root.get("model");
  if (!model.is(JsonKind::kObject) || !type_is(model, "BPE"))
    throw DataError(path + ": model.type is not BPE (only GPT-2's byte-level BPE is read)");
  const JsonValue byte_level = byte_level_of(root.get("pre_tokenizer"), path);
  if (byte_level.missing())
    throw DataError(path + ": pre_tokenizer is not ByteLevel (GPT-2's): another tokenizer kind");
  check_gpt2_kind(root, model, byte_level, path);
  const JsonValue vocab = model.get("vocab");
  const JsonValue merges = model.get("merges");
  if (!vocab.is(JsonKind::kObject))
    throw DataError(path + ": model.vocab is not an object of token -> id");
  if (!merges.is(JsonKind::kArray)) throw DataError(path + ": model.merges is not an array");
  for (const JsonValue id : vocab) {
    src.tokens.emplace_back(token_id(id, path, id.key()), std::string(id.key()));
    check_counts(src);
  }
  std::unordered_set<int64_t> known;
  for (const auto& t : src.tokens) known.insert(t.first);
  for (const JsonValue a : root.get("added_tokens")) {
    const JsonValue content = a.get("content");
    const JsonValue id = a.get("id");
    if (!content.is(JsonKind::kString) || id.missing())
      throw DataError(path + ": an added token without content and id");
    const int64_t n = token_id(id, path, content.text());
    if (known.insert(n).second) src.tokens.emplace_back(n, std::string(content.text()));
    check_counts(src);
  }
  read_merges(merges, path, src);
  return src;
}

// Note [Rank files]
// ~~~~~~~~~~~~~~~~~
// tiktoken's files (gpt2.tiktoken, cl100k_base.tiktoken, Llama 3's
// tokenizer.model) list each token's bytes in base64 with its rank; the
// rank is the id, and merging is "join the adjacent pair whose join has the
// lowest rank". They hold no merges: each token's merge is recovered by
// running that rule on its bytes with the ranks below its own until two
// parts are left, which are the merge (a token that does not come down to
// two lower-ranked parts is refused). Listed in rank order, these merges
// make merging by merge rank (Note [GPT-2 BPE]) the same as tiktoken's
// merging by the rank of the join. The files name no special tokens:
// GPT-2's (recognised by its SHA-256, tiktoken's "gpt2"/"r50k_base") gets
// <|endoftext|> as 50256, as tiktoken adds it.
constexpr size_t kMaxRankTokenBytes = 1024;
constexpr size_t kOtherPatternRanks = 100000;  // GPT-2's and p50k's have ~50,000
constexpr double kMaxRecoveryWork = 2e8;
constexpr const char* kGpt2RanksSha256 =
    "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930";

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Strict base64 (RFC 4648, padded); false for anything else.
bool base64_decode(std::string_view text, std::string& out) {
  out.clear();
  if (text.empty() || text.size() % 4 != 0) return false;
  const size_t pad = text.back() != '=' ? 0 : text[text.size() - 2] == '=' ? 2 : 1;
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t v = 0;
    for (size_t k = 0; k < 4; ++k) {
      const bool padding = i + 4 == text.size() && k >= 4 - pad;
      const int d = padding ? (text[i + k] == '=' ? 0 : -1) : base64_value(text[i + k]);
      if (d < 0) return false;
      v = (v << 6) | static_cast<uint32_t>(d);
    }
    out.push_back(static_cast<char>(v >> 16));
    if (i + 4 < text.size() || pad < 2) out.push_back(static_cast<char>((v >> 8) & 0xFF));
    if (i + 4 < text.size() || pad < 1) out.push_back(static_cast<char>(v & 0xFF));
  }
  return true;
}

// The two parts `token` comes down to under merging with ranks below
// `rank` (Note [Rank files]); false when it does not come down to two.
bool recover_merge(const std::string& token, int64_t rank,
                   const std::unordered_map<std::string, int64_t>& ranks,
                   std::pair<std::string, std::string>& merge) {
  std::vector<std::string> parts;
  for (const char c : token) parts.emplace_back(1, c);
  while (parts.size() > 2) {
    int64_t best = rank;
    size_t at = parts.size();
    for (size_t k = 0; k + 1 < parts.size(); ++k) {
      const auto it = ranks.find(parts[k] + parts[k + 1]);
      if (it != ranks.end() && it->second < best) best = it->second, at = k;
    }
    if (at == parts.size()) return false;
    parts[at] += parts[at + 1];
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  if (parts.size() != 2) return false;
  merge = {std::move(parts[0]), std::move(parts[1])};
  return true;
}

// The ranks of a .tiktoken file, by id (each token's bytes).
std::vector<std::string> read_ranks(const std::string& path, const std::string& text) {
  std::vector<std::string> by_rank;
  std::vector<char> seen;
  size_t line_no = 0;
  std::string bytes;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + at, end - at);
    at = end + 1;
    ++line_no;
    if (line.empty()) continue;
    const auto fail = [&](const std::string& why) {
      return DataError(path + " line " + std::to_string(line_no) + ": " + why);
    };
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || !base64_decode(line.substr(0, space), bytes))
      throw fail("not a base64 token, a space and a rank");
    const std::string_view number = line.substr(space + 1);
    if (number.empty() || number.size() > 7 ||
        number.find_first_not_of("0123456789") != std::string_view::npos)
      throw fail("the rank '" + std::string(number.substr(0, 20)) +
                 "' is not a whole number below " + std::to_string(kMaxVocab));
    const auto rank = static_cast<size_t>(std::stoll(std::string(number)));
    if (rank >= static_cast<size_t>(kMaxVocab))
      throw fail("rank " + std::to_string(rank) + " is not below " + std::to_string(kMaxVocab));
    if (rank >= by_rank.size()) by_rank.resize(rank + 1), seen.resize(rank + 1, 0);
    if (seen[rank] != 0) throw fail("rank " + std::to_string(rank) + " is given twice");
    seen[rank] = 1;
    by_rank[rank] = bytes;
  }
  for (size_t r = 0; r < by_rank.size(); ++r)
    if (seen[r] == 0) throw DataError(path + ": no token has rank " + std::to_string(r));
  return by_rank;
}

VocabSource read_tiktoken(const std::string& path) {
  VocabSource src;
  src.vocab_file = src.merges_file = path;
  const std::string text = read_regular_file(path, kMaxVocabFileBytes);
  const std::vector<std::string> by_rank = read_ranks(path, text);
  // Note [Rank files]: the files of today's tokenizers (cl100k_base's
  // 100,256 ranks, Llama 3's 128,000, o200k_base's 199,998) split text with
  // other patterns than GPT-2's before merging; read with GPT-2's, they
  // would give other ids than their tokenizers, silently.
  if (by_rank.size() >= kOtherPatternRanks)
    throw DataError(path + ": " + std::to_string(by_rank.size()) +
                    " ranks: a rank file of this size (cl100k_base, o200k_base, Llama 3's "
                    "tokenizer.model) belongs to a tokenizer that splits text with another "
                    "pattern than GPT-2's, which lockstep's BPE does not implement: its ids "
                    "would differ from that tokenizer's");
  std::unordered_map<std::string, int64_t> ranks;
  for (size_t r = 0; r < by_rank.size(); ++r)
    if (!ranks.emplace(by_rank[r], static_cast<int64_t>(r)).second)
      throw DataError(path + ": the token of rank " + std::to_string(r) +
                      " is listed under an earlier rank too");
  // Recovering a merge costs ~L^2 lookups for a token of L bytes: a file of
  // long tokens is refused before that work rather than taking hours.
  double work = 0;
  for (const auto& token : by_rank) {
    if (token.size() > kMaxRankTokenBytes)
      throw DataError(path + ": a token of " + std::to_string(token.size()) + " bytes, over the " +
                      std::to_string(kMaxRankTokenBytes) + " a rank file's tokens may hold");
    work += static_cast<double>(token.size()) * static_cast<double>(token.size());
  }
  if (work > kMaxRecoveryWork)
    throw DataError(path +
                    ": its tokens are too long to recover their merges in reasonable time "
                    "(the sum of squared token lengths is " +
                    std::to_string(static_cast<long long>(work)) + ", over " +
                    std::to_string(static_cast<long long>(kMaxRecoveryWork)) +
                    "; GPT-2's ranks need 2.5 million)");
  for (size_t r = 0; r < by_rank.size(); ++r) {
    src.tokens.emplace_back(static_cast<int64_t>(r), gpt2_spelling(by_rank[r]));
    if (by_rank[r].size() < 2) continue;
    std::pair<std::string, std::string> merge;
    if (!recover_merge(by_rank[r], static_cast<int64_t>(r), ranks, merge))
      throw DataError(path + ": the token of rank " + std::to_string(r) +
                      " is not the join of two tokens of lower rank (not a BPE rank file?)");
    src.merges.emplace_back(gpt2_spelling(merge.first), gpt2_spelling(merge.second));
    src.merge_lines.push_back(r);
  }
  if (sha256_hex(text) == kGpt2RanksSha256)
    src.tokens.emplace_back(static_cast<int64_t>(by_rank.size()), "<|endoftext|>");
  return src;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The one *.tiktoken file in `folder`, or "".
std::string rank_file_in(const std::string& folder) {
  std::error_code ec;
  std::string found;
  for (const auto& entry : std::filesystem::directory_iterator(folder, ec)) {
    const std::string name = entry.path().string();
    if (!ends_with(name, ".tiktoken")) continue;
    if (!found.empty())
      throw DataError(folder + ": holds two rank files (" + found + ", " + name +
                      "): give the file itself");
    found = name;
  }
  return found;
}

}  // namespace

VocabSource vocab_read(const std::string& where) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(where, ec))
    return ends_with(where, ".tiktoken") ? read_tiktoken(where) : read_tokenizer_json(where);
  if (std::filesystem::exists(where + "/encoder.json", ec)) return read_gpt2_files(where);
  if (std::filesystem::exists(where + "/tokenizer.json", ec))
    return read_tokenizer_json(where + "/tokenizer.json");
  if (std::filesystem::is_directory(where, ec)) {
    const std::string ranks = rank_file_in(where);
    if (!ranks.empty()) return read_tiktoken(ranks);
  }
  return read_gpt2_files(where);  // its error names encoder.json
}

}  // namespace lockstep
