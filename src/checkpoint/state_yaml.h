// state.yaml, the loop's own scalars in a checkpoint (Note [Stateful parts]
// in checkpoint.cpp), written and read from one field table: the keys,
// their order, which are required, their ranges and the error's list of
// keys all come from it (state_yaml.cpp).
#pragma once

#include <string>

#include "lockstep/checkpoint/run_state.h"

namespace YAML {
class Node;
}

namespace lockstep {

// The text of state.yaml for `state`, keys in the table's order.
std::string state_yaml_text(const TrainerState& state);
// `state` read from a parsed state.yaml; throws YAML::Exception naming the
// key (a missing required key, a wrong type, a value out of its range).
TrainerState state_yaml_read(const YAML::Node& node);
// What the keys hold, for an error about the file as a whole.
std::string state_yaml_keys();

}  // namespace lockstep
