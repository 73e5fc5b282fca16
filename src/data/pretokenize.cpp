// The pre-tokenizers of byte-level BPE: GPT-2's pattern and Llama 3's (which
// is cl100k_base's), written out as scanners over code points, and where
// each lets text be cut for parallel encoding.
#include "pretokenize.h"

#include <algorithm>
#include <iterator>
#include <vector>

#include "lockstep/data/bpe.h"

// Note [Pre-tokenizers]
// ~~~~~~~~~~~~~~~~~~~~~
// A byte-level BPE first cuts text into pieces with a regular expression
// and never merges across them. Two patterns are implemented, each as a
// scanner that tries the pattern's alternatives in order at each position,
// as a backtracking regex engine does (leftmost alternative first, each
// quantifier greedy, backtracking only where the pattern needs it):
//
//  GPT-2 (encoder.py, tiktoken's r50k/p50k):
//    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//  Llama 3 (Meta's tokenizer.py, tiktoken's cl100k_base):
//    (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//    ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// The classes are the references' (unicode_classes.inc, generated from
// tiktoken's regular expressions, Rust's regex crate, and checked against
// Hugging Face's tokenizers: \s is Unicode's White_Space, the letters and
// digits those of Unicode 16.0). An invalid UTF-8 byte is a character of the "other" class on its
// own (the references, fed the same bytes through surrogate escapes, see a
// lone surrogate, which is "other" too), so any bytes encode and
// decode(encode(x)) == x. Two steps of the Llama 3 pattern need backtracking:
// "\s*[\r\n]+" takes a whitespace run up to and including its last line end,
// and "\s+(?!\S)" a whitespace run less its last character when a
// non-space follows (that character then starts the next piece, as " ?" or
// "[^\r\n\p{L}\p{N}]?"). Case-insensitive "'s" also matches "'ſ" (U+017F,
// whose simple case folding is "s"), as Rust's and Python's engines do.

namespace lockstep {
namespace {

struct CodeRange {
  uint32_t first, last;
};
#include "unicode_classes.inc"

template <size_t N>
bool in_ranges(const CodeRange (&ranges)[N], uint32_t cp) {
  const auto it = std::upper_bound(std::begin(ranges), std::end(ranges), cp,
                                   [](uint32_t v, const CodeRange& r) { return v < r.first; });
  return it != std::begin(ranges) && cp <= std::prev(it)->last;
}

// The end of the run of characters of class `cls` from `i`.
size_t run_end(std::string_view s, size_t i, CharClass cls) {
  while (i < s.size()) {
    const Utf8Char c = utf8_char_at(s, i);
    if (char_class(c.cp) != cls) break;
    i += c.len;
  }
  return i;
}

CharClass class_at(std::string_view s, size_t i) {
  return i < s.size() ? char_class(utf8_char_at(s, i).cp) : CharClass::kOther;
}

bool is_line_end(uint32_t cp) {
  return cp == '\r' || cp == '\n';
}

// A whitespace run from `i`: its end, the start of its last character, how
// many characters it has and where its last line end is (npos: none).
struct SpaceRun {
  size_t end, last, count, last_line_end;
};

SpaceRun space_run(std::string_view s, size_t i) {
  SpaceRun run{i, i, 0, std::string_view::npos};
  while (run.end < s.size()) {
    const Utf8Char w = utf8_char_at(s, run.end);
    if (char_class(w.cp) != CharClass::kSpace) break;
    if (is_line_end(w.cp)) run.last_line_end = run.end;
    run.last = run.end;
    run.end += w.len;
    ++run.count;
  }
  return run;
}

// \s+(?!\S)|\s+ at a whitespace run: the whole run at the end of the text
// or when it is one character, else the run less its last character.
size_t space_piece_end(std::string_view s, const SpaceRun& run) {
  return run.end == s.size() || run.count == 1 ? run.end : run.last;
}

// 's|'t|'re|'ve|'m|'ll|'d at `i` (case-insensitive when `fold`): its length, or 0.
size_t contraction_at(std::string_view s, size_t i, bool fold) {
  if (s[i] != '\'' || i + 1 >= s.size()) return 0;
  const auto lower = [&](char c) {
    return fold && c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
  };
  const char a = lower(s[i + 1]);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (fold && s.compare(i + 1, 2, "\xC5\xBF") == 0) return 3;  // 'ſ
  if (i + 2 < s.size()) {
    const char b = lower(s[i + 2]);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  }
  return 0;
}

// One piece of the Llama 3 pattern from `i`: its end.
size_t llama3_piece(std::string_view s, size_t i) {
  if (const size_t n = contraction_at(s, i, true)) return i + n;
  const Utf8Char c = utf8_char_at(s, i);
  const CharClass cls = char_class(c.cp);
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (cls == CharClass::kLetter) return run_end(s, i, CharClass::kLetter);
  if (cls != CharClass::kNumber && !is_line_end(c.cp) &&
      class_at(s, i + c.len) == CharClass::kLetter)
    return run_end(s, i + c.len, CharClass::kLetter);
  // \p{N}{1,3}
  if (cls == CharClass::kNumber) {
    size_t end = i;
    for (int k = 0; k < 3 && class_at(s, end) == CharClass::kNumber; ++k)
      end += utf8_char_at(s, end).len;
    return end;
  }
  // ' '?[^\s\p{L}\p{N}]+[\r\n]*
  const size_t from = c.cp == ' ' && class_at(s, i + 1) == CharClass::kOther ? i + 1 : i;
  if (class_at(s, from) == CharClass::kOther) {
    size_t end = run_end(s, from, CharClass::kOther);
    while (end < s.size() && (s[end] == '\r' || s[end] == '\n')) ++end;
    return end;
  }
  // \s*[\r\n]+ | \s+(?!\S) | \s+
  const SpaceRun run = space_run(s, i);
  if (run.last_line_end != std::string_view::npos) return run.last_line_end + 1;
  return space_piece_end(s, run);
}

// One piece of GPT-2's pattern from `i`: its end.
size_t gpt2_piece(std::string_view s, size_t i) {
  if (const size_t n = contraction_at(s, i, false)) return i + n;
  const Utf8Char c = utf8_char_at(s, i);
  const CharClass cls = char_class(c.cp);
  if (c.cp == ' ' && i + 1 < s.size()) {
    const CharClass after = class_at(s, i + 1);
    if (after != CharClass::kSpace) return run_end(s, i + 1, after);  // " ?" joins the run
  }
  if (cls != CharClass::kSpace) return run_end(s, i, cls);
  return space_piece_end(s, space_run(s, i));
}

}  // namespace

Utf8Char utf8_char_at(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  const Utf8Char bad{kInvalidByte, 1};
  if (c < 0x80) return {c, 1};
  size_t len;
  uint32_t cp, min;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2, cp = c & 0x1Fu, min = 0x80;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3, cp = c & 0x0Fu, min = 0x800;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4, cp = c & 0x07u, min = 0x10000;
  } else {
    return bad;
  }
  if (i + len > s.size()) return bad;
  for (size_t k = 1; k < len; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return bad;
    cp = (cp << 6) | (b(i + k) & 0x3Fu);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return bad;
  return {cp, len};
}

CharClass char_class(uint32_t cp) {
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return CharClass::kLetter;
    if (cp >= '0' && cp <= '9') return CharClass::kNumber;
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return CharClass::kSpace;
    return CharClass::kOther;
  }
  if (cp == kInvalidByte) return CharClass::kOther;
  if (in_ranges(kLetter, cp)) return CharClass::kLetter;
  if (in_ranges(kNumber, cp)) return CharClass::kNumber;
  if (in_ranges(kSpace, cp)) return CharClass::kSpace;
  return CharClass::kOther;
}

