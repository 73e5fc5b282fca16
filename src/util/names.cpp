#include "lockstep/util/names.h"

#include "lockstep/util/error.h"

namespace lockstep {

void throw_unknown_name(const std::string& what, std::string_view text, const std::string& valid) {
  throw ConfigError(what + ": '" + std::string(text) + "' is not one of " + valid);
}

}  // namespace lockstep
