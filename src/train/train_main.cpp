// `lockstep train --config FILE.yaml [--set section.key=value ...]`, as a
// library entry point (train_main.h).
#include "lockstep/train/train_main.h"
#include "lockstep/util/allocator.h"

#include <spdlog/spdlog.h>
#include <cxxopts.hpp>

#include <cstdio>

#include "lockstep/distributed/init.h"
#include "lockstep/train/config.h"
#include "lockstep/train/recipe.h"
#include "lockstep/train/trainer.h"
#include "lockstep/util/exit_codes.h"

namespace lockstep {

int train_main(int argc, char** argv) {
  return run_guarded("train", [&] {
    cxxopts::Options options("lockstep train", "A DDP training run from a YAML configuration.");
    // clang-format off
    options.add_options()
        ("config", "YAML configuration (sections: run, dist, model, data, train, optim, ddp, check, checkpoint, log); without it, the built-in defaults: an MLP on the embedded 8x8 digits", cxxopts::value<std::string>()->default_value(""))
        ("set", "override one field: section.key=value (repeatable; wins over the file)", cxxopts::value<std::vector<std::string>>())
        ("print-config", "print the resolved configuration and exit")
        ("config-reference", "print the configuration reference (markdown) and exit")
        ("h,help", "this help");
    // clang-format on
    const auto args = options.parse(argc, argv);
    if (args.count("help") != 0) {
      std::fputs(options.help().c_str(), stdout);
      return kExitOk;
    }
    if (args.count("config-reference") != 0) {
      std::fputs(config_reference_markdown().c_str(), stdout);
      return kExitOk;
    }
    std::vector<std::string> overrides;
    if (args.count("set") != 0) overrides = args["set"].as<std::vector<std::string>>();
    if (args.count("print-config") != 0) {
      const Config config = config_load(args["config"].as<std::string>(), overrides);
      std::fputs(config_to_yaml(config).c_str(), stdout);
      return kExitOk;
    }
    // A bad configuration fails here, before the rendezvous: at once, on
    // every rank alike, waiting for no peer (and leaving none waiting).
    const Config config = config_load_validated(args["config"].as<std::string>(), overrides);
    const std::string allocator = tune_allocator();  // Note [Allocator tuning]
    auto dist = init_distributed(init_options_from_config(config));
    spdlog::debug("{}", allocator);
    if (args["config"].as<std::string>().empty() && dist.world.rank == 0) {
      // What runs, as the config says: --set may have chosen anything.
      spdlog::info(
          "no --config: training {}: the built-in defaults{} (--print-config shows "
          "them all, configs/ holds examples)",
          config_summary(config),
          overrides.empty() ? "" : " with " + std::to_string(overrides.size()) + " --set");
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
