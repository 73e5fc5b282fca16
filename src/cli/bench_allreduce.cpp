// `lockstep bench allreduce`: nccl-tests-style all-reduce (and with --ops
// reduce-scatter and all-gather) figures for each
// backend named by --backends (default: gloo and shm on one host), side by
// side, and for the ring all-reduce built from Gloo's send/recv
// (distributed/ring_allreduce.h), with a correctness check of every size.
//   algbw = bytes / time; busbw = algbw * 2(n-1)/n (nccl-tests' definition:
//   what each rank's link carries in a bandwidth-optimal ring).
#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "lockstep/distributed/agree.h"
#include "lockstep/distributed/init.h"
#include "lockstep/distributed/ring_allreduce.h"
#include "lockstep/distributed/shm_backend.h"
#include "lockstep/distributed/shm_options.h"
#include "lockstep/util/error.h"
#include "lockstep/util/names.h"

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

// The median of `iters` iterations timed one by one after `warmup`, slowest rank.
// `prepare`, untimed, runs before each iteration.
template <typename F, typename P>
double time_us(ProcessGroup& pg, int warmup, int iters, F&& op, P&& prepare) {
  for (int i = 0; i < warmup; ++i) {
    prepare();
    op();
  }
  pg.barrier();
  // Each iteration timed, the median kept: on a host shared with other
  // work (two ranks on two cores) one descheduled iteration would
  // otherwise set the mean of a small message's 100.
  std::vector<double> each(static_cast<size_t>(iters));
  for (auto& us : each) {
    prepare();
    const auto start = Clock::now();
    op();
    us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  }
  std::nth_element(each.begin(), each.begin() + iters / 2, each.end());
  return max_over_ranks(pg, std::vector<double>{each[iters / 2]})[0];
}
template <typename F>
double time_us(ProcessGroup& pg, int warmup, int iters, F&& op) {
  return time_us(pg, warmup, iters, std::forward<F>(op), [] {});
}

// Bytes copied per second by one large copy (read + write counted once, as
// nccl-tests' figures count the buffer once): `copy(to, from)`, 5 times
// after one untimed.
template <typename F>
double copy_gbps(int64_t bytes, F&& copy) {
  auto a = at::ones({bytes / 4}, at::kFloat);
  auto b = at::empty_like(a);
  copy(b, a);
  const auto start = Clock::now();
  const int reps = 5;
  for (int i = 0; i < reps; ++i) copy(b, a);
  const double s = std::chrono::duration<double>(Clock::now() - start).count() / reps;
  return static_cast<double>(bytes) / s / 1e9;
}

// The machine's copy as its users meet it (a tensor copy), and the same copy
// with streaming stores, which do not read the destination first: the
// larger is the copy limit the all-reduce is held to (docs/lab/shm-allreduce.md,
// "Which copy is the limit"). The second line is left out where this build
// has no streaming stores. Both copies are one thread's where
// OMP_NUM_THREADS=1, as the launcher sets for more than one rank per host;
// otherwise the tensor copy may use more threads than the streaming one.
void print_copy_limits(int64_t max_bytes) {
  const int64_t bytes = std::max<int64_t>(std::min<int64_t>(max_bytes, 256 << 20), 1 << 20);
  const double tensor_copy =
      copy_gbps(bytes, [](at::Tensor& to, const at::Tensor& from) { to.copy_(from); });
  std::printf("memory copy bandwidth of this machine (one %lld-byte tensor copy): %.2f GB/s\n",
              static_cast<long long>(bytes), tensor_copy);
  char probe_from[64] = {}, probe_to[64];
  if (!shm_copy_streaming(probe_to, probe_from, sizeof(probe_to))) return;
  const double streamed = copy_gbps(bytes, [](at::Tensor& to, const at::Tensor& from) {
    shm_copy_streaming(to.data_ptr(), from.data_ptr(), static_cast<std::size_t>(from.nbytes()));
  });
  std::printf(
      "streaming copy bandwidth of this machine (the same copy, streaming stores): %.2f GB/s\n",
      streamed);
}

std::vector<std::string> split_list(const std::string& text, const char* flag = "--backends") {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const auto comma = text.find(',', start);
    const auto item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (out.empty()) throw ConfigError(std::string(flag) + ": name at least one");
  return out;
}

enum class Op { kAllreduce, kReduceScatter, kAllGather };
inline constexpr NameTable<Op, 3> kOpNames{{{Op::kAllreduce, "allreduce"},
                                            {Op::kReduceScatter, "reduce_scatter"},
                                            {Op::kAllGather, "all_gather"}}};

Op op_parse(const std::string& name) {
  return parse_named(kOpNames, name, "--ops (or all)");
}

