#include "lockstep/check/fingerprint.h"
#include "lockstep/util/module_tensors.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>
#include <torch/nn/module.h>

#include <cstring>
#include <map>
#include <utility>

#include "idle_hasher.h"
#include "lockstep/distributed/coalesced.h"
#include "lockstep/util/error.h"
#include "lockstep/util/sha256.h"
#include "xxh3.h"

namespace lockstep {
namespace {

constexpr int64_t kDigestBytes = 32;  // room for SHA-256; XXH3-128 uses 16
// Below this, hashing in place (~30 us per MiB) costs less than handing the
// work to the idle thread and waking it (`scripts/bench_check.sh`, on the
// small benchmark MLP's 0.47 MB: 0.05 ms per step in place, 0.06-0.3 ms
// with the idle thread).
constexpr int64_t kIdleHashingMinBytes = 1 << 20;

DigestMode resolve(DigestMode mode, const std::vector<NamedTensor>& tensors) {
  if (mode != DigestMode::kAuto) return mode;
  for (const auto& t : tensors) {
    if (!t.tensor.is_cpu()) return DigestMode::kChecksum;
  }
  return DigestMode::kXxh3;
}

// The tensor's bytes on the host, contiguous (no copy for contiguous CPU tensors).
at::Tensor host_bytes(const at::Tensor& t) {
  return t.detach().cpu().contiguous();
}

// Two position-weighted wrapping int64 sums of the bit patterns, on t's device.
std::string checksum_of(const at::Tensor& t) {
  static const std::map<int64_t, at::ScalarType> kIntOfSize{
      {1, at::kByte}, {2, at::kShort}, {4, at::kInt}, {8, at::kLong}};
  auto flat = t.detach().contiguous().reshape({-1});
  if (flat.scalar_type() == at::kBool) flat = flat.to(at::kByte);
  const auto bits = flat.view(kIntOfSize.at(flat.element_size())).to(at::kLong);
  const auto position = at::arange(1, bits.numel() + 1, bits.options());
  // Weights 2i+1 (odd) and i^2+i+41: two independent linear forms.
  auto sums = at::stack({(bits * (2 * position + 1)).sum(),
                         ((bits ^ 0x5bd1e995) * (position * position + position + 41)).sum()})
                  .cpu();
  std::string out(16, '\0');
  std::memcpy(out.data(), sums.data_ptr<int64_t>(), 16);
  return out;
}

std::string sha256_stream(const std::vector<NamedTensor>& tensors) {
  Sha256 hasher;
  for (const auto& t : tensors) {
    const auto bytes = host_bytes(t.tensor);
    hasher.update(bytes.data_ptr(), bytes.nbytes());
  }
  return hasher.finish();
}

// One tensor's own digest: XXH3-128 of its bytes, its two checksums, or
// SHA-256 of its bytes (16, 16 or 32 bytes).
std::string tensor_digest(const at::Tensor& t, DigestMode resolved) {
  if (resolved == DigestMode::kChecksum) return checksum_of(t);
  const auto bytes = host_bytes(t);
  if (resolved == DigestMode::kSha256) {
    Sha256 hasher;
    hasher.update(bytes.data_ptr(), bytes.nbytes());
    return hasher.finish();
  }
  return xxh3_128({{bytes.data_ptr(), static_cast<size_t>(bytes.nbytes())}});
}

std::string concatenated(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) out += p;
  return out;
}

// The xxh3 and checksum digests: XXH3-128 over the per-tensor digests, in order.
std::string digest_of(const std::vector<std::string>& per_tensor) {
  const std::string all = concatenated(per_tensor);
  return xxh3_128({{all.data(), all.size()}});
}

at::Tensor as_bytes_tensor(const std::string& bytes, int64_t size, const at::Device& device) {
  auto out = at::zeros({size}, at::kByte);
  std::memcpy(out.data_ptr<uint8_t>(), bytes.data(), std::min<size_t>(bytes.size(), size));
  return out.to(device);
}

std::string from_bytes_tensor(const at::Tensor& t) {
  const auto cpu = t.cpu();
  return std::string(reinterpret_cast<const char*>(cpu.data_ptr<uint8_t>()), cpu.numel());
}

// Every rank compares the same gathered digests, so all reach the same
// verdict; on a mismatch they exchange per-tensor digests (a collective).
// `per_tensor`: the tensors' own digests when already known (the tensors may
// have changed since); computed from the tensors otherwise.
ConsistencyReport compare(ProcessGroup& pg, const std::vector<NamedTensor>& tensors,
                          DigestMode mode, int64_t step, const std::string& mine,
                          const std::vector<at::Tensor>& gathered,
                          const std::vector<std::string>& per_tensor) {
  ConsistencyReport report;
  report.step = step;
  std::vector<std::string> digests;
  for (const auto& g : gathered) digests.push_back(from_bytes_tensor(g).substr(0, mine.size()));
  report.digest_hex = hex_of(digests[0]);
  for (const auto& d : digests) report.rank_digests_hex.push_back(hex_of(d));
  for (const auto& d : digests) report.consistent = report.consistent && d == digests[0];
  if (report.consistent) return report;

  // Group ranks by digest, in order of first appearance.
  std::vector<std::string> distinct;
  for (int r = 0; r < pg.size(); ++r) {
    auto it = std::find(distinct.begin(), distinct.end(), digests[r]);
    if (it == distinct.end()) {
      distinct.push_back(digests[r]);
      report.groups.emplace_back();
      it = distinct.end() - 1;
    }
    report.groups[it - distinct.begin()].push_back(r);
  }
  // Name the first tensor that differs: per-tensor digests, all-gathered.
  const auto per = per_tensor.empty() ? fingerprint_per_tensor(tensors, mode) : per_tensor;
  const int64_t width = static_cast<int64_t>(per.empty() ? 0 : per[0].size());
  const std::string flat = concatenated(per);
  const auto all =
      pg.allgather(as_bytes_tensor(flat, std::max<int64_t>(1, width * per.size()), pg.device()));
  for (size_t i = 0; i < per.size() && report.first_tensor.empty(); ++i) {
    const std::string first = from_bytes_tensor(all[0]).substr(i * width, width);
    for (int r = 1; r < pg.size(); ++r) {
      if (from_bytes_tensor(all[r]).substr(i * width, width) != first) {
        report.first_tensor = tensors[i].name;
        break;
      }
    }
  }
  std::string groups;
  for (size_t g = 0; g < report.groups.size(); ++g) {
    std::string ranks;
    for (int r : report.groups[g]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    groups += (g ? "; " : "") + std::string("rank(s) ") + ranks + " hold " +
              hex_of(distinct[g]).substr(0, 16);
  }
  report.message = "weights differ across ranks after step " + std::to_string(step) +
                   ": first differing tensor '" + report.first_tensor + "'; " + groups + " (" +
                   digest_mode_name(resolve(mode, tensors)) + ")";
  return report;
}

}  // namespace

const char* digest_mode_name(DigestMode mode) {
  return name_of(kDigestModeNames, mode);
}

std::vector<NamedTensor> fingerprint_tensors(const torch::nn::Module& module, bool buffers) {
  std::vector<NamedTensor> out;
  for (auto& [name, tensor] : module_tensors(module, buffers, "buffer "))
    out.push_back({name, tensor});
  return out;
}

std::string fingerprint_digest(const std::vector<NamedTensor>& tensors, DigestMode mode) {
  switch (resolve(mode, tensors)) {
    case DigestMode::kSha256:
      return sha256_stream(tensors);
    default:
      return digest_of(fingerprint_per_tensor(tensors, mode));
  }
}

std::vector<std::string> fingerprint_per_tensor(const std::vector<NamedTensor>& tensors,
                                                DigestMode mode) {
  const DigestMode resolved = resolve(mode, tensors);
  std::vector<std::string> out;
  for (const auto& t : tensors) out.push_back(tensor_digest(t.tensor, resolved));
  return out;
}

CheckHashing check_hashing_for(bool with_buffers) {
  return with_buffers ? CheckHashing::kInPlace : CheckHashing::kIdleThread;
}

PendingCheck::PendingCheck(ProcessGroup& pg, std::vector<NamedTensor> tensors, DigestMode mode,
                           int64_t step, CheckHashing hashing)
    : pg_(pg), tensors_(std::move(tensors)), mode_(mode), step_(step) {
  bool all_cpu = true;
  int64_t bytes = 0;
  for (const auto& t : tensors_) {
    all_cpu = all_cpu && t.tensor.is_cpu();
    bytes += t.tensor.nbytes();
  }
  if (hashing == CheckHashing::kIdleThread && all_cpu && bytes >= kIdleHashingMinBytes &&
      resolve(mode_, tensors_) == DigestMode::kXxh3) {
    std::vector<at::Tensor> host;
    for (const auto& t : tensors_) {
      host.push_back(host_bytes(t.tensor));
      hashed_bytes_ += host.back().nbytes();
    }
    hasher_ = &IdleHasher::instance();
    idle_job_ = hasher_->start(std::move(host));
    idle_ = true;
    return;
  }
  mine_ = fingerprint_digest(tensors_, mode_);
  gathering_ = pg_.allgather_async(as_bytes_tensor(mine_, kDigestBytes, pg_.device()));
}

PendingCheck::~PendingCheck() {
  if (idle_job_ != 0) hasher_->cancel(idle_job_);
}

void PendingCheck::close() {
  if (idle_job_ == 0) return;
  const uint64_t job = std::exchange(idle_job_, 0);
  per_tensor_ = hasher_->finish(job, &idle_bytes_);
  mine_ = digest_of(per_tensor_);  // = fingerprint_digest(tensors_, kXxh3)
  gathering_ = pg_.allgather_async(as_bytes_tensor(mine_, kDigestBytes, pg_.device()));
}

ConsistencyReport PendingCheck::finish() {
  close();
  pg_.wait(gathering_.work, "fingerprint all-gather #" + std::to_string(gathering_.sequence) +
                                " (step " + std::to_string(step_) + ")");
  return compare(pg_, tensors_, mode_, step_, mine_, gathering_.outputs, per_tensor_);
}

ConsistencyReport fingerprint_check(ProcessGroup& pg, const std::vector<NamedTensor>& tensors,
                                    DigestMode mode, int64_t step) {
  return PendingCheck(pg, tensors, mode, step).finish();
}

void fingerprint_enforce(ProcessGroup& pg, const ConsistencyReport& report, CheckPolicy policy,
                         const std::vector<NamedTensor>& tensors) {
  if (report.consistent) return;
  switch (policy) {
    case CheckPolicy::kAbort:
      throw ConsistencyError(report.message);
    case CheckPolicy::kWarn:
      spdlog::error("consistency check: {} (policy: warn)", report.message);
      return;
    case CheckPolicy::kResync: {
      spdlog::error("consistency check: {} -- RESYNCING every rank to rank 0's weights",
                    report.message);
      std::vector<at::Tensor> all;
      for (const auto& t : tensors) all.push_back(t.tensor.detach());
      broadcast_coalesced(pg, all, /*root=*/0);
      return;
    }
  }
}

ConsistencyReport check_weights(ProcessGroup& pg, const torch::nn::Module& module, int64_t step,
                                const WeightCheckOptions& options) {
  const auto tensors = fingerprint_tensors(module, options.buffers);
  auto report = fingerprint_check(pg, tensors, options.mode, step);
  fingerprint_enforce(pg, report, options.policy, tensors);
  return report;
}

}  // namespace lockstep