std::vector<size_t> bpe_pieces(std::string_view s, BpePattern pattern) {
  std::vector<size_t> ends;
  const auto piece = pattern == BpePattern::kLlama3 ? llama3_piece : gpt2_piece;
  for (size_t i = 0; i < s.size();) ends.push_back(i = piece(s, i));
  return ends;
}

std::vector<size_t> gpt2_pieces(std::string_view s) {
  return bpe_pieces(s, BpePattern::kGpt2);
}

// No piece of either pattern holds a character other than a space followed
// by a space other than a line end (and GPT-2's none followed by a line end
// either); no piece of Llama 3's holds a line end followed by a character
// other than a space ("\s*[\r\n]+" ends a whitespace run at its last line
// end whatever follows; GPT-2's "\s+(?!\S)" looks ahead, so a run ending
// the text would be one piece more). The scan restarts there whatever came
// before.
size_t bpe_safe_cut(std::string_view s, size_t from, BpePattern pattern) {
  const bool line_ends = pattern == BpePattern::kGpt2;
  for (size_t p = std::max<size_t>(from, 1); p < s.size(); ++p) {
    const char c = s[p];
    if (!line_ends && (s[p - 1] == '\n' || s[p - 1] == '\r') &&
        char_class(utf8_char_at(s, p).cp) != CharClass::kSpace)
      return p;  // Llama 3's: after a line end, before other text
    if (c != ' ' && c != '\t' && c != '\v' && c != '\f' && !(line_ends && (c == '\n' || c == '\r')))
      continue;
    // The character that ends at p: back over continuation bytes to its lead.
    size_t lead = p - 1;
    while (lead > 0 && p - lead < 4 && (static_cast<unsigned char>(s[lead]) & 0xC0) == 0x80) --lead;
    const Utf8Char before = utf8_char_at(s, lead);
    const bool whole = lead + before.len == p;
    if (whole && char_class(before.cp) == CharClass::kSpace) continue;
    return p;  // a space after a non-space (or an invalid byte): no piece spans it
  }
  return s.size();
}

size_t gpt2_safe_cut(std::string_view s, size_t from) {
  return bpe_safe_cut(s, from, BpePattern::kGpt2);
}

}  // namespace lockstep
