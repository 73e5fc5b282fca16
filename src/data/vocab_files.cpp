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

// A vocabulary has no more than kMaxVocab tokens and, in GPT-2's own files,
// where each merge makes a token no other merge makes, fewer merges than
// tokens: refused as soon as a file says more, before they are held (Note
// [Bounded JSON] bounds a tokenizer.json's merges, which in Llama 3's kind
// make tokens several ways).
void check_counts(const VocabSource& src) {
  if (static_cast<int64_t>(src.tokens.size()) > kMaxVocab)
    throw DataError(src.vocab_file + ": more than " + std::to_string(kMaxVocab) + " tokens");
  if (src.merges_by_line && src.merges.size() > src.tokens.size())
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
      if (id.key() == "<|endoftext|>") src.special_ids.push_back(src.tokens.back().first);
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

const char* const kSplitBehaviour = "Isolated";

// A Split pre-tokenizer: Llama 3's pattern, its pieces kept whole, or
// refused naming what differs.
void check_llama3_split(JsonValue split, const std::string& path) {
  const std::string_view regex = split.get("pattern").get("Regex").text();
  if (regex != kLlama3Pattern)
    throw DataError(path + ": pre_tokenizer's Split pattern '" + std::string(regex.substr(0, 80)) +
                    "' is not Llama 3's: another tokenizer's pattern, which lockstep does not "
                    "implement (it reads GPT-2's and Llama 3's)");
  if (split.get("behavior").text() != kSplitBehaviour || split.get("invert").boolean())
    throw DataError(path + ": pre_tokenizer's Split has behavior '" +
                    std::string(split.get("behavior").text()) +
                    "' or invert set; Llama 3's is Isolated, not inverted");
}

// The pre-tokenizer: a ByteLevel with GPT-2's pattern (alone or in a
// Sequence), or Llama 3's Split before a ByteLevel without its own regex;
// anything else is refused by name. Sets src.pattern; returns the ByteLevel.
JsonValue read_pre_tokenizer(JsonValue pre, const std::string& path, VocabSource& src) {
  std::vector<JsonValue> steps;
  if (type_is(pre, "Sequence")) {
    for (const JsonValue p : pre.get("pretokenizers")) steps.push_back(p);
  } else if (!pre.missing() && !pre.is(JsonKind::kNull)) {
    steps.push_back(pre);
  }
  JsonValue byte_level, split;
  for (const JsonValue p : steps) {
    if (type_is(p, "ByteLevel") && byte_level.missing()) {
      byte_level = p;
    } else if (type_is(p, "Split") && split.missing() && byte_level.missing()) {
      split = p;
    } else {
      throw DataError(path + ": pre_tokenizer holds a " + std::string(p.get("type").text()) +
                      " where lockstep reads GPT-2's ByteLevel or Llama 3's Split then ByteLevel");
    }
  }
  if (byte_level.missing())
    throw DataError(path + ": pre_tokenizer is not ByteLevel (GPT-2's): another tokenizer kind");
  const JsonValue regex = byte_level.get("use_regex");
  const bool own_regex = !(regex.is(JsonKind::kBool) && !regex.boolean());
  if (split.missing()) {
    if (!own_regex)
      throw DataError(path +
                      ": pre_tokenizer.use_regex is false with no Split before it: "
                      "the text would not be cut into pieces");
    return byte_level;
  }
  check_llama3_split(split, path);
  if (own_regex)
    throw DataError(path +
                    ": the ByteLevel after Llama 3's Split has use_regex true: GPT-2's "
                    "pattern would cut the pieces again (Llama 3's sets it false)");
  src.pattern = BpePattern::kLlama3;
  return byte_level;
}

// Whatever would change the ids is refused by name: lockstep reads GPT-2's
// and Llama 3's kinds only.
void check_bpe_kind(JsonValue root, JsonValue model, JsonValue byte_level, const std::string& path,
                    VocabSource& src) {
  const auto is_null_or_empty = [](JsonValue v) {
    return v.is(JsonKind::kNull) || (v.is(JsonKind::kString) && v.text().empty()) ||
           (v.is(JsonKind::kBool) && !v.boolean());
  };
  if (!is_null_or_empty(root.get("normalizer")))
    throw DataError(path + ": normalizer is set; GPT-2's and Llama 3's tokenizers have none");
  for (const char* field : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"})
    if (!is_null_or_empty(model.get(field)))
      throw DataError(path + ": model." + field + " is set; byte-level BPE has none");
  if (byte_level.get("add_prefix_space").boolean())
    throw DataError(path +
                    ": pre_tokenizer.add_prefix_space is true; GPT-2's and Llama 3's are "
                    "false");
  src.whole_pieces = model.get("ignore_merges").boolean();
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

// A Hugging Face tokenizer.json of the byte-level BPE kind: model.type BPE
// with its vocab and merges ("a b" or ["a", "b"]; ignore_merges as
// Llama 3's sets it), a ByteLevel pre-tokenizer with GPT-2's pattern or
// Llama 3's Split before it, no prefix space; added tokens (<|endoftext|>,
// <|begin_of_text|>) join the vocabulary as special tokens.
VocabSource read_tokenizer_json(const std::string& path) {
  VocabSource src;
  src.vocab_file = src.merges_file = path;
  const JsonDocument doc(read_regular_file(path, kMaxVocabFileBytes), path, kMaxJsonValues);
  const JsonValue root = doc.root();
  const JsonValue model = root.get("model");
  if (!model.is(JsonKind::kObject) || !type_is(model, "BPE"))
    throw DataError(path +
                    ": model.type is not BPE (only byte-level BPE is read: GPT-2's and "
                    "Llama 3's kinds)");
  const JsonValue byte_level = read_pre_tokenizer(root.get("pre_tokenizer"), path, src);
  check_bpe_kind(root, model, byte_level, path, src);
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
    // An added token's content is its text, not the byte map's spelling.
    if (known.insert(n).second) src.tokens.emplace_back(n, gpt2_spelling(content.text()));
    src.special_ids.push_back(n);
    check_counts(src);
  }
  read_merges(merges, path, src);
  return src;
}

// Note [Rank files]
// ~~~~~~~~~~~~~~~~~
// tiktoken's files (gpt2.tiktoken, Llama 3's tokenizer.model) list each
// token's bytes in base64 with its rank; the rank is the id, and merging
// is "join the adjacent pair whose join has the lowest rank, the leftmost
// first", after a whole piece that is a token has been taken as it is.
// They hold no merges: every split of a token into two tokens is a merge
// of the token's rank (Note [Byte-level BPE]), as Hugging Face's
// conversion of these files writes them (a token that splits into no two
// tokens is refused: not a BPE rank file). The files name neither their
// pattern nor their special tokens: the known ones are recognised by
// their SHA-256 (GPT-2's, tiktoken's "gpt2"/"r50k_base": <|endoftext|> as
// 50256; Llama 3's, Meta's tokenizer.py: Llama 3's pattern and its 256
// special tokens from 128000, <|begin_of_text|> first). Another file is
// read with GPT-2's pattern below 100,000 ranks (p50k's size) and refused
// above (cl100k_base and o200k_base cut text with other patterns or
// special tokens lockstep would not know).
constexpr size_t kMaxRankTokenBytes = 1024;
constexpr size_t kOtherPatternRanks = 100000;  // GPT-2's and p50k's have ~50,000
constexpr double kMaxSplitWork = 3e7;          // 4x Llama 3's
constexpr size_t kMaxRankMerges = 1500000;     // 5x Llama 3's 280,147
constexpr const char* kGpt2RanksSha256 =
    "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930";
constexpr const char* kLlama3RanksSha256 =
    "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55";

// Llama 3's special tokens (Meta's tokenizer.py), in id order from 128000.
std::vector<std::string> llama3_special_tokens() {
  std::vector<std::string> names = {"<|begin_of_text|>",
                                    "<|end_of_text|>",
                                    "<|reserved_special_token_0|>",
                                    "<|reserved_special_token_1|>",
                                    "<|finetune_right_pad_id|>",
                                    "<|step_id|>",
                                    "<|start_header_id|>",
                                    "<|end_header_id|>",
                                    "<|eom_id|>",
                                    "<|eot_id|>",
                                    "<|python_tag|>",
                                    "<|image|>"};
  for (int i = 2; names.size() < 256; ++i)
    names.push_back("<|reserved_special_token_" + std::to_string(i) + "|>");
  return names;
}

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

// `text` for a message: control bytes as \xNN.
std::string printable(std::string_view text) {
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u != 0x7F) {
      out.push_back(c);
    } else {
      const char* hex = "0123456789abcdef";
      out += {'\\', 'x', hex[u >> 4], hex[u & 15]};
    }
  }
  return out;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
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
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);  // CRLF, as tiktoken reads it
    if (line.empty()) continue;
    const auto fail = [&](const std::string& why) {
      return DataError(path + " line " + std::to_string(line_no) + ": " + why);
    };
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || !base64_decode(line.substr(0, space), bytes))
      throw fail(std::string("not a base64 token, a space and a rank") +
                 (by_rank.empty() && ends_with(path, "tokenizer.model")
                      ? " (a SentencePiece model, as Llama 2's and Mistral's tokenizer.model "
                        "are? lockstep reads byte-level BPE only)"
                      : ""));
    const std::string_view number = line.substr(space + 1);
    if (number.empty() || number.size() > 7 ||
        number.find_first_not_of("0123456789") != std::string_view::npos)
      throw fail("the rank '" + printable(number.substr(0, 20)) + "' is not a whole number below " +
                 std::to_string(kMaxVocab));
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

