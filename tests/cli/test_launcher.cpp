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
#include "lockstep/util/progress.h"

using namespace lockstep::launch;
using lockstep::testing::Contains;
using namespace lockstep;

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

TEST_CASE("progress: records round-trip, hostile lines are refused", "[launcher][progress]") {
  ProgressRecord r;
  r.step = 150;
  r.total = 500;
  r.epoch = 2;
  r.loss = 1.2345;
  r.units = 245760;
  r.tokens = true;
  const std::string line = progress_record_line(r);
  CHECK(line == "progress step=150 total=500 epoch=2 loss=1.2345 units=245760 unit=tokens\n");
  const auto back = parse_progress_record(line.substr(0, line.size() - 1));
  REQUIRE(back);
  CHECK(back->step == 150);
  CHECK(back->total == 500);
  CHECK(back->epoch == 2);
  CHECK(back->loss == 1.2345);
  CHECK(back->units == 245760);
  CHECK(back->tokens);
  const char* bad[] = {
      "",
      "progress",
      "progress step=1 total=2 epoch=1 loss=1 units=0",                      // a key missing
      "progress step=3 total=2 epoch=1 loss=1 units=0 unit=samples",         // step > total
      "progress step=1 step=1 total=2 epoch=1 loss=1 units=0 unit=samples",  // repeated
      "progress step=-1 total=2 epoch=1 loss=1 units=0 unit=samples",        // negative
      "progress step=1 total=99999999999999999999 epoch=1 loss=1 units=0 unit=samples",
      "progress step=1 total=2 epoch=0 loss=1 units=0 unit=samples",  // epochs from 1
      "progress step=1 total=2 epoch=1 loss=nan units=0 unit=samples",
      "progress step=1 total=2 epoch=1 loss=1 units=0 unit=bytes",
      "progress step=1 total=2 epoch=1 loss=1 units=0 unit=samples extra=1",
      "progress step=1x total=2 epoch=1 loss=1 units=0 unit=samples",
      "[rank0]: progress step=1 total=2 epoch=1 loss=1 units=0 unit=samples",
  };
  for (const char* text : bad) {
    INFO(text);
    CHECK_FALSE(parse_progress_record(text));
  }
  CHECK_FALSE(parse_progress_record("progress step=1 total=2 epoch=1 loss=1 units=0 unit=samples" +
                                    std::string(300, ' ')));
}

TEST_CASE("progress: the line's rate and ETA over the records' window", "[launcher][progress]") {
  CHECK(duration_text(7) == "0:07");
  CHECK(duration_text(754) == "12:34");
  CHECK(duration_text(3723) == "1:02:03");
  ProgressView view;
  CHECK(view.render(120, 0).empty());
  ProgressRecord r;
  r.total = 500;
  r.tokens = true;
  r.step = 100;  // a resumed run: the first record is at step 100
  r.units = 0;
  view.update(r, 5.0);
  CHECK_THAT(view.render(120, 5.0), Contains("step 100/500 20% | ETA ? | 0:00 elapsed | epoch 1"));
  r.step = 150;  // 50 steps and 200,000 tokens in 10 s: 0.2 s a step, 350 left
  r.units = 200000;
  r.loss = 2.5;
  view.update(r, 15.0);
  const std::string line = view.render(120, 15.0);
  CHECK(line ==
        "[######..............] step 150/500 30% | ETA 1:10 | 0:10 elapsed | loss 2.5000 | "
        "20.0k tokens/s | epoch 1");
  // A narrow terminal: no bar, the tail cut, never a wrap.
  const std::string narrow = view.render(40, 15.0);
  CHECK(narrow == "step 150/500 30% | ETA 1:10 | 0:10 elap");
  CHECK(narrow.size() == 39);
  r.step = 500;
  r.units = 900000;
  view.update(r, 85.0);
  CHECK_THAT(view.render(120, 85.0), Contains("step 500/500 100% | done | 1:20 elapsed"));
  CHECK(view.render(120, 85.0).rfind("[####################] ", 0) == 0);
}
