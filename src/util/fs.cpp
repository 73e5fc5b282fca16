#include "lockstep/util/fs.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "lockstep/util/error.h"

namespace lockstep {

void make_directories(const std::string& path) {
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos == path.size() || path[pos] == '/') {
      const std::string prefix = path.substr(0, pos);
      if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
        throw DataError("cannot create '" + prefix + "': " + std::strerror(errno));
      }
    }
  }
}

}  // namespace lockstep
