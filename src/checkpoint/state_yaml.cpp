// state.yaml from one field table (state_yaml.h).
#include "state_yaml.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "lockstep/util/names.h"

namespace lockstep {
namespace {

constexpr int64_t kBig = int64_t{1} << 53;  // exact in a double
constexpr int64_t kCount = int64_t{1} << 31;

// One key of state.yaml. An integer has a range; a text its longest
// length; schedule_from is a name. Optional keys were added after the
// first checkpoints: absent, the member keeps its default (0, "": unknown).
struct StateField {
  enum Kind { kInteger, kText, kSchedule };
  const char* key;
  Kind kind;
  int64_t TrainerState::*integer = nullptr;
  std::string TrainerState::*text = nullptr;
  int64_t lo = 0, hi = 0;  // kInteger: the range; kText: hi is the longest length
  bool required = false;
  bool with_data = false;  // written only with the data's identity (data_size > 0)
};

StateField integer(const char* key, int64_t TrainerState::*m, int64_t lo, int64_t hi,
                   bool required = false) {
  StateField f{key, StateField::kInteger};
  f.integer = m;
  f.lo = lo;
  f.hi = hi;
  f.required = required;
  return f;
}

StateField text(const char* key, std::string TrainerState::*m, int64_t longest, bool required) {
  StateField f{key, StateField::kText};
  f.text = m;
  f.hi = longest;
  f.required = required;
  return f;
}

// In the order they are written.
const std::vector<StateField>& fields() {
  static const std::vector<StateField> table = [] {
    using S = TrainerState;
    std::vector<StateField> t{
        integer("step", &S::step, 0, kBig, true),
        integer("epoch", &S::epoch, 0, kBig, true),
        integer("batch_in_epoch", &S::batch_in_epoch, 0, kBig, true),
        integer("epoch_offset", &S::epoch_offset, 0, kBig),  // since elastic resume
        integer("world_size", &S::world_size, 1, 1 << 20, true),
        integer("batch_size", &S::batch_size, 0, kCount),
        integer("accumulation_steps", &S::accumulation_steps, 0, kCount),
        integer("total_steps", &S::total_steps, 0, kBig),
        StateField{"schedule_from", StateField::kSchedule},  // since optim.decay_steps
        integer("zero", &S::zero, 0, 3),                     // since ZeRO
        text("model", &S::model, 4096, true),
        integer("data_size", &S::data_size, 0, kBig),
        text("data_id", &S::data_id, 64, false),
    };
    t[11].with_data = t[12].with_data = true;
    return t;
  }();
  return table;
}

std::string range_text(int64_t v) {
  return v == kBig ? "2^53" : v == kCount ? "2^31" : v == (1 << 20) ? "2^20" : std::to_string(v);
}

void write_scaler(YAML::Emitter& yaml, const std::map<std::string, double>& scaler) {
  if (scaler.empty()) return;
  yaml << YAML::Key << "scaler" << YAML::Value << YAML::BeginMap;
  for (const auto& [key, value] : scaler) {
    yaml << YAML::Key << key << YAML::Value;
    // PyTorch's growth_interval and _growth_tracker are ints; the scale
    // and factors are floats, written so they read back exactly.
    if (value == std::floor(value) && std::fabs(value) < 9e15 && key != "scale" &&
        key.find("factor") == std::string::npos) {
      yaml << static_cast<int64_t>(value);
    } else {
      yaml << YAML::Precision(17) << value;
    }
  }
  yaml << YAML::EndMap;
}

void write_watch(YAML::Emitter& yaml, const char* key, const MetricWatch& w) {
  if (w.best_step < 0) return;
  yaml << YAML::Key << key << YAML::Value << YAML::BeginMap << YAML::Key << "best" << YAML::Value
       << YAML::Precision(17) << w.best << YAML::Key << "step" << YAML::Value << w.best_step
       << YAML::Key << "bad" << YAML::Value << w.bad << YAML::EndMap;
}

void read_field(const YAML::Node& node, const StateField& f, TrainerState& state) {
  const std::string key = f.key;
  switch (f.kind) {
    case StateField::kInteger: {
      const auto v = node.as<int64_t>();
      if (v < f.lo || v > f.hi)
        throw YAML::Exception(node.Mark(), key + ": " + std::to_string(v) + " is out of range [" +
                                               range_text(f.lo) + ", " + range_text(f.hi) + "]");
      state.*f.integer = v;
      return;
    }
    case StateField::kText: {
      auto v = node.as<std::string>();
      if (static_cast<int64_t>(v.size()) > f.hi)
        throw YAML::Exception(node.Mark(), key + ": over " + std::to_string(f.hi) + " characters");
      state.*f.text = std::move(v);
      return;
    }
    case StateField::kSchedule: {
      const auto value = value_named(kScheduleFromNames, node.as<std::string>());
      if (!value)
        throw YAML::Exception(node.Mark(), key + ": one of " + names_listed(kScheduleFromNames));
      state.schedule_from = *value;
      return;
    }
  }
}

MetricWatch read_watch(const YAML::Node& node, const char* key) {
  MetricWatch w;
  w.best = node["best"].as<double>();
  w.best_step = node["step"].as<int64_t>();
  w.bad = node["bad"].as<int64_t>();
  if (w.best_step < 0 || w.bad < 0 || !std::isfinite(w.best))
    throw YAML::Exception(node.Mark(), std::string(key) +
                                           ": a negative step or count, or a best that is not "
                                           "a finite number");
  return w;
}

}  // namespace

std::string state_yaml_text(const TrainerState& state) {
  YAML::Emitter yaml;
  yaml << YAML::BeginMap;
  for (const auto& f : fields()) {
    if (f.with_data && state.data_size <= 0) continue;
    yaml << YAML::Key << f.key << YAML::Value;
    switch (f.kind) {
      case StateField::kInteger:
        yaml << state.*f.integer;
        break;
      case StateField::kText:
        yaml << state.*f.text;
        break;
      case StateField::kSchedule:
        yaml << name_of(kScheduleFromNames, state.schedule_from);
        break;
    }
  }
  write_scaler(yaml, state.scaler);
  write_watch(yaml, "keep_best", state.keep_best);
  write_watch(yaml, "early_stop", state.early_stop);
  yaml << YAML::EndMap;
  return std::string(yaml.c_str()) + "\n";
}

TrainerState state_yaml_read(const YAML::Node& node) {
  if (!node.IsMap()) throw YAML::Exception(node.Mark(), "not a mapping");
  TrainerState state;
  for (const auto& f : fields()) {
    const YAML::Node value = node[f.key];
    if (value) {
      read_field(value, f, state);
    } else if (f.required) {
      throw YAML::Exception(node.Mark(), std::string("no ") + f.key);
    }
  }
  if (const YAML::Node scaler = node["scaler"]) {
    if (!scaler.IsMap()) throw YAML::Exception(scaler.Mark(), "scaler: not a mapping");
    for (const auto& entry : scaler)
      state.scaler[entry.first.as<std::string>()] = entry.second.as<double>();
  }
  if (const YAML::Node w = node["keep_best"]) state.keep_best = read_watch(w, "keep_best");
  if (const YAML::Node w = node["early_stop"]) state.early_stop = read_watch(w, "early_stop");
  return state;
}

std::string state_yaml_keys() {
  std::string ints, texts;
  for (const auto& f : fields()) {
    std::string& list = f.kind == StateField::kInteger ? ints : texts;
    if (f.kind == StateField::kSchedule) continue;
    list += (list.empty() ? "" : ", ") + std::string(f.key);
  }
  return "keys " + ints + ": integers; schedule_from: " + names_listed(kScheduleFromNames) + "; " +
         texts +
         ": text; scaler: a mapping of numbers; keep_best, early_stop: best, "
         "step, bad";
}

}  // namespace lockstep