// The known files' pattern and special tokens (Note [Rank files]), the
// special tokens after the `ranks` ranks.
void recognise_ranks(const std::string& path, const std::string& text, size_t ranks,
                     VocabSource& src) {
  const std::string sha = sha256_hex(text);
  std::vector<std::string> specials;
  if (sha == kGpt2RanksSha256) {
    specials = {"<|endoftext|>"};
  } else if (sha == kLlama3RanksSha256) {
    src.pattern = BpePattern::kLlama3;
    specials = llama3_special_tokens();
  } else if (ranks >= kOtherPatternRanks) {
    throw DataError(path + ": " + std::to_string(ranks) +
                    " ranks, and not Llama 3's tokenizer.model (SHA-256 " + kLlama3RanksSha256 +
                    "): a rank file of this size (cl100k_base, o200k_base) belongs to a "
                    "tokenizer whose pattern and special tokens the file does not say, and "
                    "read with GPT-2's its ids would differ from that tokenizer's");
  }
  for (size_t i = 0; i < specials.size(); ++i) {
    src.special_ids.push_back(static_cast<int64_t>(ranks + i));
    src.tokens.emplace_back(static_cast<int64_t>(ranks + i), gpt2_spelling(specials[i]));
  }
}

// Every split of each token into two tokens, a merge of the token's rank.
void split_merges(const std::string& path, const std::vector<std::string>& by_rank,
                  VocabSource& src) {
  std::unordered_map<std::string_view, int64_t> ranks;
  for (size_t r = 0; r < by_rank.size(); ++r)
    if (!ranks.emplace(by_rank[r], static_cast<int64_t>(r)).second)
      throw DataError(path + ": the token of rank " + std::to_string(r) +
                      " is listed under an earlier rank too");
  for (size_t r = 0; r < by_rank.size(); ++r) {
    const std::string_view token = by_rank[r];
    if (token.size() < 2) continue;
    const size_t before = src.merges.size();
    for (size_t k = 1; k < token.size(); ++k) {
      if (ranks.count(token.substr(0, k)) == 0 || ranks.count(token.substr(k)) == 0) continue;
      if (src.merges.size() == kMaxRankMerges)
        throw DataError(path + ": its tokens split into more than " +
                        std::to_string(kMaxRankMerges) +
                        " pairs of tokens (Llama 3's into 280,147): not a BPE rank file?");
      src.merges.emplace_back(gpt2_spelling(token.substr(0, k)), gpt2_spelling(token.substr(k)));
      src.merge_lines.push_back(r);
    }
    if (src.merges.size() == before)
      throw DataError(path + ": the token of rank " + std::to_string(r) +
                      " is not the join of two tokens (not a BPE rank file?)");
  }
}

