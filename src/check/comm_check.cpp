#include "lockstep/check/comm_check.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <functional>

namespace lockstep {
namespace {

using Clock = std::chrono::steady_clock;

struct DtypeCase {
  const char* name;
  at::ScalarType type;
};
const DtypeCase kDtypes[] = {
    {"float32", at::kFloat}, {"float64", at::kDouble}, {"int64", at::kLong}};

// Every formula below is evaluated on int64 indices and cast: all values are
// small integers, exact in float32, float64 and int64 alike.
using Formula = std::function<at::Tensor(const at::Tensor& i)>;

struct ReduceCase {
  ReduceKind op;
  // What rank r of n contributes at index i, and the closed-form answer.
  std::function<at::Tensor(const at::Tensor& i, int64_t r)> contribution;
  std::function<at::Tensor(const at::Tensor& i, int64_t n)> expected;
  int64_t corruption;  // added by a corrupt rank: pushes its value outside the others
};

int64_t factorial(int64_t n) {
  return n <= 1 ? 1 : n * factorial(n - 1);
}

std::vector<ReduceCase> reduce_cases() {
  return {
      {ReduceKind::kSum, [](const at::Tensor& i, int64_t r) { return (r + 1) * 100 + i % 7; },
       [](const at::Tensor& i, int64_t n) { return 100 * n * (n + 1) / 2 + n * (i % 7); }, 1000},
      // The sum n(n-1) + n*(i%5) is a multiple of n: the average is exact.
      {ReduceKind::kAvg, [](const at::Tensor& i, int64_t r) { return 2 * r + i % 5; },
       [](const at::Tensor& i, int64_t n) { return (n - 1) + i % 5; }, 1000},
      {ReduceKind::kMin, [](const at::Tensor& i, int64_t r) { return r + 1 + i % 3; },
       [](const at::Tensor& i, int64_t) { return 1 + i % 3; }, -1000},
      {ReduceKind::kMax, [](const at::Tensor& i, int64_t r) { return r + 1 + i % 3; },
       [](const at::Tensor& i, int64_t n) { return n + i % 3; }, 1000},
      // prod over r of (r + 1 + k) = (n + k)! / k!, with k = i % 2.
      {ReduceKind::kProduct, [](const at::Tensor& i, int64_t r) { return r + 1 + i % 2; },
       [](const at::Tensor& i, int64_t n) {
         return at::where(i % 2 == 0, at::full_like(i, factorial(n)),
                          at::full_like(i, factorial(n + 1)));
       },
       1000},
  };
}

bool check_equal(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  if (at::equal(got, want)) return true;
  const auto differs = (got != want).flatten().nonzero();
  const int64_t index = differs.numel() > 0 ? differs[0].item<int64_t>() : -1;
  spdlog::error("comm check: {}: element {} is {} but {} was expected", what, index,
                got.flatten()[index].item<double>(), want.flatten()[index].item<double>());
  return false;
}

class Runner {
 public:
  Runner(ProcessGroup& pg, const CommCheckOptions& options) : pg_(pg), options_(options) {}

  void run() {
    const bool corrupt = pg_.rank() == options_.corrupt_rank;
    const auto device = options_.device.value_or(pg_.device());
    for (const auto& rc : reduce_cases()) {
      for (const auto& dt : kDtypes) {
        for (int64_t numel : options_.sizes) {
          const auto i = at::arange(numel, at::TensorOptions(at::kLong).device(device));
          auto mine = rc.contribution(i, pg_.rank()) + (corrupt ? rc.corruption : 0);
          auto tensor = mine.to(dt.type);
          const std::string op = std::string("allreduce ") + reduce_kind_name(rc.op);
          time_case(
              op, dt.name, numel, [&] { pg_.allreduce(tensor, rc.op); },
              [&] {
                return check_equal(tensor, rc.expected(i, pg_.size()).to(dt.type),
                                   op + " " + dt.name + " n=" + std::to_string(numel));
              });
        }
      }
    }
    std::vector<int> roots{0};
    if (pg_.size() > 1) roots.push_back(pg_.size() - 1);
    for (int root : roots) {
      for (int64_t numel : options_.sizes) {
        const auto i = at::arange(numel, at::TensorOptions(at::kLong).device(device));
        const auto want = ((root + 1) * 1000 + i % 11).to(at::kFloat);
        auto tensor = pg_.rank() == root ? (want + (corrupt ? 1 : 0)) : at::full_like(want, -1);
        const std::string op = "broadcast root " + std::to_string(root);
        time_case(
            op, "float32", numel, [&] { pg_.broadcast(tensor, root); },
            [&] { return check_equal(tensor, want, op + " n=" + std::to_string(numel)); });
      }
    }
    for (int64_t numel : options_.sizes) {
      const auto i = at::arange(numel, at::TensorOptions(at::kLong).device(device));
      auto slot = [&](int64_t r) { return r * 1000 + i % 13; };
      const auto mine = slot(pg_.rank()) + (corrupt ? 1 : 0);
      std::vector<at::Tensor> gathered;
      time_case(
          "allgather", "int64", numel, [&] { gathered = pg_.allgather(mine); },
          [&] {
            bool ok = true;
            for (int r = 0; r < pg_.size(); ++r) {
              ok = check_equal(
                       gathered[r], slot(r),
                       "allgather slot " + std::to_string(r) + " n=" + std::to_string(numel)) &&
                   ok;
            }
            return ok;
          });
    }
    time_case(
        "barrier", "-", 0, [&] { pg_.barrier(); }, [] { return true; });
  }

