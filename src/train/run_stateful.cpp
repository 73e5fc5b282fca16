#include "run_stateful.h"

#include <ATen/ATen.h>

#include <map>

#include "hook_state.h"
#include "lockstep/optim/optim.h"
#include "lockstep/util/error.h"
#include "lockstep/util/module_tensors.h"

namespace lockstep {
namespace {

class ModelPart : public Stateful {
 public:
  ModelPart(RunParts& run, int rank) : run_(run), rank_(rank) {}
  std::string file() const override { return "model.pt"; }
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
  int rank_;
};

// Whole on rank 0 whatever the stage: a ZeroOptimizer gathers it from the
// owners (collective); a plain optimizer's is rank 0's own.
class OptimizerPart : public Stateful {
 public:
  OptimizerPart(RunParts& run, ProcessGroup& pg) : run_(run), pg_(pg) {}
  std::string file() const override { return "optimizer.pt"; }
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
  parts.push_back(std::make_unique<ModelPart>(run, world.rank));
  parts.push_back(std::make_unique<OptimizerPart>(run, pg));
  parts.push_back(std::make_unique<RngPart>(config, pg, world.rank));
  parts.push_back(std::make_unique<CommHookPart>(run, pg, world, saved));
  return parts;
}

}  // namespace lockstep
