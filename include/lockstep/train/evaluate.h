// Evaluation of a split, shared by the trainer (train.eval_every, the end of
// a run) and `lockstep eval` (a checkpoint, no training): each rank takes
// positions rank, rank + W, ... of the split, unpadded, and the sums are
// all-reduced, so the figures are the whole split's on any number of ranks.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>

#include "lockstep/config/config.h"
#include "lockstep/train/recipe.h"

namespace lockstep {

class Classifier;
class MixedPrecision;
class ProcessGroup;
struct WorldInfo;

struct EvalResult {
  double loss = 0;      // mean per example (per window for a language model)
  double accuracy = 0;  // classification: share right; language: next-token accuracy
  int64_t examples = 0;
};

// Examples per evaluation forward: the training batch for a language model
// (its windows are large), 256 rows otherwise.
inline int64_t eval_rows(const Config& config, TaskKind task) {
  return task == TaskKind::kLanguage ? config.data.batch_size : 256;
}

// Collective. `rows`: examples per forward (eval_rows); `max_batches` > 0 bounds each
// rank's share to that many batches (train.eval_batches). The model is put
// in eval mode and back in train mode.
EvalResult evaluate_split(Classifier& model, const Dataset& split, TaskKind task,
                          const MixedPrecision& precision, ProcessGroup& pg, const WorldInfo& world,
                          at::Device device, int64_t rows, int64_t max_batches);

// `lockstep eval`: the checkpoint `folder`'s model.pt in the model `config`
// describes (its data too), evaluated on the validation split. Collective;
// throws ConfigError/DataError naming what is wrong (an empty split, a
// model.pt that does not fit the config's model).
struct CheckpointEval {
  EvalResult result;
  int64_t step = 0;  // the checkpoint's, from its state.yaml
  TaskKind task = TaskKind::kClassification;
  std::string precision;  // what ran (train.precision resolved)
};
CheckpointEval evaluate_checkpoint(Config config, const std::string& folder, const WorldInfo& world,
                                   ProcessGroup& pg);

}  // namespace lockstep
