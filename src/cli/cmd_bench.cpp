// The DDP bench's two drivers (one mode at a time, modes
// interleaved) share one Contender and one option table; moving them to a
// file of their own would add a LibTorch translation unit (a slow compile
// in every clean build) for no separation of concepts.
// `lockstep bench ddp`: ms per training step (forward, backward, SGD step) of
// MLPs with and without DistributedDataParallel, one JSON line per row on
// rank 0. scripts/bench_ddp.sh runs it beside PyTorch's own DDP
// (scripts/bench_ddp_torch.py) and prints the ratios. Also `bench matmul`
// and the dispatch to `bench allreduce` (bench_allreduce.cpp).
#include <torch/cuda.h>
#include <torch/nn.h>
#include <torch/optim.h>

#include <spdlog/spdlog.h>

#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>
#include <sstream>

#include "bench_modes.h"
#include "common.h"
#include "lockstep/check/fingerprint.h"
#include "lockstep/check/step_checks.h"
#include "lockstep/config/config.h"
#include "lockstep/ddp/buckets.h"
#include "lockstep/ddp/ddp.h"
#include "lockstep/distributed/agree.h"
#include "lockstep/train/precision.h"
#include "lockstep/train/recipe.h"
#include "lockstep/util/error.h"
#include "lockstep/util/matmul_peak.h"
#include "lockstep/util/names.h"
#include "lockstep/util/text.h"

namespace lockstep::cli {
namespace {

struct ModelSpec {
  std::string name;
  std::vector<int64_t> dims;  // input, hidden..., classes
  int64_t batch;
};

// The same ladder as scripts/bench_ddp_torch.py.
const std::vector<ModelSpec> kModels{
    {"small", {784, 128, 128, 10}, 32},
    {"large", {784, 1024, 1024, 10}, 64},
    {"xl", {784, 4608, 4608, 10}, 32},
};

torch::nn::Sequential make_mlp(const std::vector<int64_t>& dims) {
  torch::nn::Sequential model;
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    model->push_back(torch::nn::Linear(dims[i], dims[i + 1]));
    if (i + 2 < dims.size()) model->push_back(torch::nn::ReLU());
  }
  return model;
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) items.push_back(item);
  return items;
}

struct Timing {
  double ms_per_step = 0;  // slowest rank
  double check_ms = 0;     // of which the step waited for the consistency check (slowest rank)
  double idle_share = 0;   // of the bytes hashed, the share the idle thread hashed (rank 0)
  double comm_bytes = 0;   // rank 0's payload in the gradient exchange, last step
};

