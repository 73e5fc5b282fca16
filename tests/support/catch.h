// The test framework's version layer: Catch2 v2.13 (Debian 12: one header,
// `Contains` for substrings) and v3 (Debian 13: split headers, a compiled
// main, `ContainsSubstring`). Tests include this and write `Contains(...)`
// and `Approx(...)` the same way under both.
#pragma once

// Which one: the version CMake found and links (LOCKSTEP_CATCH2_MAJOR, from
// tests/CMakeLists.txt), not whichever headers the include path shows first:
// a GPU machine's image has a v3 in its system folders beside the carried
// v2, and the tests compiled against one failed to link with the other.
#if defined(LOCKSTEP_CATCH2_MAJOR)
#define LOCKSTEP_CATCH2_V3 (LOCKSTEP_CATCH2_MAJOR >= 3)
#elif __has_include(<catch2/catch_all.hpp>)
#define LOCKSTEP_CATCH2_V3 1
#else
#define LOCKSTEP_CATCH2_V3 0
#endif

#if LOCKSTEP_CATCH2_V3
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
