// Small filesystem helpers shared by the launcher (no LibTorch) and the library.
#pragma once

#include <string>

namespace lockstep {

// mkdir -p: creates `path` and its missing parents. Throws DataError naming
// the component that could not be created and why.
void make_directories(const std::string& path);

}  // namespace lockstep