// Modes ddp+check, ddp+check-inplace and ddp+check-sha256 run the cross-rank
// fingerprint check after every optimizer step, as the trainer does with
// check.every: 1.
// GPU work is asynchronous: the clock reads after the device has finished.
void synchronize(const at::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// One mode's model, SGD and (but for local modes) DDP wrapper, stepped as
// the trainer steps: zero_grad, forward and backward per micro-batch, the
// optimizer step, and with a check mode the fingerprint check after it.
class Contender {
 public:
  Contender(ProcessGroup& pg, const ModelSpec& spec, const BenchMode& mode, const DdpOptions& base,
            const at::Device& device)
      : pg_(pg), mode_(mode), device_(device) {
    torch::manual_seed(0);
    model_ = make_mlp(spec.dims);
    model_->to(device);
    sgd_ =
        std::make_unique<torch::optim::SGD>(model_->parameters(), torch::optim::SGDOptions(0.01));
    x_ = torch::randn({spec.batch, spec.dims.front()}).to(device);
    y_ = torch::randint(0, spec.dims.back(), {spec.batch}).to(device);
    // local-amp-bf16 and ddp-amp-bf16: the forward and loss under bf16
    // autocast (train.precision: bf16), weights and SGD in float32.
    if (mode.ddp) {
      DdpOptions options = base;
      if (mode.powersgd_rank > 0) {
        PowerSgdOptions powersgd;
        powersgd.matrix_approximation_rank = mode.powersgd_rank;
        powersgd.start_iter = 2;
        options.comm_hook = comm_hook_create(CommHookKind::kPowerSgd, &powersgd);
        // One bucket, as PyTorch's side must have (scripts/bench_ddp_torch.py).
        options.bucket_cap_mb = options.first_bucket_cap_mb = 1e6;
      } else if (mode.hook) {
        options.comm_hook = comm_hook_create(*mode.hook);
      }
      if (mode.bucket_mb > 0) {
        options.bucket_cap_mb = mode.bucket_mb;
        options.first_bucket_cap_mb = std::min(options.first_bucket_cap_mb, options.bucket_cap_mb);
      }
      ddp_ = std::make_unique<DistributedDataParallel<torch::nn::Sequential>>(
          model_, pg.shared_from_this(), options);
    }
    // As the trainer does (StepChecks): a check started after each optimizer
    // step, its verdict taken before a later one. ddp+check hashes where the
    // trainer would; ddp+check-inplace always in place.
    if (mode.check)
      checks_.emplace(pg, mode.digest,
                      mode.inplace ? CheckHashing::kInPlace : check_hashing_for(false));
  }

  void step() {
    ++steps_;
    sgd_->zero_grad();
    for (int m = 0; m < mode_.micro; ++m) {
      std::optional<DdpCore::NoSyncGuard> guard;
      if (ddp_ && m < mode_.micro - 1) guard.emplace(*ddp_);
      at::Tensor loss;
      {
        std::optional<amp::AutocastGuard> bf16;
        if (mode_.autocast) bf16.emplace(device_.type(), at::kBFloat16);
        auto out = ddp_ ? ddp_->forward(x_) : model_->forward(x_);
        loss = torch::nn::functional::cross_entropy(out, y_) / mode_.micro;
      }
      loss.backward();
    }
    // local+barrier: the ranks meet where DDP's last bucket would be waited
    // for, with nothing exchanged (the step's cost of staying in step).
    if (mode_.barrier) pg_.barrier();
    if (checks_) timed([&] { verdicts(checks_->before_update()); });
    sgd_->step();
    if (checks_)
      timed([&] { checks_->start(fingerprint_tensors(*model_, false), ++step_number_); });
  }

  // The verdict of the check still in flight, timed as the step's.
  void drain() {
    if (checks_) timed([&] { verdicts(checks_->drain()); });
  }

  // From here on what check_ms and the hashing shares count.
  void start_counting() {
    counted_from_ = steps_;
    check_ms_ = 0;
    idle_before_ = checks_ ? checks_->idle_bytes() : 0;
    hashed_before_ = checks_ ? checks_->hashed_bytes() : 0;
  }

  // Steps since start_counting().
  int64_t counted_steps() const { return steps_ - counted_from_; }

  // `ms` per step on this rank over `steps` timed steps: the slowest rank's
  // figures (a collective: every rank calls it, in the same order).
  Timing timing(double ms, int steps) {
    const auto slowest = max_over_ranks(pg_, {ms, check_ms_ / steps});
    const double hashed =
        checks_ ? static_cast<double>(checks_->hashed_bytes() - hashed_before_) : 0;
    const double idle = checks_ ? static_cast<double>(checks_->idle_bytes() - idle_before_) : 0;
    const double bytes =
        ddp_ && ddp_->reducer() ? static_cast<double>(ddp_->reducer()->last_stats().bytes) : 0.0;
    return {slowest[0], slowest[1], hashed > 0 ? idle / hashed : 0.0, bytes};
  }

 private:
  template <typename F>
  void timed(F&& body) {
    const auto start = std::chrono::steady_clock::now();
    body();
    check_ms_ +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  }
  static void verdicts(const std::vector<ConsistencyReport>& reports) {
    for (const auto& report : reports)
      if (!report.consistent) throw ConsistencyError(report.message);
  }

  ProcessGroup& pg_;
  BenchMode mode_;
  at::Device device_;
  torch::nn::Sequential model_{nullptr};
  std::unique_ptr<torch::optim::SGD> sgd_;
  at::Tensor x_, y_;
  std::unique_ptr<DistributedDataParallel<torch::nn::Sequential>> ddp_;
  std::optional<StepChecks> checks_;
  int64_t step_number_ = 0;
  int64_t steps_ = 0, counted_from_ = 0;
  double check_ms_ = 0;
  size_t idle_before_ = 0, hashed_before_ = 0;
};

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// One mode at a time: `warmup` steps, then `steps` timed in one stretch.
Timing time_steps(ProcessGroup& pg, const ModelSpec& spec, const BenchMode& mode, int warmup,
                  int steps, const DdpOptions& base, const at::Device& device) {
  Contender contender(pg, spec, mode, base, device);
  for (int i = 0; i < warmup; ++i) contender.step();
  synchronize(device);
  contender.start_counting();
  pg.barrier();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) contender.step();
  contender.drain();
  synchronize(device);
  return contender.timing(ms_since(start) / steps, steps);
}

