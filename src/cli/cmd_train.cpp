// `lockstep train --config FILE.yaml [--set section.key=value ...]`, as a
// library entry point (train_main.h).
#include "lockstep/cli/train_main.h"
#include "lockstep/util/allocator.h"

#include <spdlog/spdlog.h>
#include <cxxopts.hpp>

#include <cstdio>

#include "command_line.h"
#include "lockstep/config/config.h"
#include "lockstep/distributed/init.h"
#include "lockstep/train/recipe.h"
#include "lockstep/train/trainer.h"
#include "lockstep/util/exit_codes.h"

namespace lockstep {

int train_main(int argc, char** argv) {
  return run_guarded("train", [&] {
    cxxopts::Options options("lockstep train", "A DDP training run from a YAML configuration.");
    add_config_options(options,
                       "YAML configuration (sections: run, dist, model, data, train, optim, ddp, "
                       "check, checkpoint, log); without it, the built-in defaults: an MLP on "
                       "the embedded 8x8 digits",
                       "override one field: section.key=value (repeatable; wins over the file)");
    // clang-format off
    options.add_options()
        ("print-config", "print the resolved configuration and exit")
        ("config-reference", "print the configuration reference (markdown) and exit");
    // clang-format on
    const auto parsed = parse_command_line(options, argc, argv);
    if (!parsed) return kExitOk;
    const cxxopts::ParseResult& args = *parsed;
    if (args.count("config-reference") != 0) {
      std::fputs(config_reference_markdown().c_str(), stdout);
      return kExitOk;
    }
    const std::string path = args["config"].as<std::string>();
    if (args.count("print-config") != 0) {
      std::fputs(config_to_yaml(config_load(path, config_overrides(args))).c_str(), stdout);
      return kExitOk;
    }
    // A bad configuration fails here, before the rendezvous: at once, on
    // every rank alike, waiting for no peer (and leaving none waiting).
    const Config config = config_from_args(args, path);
    const std::string allocator = tune_allocator();  // Note [Allocator tuning]
    auto dist = init_distributed(init_options_from_config(config));
    spdlog::debug("{}", allocator);
    if (path.empty() && dist.world.rank == 0) {
      // What runs, as the config says: --set may have chosen anything.
      spdlog::info(
          "no --config: training {}: the built-in defaults{} (--print-config shows "
          "them all, configs/ holds examples)",
          config_summary(config),
          config_overrides(args).empty()
              ? ""
              : " with " + std::to_string(config_overrides(args).size()) + " --set");
    }
    Trainer trainer(config, dist.world, dist.pg);
    const auto result = trainer.run();
    if (dist.world.rank == 0) {
      char validation[96] = "no validation (empty split)";
      if (result.val_examples > 0)
        std::snprintf(validation, sizeof(validation), "validation accuracy %.4f, loss %.5f",
                      result.val_accuracy, result.val_loss);
      std::printf("trained %lld steps: %s; weights %s; run %s\n",
                  static_cast<long long>(result.steps), validation, result.fingerprint.c_str(),
                  result.run_dir.c_str());
      if (!result.stopped_early.empty()) std::printf("%s\n", result.stopped_early.c_str());
      if (!result.best_checkpoint.empty())
        std::printf("best checkpoint: %s\n", result.best_checkpoint.c_str());
    }
    dist.shutdown();
    return kExitOk;
  });
}

}  // namespace lockstep
