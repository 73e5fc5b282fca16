#include "lockstep/util/progress.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <set>

namespace lockstep {

// Note [Progress line]
// ~~~~~~~~~~~~~~~~~~~~
// Under lockstep-run the workers' stdout and stderr are pipes, so no worker
// owns the terminal: rank 0 cannot draw a bar, and ranks drawing their own
// would garble each other. So the launcher owns the terminal. When its
// stdout is a TTY it hands rank 0 the write end of a pipe (LOCKSTEP_PROGRESS_FD)
// and rank 0 writes one record per optimizer step, non-blocking (a full pipe
// drops the record, never stalls training); the launcher draws one live line
// from them at the bottom, and prints every relayed log line above it (clear
// the line, the log line, the line again), stderr through the same writer
// when it is the same terminal, so the two never interleave. Not parsed
// from logs: a record is a line of its own format on a channel of its own.
// Without a TTY nothing changes: plain lines every log.every. Under
// torchrun or srun rank 0 draws the same line itself when its stdout is a
// TTY. Rate and ETA are measured over the last records' window.

namespace {
constexpr size_t kMaxRecordLine = 256;
constexpr double kMaxCount = 9007199254740992.0;  // 2^53
constexpr double kWindowS = 10.0;

bool parse_int(std::string_view text, int64_t& out, int64_t lo) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), out);
  return error == std::errc() && end == text.data() + text.size() && out >= lo &&
         static_cast<double>(out) <= kMaxCount;
}

bool parse_double(std::string_view text, double& out) {
  // from_chars for double is missing from GCC 10's library: strtod on a copy.
  if (text.empty() || text.size() > 40) return false;
  const std::string copy(text);
  char* end = nullptr;
  out = std::strtod(copy.c_str(), &end);
  return end == copy.c_str() + copy.size() && std::isfinite(out) && std::fabs(out) <= kMaxCount;
}

std::string rate_text(double per_s) {
  char text[32];
  if (per_s >= 1e6)
    std::snprintf(text, sizeof text, "%.2fM", per_s / 1e6);
  else if (per_s >= 1e4)
    std::snprintf(text, sizeof text, "%.1fk", per_s / 1e3);
  else
    std::snprintf(text, sizeof text, "%.0f", per_s);
  return text;
}
}  // namespace

std::string progress_record_line(const ProgressRecord& r) {
  char line[kMaxRecordLine];
  std::snprintf(line, sizeof line,
                "progress step=%lld total=%lld epoch=%lld loss=%.6g units=%.0f unit=%s\n",
                static_cast<long long>(r.step), static_cast<long long>(r.total),
                static_cast<long long>(r.epoch), r.loss, r.units, r.tokens ? "tokens" : "samples");
  return line;
}

std::optional<ProgressRecord> parse_progress_record(std::string_view line) {
  constexpr std::string_view kHead = "progress ";
  if (line.size() > kMaxRecordLine || line.substr(0, kHead.size()) != kHead) return std::nullopt;
  line.remove_prefix(kHead.size());
  ProgressRecord r;
  std::set<std::string_view> seen;
  while (!line.empty()) {
    const size_t space = line.find(' ');
    const std::string_view item = line.substr(0, space);
    line = space == std::string_view::npos ? std::string_view() : line.substr(space + 1);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) return std::nullopt;
    const std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
    if (!seen.insert(key).second) return std::nullopt;
    bool ok = false;
    if (key == "step") ok = parse_int(value, r.step, 0);
    if (key == "total") ok = parse_int(value, r.total, 0);
    if (key == "epoch") ok = parse_int(value, r.epoch, 1);
    if (key == "loss") ok = parse_double(value, r.loss);
    if (key == "units") ok = parse_double(value, r.units) && r.units >= 0;
    if (key == "unit") {
      ok = value == "tokens" || value == "samples";
      r.tokens = value == "tokens";
    }
    if (!ok) return std::nullopt;
  }
  if (seen.size() != 6 || r.step > r.total) return std::nullopt;
  return r;
}

std::string duration_text(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<long long>(seconds + 0.5);
  char text[32];
  if (s >= 3600)
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(text, sizeof text, "%lld:%02lld", s / 60, s % 60);
  return text;
}

void ProgressView::update(const ProgressRecord& record, double now_s) {
  if (start_s_ < 0) start_s_ = now_s;
  // A step count that goes back (a restarted attempt) starts a new window.
  if (last_ && record.step < last_->step) window_.clear();
  last_ = record;
  window_.push_back({now_s, record.step, record.units});
  while (window_.size() > 2 && now_s - window_[1].t >= kWindowS) window_.pop_front();
}

std::string ProgressView::render(int columns, double now_s) const {
  if (!last_) return "";
  const ProgressRecord& r = *last_;
  const double share = r.total > 0 ? static_cast<double>(r.step) / static_cast<double>(r.total) : 0;
  // Most telling first: a narrow terminal loses the tail (epoch, rate).
  std::string line = "step " + std::to_string(r.step) + "/" + std::to_string(r.total) + " " +
                     std::to_string(static_cast<int>(share * 100)) + "%";
  const Point& first = window_.front();
  const Point& last = window_.back();
  const double dt = last.t - first.t;
  std::string eta = "ETA ?", rate;
  if (dt > 0 && last.step > first.step) {
    rate = rate_text((last.units - first.units) / dt) + (r.tokens ? " tokens/s" : " samples/s");
    const double per_step = dt / static_cast<double>(last.step - first.step);
    eta = "ETA " + duration_text(per_step * static_cast<double>(r.total - r.step));
  }
  if (r.step >= r.total) eta = "done";
  line += " | " + eta + " | " + duration_text(now_s - start_s_) + " elapsed";
  char part[64];
  if (r.loss >= 0) {
    std::snprintf(part, sizeof part, " | loss %.4f", r.loss);
    line += part;
  }
  if (!rate.empty()) line += " | " + rate;
  line += " | epoch " + std::to_string(r.epoch);
  const size_t limit = static_cast<size_t>(std::max(columns - 1, 10));
  // A bar in front where the terminal has room for it and the figures.
  const int bar =
      static_cast<int>(std::min<size_t>(20, limit > line.size() + 3 ? limit - line.size() - 3 : 0));
  if (bar >= 8) {
    const int filled = std::min(bar, static_cast<int>(share * bar));
    line = "[" + std::string(static_cast<size_t>(filled), '#') +
           std::string(static_cast<size_t>(bar - filled), '.') + "] " + line;
  }
  if (line.size() > limit) line.resize(limit);
  return line;
}

}  // namespace lockstep