// Note [Interleaved modes]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// On a shared host a core's speed changes by phases: the small rung's step
// alone in one process runs markedly slower for one stretch than for the
// next, so two modes timed one after the other, even alternated over
// rounds of a few seconds each, meet different phases, and a ratio of two
// such medians can differ widely between two series of the same build (the
// measurements: docs/lab/ddp-overhead.md, "The modes interleaved").
// --interleave B builds every mode's model at once and times them in turn,
// B steps each, the order reversed every round, until each has run
// --steps: every mode meets the same phases. Each block starts
// with a barrier (untimed), so the ranks start it together as one stretch
// of --steps does, and ends with the check's verdict (check modes) and the
// device's work done, timed. A mode's ms per step is its blocks' total over
// its steps, the slowest rank's, as in one stretch.
std::vector<Timing> time_interleaved(ProcessGroup& pg, const ModelSpec& spec,
                                     const std::vector<BenchMode>& modes, int warmup, int steps,
                                     int block, const DdpOptions& base, const at::Device& device) {
  std::vector<std::unique_ptr<Contender>> contenders;
  for (const auto& mode : modes)
    contenders.push_back(std::make_unique<Contender>(pg, spec, mode, base, device));
  for (auto& c : contenders) {
    for (int i = 0; i < warmup; ++i) c->step();
    c->drain();
  }
  synchronize(device);
  for (auto& c : contenders) c->start_counting();
  std::vector<double> ms(contenders.size(), 0.0);
  const std::size_t n = contenders.size();
  int done = 0;
  for (int round = 0; done < steps; ++round) {
    const int now = std::min(block, steps - done);
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t c = round % 2 == 0 ? k : n - 1 - k;
      spdlog::debug("bench: round {}, {} steps of {}", round, now, modes[c].name);
      pg.barrier();
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < now; ++i) contenders[c]->step();
      contenders[c]->drain();
      synchronize(device);
      ms[c] += ms_since(start);
    }
    done += now;
  }
  std::vector<Timing> timings;
  for (std::size_t c = 0; c < n; ++c) {
    spdlog::debug("bench: {} ran {} timed steps", modes[c].name, contenders[c]->counted_steps());
    timings.push_back(contenders[c]->timing(ms[c] / steps, steps));
  }
  return timings;
}