VocabSource read_tiktoken(const std::string& path) {
  VocabSource src;
  src.vocab_file = src.merges_file = path;
  src.whole_pieces = src.priority_by_result = true;
  const std::string text = read_regular_file(path, kMaxVocabFileBytes);
  const std::vector<std::string> by_rank = read_ranks(path, text);
  recognise_ranks(path, text, by_rank.size(), src);
  // Splitting a token of L bytes hashes ~L^2 bytes: a file of long tokens
  // is refused before that work rather than taking hours.
  double work = 0;
  for (const auto& token : by_rank) {
    if (token.size() > kMaxRankTokenBytes)
      throw DataError(path + ": a token of " + std::to_string(token.size()) + " bytes, over the " +
                      std::to_string(kMaxRankTokenBytes) + " a rank file's tokens may hold");
    work += static_cast<double>(token.size()) * static_cast<double>(token.size());
  }
  if (work > kMaxSplitWork)
    throw DataError(path +
                    ": its tokens are too long to find their merges in reasonable time "
                    "(the sum of squared token lengths is " +
                    std::to_string(static_cast<long long>(work)) + ", over " +
                    std::to_string(static_cast<long long>(kMaxSplitWork)) +
                    "; GPT-2's ranks need 2.5 million, Llama 3's 7.4 million)");
  for (size_t r = 0; r < by_rank.size(); ++r)
    src.tokens.emplace_back(static_cast<int64_t>(r), gpt2_spelling(by_rank[r]));
  split_merges(path, by_rank, src);
  return src;
}

// A rank file by its name: *.tiktoken, or tokenizer.model (Llama 3's).
bool is_rank_file(const std::string& path) {
  return ends_with(path, ".tiktoken") ||
         std::filesystem::path(path).filename() == "tokenizer.model";
}

// The one rank file in `folder`, or "".
std::string rank_file_in(const std::string& folder) {
  std::error_code ec;
  std::string found;
  for (const auto& entry : std::filesystem::directory_iterator(folder, ec)) {
    const std::string name = entry.path().string();
    if (!is_rank_file(name)) continue;
    if (!found.empty())
      throw DataError(folder + ": holds two rank files (" + found + ", " + name +
                      "): give the file itself");
    found = name;
  }
  return found;
}

}  // namespace

const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

VocabSource vocab_read(const std::string& where) {
  std::error_code ec;
  if (std::filesystem::exists(where, ec) && !std::filesystem::is_regular_file(where, ec) &&
      !std::filesystem::is_directory(where, ec))
    throw DataError("'" + where + "' is neither a file nor a folder (a device or a pipe?)");
  if (std::filesystem::is_regular_file(where, ec))
    return is_rank_file(where) ? read_tiktoken(where) : read_tokenizer_json(where);
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
