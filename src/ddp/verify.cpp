// verify_same_tensors: DDP's construction-time check that all ranks built
// the same model. Three small all-gathers, and every rank reaches the same
// verdict from the same gathered data, so all of them throw or none does.
//   1. the tensor count of each rank;
//   2. a 64-bit FNV-1a hash of "name|dtype|shape|requires_grad" per tensor,
//      padded to the largest count (requires_grad decides which parameters
//      the Reducer buckets: a rank-dependent flag would give ranks different
//      buckets, and Gloo would abort mid-collective);
//   3. only on mismatch: each rank's description of the first differing index.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

#include "lockstep/ddp/ddp.h"
#include "lockstep/util/error.h"

namespace lockstep {
namespace {

int64_t fnv1a(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return static_cast<int64_t>(hash >> 1);  // non-negative: 0 marks "absent"
}

std::string describe(const std::string& name, const at::Tensor& t) {
  std::string shape;
  for (auto d : t.sizes()) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
  return "'" + name + "' " + std::string(c10::toString(t.scalar_type())) + " [" + shape + "]" +
         (t.requires_grad() ? " requires_grad" : " without requires_grad");
}

constexpr int64_t kDescriptionBytes = 256;

}  // namespace

void verify_same_tensors(ProcessGroup& pg, const std::vector<std::string>& names,
                         const std::vector<at::Tensor>& tensors) {
  if (pg.size() == 1) return;
  const auto device = pg.device();
  const auto counts =
      pg.allgather(at::tensor({static_cast<int64_t>(tensors.size())}, at::kLong).to(device));
  int64_t most = 0;
  for (const auto& c : counts) most = std::max(most, c.cpu().item<int64_t>());

  auto hashes = at::zeros({std::max<int64_t>(most, 1)}, at::kLong);
  for (size_t i = 0; i < tensors.size(); ++i) {
    hashes[i] = fnv1a(describe(names[i], tensors[i]));
  }
  auto gathered = pg.allgather(hashes.to(device));
  for (auto& g : gathered) g = g.cpu();

  int64_t first = -1;
  for (int64_t i = 0; i < most && first < 0; ++i) {
    for (int r = 1; r < pg.size(); ++r) {
      if (gathered[r][i].item<int64_t>() != gathered[0][i].item<int64_t>()) first = i;
    }
  }
  if (first < 0) return;

  // Everyone agrees on `first`: exchange the human-readable descriptions.
  std::string mine = first < static_cast<int64_t>(tensors.size())
                         ? describe(names[first], tensors[first])
                         : "nothing (only " + std::to_string(tensors.size()) + " tensors)";
  mine.resize(kDescriptionBytes - 1, '\0');
  auto text = at::zeros({kDescriptionBytes}, at::kByte);
  std::memcpy(text.data_ptr<uint8_t>(), mine.data(), mine.size());
  auto descriptions = pg.allgather(text.to(device));
  auto read = [&](int r) {
    auto bytes = descriptions[r].cpu();
    return std::string(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()));
  };
  std::string message = "model mismatch across ranks at parameter/buffer #" +
                        std::to_string(first) + ": rank 0 has " + read(0);
  for (int r = 1; r < pg.size(); ++r) {
    if (gathered[r][first].item<int64_t>() != gathered[0][first].item<int64_t>()) {
      message += "; rank " + std::to_string(r) + " has " + read(r);
    }
  }
  message +=
      ". Every rank must construct the same model (names, dtypes, shapes and "
      "requires_grad) before DistributedDataParallel";
  throw ConfigError(message);
}

}  // namespace lockstep
