#include "lockstep/util/error.h"

#include <c10/util/Exception.h>

#include <new>

namespace lockstep {

std::string what_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) return true;
  if (dynamic_cast<const OutOfMemoryError*>(&e) != nullptr) return true;
  if (dynamic_cast<const c10::Error*>(&e) == nullptr) return false;
  const std::string text = what_of(e);
  return text.find("can't allocate memory") != std::string::npos ||
         text.find("out of memory") != std::string::npos;
}

}  // namespace lockstep
