#include "lockstep/util/error.h"

#include <c10/util/Exception.h>

namespace lockstep {

std::string what_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

}  // namespace lockstep
