// The command-line pieces every `lockstep` command shares (command_line.h).
#include "command_line.h"

#include <cstdio>

#include "lockstep/util/error.h"

namespace lockstep {

std::optional<cxxopts::ParseResult> parse_command_line(cxxopts::Options& options, int argc,
                                                       char** argv) {
  options.add_options()("h,help", "this help");
  auto args = options.parse(argc, argv);
  if (args.count("help") != 0) {
    std::fputs(options.help().c_str(), stdout);
    return std::nullopt;
  }
  // cxxopts keeps a word it cannot place aside; a command that went on
  // would run without it (`lockstep train run.yaml` would train the
  // built-in defaults).
  if (!args.unmatched().empty()) {
    const bool takes_config = options.help().find("--config") != std::string::npos;
    throw ConfigError(
        "unexpected argument '" + args.unmatched().front() + "' (options are --name value" +
        (takes_config ? "; a configuration is --config FILE" : "") + "; --help lists them)");
  }
  return args;
}

void add_config_options(cxxopts::Options& options, const std::string& config_help,
                        const std::string& set_help, const std::string& config_default) {
  options.add_options()("config", config_help,
                        cxxopts::value<std::string>()->default_value(config_default))(
      "set", set_help, cxxopts::value<std::vector<std::string>>());
}

std::vector<std::string> config_overrides(const cxxopts::ParseResult& args) {
  if (args.count("set") == 0) return {};
  return args["set"].as<std::vector<std::string>>();
}

Config config_from_args(const cxxopts::ParseResult& args, const std::string& path) {
  return config_load_validated(path, config_overrides(args));
}

}  // namespace lockstep