const char* op_title(Op op) {
  return op == Op::kAllreduce       ? "all-reduce SUM"
         : op == Op::kReduceScatter ? "reduce-scatter SUM (bytes: the whole input)"
                                    : "all-gather (bytes: the whole output)";
}

// One table: every size on every contender (alternating the order per
// size), then a check of each against the closed form. Returns the number
// of sizes that failed it.
int time_op(Op op, ProcessGroup& pg, const std::vector<std::shared_ptr<ProcessGroup>>& groups,
            const std::shared_ptr<ProcessGroup>& gloo_group, at::ScalarType dtype,
            int64_t min_bytes, int64_t max_bytes, int warmup, int iters,
            const std::string& dtype_name) {
  const int n = pg.size();
  // nccl-tests: all-reduce moves 2(n-1)/n of the buffer per rank, the
  // reduce-scatter and the all-gather (n-1)/n of the whole.
  const double bus_factor = n == 1                 ? 1.0
                            : op == Op::kAllreduce ? 2.0 * (n - 1) / n
                                                   : 1.0 * (n - 1) / n;
  const std::shared_ptr<ProcessGroup> gloo = op == Op::kAllreduce ? gloo_group : nullptr;
  const int64_t element = at::elementSize(dtype);
  // shm all-reduces twice: a tensor of private memory, and one made as DDP
  // makes its buckets (bucket_zeros: Note [Buckets in shared memory]).
  std::vector<std::shared_ptr<ProcessGroup>> bucketed;
  if (op == Op::kAllreduce && n > 1)
    for (const auto& g : groups)
      if (g->kind() == BackendKind::kShm) bucketed.push_back(g);
  const std::size_t contenders = groups.size() + bucketed.size() + (gloo ? 1 : 0);
  if (pg.rank() == 0) {
    std::printf(
        "%s, %s, %d ranks; time in us (median iteration, slowest rank), bus bandwidth in GB/s%s\n",
        op_title(op), dtype_name.c_str(), n, gloo ? "; ring: from Gloo's send/recv" : "");
    std::printf("%12s %11s", "bytes", "elements");
    for (const auto& g : groups) {
      const bool fallback = op == Op::kReduceScatter && !g->reduce_scatter_native();
      std::printf(" | %9s%s us %8s", backend_kind_name(g->kind()), fallback ? "*" : "", "busbw");
    }
    for (std::size_t b = 0; b < bucketed.size(); ++b)
      std::printf(" | %9s us %8s", "shm-bkt", "busbw");
    if (gloo) std::printf(" | %9s us %8s", "ring", "busbw");
    std::printf(" | check\n");
  }
  const auto on = at::TensorOptions(dtype).device(pg.device());
  int failures = 0;
  int round = 0;
  for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2, ++round) {
    // The whole buffer: a multiple of n elements, so the chunks are equal.
    int64_t numel = std::max<int64_t>(1, bytes / element);
    if (op != Op::kAllreduce) numel = std::max<int64_t>(n, numel / n * n);
    const int64_t real_bytes = numel * element;
    const int64_t chunk = numel / n;
    const int it = real_bytes >= (16 << 20) ? std::max(3, iters / 4) : iters;
    auto whole = at::zeros({numel}, on);
    auto part = at::zeros({op == Op::kAllreduce ? 1 : chunk}, on);
    std::vector<at::Tensor> buckets;  // every rank makes them alike, in this order
    for (const auto& g : bucketed) buckets.push_back(g->bucket_zeros(numel, on));
    std::vector<double> us(contenders, 0);
    for (std::size_t k = 0; k < contenders; ++k) {
      const std::size_t c = round % 2 == 0 ? k : contenders - 1 - k;
      if (c < groups.size()) {
        ProcessGroup& g = *groups[c];
        us[c] = time_us(g, warmup, it, [&] {
          if (op == Op::kAllreduce) g.allreduce(whole, ReduceKind::kSum);
          if (op == Op::kReduceScatter) g.reduce_scatter(part, whole);
          if (op == Op::kAllGather) g.all_gather_into(whole, part);
        });
      } else if (c < groups.size() + bucketed.size()) {
        ProcessGroup& g = *bucketed[c - groups.size()];
        at::Tensor& b = buckets[c - groups.size()];
        // Each rank writes its whole copy first, as a backward writes its
        // gradients: without it a rank's share of every copy would be
        // touched by that rank alone, and no line would cross cores.
        us[c] = time_us(
            g, warmup, it, [&] { g.allreduce(b, ReduceKind::kSum); }, [&] { b.fill_(1); });
      } else {
        us[c] = time_us(*gloo, warmup, it, [&] { ring_allreduce(*gloo, whole); });
      }
    }
    // Correctness: small integers, exact in every dtype, against the closed form.
    const auto i = at::arange(numel, at::TensorOptions(at::kLong).device(pg.device())).remainder(7);
    bool all_ok = true;
    for (std::size_t c = 0; c < contenders; ++c) {
      auto a = ((pg.rank() + 1) + i).to(dtype);
      if (op == Op::kAllreduce) {
        const auto want = (static_cast<int64_t>(n) * (n + 1) / 2 + n * i).to(dtype);
        if (c < groups.size()) {
          groups[c]->allreduce(a, ReduceKind::kSum);
        } else if (c < groups.size() + bucketed.size()) {
          at::Tensor& b = buckets[c - groups.size()];
          b.copy_(a);
          bucketed[c - groups.size()]->allreduce(b, ReduceKind::kSum);
          a = b;
        } else {
          ring_allreduce(*gloo, a);
        }
        all_ok = all_ok && at::equal(a, want);
      } else if (op == Op::kReduceScatter) {
        auto out = at::empty({chunk}, on);
        groups[c]->reduce_scatter(out, a);
        const auto want = (static_cast<int64_t>(n) * (n + 1) / 2 + n * i).to(dtype);
        all_ok = all_ok && at::equal(out, want.narrow(0, pg.rank() * chunk, chunk));
      } else {
        auto out = at::empty({numel}, on);
        groups[c]->all_gather_into(out, a.narrow(0, 0, chunk));
        const auto k = at::arange(numel, at::TensorOptions(at::kLong).device(pg.device()));
        const auto want = (k.div(chunk, "floor") + 1 + k.remainder(chunk).remainder(7)).to(dtype);
        all_ok = all_ok && at::equal(out, want);
      }
    }
    const bool passed = min_over_ranks(pg, all_ok ? 1 : 0) == 1;
    failures += passed ? 0 : 1;
    if (pg.rank() == 0) {
      std::printf("%12lld %11lld", static_cast<long long>(real_bytes),
                  static_cast<long long>(numel));
      for (std::size_t c = 0; c < contenders; ++c)
        std::printf(" | %12.1f %8.3f", us[c], real_bytes / us[c] / 1e3 * bus_factor);
      std::printf(" | %s\n", passed ? "ok" : "FAIL");
      std::fflush(stdout);
    }
  }
  if (op == Op::kReduceScatter && pg.rank() == 0) {
    for (const auto& g : groups) {
      if (!g->reduce_scatter_native()) {
        std::printf(
            "* %s has no reduce-scatter here: an all-reduce of the whole input, then the "
            "slice\n",
            backend_kind_name(g->kind()));
      }
    }
  }
  return failures;
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
  std::string ops_text = args["ops"].as<std::string>();
  if (ops_text == "all") {
    ops_text.clear();
    for (const auto& name : names_of(kOpNames)) ops_text += (ops_text.empty() ? "" : ",") + name;
  }
  std::vector<Op> ops;
  for (const auto& name : split_list(ops_text, "--ops")) ops.push_back(op_parse(name));
  const double chunk_mb = args["shm-chunk-mb"].as<double>();
  if (!(chunk_mb >= 0.0625 && chunk_mb <= 1024))
    throw ConfigError("--shm-chunk-mb must be in [0.0625, 1024] (as dist.shm_chunk_mb)");
  const std::size_t chunk_bytes = shm_chunk_bytes_from_mib(chunk_mb);
  auto dist = dist_setup(args);
  // The contenders, each a process group of its own on the job's store;
  // every size is timed on each in turn (alternating the order per size).
  std::vector<std::shared_ptr<ProcessGroup>> groups;
  std::string names = args["backends"].as<std::string>();
  if (names == "auto")
    names = dist.pg->kind() == BackendKind::kShm ? "gloo,shm" : backend_kind_name(dist.pg->kind());
  std::shared_ptr<ProcessGroup> gloo;
  for (const auto& name : split_list(names)) {
    ProcessGroupOptions options;
    options.backend = parse_named(kBackendKindNames, name, "--backends");
    options.timeout = timeout_from_seconds(args["timeout-s"].as<double>(), "timeout");
    options.name = "bench-" + name;
    options.shm_chunk_bytes = chunk_bytes;
    groups.push_back(ProcessGroup::create(dist.store, dist.world, options));
    if (groups.back()->kind() == BackendKind::kGloo) gloo = groups.back();
  }
  ProcessGroup& pg = *dist.pg;
  int failures = 0;
  for (const Op op : ops) {
    failures += time_op(op, pg, groups, gloo, dtype, min_bytes, max_bytes, warmup, iters,
                        args["dtype"].as<std::string>());
  }
  if (dist.world.rank == 0) print_copy_limits(max_bytes);
  return failures == 0 ? kExitOk : kExitCheckFailed;
}

}  // namespace lockstep::cli
