#include "lockstep/distributed/agree.h"

#include <ATen/ATen.h>

#include <cstring>
#include <exception>
#include <tuple>

#include "lockstep/util/error.h"

namespace lockstep {
namespace {

std::vector<double> reduce(ProcessGroup& pg, const std::vector<double>& values, ReduceKind op) {
  auto t = at::tensor(values, at::kDouble).to(pg.device());
  pg.allreduce(t, op);
  t = t.cpu();
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

int64_t reduce(ProcessGroup& pg, int64_t value, ReduceKind op) {
  auto t = at::full({1}, value, at::kLong).to(pg.device());
  pg.allreduce(t, op);
  return t.cpu().item<int64_t>();
}

constexpr std::size_t kMaxDigest = 64;
constexpr std::size_t kMaxMessage = 4096;

// An error's class as one byte, and back (agree_on_failure, rank0_outcome).
enum class ErrorKind : uint8_t {
  kNone,
  kConfig,
  kData,
  kStorage,
  kEnv,
  kUsage,
  kTraining,
  kConsistency,
  kComm,
  kTimeout,
  kSystem,
  kOutOfMemory,
  kInternal  // InternalError, and anything that is not a lockstep::Error
};

ErrorKind kind_of(const std::exception& e) {
  if (dynamic_cast<const ConfigError*>(&e)) return ErrorKind::kConfig;
  if (dynamic_cast<const StorageError*>(&e)) return ErrorKind::kStorage;
  if (dynamic_cast<const DataError*>(&e)) return ErrorKind::kData;
  if (dynamic_cast<const EnvError*>(&e)) return ErrorKind::kEnv;
  if (dynamic_cast<const UsageError*>(&e)) return ErrorKind::kUsage;
  if (dynamic_cast<const TrainingError*>(&e)) return ErrorKind::kTraining;
  if (dynamic_cast<const ConsistencyError*>(&e)) return ErrorKind::kConsistency;
  if (dynamic_cast<const TimeoutError*>(&e)) return ErrorKind::kTimeout;
  if (dynamic_cast<const CommError*>(&e)) return ErrorKind::kComm;
  if (dynamic_cast<const SystemError*>(&e)) return ErrorKind::kSystem;
  if (is_out_of_memory(e)) return ErrorKind::kOutOfMemory;
  return ErrorKind::kInternal;
}

[[noreturn]] void throw_as(ErrorKind kind, const std::string& what) {
  switch (kind) {
    case ErrorKind::kConfig:
      throw ConfigError(what);
    case ErrorKind::kData:
      throw DataError(what);
    case ErrorKind::kStorage:
      throw StorageError(what);
    case ErrorKind::kEnv:
      throw EnvError(what);
    case ErrorKind::kUsage:
      throw UsageError(what);
    case ErrorKind::kTraining:
      throw TrainingError(what);
    case ErrorKind::kConsistency:
      throw ConsistencyError(what);
    case ErrorKind::kTimeout:
      throw TimeoutError(what);
    case ErrorKind::kComm:
      throw CommError(what);
    case ErrorKind::kSystem:
      throw SystemError(what);
    case ErrorKind::kOutOfMemory:
      throw OutOfMemoryError(what);
    case ErrorKind::kNone:
    case ErrorKind::kInternal:
      break;
  }
  throw InternalError(what);
}

// Broadcasts (kind, message) from `root`; every rank returns root's.
std::pair<ErrorKind, std::string> share_error(ProcessGroup& pg, int root, ErrorKind kind,
                                              const std::string& problem) {
  auto message = at::zeros({static_cast<int64_t>(kMaxMessage + 9)}, at::kByte);
  if (pg.rank() == root) {
    const int64_t length = static_cast<int64_t>(std::min(problem.size(), kMaxMessage));
    std::memcpy(message.data_ptr<uint8_t>(), &length, sizeof(length));
    message.data_ptr<uint8_t>()[8] = static_cast<uint8_t>(kind);
    std::memcpy(message.data_ptr<uint8_t>() + 9, problem.data(), static_cast<size_t>(length));
  }
  message = message.to(pg.device());
  pg.broadcast(message, root);
  message = message.cpu();
  int64_t got = 0;
  std::memcpy(&got, message.data_ptr<uint8_t>(), sizeof(got));
  got = std::max<int64_t>(0, std::min<int64_t>(got, kMaxMessage));
  const uint8_t k = message.data_ptr<uint8_t>()[8];
  return {k <= static_cast<uint8_t>(ErrorKind::kInternal) ? static_cast<ErrorKind>(k)
                                                          : ErrorKind::kInternal,
          std::string(reinterpret_cast<const char*>(message.data_ptr<uint8_t>()) + 9,
                      static_cast<std::size_t>(got))};
}

}  // namespace

std::vector<double> sum_over_ranks(ProcessGroup& pg, const std::vector<double>& values) {
  return reduce(pg, values, ReduceKind::kSum);
}

std::vector<double> max_over_ranks(ProcessGroup& pg, const std::vector<double>& values) {
  return reduce(pg, values, ReduceKind::kMax);
}

int64_t max_over_ranks(ProcessGroup& pg, int64_t value) {
  return reduce(pg, value, ReduceKind::kMax);
}

int64_t min_over_ranks(ProcessGroup& pg, int64_t value) {
  return reduce(pg, value, ReduceKind::kMin);
}

std::vector<int> ranks_differing_from_rank0(ProcessGroup& pg, const std::string& digest) {
  if (digest.size() > kMaxDigest)
    throw std::invalid_argument("ranks_differing_from_rank0: a digest of " +
                                std::to_string(digest.size()) + " bytes (at most 64)");
  auto mine = at::zeros({static_cast<int64_t>(kMaxDigest + 1)}, at::kByte);
  mine[0] = static_cast<int64_t>(digest.size());
  std::memcpy(mine.data_ptr<uint8_t>() + 1, digest.data(), digest.size());
  const auto all = pg.allgather(mine.to(pg.device()));
  const auto first = all[0].cpu();
  std::vector<int> differ;
  for (int r = 1; r < pg.size(); ++r)
    if (!at::equal(all[r].cpu(), first)) differ.push_back(r);
  return differ;
}

std::string rank0_outcome(ProcessGroup& pg, const std::function<void()>& body) {
  std::string problem;
  ErrorKind kind = ErrorKind::kNone;
  std::exception_ptr failure;  // not a verdict: rethrown on rank 0 after the others learn it
  if (pg.rank() == 0) {
    try {
      body();
    } catch (const Error& e) {
      problem = std::string(e.what()).substr(0, kMaxMessage);
      if (problem.empty()) problem = "rank 0 failed without a message";
      kind = ErrorKind::kConfig;  // a verdict, whatever its class
    } catch (const std::exception& e) {
      problem = "rank 0: " + what_of(e);
      kind = ErrorKind::kInternal;
      failure = std::current_exception();
    }
  }
  if (pg.size() > 1) std::tie(kind, problem) = share_error(pg, 0, kind, problem);
  if (failure) std::rethrow_exception(failure);
  if (kind == ErrorKind::kInternal) throw InternalError(problem);
  return problem;
}

void agree_on_failure(ProcessGroup& pg, const std::function<void()>& body) {
  std::exception_ptr failure;
  ErrorKind kind = ErrorKind::kNone;
  std::string problem;
  try {
    body();
  } catch (const std::exception& e) {
    failure = std::current_exception();
    kind = kind_of(e);
    problem = what_of(e);
  }
  if (pg.size() == 1) {
    if (failure) std::rethrow_exception(failure);
    return;
  }
  const int64_t first = min_over_ranks(pg, failure ? int64_t{pg.rank()} : int64_t{pg.size()});
  if (first >= pg.size()) return;
  const auto [k, words] = share_error(pg, static_cast<int>(first), kind, problem);
  if (first == pg.rank()) std::rethrow_exception(failure);
  throw_as(k, "rank " + std::to_string(first) + ": " + words);
}

}  // namespace lockstep
