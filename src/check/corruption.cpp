#include "lockstep/check/corruption.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "lockstep/check/fingerprint.h"
#include "lockstep/distributed/agree.h"
#include "lockstep/util/error.h"

namespace lockstep {

// Note [Silent corruption]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// The weight check compares what the ranks hold after the exchange; a rank
// whose own backward went wrong (a flipped bit in a core, a DIMM, a GPU)
// passes it, because the all-reduce copies its wrong gradient into every
// rank. So both checks look at each rank's local gradient before the
// exchange, where DDP's Reducer (and fully_shard's reduce-scatter) hand
// it to a LocalGradObserver.
// The screen records each parameter's local 2-norm (one reduction per
// parameter, no host sync), all-gathers the few numbers after the
// backward, and names a rank whose gradient is non-finite where the other
// ranks' are finite (unless a GradScaler runs: overflow is its business;
// or the rank's own loss is non-finite: that is divergence, Note
// [Diverged training]), or whose total is `threshold` times both the
// other ranks' median and its own largest of the recent steps. It catches
// what changes a gradient by orders of magnitude (a high exponent bit); a
// mantissa bit or a small change passes it.
// The replay catches those: with the same weights, the same batch, the
// same generator state and deterministic kernels, two ranks compute the
// same gradient bits. Every N steps each rank hashes its local gradients
// (XXH3 per parameter, as they enter the exchange), then computes its
// neighbour's (r + 1 mod W) from the neighbour's micro-batches and
// generator state (all-gathered), under no_sync, with its own gradients,
// buffers and generator put back afterwards. On a mismatch every rank
// computes the owner's batch once more and the majority settles it: the
// owner's first result alone differs (the owner is named), or the
// replay's (the replayer is). With 2 ranks, two ranks that each
// reproduce their own result cannot be told apart: both are named.
// Every rank sees the same gathered numbers and reaches the same verdict.

namespace {

constexpr int64_t kDigestWidth = 32;  // bytes per parameter in the exchange
// The outlier rule needs this many clean steps of a rank's own history (a
// run's first steps, and the first after a resume: the history is not
// checkpointed); the non-finite rule applies from the first step.
constexpr size_t kMinHistory = 10;
constexpr int64_t kPlaceWidth = 256;  // "host device" per rank

double total_of(const std::vector<double>& norms, size_t count) {
  double sum = 0;
  for (size_t i = 0; i < count; ++i)
    if (!(norms[i] < 0)) sum += norms[i] * norms[i];  // NaN counts: it is present
  return std::sqrt(sum);
}

// Four significant digits: a figure for a message, not for reading back.
std::string figure(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4g", v);
  return text;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// + 0.0 makes -0.0 +0.0: a gradient accumulated into zeros (0 + -0.0) and
// one assigned fresh (-0.0) hold the same value in other bits.
std::string digest_of(const at::Tensor& grad) {
  return fingerprint_per_tensor({{"", at::add(grad.detach(), 0.0)}}, DigestMode::kXxh3)[0];
}

int64_t first_difference(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  return a.size() == b.size() ? -1 : static_cast<int64_t>(std::min(a.size(), b.size()));
}

std::vector<std::string> unpack(const at::Tensor& bytes, size_t count, int64_t width) {
  const at::Tensor cpu = bytes.cpu().contiguous();
  const char* data = reinterpret_cast<const char*>(cpu.data_ptr<uint8_t>());
  std::vector<std::string> out;
  for (size_t i = 0; i < count; ++i) {
    out.emplace_back(data + i * width, static_cast<size_t>(width));
  }
  return out;
}

at::Tensor pack(const std::vector<std::string>& items, int64_t width, const at::Device& device) {
  auto out = at::zeros({static_cast<int64_t>(items.size()) * width + 1}, at::kByte);
  for (size_t i = 0; i < items.size(); ++i)
    std::memcpy(out.data_ptr<uint8_t>() + i * width, items[i].data(),
                std::min<size_t>(items[i].size(), static_cast<size_t>(width)));
  return out.to(device);
}

// Every rank's list of `count` strings of at most `width` bytes.
std::vector<std::vector<std::string>> gather_strings(ProcessGroup& pg,
                                                     const std::vector<std::string>& mine,
                                                     int64_t width) {
  std::vector<std::vector<std::string>> all;
  for (const auto& t : pg.allgather(pack(mine, width, pg.device())))
    all.push_back(unpack(t, mine.size(), width));
  return all;
}

std::vector<at::Tensor> gather_cpu(ProcessGroup& pg, const at::Tensor& t) {
  std::vector<at::Tensor> out;
  for (const auto& g : pg.allgather(t.contiguous().to(pg.device()))) out.push_back(g.cpu());
  return out;
}

}  // namespace

std::string CorruptionFinding::message() const {
  std::string who = "rank " + std::to_string(rank);
  if (!where.empty()) who += " (" + where + ")";
  if (other >= 0) who += " or rank " + std::to_string(other);
  return "step " + std::to_string(step) + ": " + who + ", found by " +
         (check == "replay" ? "check.replay_every" : "check.grad_screen") + ": " + detail +
         (parameter.empty() ? "" : "; first parameter: '" + parameter + "'");
}

CorruptionFinding screen_verdict(const std::vector<std::vector<double>>& norms,
                                 const std::vector<double>& recent, bool nonfinite_expected,
                                 double threshold, const std::vector<std::string>& names) {
  CorruptionFinding f;
  f.check = "grad_screen";
  const int world = static_cast<int>(norms.size());
  const size_t count = names.size();
  std::vector<double> totals;
  for (const auto& n : norms) totals.push_back(total_of(n, count));
  std::vector<int> bad;
  for (int r = 0; r < world; ++r)
    if (!std::isfinite(totals[r])) bad.push_back(r);
  if (!nonfinite_expected && !bad.empty() && static_cast<int>(bad.size()) < world) {
    f.rank = bad.front();
    for (size_t i = 0; i < count && f.parameter.empty(); ++i)
      if (!std::isfinite(norms[f.rank][i])) f.parameter = names[i];
    f.detail = "its local gradient is not finite (norm " + figure(totals[f.rank]) +
               ") where the other ranks' are (a corrupted value, or a NaN its own computation "
               "made from this batch with a finite loss)";
    return f;
  }
  for (int r = 0; r < world && world > 1; ++r) {
    std::vector<double> others;
    for (int q = 0; q < world; ++q)
      if (q != r && std::isfinite(totals[q])) others.push_back(totals[q]);
    if (!std::isfinite(totals[r]) || others.empty()) continue;
    const double median = median_of(others);
    if (!(median > 0) || totals[r] <= threshold * median) continue;
    // Its own history is required: a rank's first steps may legitimately
    // differ from the others' by more (tiny batches, W = 2).
    if (r >= static_cast<int>(recent.size()) || !(recent[r] > 0) ||
        totals[r] <= threshold * recent[r])
      continue;
    f.rank = r;
    double worst = 0;
    for (size_t i = 0; i < count; ++i) {
      std::vector<double> theirs;
      for (int q = 0; q < world; ++q)
        if (q != r && !(norms[q][i] < 0)) theirs.push_back(norms[q][i]);
      const double base = theirs.empty() ? 0 : median_of(theirs);
      const double ratio = norms[r][i] / std::max(base, 1e-30);
      if (ratio > worst) worst = ratio, f.parameter = names[i];
    }
    f.detail = "its local gradient norm " + figure(totals[r]) + " is " +
               figure(totals[r] / median) + "x the other ranks' median " + figure(median) +
               " and " + figure(totals[r] / recent[r]) + "x its own largest of the recent steps";
    return f;
  }
  return f;
}

CorruptionFinding replay_verdict(const std::vector<std::vector<std::string>>& own,
                                 const std::vector<std::vector<std::string>>& replayed,
                                 const std::vector<std::vector<std::string>>& again,
                                 const std::vector<std::string>& names) {
  CorruptionFinding f;
  f.check = "replay";
  const int world = static_cast<int>(own.size());
  for (int o = 0; o < world; ++o) {
    const int p = (o + world - 1) % world;
    const int64_t i = first_difference(own[o], replayed[p]);
    if (i < 0) continue;
    f.parameter = i < static_cast<int64_t>(names.size()) ? names[i] : "";
    f.rank = o;
    f.other = p;
    if (again.empty()) return f;  // to be settled by recomputing
    int with_own = 0, with_replay = 0;
    for (const auto& a : again) {
      with_own += a == own[o] ? 1 : 0;
      with_replay += a == replayed[p] ? 1 : 0;
    }
    const std::string of = std::to_string(world) + " recomputations";
    if (with_replay > with_own) {
      f.other = -1;
      f.detail = "its local gradient differs from rank " + std::to_string(p) +
                 "'s replay of its batch, which " + std::to_string(with_replay) + " of " + of +
                 " reproduce";
    } else if (with_own > with_replay) {
      f.rank = p;
      f.other = -1;
      f.detail = "its replay of rank " + std::to_string(o) + "'s batch differs from rank " +
                 std::to_string(o) + "'s own result, which " + std::to_string(with_own) + " of " +
                 of + " reproduce";
    } else if (with_own == 0 && with_replay == 0) {
      f.detail = "its local gradient differs from rank " + std::to_string(p) +
                 "'s replay of its batch, and no recomputation reproduces either: the "
                 "computation is not deterministic here (on CUDA, deterministic algorithms; "
                 "the same hosts, builds and thread counts on every rank)";
    } else {
      f.detail =
          "the two ranks compute different gradients for the same weights and batch, "
          "each reproducibly (" +
          std::to_string(with_own) + " and " + std::to_string(with_replay) + " of " + of +
          "): which one is wrong cannot be told" + (world == 2 ? " with 2 ranks" : "");
    }
    return f;
  }
  return f;
}

struct CorruptionChecks::Recorder : LocalGradObserver {
  explicit Recorder(size_t count) : norms(count), digests(count) {}

