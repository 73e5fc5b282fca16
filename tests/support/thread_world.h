// Ranks as threads over one in-memory c10d::HashStore (Gloo's own tests do
// the same). Catch2 assertions are not thread-safe: each rank's body returns
// its result and the test asserts on the main thread.
#pragma once

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "lockstep/distributed/process_group.h"

namespace lockstep::testing {

template <typename Result>
struct RankOutcome {
  Result result{};
  std::exception_ptr error;
};

template <typename Result>
std::vector<RankOutcome<Result>> run_ranks(
    int world_size, const std::function<Result(ProcessGroup&)>& body,
    std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<RankOutcome<Result>> outcomes(world_size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        WorldInfo world;
        world.rank = rank;
        world.world_size = world_size;
        world.local_rank = rank;
        world.local_world_size = world_size;
        world.master_addr = "127.0.0.1";
        ProcessGroupOptions options;
        options.timeout = timeout;
        auto pg = ProcessGroup::create(store, world, options);
        outcomes[rank].result = body(*pg);
      } catch (...) {
        outcomes[rank].error = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return outcomes;
}

inline std::string error_text(const std::exception_ptr& error) {
  if (!error) return "";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace lockstep::testing
