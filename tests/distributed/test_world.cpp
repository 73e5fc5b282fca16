// WorldInfo: each launcher convention, their precedence, and bad values;
// init_distributed's world outliving an error until it is reported.
#include "support/catch.h"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/distributed/init.h"
#include "lockstep/distributed/world.h"
#include "lockstep/util/error.h"
#include "lockstep/util/exit_codes.h"

using lockstep::env_from_map;
using lockstep::EnvError;
using lockstep::world_from_env;
using lockstep::WorldSource;

namespace {
// Catch2 v2's REQUIRE_THROWS_WITH needs a matcher: a substring is enough here.
using lockstep::testing::Contains;
}  // namespace

TEST_CASE("no launcher variables mean a single process", "[world]") {
  const auto w = world_from_env(env_from_map({}));
  CHECK(w.source == WorldSource::kSingle);
  CHECK(w.rank == 0);
  CHECK(w.world_size == 1);
  CHECK(w.is_single());
}

TEST_CASE("torchrun variables", "[world]") {
  const auto w = world_from_env(env_from_map({{"RANK", "5"},
                                              {"WORLD_SIZE", "8"},
                                              {"LOCAL_RANK", "1"},
                                              {"LOCAL_WORLD_SIZE", "4"},
                                              {"GROUP_RANK", "1"},
                                              {"MASTER_ADDR", "node0"},
                                              {"MASTER_PORT", "29500"},
                                              {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                              {"TORCHELASTIC_RESTART_COUNT", "2"}}));
  CHECK(w.source == WorldSource::kTorchrun);
  CHECK(w.rank == 5);
  CHECK(w.world_size == 8);
  CHECK(w.local_rank == 1);
  CHECK(w.local_world_size == 4);
  CHECK(w.node_rank == 1);
  CHECK(w.master_addr == "node0");
  CHECK(w.master_port == 29500);
  CHECK(w.use_agent_store);
  CHECK(w.restart_count == 2);
}

TEST_CASE("hand-set RANK/WORLD_SIZE describe one node", "[world]") {
  const auto w = world_from_env(env_from_map(
      {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1234"}}));
  CHECK(w.local_rank == 1);
  CHECK(w.local_world_size == 2);
  CHECK(w.node_rank == 0);
  CHECK_FALSE(w.use_agent_store);
}

TEST_CASE("slurm variables, with SLURM_TASKS_PER_NODE expanded per node", "[world]") {
  const auto w = world_from_env(env_from_map({{"SLURM_PROCID", "5"},
                                              {"SLURM_NTASKS", "7"},
                                              {"SLURM_LOCALID", "0"},
                                              {"SLURM_NODEID", "2"},
                                              {"SLURM_TASKS_PER_NODE", "2(x2),3"},
                                              {"MASTER_ADDR", "n0"},
                                              {"MASTER_PORT", "29500"}}));
  CHECK(w.source == WorldSource::kSlurm);
  CHECK(w.rank == 5);
  CHECK(w.world_size == 7);
  CHECK(w.node_rank == 2);
  CHECK(w.local_world_size == 3);
  REQUIRE_THROWS_WITH(world_from_env(env_from_map({{"SLURM_PROCID", "0"},
                                                   {"SLURM_NTASKS", "2"},
                                                   {"SLURM_NODEID", "3"},
                                                   {"SLURM_TASKS_PER_NODE", "1(x2)"},
                                                   {"MASTER_ADDR", "n0"},
                                                   {"MASTER_PORT", "1"}})),
                      Contains("SLURM_TASKS_PER_NODE='1(x2)' has no entry for SLURM_NODEID=3"));
}

TEST_CASE("open mpi variables", "[world]") {
  const auto w = world_from_env(env_from_map({{"OMPI_COMM_WORLD_RANK", "3"},
                                              {"OMPI_COMM_WORLD_SIZE", "4"},
                                              {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                              {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                              {"MASTER_ADDR", "n0"},
                                              {"MASTER_PORT", "29500"}}));
  CHECK(w.source == WorldSource::kOpenMpi);
  CHECK(w.rank == 3);
  CHECK(w.local_rank == 1);
  CHECK(w.node_rank == 1);
}

TEST_CASE("torchrun wins over slurm, slurm over open mpi", "[world]") {
  const std::map<std::string, std::string> slurm{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}};
  const std::map<std::string, std::string> mpi{{"OMPI_COMM_WORLD_RANK", "2"},
                                               {"OMPI_COMM_WORLD_SIZE", "4"}};
  std::map<std::string, std::string> all{{"RANK", "0"}, {"WORLD_SIZE", "1"}};
  all.insert(slurm.begin(), slurm.end());
  all.insert(mpi.begin(), mpi.end());
  CHECK(world_from_env(env_from_map(all)).source == WorldSource::kTorchrun);

  std::map<std::string, std::string> slurm_mpi = slurm;
  slurm_mpi.insert(mpi.begin(), mpi.end());
  slurm_mpi["MASTER_ADDR"] = "n0";
  slurm_mpi["MASTER_PORT"] = "1";
  const auto w = world_from_env(env_from_map(slurm_mpi));
  CHECK(w.source == WorldSource::kSlurm);
  CHECK(w.rank == 1);
}

TEST_CASE("bad values name the variable and the value", "[world]") {
  REQUIRE_THROWS_AS(world_from_env(env_from_map({{"RANK", "abc"}, {"WORLD_SIZE", "2"}})), EnvError);
  REQUIRE_THROWS_WITH(world_from_env(env_from_map({{"RANK", "abc"}, {"WORLD_SIZE", "2"}})),
                      Contains("RANK='abc' is not an integer"));
  REQUIRE_THROWS_WITH(
      world_from_env(env_from_map(
          {{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}})),
      Contains("RANK=2 must be smaller than the world size 2"));
  REQUIRE_THROWS_WITH(
      world_from_env(env_from_map({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}})),
      Contains("MASTER_PORT is not set"));
  REQUIRE_THROWS_WITH(
      world_from_env(env_from_map({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}})),
      Contains("MASTER_ADDR is not set"));
  REQUIRE_THROWS_WITH(
      world_from_env(env_from_map(
          {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}})),
      Contains("MASTER_PORT=70000 is out of range [1, 65535]"));
  REQUIRE_THROWS_WITH(world_from_env(env_from_map({{"RANK", "0"}})),
                      Contains("WORLD_SIZE is not set"));
  REQUIRE_THROWS_WITH(world_from_env(env_from_map({{"RANK", "0"},
                                                   {"WORLD_SIZE", "4"},
                                                   {"LOCAL_RANK", "2"},
                                                   {"LOCAL_WORLD_SIZE", "2"},
                                                   {"MASTER_ADDR", "h"},
                                                   {"MASTER_PORT", "1"}})),
                      Contains("LOCAL_RANK=2 must be smaller than the local world size 2"));
  REQUIRE_THROWS_WITH(
      world_from_env(env_from_map(
          {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"TORCHELASTIC_USE_AGENT_STORE", "maybe"}})),
      Contains("TORCHELASTIC_USE_AGENT_STORE='maybe' is not a boolean"));
  REQUIRE_THROWS_WITH(world_from_env(env_from_map({{"SLURM_PROCID", "0"}})),
                      Contains("SLURM_NTASKS is not set"));
  REQUIRE_THROWS_WITH(world_from_env(env_from_map({{"RANK", " 1"}, {"WORLD_SIZE", "2"}})),
                      Contains("RANK=' 1' is not an integer"));
}

namespace {
// Records each log line with whether the watched objects were all alive.
class WatchingSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit WatchingSink(std::function<bool()> alive) : alive_(std::move(alive)) {}
  std::vector<std::pair<std::string, bool>> lines;

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    lines.emplace_back(std::string(msg.payload.data(), msg.payload.size()), alive_());
  }
  void flush_() override {}

 private:
  std::function<bool()> alive_;
};
}  // namespace