  void reset(bool want_norms, bool want_digests) {
    std::lock_guard<std::mutex> lock(mu);
    norms_on = want_norms;
    digests_on = want_digests;
    std::fill(norms.begin(), norms.end(), at::Tensor());
    std::fill(digests.begin(), digests.end(), std::string());
  }

  void local_grad(size_t index, const at::Tensor& grad) override {
    std::lock_guard<std::mutex> lock(mu);
    if (inject) inject(index, grad);
    if (index >= norms.size()) return;
    at::NoGradGuard no_grad;
    if (norms_on) norms[index] = grad.detach().norm(2).to(at::kDouble);
    if (digests_on) digests[index] = digest_of(grad);
  }

  std::mutex mu;
  bool norms_on = false, digests_on = false;
  std::vector<at::Tensor> norms;     // this step's, per parameter (undefined: none)
  std::vector<std::string> digests;  // a replay step's, per parameter ("" none)
  std::function<void(size_t, const at::Tensor&)> inject;
};

CorruptionChecks::CorruptionChecks(ProcessGroup& pg, NamedTensors params,
                                   std::vector<at::Tensor> buffers, at::Generator generator,
                                   CorruptionOptions options)
    : pg_(pg),
      params_(std::move(params)),
      buffers_(std::move(buffers)),
      generator_(std::move(generator)),
      options_(options),
      recorder_(std::make_shared<Recorder>(params_.size())),
      history_(static_cast<size_t>(pg.size())) {
  for (const auto& [name, p] : params_) names_.push_back(name);
}

CorruptionChecks::~CorruptionChecks() = default;

std::shared_ptr<LocalGradObserver> CorruptionChecks::observer() const {
  return recorder_;
}

void CorruptionChecks::set_injector(std::function<void(size_t, const at::Tensor&)> inject) {
  std::lock_guard<std::mutex> lock(recorder_->mu);
  recorder_->inject = std::move(inject);
}

void CorruptionChecks::begin_step(int64_t step, bool scaling) {
  step_ = step;
  scaling_ = scaling;
  recorder_->reset(options_.screen, replay_due());
}

bool CorruptionChecks::replay_due() const {
  return options_.replay_every > 0 && step_ % options_.replay_every == 0 && pg_.size() > 1;
}

CorruptionFinding CorruptionChecks::verdict(const MicroBatches& batches,
                                            const at::Tensor& rng_state, const at::Tensor& loss,
                                            const Recompute& recompute) {
  CorruptionFinding f;
  if (pg_.size() < 2) return f;
  std::vector<double> totals;
  if (options_.screen) f = screen(loss, totals);
  if (f.rank < 0 && replay_due()) f = replay(batches, rng_state, recompute);
  f.step = step_;
  if (f.rank >= 0) {
    locate(f);
    return f;
  }
  // Only a clean step's figures become history.
  for (size_t r = 0; r < totals.size() && r < history_.size(); ++r) {
    if (!std::isfinite(totals[r])) continue;
    history_[r].push_back(totals[r]);
    if (static_cast<int64_t>(history_[r].size()) > options_.history)
      history_[r].erase(history_[r].begin());
  }
  return f;
}

CorruptionFinding CorruptionChecks::screen(const at::Tensor& loss, std::vector<double>& totals) {
  const size_t count = params_.size();
  const at::Device device =
      params_.empty() ? at::Device(at::kCPU) : params_.front().second.device();
  // One tensor on the gradients' device, one copy to the host.
  std::vector<at::Tensor> each;
  for (size_t i = 0; i < count; ++i) {
    const at::Tensor& n = recorder_->norms[i];
    each.push_back(n.defined() ? n.to(device).reshape({1})
                               : at::full({1}, -1.0, at::dtype(at::kDouble).device(device)));
  }
  const at::Tensor finite =
      loss.defined() ? loss.detach().isfinite().all().to(at::kDouble) : at::ones({}, at::kDouble);
  each.push_back(finite.to(device).reshape({1}));
  std::vector<std::vector<double>> norms;
  std::vector<bool> loss_ok;
  for (const auto& t : gather_cpu(pg_, at::cat(each).cpu())) {
    const double* v = t.data_ptr<double>();
    norms.emplace_back(v, v + count);
    loss_ok.push_back(v[count] != 0);
  }
  std::vector<double> recent;
  for (const auto& h : history_)
    recent.push_back(h.size() < kMinHistory ? 0 : *std::max_element(h.begin(), h.end()));
  CorruptionFinding f = screen_verdict(norms, recent, scaling_, options_.threshold, names_);
  if (f.rank >= 0 && !loss_ok[f.rank]) f = CorruptionFinding{};  // divergence: not ours
  for (const auto& n : norms) totals.push_back(total_of(n, count));
  return f;
}

CorruptionFinding CorruptionChecks::replay(const MicroBatches& batches, const at::Tensor& rng_state,
                                           const Recompute& recompute) {
  const int world = pg_.size(), rank = pg_.rank();
  // Every rank's micro-batches and generator state: the shapes first (a
  // rank's batch of another shape cannot be gathered; no replay then).
  std::vector<int64_t> shape{static_cast<int64_t>(batches.size())};
  for (const auto& [x, y] : batches) {
    for (const auto& t : {x, y}) {
      shape.push_back(t.dim());
      for (int64_t d : t.sizes()) shape.push_back(d);
    }
  }
  bool same = true;
  const auto lengths =
      gather_cpu(pg_, at::full({1}, static_cast<int64_t>(shape.size()), at::kLong));
  for (const auto& n : lengths) same = same && n.equal(lengths[0]);
  if (same) {
    const auto shapes = gather_cpu(pg_, at::tensor(shape, at::kLong));
    for (const auto& s : shapes) same = same && s.equal(shapes[0]);
  }
  {
    if (!same) {
      if (rank == 0)
        spdlog::warn(
            "step {}: check.replay_every: the ranks' micro-batches differ in shape; "
            "no replay this step",
            step_);
      return {};
    }
  }
  std::vector<MicroBatches> all(static_cast<size_t>(world));
  for (const auto& [x, y] : batches) {
    const auto xs = gather_cpu(pg_, x), ys = gather_cpu(pg_, y);
    for (int q = 0; q < world; ++q) all[q].emplace_back(xs[q], ys[q]);
  }
  const auto states = gather_cpu(pg_, rng_state);
  std::vector<std::string> mine;
  {
    std::lock_guard<std::mutex> lock(recorder_->mu);
    mine = recorder_->digests;
  }
  const auto own = gather_strings(pg_, mine, kDigestWidth);
  const int next = (rank + 1) % world;
  const auto replayed =
      gather_strings(pg_, recompute_digests(all[next], states[next], recompute), kDigestWidth);
  CorruptionFinding f = replay_verdict(own, replayed, {}, names_);
  if (f.rank < 0) return f;
  const int owner = f.rank;
  const auto again =
      gather_strings(pg_, recompute_digests(all[owner], states[owner], recompute), kDigestWidth);
  return replay_verdict(own, replayed, again, names_);
}

std::vector<std::string> CorruptionChecks::recompute_digests(const MicroBatches& batches,
                                                             const at::Tensor& rng_state,
                                                             const Recompute& recompute) {
  // This rank's gradients, buffers and generator, put back whatever happens.
  std::vector<at::Tensor> grads;
  for (auto& [name, p] : params_) {
    grads.push_back(p.grad());
    p.mutable_grad() = at::Tensor();
  }
  std::vector<at::Tensor> kept;
  for (const auto& b : buffers_) kept.push_back(b.clone());
  at::Tensor now;
  {
    std::lock_guard<std::mutex> lock(generator_.mutex());
    now = generator_.get_state();
    generator_.set_state(rng_state);
  }
  std::vector<std::string> digests;
  const auto restore = [&] {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) params_[i].second.mutable_grad() = grads[i];
    for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].copy_(kept[i]);
    std::lock_guard<std::mutex> lock(generator_.mutex());
    generator_.set_state(now);
  };
  try {
    // A failure on one rank (memory) is every rank's: none waits in the
    // gather that follows.
    agree_on_failure(pg_, [&] {
      recompute(batches);
      for (const auto& [name, p] : params_)
        digests.push_back(p.grad().defined() ? digest_of(p.grad()) : std::string());
    });
  } catch (...) {
    restore();
    throw;
  }
  restore();
  return digests;
}

void CorruptionChecks::locate(CorruptionFinding& finding) {
  char host[128] = {0};
  gethostname(host, sizeof host - 1);
  const std::string device =
      params_.empty() ? std::string("cpu") : params_.front().second.device().str();
  const auto places = gather_strings(pg_, {std::string(host) + ", " + device}, kPlaceWidth);
  if (finding.rank >= 0 && finding.rank < static_cast<int>(places.size()))
    finding.where = "host " + places[finding.rank][0].substr(0, places[finding.rank][0].find('\0'));
}

}  // namespace lockstep
