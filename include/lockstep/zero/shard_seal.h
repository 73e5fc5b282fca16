// The weight check of fully sharded parameters (optim.zero 3; Note [Shard
// seal], shard_seal.cpp). Each weight lives on one rank, so there is no
// replica to compare across ranks; instead each owner seals its weights
// (one digest each) right after its optimizer step, and at the next check
// hashes them again: a weight that changed in between, outside the
// optimizer (a flipped bit, a stray write), is named with its rank.
#pragma once

#include <string>
#include <vector>

#include "lockstep/check/check_kinds.h"
#include "lockstep/check/fingerprint.h"
#include "lockstep/distributed/process_group.h"

namespace lockstep {

class ShardSeal {
 public:
  // `names`: every sharded parameter's, in the owners' order; `owners`: the
  // rank that holds each.
  ShardSeal(ProcessGroup& pg, std::vector<std::string> names, std::vector<int> owners,
            DigestMode mode);
  // After the optimizer step that completed step `done`: digests of this
  // rank's weights (`mine`: its own, each with its index in `names`).
  void seal(const std::vector<std::pair<size_t, at::Tensor>>& mine, int64_t done);
  // Collective: hashes this rank's weights again; every rank returns the
  // same report, naming the first changed weight (lowest rank first). A
  // rank with no seal yet reports consistent.
  ConsistencyReport verify(const std::vector<std::pair<size_t, at::Tensor>>& mine, int64_t step);

 private:
  std::vector<std::string> digests(const std::vector<std::pair<size_t, at::Tensor>>& mine) const;

  ProcessGroup& pg_;
  std::vector<std::string> names_;
  std::vector<int> owners_;
  DigestMode mode_;
  std::vector<std::string> sealed_;  // by position in `mine`
  int64_t sealed_at_ = -1;
};

}  // namespace lockstep
