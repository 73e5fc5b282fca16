// Weight fingerprints: a bit-exact digest of a model's tensors, and the
// cross-rank check built on it ("are the weights on every rank the same?").
//
// Modes (all bit-exact: any flipped bit changes the digest):
//   xxh3     - XXH3-128 streamed over every tensor's raw bytes, in order.
//              Memory speed; the default for CPU tensors.
//   checksum - per tensor, two position-weighted sums of the elements' bit
//              patterns in wrapping int64 arithmetic, computed with tensor
//              ops where the tensor lives (no copy to the host for CUDA):
//              integer addition is associative, so the result does not
//              depend on reduction order. The default for CUDA tensors.
//   sha256   - SHA-256 streamed over every tensor's contiguous bytes in
//              order: for CPU float tensors exactly Python's
//              hashlib.sha256 over p.detach().numpy().tobytes() for p in
//              model.parameters(), so digests can be compared with Python.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/distributed/process_group.h"
#include "lockstep/util/names.h"

namespace torch::nn {
class Module;
}

namespace lockstep {

enum class DigestMode { kAuto, kXxh3, kChecksum, kSha256 };
inline constexpr NameTable<DigestMode, 4> kDigestModeNames{{{DigestMode::kAuto, "auto"},
                                                            {DigestMode::kXxh3, "xxh3"},
                                                            {DigestMode::kChecksum, "checksum"},
                                                            {DigestMode::kSha256, "sha256"}}};
DigestMode digest_mode_parse(const std::string& name);  // auto|xxh3|checksum|sha256
const char* digest_mode_name(DigestMode mode);

struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};

// Parameters in registration order (the state_dict's), then, when asked,
// buffers (prefixed "buffer ").
std::vector<NamedTensor> fingerprint_tensors(const torch::nn::Module& module, bool buffers);

// One digest (raw bytes) over all tensors, in order.
std::string fingerprint_digest(const std::vector<NamedTensor>& tensors, DigestMode mode);
// One digest per tensor (used to find which tensor differs).
std::vector<std::string> fingerprint_per_tensor(const std::vector<NamedTensor>& tensors,
                                                DigestMode mode);
std::string to_hex(const std::string& bytes);

enum class CheckPolicy { kAbort, kWarn, kResync };
inline constexpr NameTable<CheckPolicy, 3> kCheckPolicyNames{{{CheckPolicy::kAbort, "abort"},
                                                              {CheckPolicy::kWarn, "warn"},
                                                              {CheckPolicy::kResync, "resync"}}};
CheckPolicy check_policy_parse(const std::string& name);  // abort|warn|resync

struct ConsistencyReport {
  bool consistent = true;
  int64_t step = 0;
  std::string digest_hex;                     // rank 0's digest
  std::vector<std::string> rank_digests_hex;  // every rank's, by rank
  std::string first_tensor;                   // on mismatch: the first tensor that differs
  std::vector<std::vector<int>> groups;       // on mismatch: ranks grouped by digest
  std::string message;                        // on mismatch: step, tensor, ranks
};

// Collective: all-gathers the digest and compares. On mismatch, exchanges
// per-tensor digests to name the first differing tensor and groups the
// ranks. Every rank returns the same report.
ConsistencyReport fingerprint_check(ProcessGroup& pg, const std::vector<NamedTensor>& tensors,
                                    DigestMode mode, int64_t step);

// The same check split in two so that its all-gather overlaps the next
// step's forward and backward: start() digests the tensors now and starts
// the all-gather; finish() waits and compares (exchanging per-tensor digests
// on a mismatch, so the tensors must still hold the checked values: call it
// before the next optimizer step). Both are collectives.
class PendingCheck {
 public:
  PendingCheck(ProcessGroup& pg, std::vector<NamedTensor> tensors, DigestMode mode, int64_t step);
  ConsistencyReport finish();

 private:
  ProcessGroup& pg_;
  std::vector<NamedTensor> tensors_;
  DigestMode mode_;
  int64_t step_;
  std::string mine_;
  ProcessGroup::Gathering gathering_;
};

// Applies `policy` to a report: abort throws ConsistencyError; warn logs;
// resync broadcasts rank 0's tensors (coalesced) and logs loudly.
void fingerprint_enforce(ProcessGroup& pg, const ConsistencyReport& report, CheckPolicy policy,
                         const std::vector<NamedTensor>& tensors);

}  // namespace lockstep
