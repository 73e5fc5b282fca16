// A Hugging Face model folder (save_pretrained's layout): config.json, and
// the weights in model.safetensors or in several files named by
// model.safetensors.index.json's weight_map. Read as hostile: the index
// may name only plain file names in the folder, each tensor once, and
// every file holds exactly the tensors the index gives it; a folder with
// both model.safetensors and an index is refused (ambiguous).
#pragma once

#include <string>

#include "lockstep/io/state_dict.h"

namespace lockstep {

// Whether `path` is a folder holding config.json.
bool is_hf_folder(const std::string& path);
// config.json's text (at most 1 MiB); DataError naming the file otherwise.
std::string hf_config_text(const std::string& folder);
// Every tensor of the folder's weights, in file order (the index's files
// in the order they are first named).
StateDict hf_folder_weights(const std::string& folder);

}  // namespace lockstep
