// Evaluation of a split (trainer and `lockstep eval`), and a checkpoint's
// evaluation without training.
#include "lockstep/train/evaluate.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <set>

#include "lockstep/checkpoint/checkpoint.h"
#include "lockstep/data/loader.h"
#include "lockstep/distributed/agree.h"
#include "lockstep/distributed/process_group.h"
#include "lockstep/distributed/world.h"
#include "lockstep/io/state_dict.h"
#include "lockstep/model/models.h"
#include "lockstep/train/precision.h"
#include "lockstep/util/error.h"
#include "lockstep/util/unit_call.h"

namespace lockstep {

EvalResult evaluate_split(Classifier& model, const Dataset& split, TaskKind task,
                          const MixedPrecision& precision, ProcessGroup& pg, const WorldInfo& world,
                          at::Device device, int64_t rows, int64_t max_batches) {
  const int64_t size = split.size();
  model.eval();
  at::NoGradGuard no_grad;
  std::vector<int64_t> mine;  // unpadded shard: exact global counts
  for (int64_t i = world.rank; i < size; i += world.world_size) mine.push_back(i);
  if (max_batches > 0 && static_cast<int64_t>(mine.size()) > max_batches * rows)
    mine.resize(static_cast<size_t>(max_batches * rows));
  double loss_sum = 0, correct = 0;
  // Under fully sharded parameters (optim.zero 3) a forward is collective
  // (each unit's weights are gathered): every rank runs as many forwards as
  // the rank with the most rows, the extra ones on its first rows (or the
  // split's first) and not counted.
  const bool collective = unit_wrapper(model) != nullptr;
  int64_t forwards = (static_cast<int64_t>(mine.size()) + rows - 1) / rows;
  if (collective) {
    const int64_t most = std::min<int64_t>(
        (size + world.world_size - 1) / world.world_size,
        max_batches > 0 ? max_batches * rows : std::numeric_limits<int64_t>::max());
    forwards = (most + rows - 1) / rows;
  }
  // The loader shares the split; it does not own it here.
  std::shared_ptr<const Dataset> shared(&split, [](const Dataset*) {});
  std::vector<int64_t> filler = mine.empty() ? std::vector<int64_t>{0} : mine;
  if (static_cast<int64_t>(filler.size()) > rows) filler.resize(static_cast<size_t>(rows));
  BatchLoader loader(shared, mine.empty() ? filler : mine, LoaderOptions{rows, false, false});
  for (int64_t b = 0; b < forwards; ++b) {
    const bool counted = b * rows < static_cast<int64_t>(mine.size());
    auto batch = counted ? loader.next() : BatchLoader(shared, filler, {rows, false, false}).next();
    if (!batch) throw InternalError("evaluation: the batches ran out at " + std::to_string(b));
    const auto x = batch->x.to(device), y = batch->y.to(device);
    at::Tensor out, loss;
    precision.run([&] {  // as the training forward
      out = call_unit(model, [&] { return model.forward(x); });
      loss = loss_for(task, out, y);
    });
    if (!counted) continue;
    loss_sum += loss.item<double>() * x.size(0);
    if (task == TaskKind::kClassification) correct += (out.argmax(1) == y).sum().item<double>();
    if (task == TaskKind::kLanguage)  // next-token accuracy, a share per window
      correct += (out.argmax(-1) == y).to(at::kDouble).mean(1).sum().item<double>();
  }
  const auto sums = sum_over_ranks(pg, {loss_sum, correct, static_cast<double>(mine.size())});
  const double count = std::max(1.0, sums[2]);
  model.train();
  return EvalResult{sums[0] / count, sums[1] / count, static_cast<int64_t>(sums[2])};
}

CheckpointEval evaluate_checkpoint(Config config, const std::string& folder, const WorldInfo& world,
                                   ProcessGroup& pg) {
  CheckpointEval out;
  // Every rank reads and checks the checkpoint; a bad one fails all alike.
  Checkpointer::Loaded loaded;
  agree_on_failure(pg, [&] { loaded = Checkpointer::load(folder, nullptr, {"model.pt"}); });
  out.step = loaded.state.step;
  TrainData data;  // a rank that cannot read it fails every rank alike (exit 2), no wait
  agree_on_failure(pg, [&] { data = data_from_config(config); });
  out.task = data.task;
  if (data.validation->size() == 0) {
    throw ConfigError("the validation split is empty (data.validation_fraction=" +
                      std::to_string(config.data.validation_fraction) +
                      " of data.path's examples): nothing to evaluate");
  }
  resolve_precision(config, device_from_config(config, world, pg.kind()), pg);
  out.precision = name_of(kPrecisionNames, config.train.precision);
  // The checkpoint holds every weight: model.init_from, the file the run
  // started from, is not read again (it may have moved since).
  config.model.init_from.clear();
  std::shared_ptr<Classifier> model;
  within_memory("the model (section model)", [&] { model = model_from_config(config, data); });
  const at::Device device = device_from_config(config, world, pg.kind());
  const StateDict& weights = loaded.part("model.pt");
  std::set<std::string> parameters;
  for (const auto& item : model->named_parameters()) parameters.insert(item.key());
  Checkpointer::check_model_values(weights, parameters, folder + "/model.pt");
  state_dict_load(*model, weights, folder + "/model.pt");
  model->to(device);
  MixedPrecision precision(config.train, device, &pg);
  const int64_t rows = eval_rows(config, data.task);
  out.result = evaluate_split(*model, *data.validation, data.task, precision, pg, world, device,
                              rows, config.train.eval_batches);
  return out;
}

}  // namespace lockstep
