// Weight fingerprints: a bit-exact digest of a model's tensors, and the
// cross-rank check built on it ("are the weights on every rank the same?").
//
// Modes (all bit-exact: any flipped bit changes the digest):
//   xxh3     - XXH3-128 of each tensor's raw bytes; the digest is XXH3-128
//              over those 16-byte digests, in order. Memory speed; the
//              default for CPU tensors.
//   checksum - per tensor, two position-weighted sums of the elements' bit
//              patterns in wrapping int64 arithmetic, computed with tensor
//              ops where the tensor lives (no copy to the host for CUDA):
//              integer addition is associative, so the result does not
//              depend on reduction order; the digest is XXH3-128 over them,
//              in order. The default for CUDA tensors.
//   sha256   - SHA-256 streamed over every tensor's contiguous bytes in
//              order: for CPU float tensors exactly Python's
//              hashlib.sha256 over p.detach().numpy().tobytes() for p in
//              model.parameters(), so digests can be compared with Python.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/check/check_kinds.h"
#include "lockstep/distributed/process_group.h"
#include "lockstep/util/hex.h"  // hex_of: digests as text

#include "lockstep/util/module_tensors.h"

namespace torch::nn {
class Module;
}

namespace lockstep {

const char* digest_mode_name(DigestMode mode);

// Parameters in registration order (the state_dict's), then, when asked,
// buffers (prefixed "buffer ").
std::vector<NamedTensor> fingerprint_tensors(const torch::nn::Module& module, bool buffers);

// One digest (raw bytes) over all tensors, in order.
std::string fingerprint_digest(const std::vector<NamedTensor>& tensors, DigestMode mode);
// One digest per tensor (used to find which tensor differs): xxh3 16 bytes,
// checksum 16, sha256 32.
std::vector<std::string> fingerprint_per_tensor(const std::vector<NamedTensor>& tensors,
                                                DigestMode mode);

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

// Where a PendingCheck hashes:
//   kInPlace   - in the constructor, whose all-gather then overlaps the
//                next step's forward and backward;
//   kIdleThread - on a thread of idle priority while the next step runs
//                (Note [Idle-priority hashing], src/check/idle_hasher.cpp);
//                close() hashes what is left and starts the all-gather.
//                XXH3 of CPU tensors of 1 MiB or more in all (others hash in
//                place), and the tensors must not change before close():
//                parameters and optimizer state qualify, BatchNorm buffers
//                (a forward updates them) do not.
enum class CheckHashing { kInPlace, kIdleThread };
class IdleHasher;  // src/check/idle_hasher.h

// The trainer's choice: the idle thread unless buffers are checked
// (`with_buffers`: a forward changes them before close()).
CheckHashing check_hashing_for(bool with_buffers);

// The same check split up so that it overlaps the next step's forward and
// backward: the constructor starts it (see CheckHashing); close() ends the
// hashing and starts the all-gather of the digests; finish() (close() first
// if not yet) waits and compares, exchanging per-tensor digests on a
// mismatch. The tensors must hold the checked values until close() (with
// CheckHashing::kInPlace: until finish(), which hashes them again per tensor
// on a mismatch). All three are collectives.
class PendingCheck {
 public:
  PendingCheck(ProcessGroup& pg, std::vector<NamedTensor> tensors, DigestMode mode, int64_t step,
               CheckHashing hashing = CheckHashing::kInPlace);
  ~PendingCheck();
  PendingCheck(const PendingCheck&) = delete;
  PendingCheck& operator=(const PendingCheck&) = delete;
  void close();
  ConsistencyReport finish();
  // Whether the tensors may change between close() and finish(): the
  // idle thread's per-tensor digests are kept for a mismatch.
  bool verdict_can_wait() const { return idle_; }
  // After close(): the bytes the idle thread hashed, of `hashed_bytes()`.
  size_t idle_bytes() const { return idle_bytes_; }
  size_t hashed_bytes() const { return hashed_bytes_; }

 private:
  ProcessGroup& pg_;
  std::vector<NamedTensor> tensors_;
  DigestMode mode_;
  int64_t step_;
  bool idle_ = false;                    // hashed on the idle thread
  IdleHasher* hasher_ = nullptr;         // the constructing thread's
  uint64_t idle_job_ = 0;                // its open job there, 0: none (closed)
  std::vector<std::string> per_tensor_;  // its per-tensor digests, from close()
  size_t idle_bytes_ = 0;
  size_t hashed_bytes_ = 0;
  std::string mine_;
  ProcessGroup::Gathering gathering_;
};

// The per-step check in a loop of one's own, in one call (collective):
//   lockstep::check_weights(*dist.pg, *net, step);   // throws ConsistencyError
// compares `module`'s parameters (and, with `buffers`, its buffers) across
// ranks and applies `policy`; returns the report (warn and resync go on).
struct WeightCheckOptions {
  bool buffers = false;
  DigestMode mode = DigestMode::kAuto;
  CheckPolicy policy = CheckPolicy::kAbort;
};
ConsistencyReport check_weights(ProcessGroup& pg, const torch::nn::Module& module, int64_t step,
                                const WeightCheckOptions& options = {});

// Applies `policy` to a report: abort throws ConsistencyError; warn logs;
// resync broadcasts rank 0's tensors (coalesced) and logs loudly.
void fingerprint_enforce(ProcessGroup& pg, const ConsistencyReport& report, CheckPolicy policy,
                         const std::vector<NamedTensor>& tensors);

}  // namespace lockstep