// Communication only: the model's gradients exchanged as DDP's buckets (all
// launched, then all waited, as in one backward) or as one flat all-reduce.
Timing time_exchange(ProcessGroup& pg, const ModelSpec& spec, const BenchMode& mode, int warmup,
                     int steps, const DdpOptions& options) {
  torch::manual_seed(0);
  auto model = make_mlp(spec.dims);
  auto params = model->parameters();
  std::vector<at::Tensor> buffers;
  if (mode.flat) {
    int64_t total = 0;
    for (const auto& p : params) total += p.numel();
    buffers.push_back(torch::zeros({total}));
  } else {
    // The Reducer's own buckets (its order, its caps), not a second
    // computation of them that could drift.
    DistributedDataParallel<torch::nn::Sequential> ddp(model, pg.shared_from_this(), options);
    if (ddp.reducer() == nullptr) throw ConfigError("exchange-bucketed needs 2 or more ranks");
    for (const auto& bucket : ddp.reducer()->bucket_indices()) {
      int64_t numel = 0;
      for (size_t i : bucket) numel += params[i].numel();
      buffers.push_back(torch::zeros({numel}));
    }
  }
  auto exchange = [&] {
    std::vector<Ptr<C10dWork>> works;
    for (auto& b : buffers) works.push_back(pg.allreduce_async(b, ReduceKind::kSum));
    for (auto& w : works) pg.wait(w, "exchange");
  };
  for (int i = 0; i < warmup; ++i) exchange();
  pg.barrier();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) exchange();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
      steps;
  return {max_over_ranks(pg, std::vector<double>{ms})[0], 0};
}

// This process's peak resident memory so far (VmHWM): per mode only when
// one mode runs per process (scripts/bench_amp.sh).
double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

// The --shm-chunk-mb default: dist.shm_chunk_mb's, written as a flag value.
std::string default_chunk_mb() {
  std::ostringstream out;
  out << Config{}.dist.shm_chunk_mb;
  return out.str();
}

// `lockstep bench matmul`: this core's product peak per dtype and size
// (one process; the threads LibTorch is set to), the limit MFU is measured
// against (log.mfu, scripts/bench_all.sh).
int bench_matmul(const cxxopts::ParseResult& args) {
  for (const auto& dtype_name : split(args["dtypes"].as<std::string>())) {
    if (dtype_name != "fp32" && dtype_name != "bf16")
      throw ConfigError("--dtypes: '" + dtype_name + "' is not one of fp32, bf16");
    const auto dtype = dtype_name == "fp32" ? at::kFloat : at::kBFloat16;
    for (const auto& size : split(args["sizes"].as<std::string>())) {
      char* end = nullptr;
      const long long n = std::strtoll(size.c_str(), &end, 10);
      if (end == size.c_str() || *end != '\0' || n < 16 || n > 8192)
        throw ConfigError("--sizes: '" + size + "' is not a whole number in [16, 8192]");
      std::printf(
          "{\"bench\": \"matmul\", \"dtype\": \"%s\", \"n\": %lld, \"threads\": %d, "
          "\"gflops\": %.1f}\n",
          dtype_name.c_str(), n, at::get_num_threads(), matmul_peak_gflops(dtype, n));
      std::fflush(stdout);
    }
  }
  return kExitOk;
}

