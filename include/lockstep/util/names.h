// One name table per enum: the single source for parsing a name
// (parse_named), printing a value, and listing the valid names (config errors, the YAML dump,
// docs/config.md). An enum's owner defines its table next to the enum:
//   inline constexpr NameTable<DigestMode, 4> kDigestModeNames{{
//       {DigestMode::kAuto, "auto"}, {DigestMode::kXxh3, "xxh3"}, ...}};
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep {

template <typename E>
struct Named {
  E value;
  const char* name;
};

template <typename E, std::size_t N>
using NameTable = std::array<Named<E>, N>;

template <typename E, std::size_t N>
constexpr const char* name_of(const NameTable<E, N>& table, E value) {
  for (const auto& entry : table)
    if (entry.value == value) return entry.name;
  return "?";
}

template <typename E, std::size_t N>
std::optional<E> value_named(const NameTable<E, N>& table, std::string_view name) {
  for (const auto& entry : table)
    if (name == entry.name) return entry.value;
  return std::nullopt;
}

template <typename E, std::size_t N>
std::vector<std::string> names_of(const NameTable<E, N>& table) {
  std::vector<std::string> out;
  for (const auto& entry : table) out.emplace_back(entry.name);
  return out;
}

// "a, b, c": for messages that list what is valid.
template <typename E, std::size_t N>
std::string names_listed(const NameTable<E, N>& table) {
  std::string out;
  for (const auto& entry : table) out += (out.empty() ? "" : ", ") + std::string(entry.name);
  return out;
}

// The value named `text`; throws ConfigError "<what>: 'text' is not one of
// a, b, c" otherwise. `what` names where the text came from (a config key
// with its file, a command-line flag).
// names.cpp: ConfigError "<what>: '<text>' is not one of <valid>".
[[noreturn]] void throw_unknown_name(const std::string& what, std::string_view text,
                                     const std::vector<std::string>& valid);

// `text` for a message: whole up to 80 bytes, else its start and its size.
std::string shown_name(std::string_view text);
// The edits (insert, delete, replace, swap two neighbours) from `a` to `b`.
size_t edit_distance(const std::string& a, const std::string& b);
// "did you mean '<prefix>x'?" when a valid name is a near miss (at most 2
// edits, and fewer than the name's length), else "valid: <prefix>a, ...".
std::string near_miss(const std::string& wrong, const std::vector<std::string>& valid,
                      const std::string& prefix = "");

template <typename E, std::size_t N>
E parse_named(const NameTable<E, N>& table, std::string_view text, const std::string& what) {
  if (auto value = value_named(table, text)) return *value;
  throw_unknown_name(what, text, names_of(table));
}

}  // namespace lockstep
