// Numbers as people write them: whole numbers in full (300), others as the
// shortest text that reads back as the same double (0.1, not
// 0.10000000000000001), for the config dump, help
// texts and messages.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace lockstep {

inline std::string number_text(double value) {
  char text[32];
  if (value == std::floor(value) && std::fabs(value) < 1e15) {  // whole: 300, not 3e+02
    std::snprintf(text, sizeof text, "%.0f", value);
    return text;
  }
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(text, sizeof text, "%.*g", precision, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  return text;
}

}  // namespace lockstep
