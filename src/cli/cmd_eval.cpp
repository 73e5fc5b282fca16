// `lockstep eval --checkpoint DIR [--config FILE] [--set section.key=value]`:
// a checkpoint's validation loss, accuracy and perplexity on any number of
// ranks, without training; one JSON object on stdout (rank 0).
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdio>

#include "common.h"
#include "lockstep/cli/generate.h"
#include "lockstep/train/evaluate.h"
#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"
#include "lockstep/util/utf8.h"

namespace lockstep::cli {
namespace {

std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";  // JSON has no NaN/inf: a diverged model
  char text[40];
  std::snprintf(text, sizeof text, "%.9g", value);
  return text;
}

}  // namespace

int cmd_eval(int argc, char** argv) {
  return run_guarded("eval", [&] {
    cxxopts::Options options(
        "lockstep eval",
        "Evaluates a checkpoint on the validation split (any number of ranks, no training); "
        "prints one JSON object on stdout.");
    // clang-format off
    options.add_options()
        ("checkpoint", "a checkpoint folder, or a run folder (its newest checkpoint)", cxxopts::value<std::string>())
        ("output", "also write the JSON to this file (rank 0; under a launcher, whose stdout tags each line)", cxxopts::value<std::string>()->default_value(""));
    // clang-format on
    add_config_options(options,
                       "the run's configuration (default: the checkpoint's own config.yaml); its "
                       "model must be the checkpoint's",
                       "override one field: section.key=value (repeatable; e.g. data.path, "
                       "train.eval_batches, train.precision)");
    const auto parsed = parse_command_line(options, argc, argv);
    if (!parsed) return kExitOk;
    const cxxopts::ParseResult& args = *parsed;
    if (args.count("checkpoint") == 0) throw ConfigError("--checkpoint PATH is required");
    const std::string folder = checkpoint_folder(args["checkpoint"].as<std::string>());
    const std::string given = args["config"].as<std::string>();
    const Config config = config_from_args(args, given.empty() ? folder + "/config.yaml" : given);
    auto dist = init_distributed(init_options_from_config(config));
    const CheckpointEval eval = evaluate_checkpoint(config, folder, dist.world, *dist.pg);
    if (dist.world.rank == 0) {
      const EvalResult& r = eval.result;
      std::string json =
          "{\"checkpoint\": " + json_quoted(folder) + ", \"step\": " + std::to_string(eval.step) +
          ", \"split\": \"validation\", \"examples\": " + std::to_string(r.examples) +
          ", \"loss\": " + json_number(r.loss);
      if (eval.task != TaskKind::kRegression) json += ", \"accuracy\": " + json_number(r.accuracy);
      if (eval.task == TaskKind::kLanguage)
        json += ", \"perplexity\": " + json_number(std::exp(r.loss));
      json += ", \"ranks\": " + std::to_string(dist.world.world_size) +
              ", \"precision\": " + json_quoted(eval.precision) + "}\n";
      // The file first: a failed --output prints nothing and exits 2.
      if (const std::string output = args["output"].as<std::string>(); !output.empty())
        write_file(output, json);
      std::fputs(json.c_str(), stdout);
      std::fflush(stdout);
      spdlog::info("evaluated {} at step {} on {} rank(s): {} examples", folder, eval.step,
                   dist.world.world_size, r.examples);
    }
    dist.shutdown();
    return kExitOk;
  });
}

}  // namespace lockstep::cli
