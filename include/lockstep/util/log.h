// Rank-tagged logging on top of spdlog. Every line carries "[rank N]" so the
// interleaved output of several ranks can be told apart (and grepped).
#pragma once

#include <spdlog/spdlog.h>

#include <string>

#include "lockstep/util/names.h"

namespace lockstep {

// spdlog's levels by name: the one list (--log-level, LOCKSTEP_LOG_LEVEL,
// log.level).
inline constexpr NameTable<spdlog::level::level_enum, 7> kLogLevelNames{
    {{spdlog::level::trace, "trace"},
     {spdlog::level::debug, "debug"},
     {spdlog::level::info, "info"},
     {spdlog::level::warn, "warn"},
     {spdlog::level::err, "error"},
     {spdlog::level::critical, "critical"},
     {spdlog::level::off, "off"}}};

// Sets the rank tag and the level of the default logger. The level comes from
// `level` when non-empty, otherwise from LOCKSTEP_LOG_LEVEL, otherwise "info".
// Throws ConfigError on an unknown level name, listing the valid ones.
void log_init(int rank, const std::string& level = "");

// Parses "trace|debug|info|warn|error|critical|off"; throws ConfigError
// naming `where` (e.g. "--log-level") otherwise.
spdlog::level::level_enum log_parse_level(const std::string& name, const std::string& where);

}  // namespace lockstep

namespace lockstep {
// Also writes the default logger's lines to `path` (appending).
void log_to_file(const std::string& path);
// The console's log lines start by clearing the terminal's current line
// (rank 0's own live progress line, Note [Progress line]).
void log_clear_line_first();

}  // namespace lockstep
