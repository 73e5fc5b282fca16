#include "lockstep/util/trace.h"

#include <cstdio>
#include <fstream>

#include "lockstep/util/error.h"

namespace lockstep {
namespace {
std::string escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}
}  // namespace

Tracer::Tracer(int rank) : rank_(rank), origin_(Clock::now()) {}

void Tracer::complete(const std::string& name, const std::string& category, Clock::time_point start,
                      Clock::time_point end, int lane) {
  const double ts = std::chrono::duration<double, std::micro>(start - origin_).count();
  const double dur = std::chrono::duration<double, std::micro>(end - start).count();
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back({name, category, ts, dur, lane});
}

std::string Tracer::json() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  char line[512];
  std::snprintf(line, sizeof line,
                "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, "
                "\"args\": {\"name\": \"rank %d\"}},\n"
                "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, "
                "\"args\": {\"name\": \"training\"}},\n"
                "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 1, "
                "\"args\": {\"name\": \"communication\"}}",
                rank_, rank_, rank_, rank_);
  out += line;
  for (const auto& e : events_) {
    std::snprintf(line, sizeof line,
                  ",\n{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"ts\": %.3f, "
                  "\"dur\": %.3f, \"pid\": %d, \"tid\": %d}",
                  escaped(e.name).c_str(), escaped(e.category).c_str(), e.ts_us, e.dur_us, rank_,
                  e.lane);
    out += line;
  }
  out += "\n]}\n";
  return out;
}

void Tracer::write(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << json();
    if (!out) throw DataError("cannot write trace '" + tmp + "'");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    throw DataError("cannot rename '" + tmp + "' to '" + path + "'");
  }
}

}  // namespace lockstep
