// lockstep-run's pure parts (src/cli/launcher.h): the environment each worker
// gets (torchrun's contract and the store secret), the flags it refuses, and
// the line splitter that keeps the relay's memory bounded. The processes
// themselves are tested in tests/multiproc/launcher.sh.
#include "support/catch.h"

#include <map>
#include <string>

#include "cli/launcher.h"
#include "cli/process_tree.h"
#include "lockstep/util/error.h"

using namespace lockstep::launch;
using lockstep::testing::Contains;

TEST_CASE("launcher: each worker gets torchrun's environment and the job's secret", "[launcher]") {
  LaunchOptions o;
  o.nproc_per_node = 4;
  o.nnodes = 3;
  o.node_rank = 2;
  o.master_addr = "10.0.0.1";
  o.max_restarts = 5;
  o.store_secret = "0123456789abcdef0123";
  const auto list =
      worker_environment(o, /*rank=*/9, /*local_rank=*/1, /*master_port=*/29511, /*attempt=*/2);
  std::map<std::string, std::string> env(list.begin(), list.end());
  CHECK(env.size() == list.size());  // no variable set twice
  CHECK(env["RANK"] == "9");
  CHECK(env["WORLD_SIZE"] == "12");
  CHECK(env["LOCAL_RANK"] == "1");
  CHECK(env["LOCAL_WORLD_SIZE"] == "4");
  CHECK(env["GROUP_RANK"] == "2");
  CHECK(env["GROUP_WORLD_SIZE"] == "3");
  CHECK(env["ROLE_RANK"] == "9");
  CHECK(env["ROLE_WORLD_SIZE"] == "12");
  CHECK(env["MASTER_ADDR"] == "10.0.0.1");
  CHECK(env["MASTER_PORT"] == "29511");
  CHECK(env["TORCHELASTIC_RESTART_COUNT"] == "2");
  CHECK(env["TORCHELASTIC_MAX_RESTARTS"] == "5");
  CHECK(env["TORCHELASTIC_USE_AGENT_STORE"] == "False");
  CHECK(env["LOCKSTEP_STORE_SECRET"] == "0123456789abcdef0123");
  CHECK(env["LOCKSTEP_LINES_TAGGED"] == "1");
  // The launch's mark on every process of the job (Note [Launch id]).
  o.launch_id = "inner0123";
  const auto own = worker_environment(o, 9, 1, 29511, 2);
  CHECK(std::map<std::string, std::string>(own.begin(), own.end())["LOCKSTEP_LAUNCH_ID"] ==
        "inner0123");
  o.enclosing_launch_ids = "outer4567";  // a lockstep-run that is another's worker
  const auto nested = worker_environment(o, 9, 1, 29511, 2);
  CHECK(std::map<std::string, std::string>(nested.begin(), nested.end())["LOCKSTEP_LAUNCH_ID"] ==
        "outer4567:inner0123");
}

TEST_CASE("launcher: a process belongs to a launch only if its environment names the launch's id",
          "[launcher]") {
  using namespace std::string_literals;
  const std::string block = "PATH=/bin\0LOCKSTEP_LAUNCH_ID=outer4567:inner0123\0HOME=/root\0"s;
  CHECK(environ_carries_launch_id(block, "inner0123"));
  CHECK(environ_carries_launch_id(block, "outer4567"));
  // Never a prefix, a suffix, another variable's value, or an empty id.
  CHECK_FALSE(environ_carries_launch_id(block, "inner012"));
  CHECK_FALSE(environ_carries_launch_id(block, "nner0123"));
  CHECK_FALSE(environ_carries_launch_id(block, "/root"));
  CHECK_FALSE(environ_carries_launch_id(block, ""));
  CHECK_FALSE(environ_carries_launch_id("X_LOCKSTEP_LAUNCH_ID=inner0123\0"s, "inner0123"));
  CHECK(environ_carries_launch_id("LOCKSTEP_LAUNCH_ID=inner0123"s, "inner0123"));  // no final NUL
}

TEST_CASE("launcher: inconsistent flags are refused by name", "[launcher]") {
  LaunchOptions o;
  o.command = {"true"};
  CHECK_NOTHROW(launch_validate(o));
  o.nnodes = 2;
  o.node_rank = 2;
  CHECK_THROWS_WITH(launch_validate(o), Contains("--node-rank=2 must be in [0, --nnodes=2)"));
  o.node_rank = 1;
  CHECK_THROWS_WITH(launch_validate(o), Contains("needs LOCKSTEP_STORE_SECRET"));
  o.store_secret = "a-secret-for-both-nodes";
  CHECK_NOTHROW(launch_validate(o));
  o.grace_s = 1e10;
  CHECK_THROWS_AS(launch_validate(o), lockstep::ConfigError);
  CHECK_THROWS_WITH(launch_validate(o), Contains("must be in [0, 86400] seconds"));
}

TEST_CASE("launcher: output is split into lines, and a line without end into bounded pieces",
          "[launcher]") {
  LineSplitter lines(8);
  auto out = lines.feed("ab\ncd", 5);
  REQUIRE(out.size() == 1);
  CHECK(out[0] == "ab");
  out = lines.feed("e\n\nf", 4);
  REQUIRE(out.size() == 2);
  CHECK(out[0] == "cde");
  CHECK(out[1] == "");
  // 20 bytes without a newline: two pieces of 8 now, 4 bytes held.
  out = lines.feed("0123456789abcdefghij", 20);
  REQUIRE(out.size() == 2);
  CHECK(out[0] == "f0123456");
  CHECK(out[1] == "789abcde");
  CHECK(lines.held() == 5);
  out = lines.finish();
  REQUIRE(out.size() == 1);
  CHECK(out[0] == "fghij");
  CHECK(lines.finish().empty());
  // Memory stays bounded however much arrives without a newline.
  LineSplitter big(64 * 1024);
  const std::string chunk(1 << 20, 'x');
  std::size_t pieces = 0;
  for (int i = 0; i < 16; ++i) {
    pieces += big.feed(chunk.data(), chunk.size()).size();
    CHECK(big.held() < 64 * 1024);
  }
  CHECK(pieces == 256);
}