  CommCheckReport agree() {
    // Every rank learns every rank's verdict and the slowest time per case.
    const auto count = static_cast<int64_t>(cases_.size());
    auto failed = at::tensor(failed_, at::kLong).to(pg_.device());
    auto times = at::tensor(times_ms_, at::kDouble).to(pg_.device());
    const auto all_failed = pg_.allgather(failed);
    pg_.allreduce(times, ReduceKind::kMax);
    times = times.cpu();
    CommCheckReport report;
    report.world_size = pg_.size();
    report.backend = backend_kind_name(pg_.kind());
    report.device = options_.device.value_or(pg_.device()).str();
    for (int64_t c = 0; c < count; ++c) {
      cases_[c].max_ms = times[c].item<double>();
      for (int r = 0; r < pg_.size(); ++r) {
        if (all_failed[r].cpu()[c].item<int64_t>() != 0) cases_[c].failed_ranks.push_back(r);
      }
    }
    report.cases = std::move(cases_);
    return report;
  }

 private:
  void time_case(const std::string& op, const std::string& dtype, int64_t numel,
                 const std::function<void()>& collective, const std::function<bool()>& verify) {
    const auto start = Clock::now();
    collective();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    const bool ok = verify();
    spdlog::debug("comm check: {} {} n={}: {} in {:.3f} ms", op, dtype, numel, ok ? "ok" : "FAIL",
                  ms);
    cases_.push_back({op, dtype, numel, 0, {}});
    failed_.push_back(ok ? 0 : 1);
    times_ms_.push_back(ms);
  }

  ProcessGroup& pg_;
  const CommCheckOptions& options_;
  std::vector<CommCheckCase> cases_;
  std::vector<int64_t> failed_;
  std::vector<double> times_ms_;
};

}  // namespace

bool CommCheckReport::passed() const {
  for (const auto& c : cases) {
    if (!c.failed_ranks.empty()) return false;
  }
  return !cases.empty();
}

std::string CommCheckReport::table() const {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-20s %-8s %10s %11s  %s\n", "case", "dtype", "elements",
                "max ms", "result");
  out += line;
  int failed = 0;
  for (const auto& c : cases) {
    std::string result = "ok";
    if (!c.failed_ranks.empty()) {
      ++failed;
      result = "FAIL on rank";
      for (size_t k = 0; k < c.failed_ranks.size(); ++k) {
        result += (k == 0 ? " " : ", ") + std::to_string(c.failed_ranks[k]);
      }
    }
    std::snprintf(line, sizeof line, "%-20s %-8s %10lld %11.3f  %s\n", c.op.c_str(),
                  c.dtype.c_str(), static_cast<long long>(c.numel), c.max_ms, result.c_str());
    out += line;
  }
  const std::string on = device == "cpu" ? "" : ", tensors on " + device;
  std::snprintf(line, sizeof line, "comm check (%s, %d ranks%s): %d passed, %d failed\n",
                backend.c_str(), world_size, on.c_str(), static_cast<int>(cases.size()) - failed,
                failed);
  out += line;
  return out;
}

CommCheckReport comm_check_run(ProcessGroup& pg, const CommCheckOptions& options) {
  Runner runner(pg, options);
  runner.run();
  return runner.agree();
}

}  // namespace lockstep
