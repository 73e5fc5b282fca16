#include "lockstep/util/log.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <cstdlib>

#include "lockstep/util/error.h"

namespace lockstep {

namespace {
std::string g_console_pattern = "[%Y-%m-%d %H:%M:%S.%e] [%l] %v";  // the stderr sink's
}  // namespace

void log_clear_line_first() {
  // Note [Progress line]: rank 0's own live line sits on the terminal
  // without a newline; each message first clears it (the next redraw puts
  // it back below). The console sink only: a log file gets no escapes.
  auto logger = spdlog::default_logger();
  if (!logger || logger->sinks().empty()) return;
  logger->sinks().front()->set_pattern("\r\033[K" + g_console_pattern);
}

spdlog::level::level_enum log_parse_level(const std::string& name, const std::string& where) {
  if (const auto level = value_named(kLogLevelNames, name)) return *level;
  throw ConfigError(where + ": unknown log level '" + name +
                    "' (valid: " + names_listed(kLogLevelNames) + ")");
}

void log_init(int rank, const std::string& level) {
  std::string name = level;
  std::string where = "--log-level";
  if (name.empty()) {
    const char* env = std::getenv("LOCKSTEP_LOG_LEVEL");
    name = env != nullptr && *env != '\0' ? env : "info";
    where = "LOCKSTEP_LOG_LEVEL";
  }
  const auto parsed = log_parse_level(name, where);
  // Logs go to stderr so that stdout stays for results (tables, JSON).
  spdlog::drop("lockstep");
  auto logger = spdlog::stderr_logger_mt("lockstep");
  // Under lockstep-run every line already starts with "[rankN]: ".
  const char* tagged = std::getenv("LOCKSTEP_LINES_TAGGED");
  const bool launcher_tags = tagged != nullptr && std::string(tagged) == "1";
  logger->set_pattern(launcher_tags
                          ? "[%Y-%m-%d %H:%M:%S.%e] [%l] %v"
                          : "[%Y-%m-%d %H:%M:%S.%e] [rank " + std::to_string(rank) + "] [%l] %v");
  g_console_pattern = launcher_tags
                          ? "[%Y-%m-%d %H:%M:%S.%e] [%l] %v"
                          : "[%Y-%m-%d %H:%M:%S.%e] [rank " + std::to_string(rank) + "] [%l] %v";
  logger->set_level(parsed);
  spdlog::set_default_logger(logger);
}

}  // namespace lockstep

#include <spdlog/sinks/basic_file_sink.h>

namespace lockstep {

void log_to_file(const std::string& path) {
  auto logger = spdlog::default_logger();
  auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/false);
  sink->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
  logger->sinks().push_back(sink);
}

}  // namespace lockstep
