// `lockstep check`: consistency checks. --comm runs the communication
// self-check (lockstep/check/comm_check.h) on every rank of the job.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <sstream>

#include "common.h"
#include "lockstep/check/comm_check.h"
#include "lockstep/config/config.h"
#include "lockstep/train/check_run.h"
#include "lockstep/train/recipe.h"
#include "lockstep/util/error.h"

namespace lockstep::cli {
namespace {

std::vector<int64_t> parse_sizes(const std::string& text) {
  std::vector<int64_t> sizes;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    char* end = nullptr;
    const long long value = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || value < 1) {
      throw ConfigError("--sizes: '" + item + "' is not a positive element count (in '" + text +
                        "')");
    }
    sizes.push_back(value);
  }
  if (sizes.empty()) throw ConfigError("--sizes is empty");
  return sizes;
}

int check_config_mode(const cxxopts::ParseResult& args) {
  // As lockstep train validates it: a run train refuses is not checked.
  const Config config = config_from_args(args, args["config"].as<std::string>());
  CheckRunOptions options;
  options.steps = args["steps"].as<int64_t>();
  options.fault = parse_named(kCheckFaultNames, args["inject"].as<std::string>(), "--inject");
  auto dist = init_distributed(init_options_from_config(config));
  options.fault_rank = args["fault-rank"].as<int>();
  const auto result = check_run(config, dist.world, dist.pg, options);
  if (dist.world.rank == 0) {
    std::fputs(result.summary.c_str(), stdout);
    std::fflush(stdout);
  }
  if (result.passed) return kExitOk;
  spdlog::error("consistency check FAILED (see the summary on rank 0)");
  return kExitCheckFailed;
}

}  // namespace

int cmd_check(int argc, char** argv) {
  return run_guarded("check", [&] {
    cxxopts::Options options("lockstep check", "Consistency checks across the ranks of a job.");
    options.add_options()("comm",
                          "communication self-check: every collective, op and dtype against its "
                          "closed-form answer");
    add_config_options(options,
                       "consistency-check mode: self-check, K DDP steps of this config with "
                       "per-step digests, a negative control",
                       "with --config: override section.key=value (repeatable)");
    // clang-format off
    options.add_options()
        ("steps", "with --config: training steps to check", cxxopts::value<int64_t>()->default_value(std::to_string(CheckRunOptions{}.steps)))
        ("inject", "with --config: fault to inject: none | lr | init | no-buffer-broadcast | grad-flip | act-flip", cxxopts::value<std::string>()->default_value("none"))
        ("fault-rank", "with --config: the rank that misbehaves (-1: the last)", cxxopts::value<int>()->default_value("-1"))
        ("sizes", "element counts per case, comma-separated", cxxopts::value<std::string>()->default_value("1,1001,1048576"))
        ("device", "--comm: where the tensors live: auto (the backend's: cuda for nccl) | cpu | cuda (GPU LOCAL_RANK; gloo reduces CUDA tensors too)", cxxopts::value<std::string>()->default_value("auto"))
        ("corrupt-rank", "fault injection: this rank contributes wrong values (shows the check failing)", cxxopts::value<int>()->default_value("-1"));
    // clang-format on
    add_dist_options(options);
    const auto parsed = parse_command_line(options, argc, argv);
    if (!parsed) return kExitOk;
    const cxxopts::ParseResult& args = *parsed;
    if (args.count("config") != 0) return check_config_mode(args);
    if (args.count("comm") == 0)
      throw ConfigError("nothing to check: pass --comm or --config FILE");

    CommCheckOptions check;
    check.sizes = parse_sizes(args["sizes"].as<std::string>());
    check.corrupt_rank = args["corrupt-rank"].as<int>();
    Config where;  // the device rule of train.device, for the check's tensors
    where.train.device =
        parse_named(kDeviceKindNames, args["device"].as<std::string>(), "--device");
    auto dist = dist_setup(args);
    if (where.train.device != DeviceKind::kAuto)
      check.device = device_from_config(where, dist.world, dist.pg->kind(), "--device");
    const auto report = comm_check_run(*dist.pg, check);
    if (dist.world.rank == 0) {
      std::fputs(report.table().c_str(), stdout);
      std::fflush(stdout);
    }
    if (report.passed()) {
      spdlog::info("comm check passed: {} cases on {} ranks", report.cases.size(),
                   report.world_size);
      return kExitOk;
    }
    spdlog::error("comm check FAILED (see the table on rank 0)");
    return kExitCheckFailed;
  });
}

}  // namespace lockstep::cli