// The command's options and their help: every kind of bench's, one table.
cxxopts::Options bench_options() {
  cxxopts::Options options("lockstep bench", "Benchmarks. usage: lockstep bench ddp [options]");
  // clang-format off
  options.add_options()
      ("what", "ddp | allreduce", cxxopts::value<std::string>())
      ("min-bytes", "allreduce: smallest message", cxxopts::value<int64_t>()->default_value("8"))
      ("max-bytes", "allreduce: largest message (powers of two up to it)", cxxopts::value<int64_t>()->default_value("268435456"))
      ("dtype", "allreduce: float32 | float64 | float16 | int32 | int64", cxxopts::value<std::string>()->default_value("float32"))
      ("backends", "allreduce: comma-separated contenders, e.g. gloo,shm,mpi (auto: gloo,shm on one host)", cxxopts::value<std::string>()->default_value("auto"))
      ("ops", "allreduce: collectives to time, comma-separated: allreduce, reduce_scatter, all_gather (all: the three)", cxxopts::value<std::string>()->default_value("allreduce"))
      ("shm-chunk-mb", "allreduce: the shm contenders' chunk, MiB per step through each rank's slot (as dist.shm_chunk_mb)", cxxopts::value<double>()->default_value(default_chunk_mb()))
      ("iters", "allreduce: timed iterations per size (a quarter from 16 MB)", cxxopts::value<int>()->default_value("20"))
      ("models", "comma-separated: small (784-128-128-10, batch 32), large (784-1024-1024-10, batch 64), xl (784-4608-4608-10, batch 32: 24.9M parameters)", cxxopts::value<std::string>()->default_value("small,large"))
      ("modes", "comma-separated: local (no communication), local+barrier (no communication but a barrier after each backward: the cost of keeping the ranks in step), ddp, ddp-fp16, ddp-bf16 (LibTorch 2.x on Gloo), ddp-powersgd{1,2,4} (PowerSGD of that rank, compressing from the second step, one bucket), ddp-bucket{1,5,25,100}, ddp-accum4 (4 micro-batches, no_sync on 3), ddp+check (xxh3 check every step, hashed where the trainer would: on an idle-priority thread for weights of 1 MiB or more), ddp+check-inplace (hashed in the step), ddp+check-sha256, local-amp-bf16 / ddp-amp-bf16 (forward and loss under bf16 autocast, as train.precision: bf16), exchange-bucketed / exchange-flat (communication only; 2 or more ranks)", cxxopts::value<std::string>()->default_value("local,ddp"))
      ("bucket-cap-mb", "DDP bucket cap", cxxopts::value<double>()->default_value(number_text(DdpOptions{}.bucket_cap_mb)))
      ("first-bucket-cap-mb", "DDP first bucket cap", cxxopts::value<double>()->default_value(number_text(DdpOptions{}.first_bucket_cap_mb)))
      ("device", "ddp: where the models live: auto (cuda with nccl) | cpu | cuda (GPU LOCAL_RANK)", cxxopts::value<std::string>()->default_value("auto"))
      ("warmup", "untimed steps (ddp) or iterations (allreduce)", cxxopts::value<int>()->default_value("5"))
      ("steps", "timed steps", cxxopts::value<int>()->default_value("50"))
      ("interleave", "ddp: 0 (each mode in one stretch, one after another) or B: every mode's model built at once and timed in turn, B steps each, the order reversed each round, until each has run --steps (the same host phases for every mode)", cxxopts::value<int>()->default_value("0"))
      ("sizes", "matmul: n of the n x n x n products, comma-separated", cxxopts::value<std::string>()->default_value("512,1024,2048"))
      ("dtypes", "matmul: fp32, bf16 (comma-separated)", cxxopts::value<std::string>()->default_value("fp32,bf16"));
  // clang-format on
  options.parse_positional({"what"});
  add_dist_options(options);
  return options;
}

// `lockstep bench ddp`'s arguments, checked before the rendezvous.
struct DdpBench {
  int warmup = 0;
  int steps = 0;
  int interleave = 0;  // 0: each mode in one stretch (Note [Interleaved modes])
  std::vector<ModelSpec> models;
  std::vector<BenchMode> modes;
  DdpOptions ddp_options;
};

