#include "run_stateful.h"

#include <ATen/ATen.h>

#include <map>

#include "lockstep/checkpoint/hook_state.h"
#include "lockstep/optim/optim.h"
#include "lockstep/util/error.h"
#include "lockstep/util/module_tensors.h"
#include "lockstep/zero/zero.h"

namespace lockstep {
namespace {

// Note [Sharded checkpoints]: which rank writes each entry of model.pt (and
// a parameter's optimizer state): a trainable parameter its ZeRO owner (at
// optim.zero 0 the owner zero_partition would give it), any other entry
// (a buffer, a frozen parameter) the rank with the fewest bytes so far.
// The same on every rank: the shapes are (placeholders keep theirs).
struct Writers {
  std::map<std::string, int> of_entry;  // model.pt's names
  std::vector<int> of_param;            // by trainable_parameters' index
};

Writers writers_of(const RunParts& run, int world) {
  Writers w;
  const NamedTensors params = trainable_parameters(*run.model);
  if (run.zero != nullptr) {
    w.of_param = run.zero->owners();
  } else {
    std::vector<at::Tensor> tensors;
    for (const auto& [name, p] : params) tensors.push_back(p);
    w.of_param = zero_partition(tensors, world);
  }
  std::vector<int64_t> bytes(static_cast<size_t>(world), 0);
  for (size_t i = 0; i < params.size(); ++i) {
    w.of_entry[params[i].first] = w.of_param[i];
    bytes[static_cast<size_t>(w.of_param[i])] +=
        params[i].second.numel() * params[i].second.element_size();
  }
  for (const auto& [name, t] : state_dict_of(*run.model)) {
    if (w.of_entry.count(name) != 0) continue;
    const auto least = std::min_element(bytes.begin(), bytes.end()) - bytes.begin();
    w.of_entry[name] = static_cast<int>(least);
    bytes[static_cast<size_t>(least)] += t.numel() * t.element_size();
  }
  return w;
}

class ModelPart : public Stateful {
 public:
  ModelPart(RunParts& run, int rank, int world) : run_(run), rank_(rank), world_(world) {}
  std::string file() const override { return "model.pt"; }
  bool shardable() const override { return true; }
  // This rank's entries as they are (under optim.zero 3 an owner's own
  // weights): written from the live tensors, nothing gathered.
  StateDict local_state_dict() override {
    const Writers w = writers_of(run_, world_);
    StateDict out;
    for (auto& [name, t] : state_dict_of(*run_.model))
      if (w.of_entry.at(name) == rank_) out.emplace_back(name, t.detach());
    return out;
  }
  // Under optim.zero 3 the weights are gathered for it (collective).
  StateDict state_dict() override {
    if (!run_.sharded) return state_dict_of(*run_.model);
    // Unit by unit: rank 0 copies each parameter while its unit is
    // gathered; no rank holds the whole model gathered at once.
    std::map<const c10::TensorImpl*, at::Tensor> whole;
    const NamedTensors params = trainable_parameters(*run_.model);
    const auto& owners = run_.sharded->owners();
    run_.sharded->visit_whole([&](size_t i, const at::Tensor& t) {
      // Rank 0's own weights stay as they are through the save: no copy.
      if (rank_ == 0)
        whole[params.at(i).second.unsafeGetTensorImpl()] =
            owners.at(i) == 0 ? t.detach() : t.detach().clone();
    });
    if (rank_ != 0) return {};  // rank 0 writes it
    StateDict out = state_dict_of(*run_.model);
    for (auto& [name, t] : out) {
      const auto it = whole.find(t.unsafeGetTensorImpl());
      if (it != whole.end()) t = it->second;
    }
    return out;
  }
  void load_state_dict(const StateDict& saved, const std::string& source) override {
    with_whole_weights(run_, [&] { state_dict_load(*run_.model, saved, source); });
  }

