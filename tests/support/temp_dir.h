// A temporary folder for one test, removed with everything in it.
#pragma once

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

namespace lockstep::testing {

struct TempDir {
  std::string path;
  TempDir() {
    char pattern[] = "/tmp/lockstep-test-XXXXXX";
    path = mkdtemp(pattern);
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string write(const std::string& name, const std::string& content) const {
    std::ofstream(path + "/" + name, std::ios::binary) << content;
    return path + "/" + name;
  }
  static std::string read_file(const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
};

}  // namespace lockstep::testing