DdpBench ddp_bench_from_args(const cxxopts::ParseResult& args) {
  DdpBench bench;
  bench.warmup = args["warmup"].as<int>();
  bench.steps = args["steps"].as<int>();
  if (bench.warmup < 0 || bench.steps < 1)
    throw ConfigError("--warmup must be >= 0 and --steps >= 1");
  bench.interleave = args["interleave"].as<int>();
  if (bench.interleave < 0) throw ConfigError("--interleave must be 0 or a number of steps >= 1");
  for (const auto& name : split(args["models"].as<std::string>())) {
    auto it = std::find_if(kModels.begin(), kModels.end(),
                           [&](const ModelSpec& m) { return m.name == name; });
    if (it == kModels.end())
      throw ConfigError("--models: unknown model '" + name + "' (valid: small, large, xl)");
    bench.models.push_back(*it);
  }
  for (const auto& name : split(args["modes"].as<std::string>())) {
    bench.modes.push_back(bench_mode(name));
    if (bench.interleave > 0 && bench.modes.back().exchange)
      throw ConfigError("--interleave: mode '" + name +
                        "' times communication alone, not training steps; run it without "
                        "--interleave");
  }
  bench.ddp_options.bucket_cap_mb = args["bucket-cap-mb"].as<double>();
  bench.ddp_options.first_bucket_cap_mb = args["first-bucket-cap-mb"].as<double>();
  return bench;
}

// One row's JSON line on stdout (rank 0's).
void print_ddp_row(const ModelSpec& spec, const BenchMode& mode, int world_size,
                   const at::Device& device, const Timing& t, int interleave) {
  std::printf(
      "{\"bench\": \"ddp\", \"impl\": \"lockstep\", \"model\": \"%s\", \"mode\": \"%s\", "
      "\"world\": %d, \"device\": \"%s\", \"batch\": %lld, \"ms_per_step\": %.4f, "
      "\"check_ms\": %.4f, "
      "\"check_share\": %.5f, \"check_idle_share\": %.4f, \"peak_rss_mib\": %.1f, "
      "\"comm_bytes_per_step\": %.0f, \"interleave\": %d}\n",
      spec.name.c_str(), mode.name.c_str(), world_size, device.is_cuda() ? "cuda" : "cpu",
      static_cast<long long>(spec.batch), t.ms_per_step, t.check_ms, t.check_ms / t.ms_per_step,
      t.idle_share, peak_rss_mib(), t.comm_bytes, interleave);
  std::fflush(stdout);
}

// `lockstep bench ddp`: every model in every mode, one row each.
int bench_ddp(const cxxopts::ParseResult& args) {
  const DdpBench bench = ddp_bench_from_args(args);
  auto dist = dist_setup(args);
  Config where;  // the device rule of train.device
  where.train.device = parse_named(kDeviceKindNames, args["device"].as<std::string>(), "--device");
  const at::Device device = device_from_config(where, dist.world, dist.pg->kind(), "--device");
  for (const auto& spec : bench.models) {
    std::vector<Timing> interleaved;
    if (bench.interleave > 0)
      interleaved = time_interleaved(*dist.pg, spec, bench.modes, bench.warmup, bench.steps,
                                     bench.interleave, bench.ddp_options, device);
    for (std::size_t k = 0; k < bench.modes.size(); ++k) {
      const BenchMode& mode = bench.modes[k];
      Timing t;
      if (bench.interleave > 0)
        t = interleaved[k];
      else if (mode.exchange)
        t = time_exchange(*dist.pg, spec, mode, bench.warmup, bench.steps, bench.ddp_options);
      else
        t = time_steps(*dist.pg, spec, mode, bench.warmup, bench.steps, bench.ddp_options, device);
      if (dist.world.rank == 0)
        print_ddp_row(spec, mode, dist.world.world_size, device, t, bench.interleave);
    }
  }
  return kExitOk;
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  return run_guarded("bench", [&] {
    cxxopts::Options options = bench_options();
    const auto parsed = parse_command_line(options, argc, argv);
    if (!parsed) return kExitOk;
    const cxxopts::ParseResult& args = *parsed;
    const std::string what = args.count("what") != 0 ? args["what"].as<std::string>() : "";
    if (what == "allreduce") return bench_allreduce(args);
    if (what == "matmul") return bench_matmul(args);
    if (what != "ddp")
      throw ConfigError("lockstep bench: say what to benchmark (valid: ddp, allreduce, matmul)");
    return bench_ddp(args);
  });
}

}  // namespace lockstep::cli