 private:
  RunParts& run_;
  int rank_, world_;
};

// Whole on rank 0 whatever the stage: a ZeroOptimizer gathers it from the
// owners (collective); a plain optimizer's is rank 0's own.
class OptimizerPart : public Stateful {
 public:
  OptimizerPart(RunParts& run, ProcessGroup& pg) : run_(run), pg_(pg) {}
  std::string file() const override { return "optimizer.pt"; }
  bool shardable() const override { return true; }
  // A parameter's state goes with its weight (Writers): a ZeroOptimizer's
  // owner holds it; a plain optimizer's replicas are written once each.
  StateDict local_state_dict() override {
    const NamedTensors params = trainable_parameters(*run_.model);
    const Writers w = writers_of(run_, pg_.size());
    NamedTensors mine;
    for (size_t i = 0; i < params.size(); ++i)
      if (w.of_param[i] == pg_.rank()) mine.push_back(params[i]);
    return optimizer_state_dict(run_.zero != nullptr ? run_.zero->local() : *run_.optimizer, mine);
  }
  // Loading: a ZeroOptimizer's owner reads its parameters' state alone.
  bool needs_every_entry() const override { return run_.zero == nullptr; }
  bool reads(const std::string& entry) const override {
    if (owned_.empty()) {
      const NamedTensors params = trainable_parameters(*run_.model);
      for (size_t i = 0; i < params.size(); ++i) owned_[params[i].first] = run_.zero->owns(i);
    }
    const auto found = owned_.find(entry.substr(0, entry.rfind('.')));
    return found == owned_.end() || found->second;  // unknown: read, refused by name on load
  }
  StateDict state_dict() override {
    if (run_.zero != nullptr) return run_.zero->consolidated_state_dict();
    if (pg_.rank() != 0) return {};
    return optimizer_state_dict(*run_.optimizer, trainable_parameters(*run_.model));
  }
  void load_state_dict(const StateDict& saved, const std::string& source) override {
    if (run_.zero != nullptr) {
      run_.zero->load_state_dict(saved, source);
    } else {
      optimizer_load_state_dict(*run_.optimizer, trainable_parameters(*run_.model), saved, {},
                                source);
    }
  }

 private:
  RunParts& run_;
  ProcessGroup& pg_;
  mutable std::map<std::string, bool> owned_;  // reads(): parameter name -> this rank owns it
};

// rng.pt: one row per writing rank (a single tensor). A rank the writer
// did not have is seeded afresh (Note [Elastic resume]).
class RngPart : public Stateful {
 public:
  RngPart(const Config& config, ProcessGroup& pg, int rank)
      : config_(config), pg_(pg), rank_(rank) {}
  std::string file() const override { return "rng.pt"; }
  StateDict state_dict() override {
    const auto states = pg_.allgather(generator_state().to(pg_.device()));
    if (pg_.rank() != 0) return {};
    std::vector<at::Tensor> rows;
    for (const auto& s : states) rows.push_back(s.cpu());
    return {{"", at::stack(rows)}};
  }
  void load_state_dict(const StateDict& saved, const std::string& source) override {
    const at::Tensor rows = saved.size() == 1 ? saved[0].second : at::Tensor();
    if (!rows.defined() || rows.dim() != 2)
      throw DataError(source + ": not a [ranks, bytes] tensor");
    if (rank_ >= rows.size(0)) {
      seed_rank_generator(config_, rank_);
      return;
    }
    try {
      generator_restore(rows[rank_]);
    } catch (const c10::Error& e) {
      throw DataError(source + ": row " + std::to_string(rank_) +
                      " is not a CPU generator state: " + what_of(e).substr(0, 200));
    }
  }

 private:
  const Config& config_;
  ProcessGroup& pg_;
  int rank_;
};

// comm_hook.pt: a stateful hook's state, every rank's (hook_state.h).
class CommHookPart : public Stateful {
 public:
  CommHookPart(RunParts& run, ProcessGroup& pg, const WorldInfo& world, const TrainerState& saved)
      : run_(run), pg_(pg), world_(world), saved_(saved) {}
  std::string file() const override { return "comm_hook.pt"; }
  bool required() const override { return false; }
  bool needs_ddp() const override { return true; }
  StateDict state_dict() override {
    if (!run_.comm_hook) return {};
    return hook_state_gather(pg_, *run_.comm_hook, *run_.ddp);
  }
  void load_state_dict(const StateDict& saved, const std::string& source) override {
    hook_state_restore(run_.comm_hook.get(), *run_.ddp, saved, world_.rank, world_.world_size,
                       saved_.world_size, source);
  }

 private:
  RunParts& run_;
  ProcessGroup& pg_;
  const WorldInfo& world_;
  const TrainerState& saved_;
};

}  // namespace

std::vector<std::unique_ptr<Stateful>> run_stateful_parts(RunParts& run, const Config& config,
                                                          ProcessGroup& pg, const WorldInfo& world,
                                                          const TrainerState& saved) {
  std::vector<std::unique_ptr<Stateful>> parts;
  parts.push_back(std::make_unique<ModelPart>(run, world.rank, world.world_size));
  parts.push_back(std::make_unique<OptimizerPart>(run, pg));
  parts.push_back(std::make_unique<RngPart>(config, pg, world.rank));
  parts.push_back(std::make_unique<CommHookPart>(run, pg, world, saved));
  return parts;
}

}  // namespace lockstep
