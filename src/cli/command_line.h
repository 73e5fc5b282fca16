// What every `lockstep` command shares on its command line, in one place:
// -h/--help, and for the commands that take a configuration (train, check
// --config, eval) --config and --set with the one loading path. A private
// header of the library (cxxopts is not exported): train_main and src/cli
// include it.
#pragma once

#include <cxxopts.hpp>

#include <optional>
#include <string>
#include <vector>

#include "lockstep/config/config.h"

namespace lockstep {

// Adds -h/--help and parses argv. On --help prints the options to stdout
// and returns nothing: the command then exits 0. A word that is no option
// and no declared positional is a ConfigError (exit 2), never ignored.
std::optional<cxxopts::ParseResult> parse_command_line(cxxopts::Options& options, int argc,
                                                       char** argv);

// --config FILE (default `config_default`) and --set section.key=value
// (repeatable, applied after the file and its includes), with the
// command's own wording of what they mean.
void add_config_options(cxxopts::Options& options, const std::string& config_help,
                        const std::string& set_help, const std::string& config_default = "");

// The --set values, in order.
std::vector<std::string> config_overrides(const cxxopts::ParseResult& args);

// The one loading path: `path` with its includes, the --set overrides, then
// config_validate's cross-field rules. Every command calls it before the
// rendezvous, so a bad configuration fails at once on every rank alike,
// with exit 2, waiting for no peer and leaving none waiting.
Config config_from_args(const cxxopts::ParseResult& args, const std::string& path);

}  // namespace lockstep
