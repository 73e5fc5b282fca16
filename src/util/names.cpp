#include "lockstep/util/names.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "lockstep/util/error.h"

namespace lockstep {

std::string shown_name(std::string_view text) {
  constexpr size_t kShown = 80;  // a 10 MB "name" is not echoed whole
  if (text.size() <= kShown) return std::string(text);
  return std::string(text.substr(0, kShown)) + "... (" + std::to_string(text.size()) + " bytes)";
}

size_t edit_distance(const std::string& a, const std::string& b) {
  // Optimal string alignment: insertions, deletions, substitutions and
  // swaps of two neighbours ("gtp" is one edit from "gpt", two from "mlp").
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min(
          {d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1] ? 1 : 0)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

// "did you mean 'x'?" when a valid name is a near miss (at most 2 edits,
// and fewer than the name's length: 'amp' is not a typo of 'epochs'),
// else every valid name: "(valid: a, b, c)".
std::string near_miss(const std::string& wrong, const std::vector<std::string>& valid,
                      const std::string& prefix) {
  std::string best, all;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (const auto& v : valid) {
    // A name far longer than any valid one is no typo (and its table would
    // cost memory in proportion to it).
    const size_t d = wrong.size() > v.size() + 2 ? wrong.size() : edit_distance(wrong, v);
    if (d < best_distance) best_distance = d, best = v;
    all += (all.empty() ? "" : ", ") + prefix + v;
  }
  if (best_distance <= 2 && best_distance < wrong.size())
    return "did you mean '" + prefix + best + "'?";
  return "valid: " + all;
}

void throw_unknown_name(const std::string& what, std::string_view text,
                        const std::vector<std::string>& valid) {
  std::string listed;
  for (const auto& v : valid) listed += (listed.empty() ? "" : ", ") + v;
  const std::string hint = near_miss(std::string(text), valid, "");
  throw ConfigError(what + ": '" + shown_name(text) + "' is not one of " + listed +
                    (hint.rfind("did you mean", 0) == 0 ? " (" + hint + ")" : ""));
}

}  // namespace lockstep
