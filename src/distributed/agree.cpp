#include "lockstep/distributed/agree.h"

#include <ATen/ATen.h>

#include <cstring>

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
  if (pg.rank() == 0) {
    try {
      body();
    } catch (const Error& e) {
      problem = std::string(e.what()).substr(0, kMaxMessage);
      if (problem.empty()) problem = "rank 0 failed without a message";
    }
  }
  if (pg.size() == 1) return problem;
  auto message = at::zeros({static_cast<int64_t>(kMaxMessage + 8)}, at::kByte);
  const int64_t length = static_cast<int64_t>(problem.size());
  std::memcpy(message.data_ptr<uint8_t>(), &length, sizeof(length));
  std::memcpy(message.data_ptr<uint8_t>() + 8, problem.data(), problem.size());
  message = message.to(pg.device());
  pg.broadcast(message, 0);
  message = message.cpu();
  int64_t got = 0;
  std::memcpy(&got, message.data_ptr<uint8_t>(), sizeof(got));
  got = std::max<int64_t>(0, std::min<int64_t>(got, kMaxMessage));
  return std::string(reinterpret_cast<const char*>(message.data_ptr<uint8_t>()) + 8,
                     static_cast<std::size_t>(got));
}

}  // namespace lockstep
