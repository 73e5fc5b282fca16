#include "lockstep/io/hf_folder.h"

#include <map>
#include <set>
#include <vector>

#include "lockstep/io/safetensors.h"
#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"
#include "lockstep/util/json.h"

namespace lockstep {
namespace {

constexpr size_t kConfigBytes = 1 << 20;
constexpr size_t kIndexBytes = 64 << 20;

bool plain_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

}  // namespace

bool is_hf_folder(const std::string& path) {
  return is_directory(path) && path_exists(path + "/config.json");
}

std::string hf_config_text(const std::string& folder) {
  return read_regular_file(folder + "/config.json", kConfigBytes);
}

StateDict hf_folder_weights(const std::string& folder) {
  const std::string single = folder + "/model.safetensors";
  const std::string index_path = folder + "/model.safetensors.index.json";
  if (path_exists(index_path) && path_exists(single))
    throw DataError("'" + folder + "' holds both model.safetensors and " +
                    "model.safetensors.index.json: which weights are meant is ambiguous (remove "
                    "the one that is stale)");
  if (!path_exists(index_path)) {
    if (!path_exists(single))
      throw DataError("'" + folder + "' holds neither model.safetensors nor " +
                      "model.safetensors.index.json (a Hugging Face folder's weights)");
    return safetensors_load(single);
  }
  const std::string text = read_regular_file(index_path, kIndexBytes);
  const JsonDocument doc(text, index_path);
  const JsonValue map = doc.root().get("weight_map");
  if (!map.is(JsonKind::kObject) || map.size() == 0)
    throw DataError(index_path + ": no weight_map object of tensor names and files");
  std::vector<std::string> files;
  std::map<std::string, std::set<std::string>> wanted;  // file -> its tensors
  for (const JsonValue entry : map) {
    const std::string file(entry.text());
    if (!entry.is(JsonKind::kString) || !plain_name(file))
      throw DataError(index_path + ": weight_map['" + std::string(entry.key()) +
                      "'] is not a file name in the folder");
    if (wanted.find(file) == wanted.end()) files.push_back(file);
    wanted[file].insert(std::string(entry.key()));
  }
  StateDict all;
  std::set<std::string> seen;
  for (const auto& file : files) {
    StateDict part = safetensors_load(folder + "/" + file);
    std::set<std::string> held;
    for (auto& [name, tensor] : part) {
      if (!wanted[file].count(name))
        throw DataError(folder + "/" + file + ": holds '" + name +
                        "', which the index does not give to this file");
      if (!seen.insert(name).second)
        throw DataError(folder + "/" + file + ": '" + name + "' appears in two files");
      held.insert(name);
      all.emplace_back(name, std::move(tensor));
    }
    for (const auto& name : wanted[file])
      if (!held.count(name))
        throw DataError(index_path + ": '" + name + "' is said to be in " + file +
                        ", which does not hold it");
  }
  return all;
}

}  // namespace lockstep
