// The test framework's version layer: Catch2 v2.13 (Debian 12: one header,
// `Contains` for substrings) and v3 (Debian 13: split headers, a compiled
// main, `ContainsSubstring`). Tests include this and write `Contains(...)`
// and `Approx(...)` the same way under both.
#pragma once

#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <string>

using Catch::Approx;
namespace lockstep::testing {
inline Catch::Matchers::StringContainsMatcher Contains(const std::string& text) {
  return Catch::Matchers::ContainsSubstring(text);
}
}  // namespace lockstep::testing
#else
#include <catch2/catch.hpp>
namespace lockstep::testing {
using Catch::Matchers::Contains;
}  // namespace lockstep::testing
#endif
