// `lockstep bench allreduce`: nccl-tests-style all-reduce figures for the
// backend's all-reduce and for the ring all-reduce built from send/recv
// (distributed/ring_allreduce.h), with a correctness check of every size.
//   algbw = bytes / time; busbw = algbw * 2(n-1)/n (nccl-tests' definition:
//   what each rank's link carries in a bandwidth-optimal ring).
#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>

#include "common.h"
#include "lockstep/distributed/ring_allreduce.h"
#include "lockstep/util/error.h"

namespace lockstep::cli {
namespace {

using Clock = std::chrono::steady_clock;

at::ScalarType dtype_parse(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "float64") return at::kDouble;
  if (name == "float16") return at::kHalf;
  if (name == "int32") return at::kInt;
  if (name == "int64") return at::kLong;
  throw ConfigError("--dtype: unknown '" + name +
                    "' (valid: float32, float64, float16, int32, int64)");
}

// Median-free and simple: the mean over `iters` after `warmup`, slowest rank.
template <typename F>
double time_us(ProcessGroup& pg, int warmup, int iters, F&& op) {
  for (int i = 0; i < warmup; ++i) op();
  pg.barrier();
  const auto start = Clock::now();
  for (int i = 0; i < iters; ++i) op();
  double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count() / iters;
  auto t = at::tensor({us}, at::kDouble);
  pg.allreduce(t, ReduceKind::kMax);
  return t.item<double>();
}

// Bytes copied per second by one large tensor copy (read + write counted once,
// as nccl-tests' figures count the buffer once).
double memcpy_gbps(int64_t bytes) {
  auto a = at::ones({bytes / 4}, at::kFloat);
  auto b = at::empty_like(a);
  b.copy_(a);
  const auto start = Clock::now();
  const int reps = 5;
  for (int i = 0; i < reps; ++i) b.copy_(a);
  const double s = std::chrono::duration<double>(Clock::now() - start).count() / reps;
  return static_cast<double>(bytes) / s / 1e9;
}

}  // namespace

int bench_allreduce(const cxxopts::ParseResult& args) {
  const auto dtype = dtype_parse(args["dtype"].as<std::string>());
  const int64_t min_bytes = args["min-bytes"].as<int64_t>();
  const int64_t max_bytes = args["max-bytes"].as<int64_t>();
  const int warmup = args["warmup"].as<int>();
  const int iters = args["iters"].as<int>();
  if (min_bytes < 1 || max_bytes < min_bytes) {
    throw ConfigError("--min-bytes and --max-bytes must satisfy 1 <= min <= max");
  }
  auto dist = dist_setup(args);
  ProcessGroup& pg = *dist.pg;
  const int n = pg.size();
  const double bus_factor = n > 1 ? 2.0 * (n - 1) / n : 1.0;
  const int64_t element = at::elementSize(dtype);
  if (dist.world.rank == 0) {
    std::printf("all-reduce SUM, %s, %d ranks, %s; time in us (slowest rank), bandwidth in GB/s\n",
                args["dtype"].as<std::string>().c_str(), n, backend_kind_name(pg.kind()));
    std::printf("%12s %11s | %11s %8s %8s | %11s %8s %8s | %s\n", "bytes", "elements", "backend us",
                "algbw", "busbw", "ring us", "algbw", "busbw", "check");
  }
  int failures = 0;
  for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    const int64_t numel = std::max<int64_t>(1, bytes / element);
    const int64_t real_bytes = numel * element;
    // Big messages take long: fewer iterations, same warm-up rule.
    const int it = real_bytes >= (16 << 20) ? std::max(3, iters / 4) : iters;
    auto zeros = at::zeros({numel}, at::TensorOptions(dtype).device(pg.device()));
    const double backend_us =
        time_us(pg, warmup, it, [&] { pg.allreduce(zeros, ReduceKind::kSum); });
    auto ring_buf = zeros.clone();
    const double ring_us = time_us(pg, warmup, it, [&] { ring_allreduce(pg, ring_buf); });
    // Correctness: small integers, exact in every dtype, against the closed form.
    const auto i = at::arange(numel, at::TensorOptions(at::kLong).device(pg.device())).remainder(7);
    auto a = ((pg.rank() + 1) + i).to(dtype);
    auto b = a.clone();
    pg.allreduce(a, ReduceKind::kSum);
    ring_allreduce(pg, b);
    const auto want = (static_cast<int64_t>(n) * (n + 1) / 2 + n * i).to(dtype);
    auto ok = at::tensor({at::equal(a, want) && at::equal(b, want) ? 1 : 0}, at::kInt);
    pg.allreduce(ok, ReduceKind::kMin);
    const bool passed = ok.item<int>() == 1;
    failures += passed ? 0 : 1;
    if (dist.world.rank == 0) {
      const double alg = real_bytes / backend_us / 1e3, ring_alg = real_bytes / ring_us / 1e3;
      std::printf("%12lld %11lld | %11.1f %8.3f %8.3f | %11.1f %8.3f %8.3f | %s\n",
                  static_cast<long long>(real_bytes), static_cast<long long>(numel), backend_us,
                  alg, alg * bus_factor, ring_us, ring_alg, ring_alg * bus_factor,
                  passed ? "ok" : "FAIL");
      std::fflush(stdout);
    }
  }
  if (dist.world.rank == 0) {
    std::printf("memory copy bandwidth of this machine (one %lld-byte tensor copy): %.2f GB/s\n",
                static_cast<long long>(std::min<int64_t>(max_bytes, 256 << 20)),
                memcpy_gbps(std::max<int64_t>(std::min<int64_t>(max_bytes, 256 << 20), 1 << 20)));
  }
  return failures == 0 ? kExitOk : kExitCheckFailed;
}

}  // namespace lockstep::cli