// Note [Report before teardown]: a peer sees the group go at once, so the
// error line must come first; after it, nothing is held.
TEST_CASE("a failing rank reports its error before its process group goes", "[world]") {
  std::weak_ptr<lockstep::ProcessGroup> pg;
  c10::weak_intrusive_ptr<lockstep::C10dStore> store{c10::intrusive_ptr<lockstep::C10dStore>()};
  auto sink = std::make_shared<WatchingSink>([&] { return !pg.expired() && !store.expired(); });
  const auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("lockstep", sink));
  lockstep::InitOptions options;
  options.init_logging = false;
  const int code = lockstep::run_guarded("test", [&]() -> int {
    auto dist = lockstep::init_distributed(options);
    pg = dist.pg;
    store = c10::weak_intrusive_ptr<lockstep::C10dStore>(dist.store);
    throw lockstep::ConfigError("the cause");
  });
  spdlog::set_default_logger(previous);
  CHECK(code == lockstep::kExitBadInput);
  int reported = 0;
  for (const auto& [line, alive] : sink->lines) {
    if (line.find("the cause") == std::string::npos) continue;
    ++reported;
    CHECK(alive);
  }
  CHECK(reported == 1);
  CHECK(pg.expired());  // released once reported
  CHECK(store.expired());

  {  // no error: released with the object, nothing kept
    auto dist = lockstep::init_distributed(options);
    pg = dist.pg;
    REQUIRE_FALSE(pg.expired());
  }
  CHECK(pg.expired());

  // Made and ended while another exception unwinds (a destructor's work):
  // that unwinding is not this object's, so nothing is kept.
  struct DuringUnwinding {
    std::weak_ptr<lockstep::ProcessGroup>* watched;
    lockstep::InitOptions options;
    ~DuringUnwinding() {
      auto dist = lockstep::init_distributed(options);
      *watched = dist.pg;
    }
  };
  try {
    DuringUnwinding during{&pg, options};
    throw std::runtime_error("elsewhere");
  } catch (const std::runtime_error&) {
  }
  CHECK(pg.expired());
}
