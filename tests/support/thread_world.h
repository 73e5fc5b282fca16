// Ranks as threads over one in-memory c10d::HashStore (Gloo's own tests do
// the same). Catch2 assertions are not thread-safe: each rank's body returns
// its result and the test asserts on the main thread.
#pragma once

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <cstdlib>
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

// The backend the tests run on: LOCKSTEP_TEST_BACKEND (auto, gloo, shm),
// auto when unset (shm: the threads share one host). CTest runs the
// collective and DDP tests once more with gloo forced.
inline BackendKind test_backend() {
  const char* name = std::getenv("LOCKSTEP_TEST_BACKEND");
  return name == nullptr ? BackendKind::kAuto
                         : parse_named(kBackendKindNames, name, "LOCKSTEP_TEST_BACKEND");
}

template <typename Result>
std::vector<RankOutcome<Result>> run_ranks(
    int world_size, const std::function<Result(ProcessGroup&)>& body,
    std::chrono::milliseconds timeout = std::chrono::seconds(60),
    BackendKind backend = test_backend(), const std::function<void(int rank)>& before_create = {}) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<RankOutcome<Result>> outcomes(world_size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        // E.g. pinning the rank's thread: the backend's threads, made by
        // ProcessGroup::create, inherit its CPU mask.
        if (before_create) before_create(rank);
        WorldInfo world;
        world.rank = rank;
        world.world_size = world_size;
        world.local_rank = rank;
        world.local_world_size = world_size;
        world.master_addr = "127.0.0.1";
        ProcessGroupOptions options;
        options.timeout = timeout;
        options.backend = backend;
        options.shm_chunk_bytes = 64 * 1024;  // small: tensors of the tests span several chunks
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
