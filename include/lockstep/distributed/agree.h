// Small agreements among ranks, in one place: "every rank holds the same
// value", "rank 0 decides and every rank learns the outcome", and reductions
// of a few scalars. Each is one collective; every rank must call it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/distributed/process_group.h"

namespace lockstep {

// Element-wise sum, maximum or minimum over the ranks of a few values.
std::vector<double> sum_over_ranks(ProcessGroup& pg, const std::vector<double>& values);
std::vector<double> max_over_ranks(ProcessGroup& pg, const std::vector<double>& values);
int64_t max_over_ranks(ProcessGroup& pg, int64_t value);
int64_t min_over_ranks(ProcessGroup& pg, int64_t value);

// The ranks whose `digest` (at most 64 bytes, e.g. a hash) differs from
// rank 0's, ascending; empty when every rank agrees.
std::vector<int> ranks_differing_from_rank0(ProcessGroup& pg, const std::string& digest);

// Runs `body` on rank 0 alone; then every rank returns the outcome: "" when
// it succeeded, else rank 0's error message (a lockstep::Error it threw; at
// most 4 KB), so that every rank stops with the same words. Any other
// exception on rank 0 (c10::Error, std::bad_alloc) is not a verdict but a
// failure: every rank throws InternalError with rank 0's words (rank 0 its
// own exception), at once rather than after the other ranks' timeout.
std::string rank0_outcome(ProcessGroup& pg, const std::function<void()>& body);

// Runs `body` on every rank; then, if any rank threw, every rank throws the
// error of the lowest rank that did, as the same lockstep::Error class
// (ConfigError, DataError, ...: the same exit code everywhere) and the same
// words, prefixed "rank r: " on the others; an exception that is not a
// lockstep::Error becomes InternalError. The rank that threw rethrows its
// own. For checks whose outcome may differ by rank (a rank validates only
// what it owns) but whose verdict must not: nobody leaves alone.
void agree_on_failure(ProcessGroup& pg, const std::function<void()>& body);

}  // namespace lockstep
