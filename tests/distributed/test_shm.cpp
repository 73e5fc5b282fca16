// The shared-memory backend (Note [Shared-memory backend]): every
// collective against its closed form for every reduce op and dtype, sizes
// smaller than the rank count and spanning several chunks, 1 to 8 ranks;
// the same bits as Gloo; a missing rank fails the collective after the
// timeout; no segment is left in /dev/shm, and orphans are removed.
#include <ATen/ATen.h>
#include "support/catch.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "distributed/shm_reduce.h"
#include "distributed/shm_segment.h"
#include "distributed/shm_store_choice.h"
#include "lockstep/distributed/shm_backend.h"
#include "lockstep/util/error.h"
#include "lockstep/util/hex.h"
#include "support/thread_world.h"

using namespace lockstep;
using lockstep::testing::Contains;
using lockstep::testing::error_text;
using lockstep::testing::run_ranks;

namespace {

const auto kShm = BackendKind::kShm;
const auto kTimeout = std::chrono::seconds(60);

// Rank r's value at index i: small integers, exact in every dtype.
at::Tensor values(int rank, int64_t n, at::ScalarType dtype) {
  return (at::arange(n, at::kLong).remainder(5) + rank + 1).to(dtype);
}

at::Tensor closed_form(int world, int64_t n, at::ScalarType dtype, ReduceKind op) {
  auto acc = values(0, n, at::kDouble);
  for (int r = 1; r < world; ++r) {
    const auto v = values(r, n, at::kDouble);
    if (op == ReduceKind::kSum || op == ReduceKind::kAvg) acc = acc + v;
    if (op == ReduceKind::kMin) acc = at::minimum(acc, v);
    if (op == ReduceKind::kMax) acc = at::maximum(acc, v);
    if (op == ReduceKind::kProduct) acc = acc * v;
  }
  if (op == ReduceKind::kAvg) {
    acc = at::isIntegralType(dtype, false) ? at::div(acc, world, "trunc") : acc / world;
  }
  return acc.to(dtype);
}

std::vector<std::string> our_segments() {
  std::vector<std::string> out;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return out;
  const std::string suffix = "-" + std::to_string(getpid());
  while (dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name.rfind("lockstep-", 0) == 0 && name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      out.push_back(name);
  }
  closedir(dir);
  return out;
}

// Sets LOCKSTEP_SHM_STREAMING for its lifetime; restores the value it had
// (or its absence), also when a check throws.
class StreamingEnv {
 public:
  explicit StreamingEnv(const char* value) {
    if (const char* was = std::getenv(kName)) was_ = was;
    if (value == nullptr)
      unsetenv(kName);
    else
      setenv(kName, value, 1);
  }
  ~StreamingEnv() {
    if (was_)
      setenv(kName, was_->c_str(), 1);
    else
      unsetenv(kName);
  }
  StreamingEnv(const StreamingEnv&) = delete;
  StreamingEnv& operator=(const StreamingEnv&) = delete;

 private:
  static constexpr const char* kName = "LOCKSTEP_SHM_STREAMING";
  std::optional<std::string> was_;
};

}  // namespace

TEST_CASE("shm: all-reduce equals the closed form for every op and dtype", "[shm]") {
  const std::vector<at::ScalarType> dtypes{at::kFloat,    at::kDouble, at::kHalf,
                                           at::kBFloat16, at::kInt,    at::kLong};
  const std::vector<ReduceKind> ops{ReduceKind::kSum, ReduceKind::kAvg, ReduceKind::kMin,
                                    ReduceKind::kMax, ReduceKind::kProduct};
  for (int n : {1, 2, 3, 4}) {
    DYNAMIC_SECTION(n << " ranks") {
      // 3 elements is fewer than 4 ranks; 70001 float32 span five 64 KiB chunks.
      auto outcomes = run_ranks<std::string>(
          n,
          [&](ProcessGroup& pg) {
            std::string wrong;
            for (auto dtype : dtypes) {
              for (auto op : ops) {
                if (op == ReduceKind::kProduct && (dtype == at::kHalf || dtype == at::kBFloat16))
                  continue;
                for (int64_t numel : {int64_t{1}, int64_t{3}, int64_t{1000}, int64_t{70001}}) {
                  auto t = values(pg.rank(), numel, dtype);
                  pg.allreduce(t, op);
                  if (!at::equal(t, closed_form(pg.size(), numel, dtype, op)))
                    wrong += std::string(c10::toString(dtype)) + " " + reduce_kind_name(op) +
                             " n=" + std::to_string(numel) + "; ";
                }
              }
            }
            return wrong;
          },
          kTimeout, kShm);
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r << ": " << error_text(outcomes[r].error));
        REQUIRE_FALSE(outcomes[r].error);
        CHECK(outcomes[r].result == "");
      }
    }
  }
}

TEST_CASE("shm: 8 ranks, async all-reduces in flight, broadcast, all-gather, barrier", "[shm]") {
  const int n = 8;
  auto outcomes = run_ranks<std::string>(
      n,
      [&](ProcessGroup& pg) {
        std::string wrong;
        // Three all-reduces in flight at once, finished in order.
        std::vector<at::Tensor> ts;
        std::vector<Ptr<C10dWork>> works;
        for (int k = 0; k < 3; ++k) {
          ts.push_back(values(pg.rank(), 20000 + k, at::kFloat));
          works.push_back(pg.allreduce_async(ts.back(), ReduceKind::kSum));
        }
        for (int k = 0; k < 3; ++k) {
          pg.wait(works[k], "allreduce");
          if (!at::equal(ts[k], closed_form(n, 20000 + k, at::kFloat, ReduceKind::kSum)))
            wrong += "async; ";
        }
        for (int root : {0, 5}) {
          auto t = pg.rank() == root ? at::arange(100001, at::kDouble)
                                     : at::zeros({100001}, at::kDouble);
          pg.broadcast(t, root);
          if (!at::equal(t, at::arange(100001, at::kDouble))) wrong += "broadcast; ";
        }
        const auto gathered = pg.allgather(at::full({33333}, pg.rank(), at::kLong));
        for (int r = 0; r < n; ++r)
          if (!at::equal(gathered[r], at::full({33333}, r, at::kLong))) wrong += "allgather; ";
        pg.barrier();
        // A strided view is reduced in place.
        auto base = values(pg.rank(), 400, at::kFloat).reshape({20, 20});
        auto view = base.t();
        pg.allreduce(view, ReduceKind::kMax);
        if (!at::equal(base, closed_form(n, 400, at::kFloat, ReduceKind::kMax).reshape({20, 20})))
          wrong += "strided; ";
        if (!our_segments().empty()) wrong += "a segment is still named in /dev/shm; ";
        return wrong;
      },
      kTimeout, kShm);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << error_text(outcomes[r].error));
    REQUIRE_FALSE(outcomes[r].error);
    CHECK(outcomes[r].result == "");
  }
  CHECK(our_segments().empty());
}

TEST_CASE(
    "shm: works waited for last-first are run in issue order by the waiting thread, and a wait "
    "from inside a collective's callback is refused, not hung",
    "[shm]") {
  auto outcomes = run_ranks<std::string>(
      2,
      [&](ProcessGroup& pg) {
        std::string wrong;
        // Note [Waiting runs the queue]: five all-reduces, the last waited
        // for first; every one equals its closed form (issue order kept:
        // a swapped pair would add the wrong sizes' buffers and throw).
        std::vector<at::Tensor> ts;
        std::vector<Ptr<C10dWork>> works;
        for (int k = 0; k < 5; ++k) {
          ts.push_back(values(pg.rank(), 1000 + 7 * k, at::kFloat));
          works.push_back(pg.allreduce_async(ts.back(), ReduceKind::kSum));
        }
        for (int k = 4; k >= 0; --k) {
          pg.wait(works[k], "allreduce");
          if (!at::equal(ts[k], closed_form(2, 1000 + 7 * k, at::kFloat, ReduceKind::kSum)))
            wrong += "all-reduce " + std::to_string(k) + " wrong; ";
        }
        // A callback of `first` that waits for `second`, issued after it,
        // could never see it done (the queue runs `first`'s callbacks
        // before `second`): refused with a UsageError. Rank 1 comes late,
        // so rank 0's `first` is surely still pending when its callback is
        // added (a callback added to a finished future runs at once, on
        // the caller, where the wait is fine).
        if (pg.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
        auto a = values(pg.rank(), 64, at::kFloat), b = values(pg.rank(), 64, at::kFloat);
        auto first = pg.allreduce_async(a, ReduceKind::kSum);
        auto second = pg.allreduce_async(b, ReduceKind::kSum);
        std::string refused;
        first->getFuture()->addCallback([&](c10::ivalue::Future&) {
          try {
            second->wait();
          } catch (const UsageError& e) {
            refused = e.what();
          }
        });
        pg.wait(second, "allreduce");
        pg.wait(first, "allreduce");
        if (pg.rank() == 0 &&
            refused.find("waited for from inside another collective") == std::string::npos)
          wrong += "callback's wait not refused (" + refused + "); ";
        if (!at::equal(b, closed_form(2, 64, at::kFloat, ReduceKind::kSum))) wrong += "second; ";
        return wrong;
      },
      kTimeout, kShm);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << error_text(outcomes[r].error));
    REQUIRE_FALSE(outcomes[r].error);
    CHECK(outcomes[r].result == "");
  }
}

TEST_CASE("shm: sums of two ranks are the same bits as Gloo's", "[shm]") {
  auto run = [](BackendKind kind) {
    return run_ranks<at::Tensor>(
        2,
        [](ProcessGroup& pg) {
          auto gen = at::detail::createCPUGenerator(7 + pg.rank());
          auto t = at::randn({300001}, gen, at::kFloat);
          pg.allreduce(t, ReduceKind::kSum);
          return t;
        },
        kTimeout, kind);
  };
  const auto shm = run(kShm);
  const auto gloo = run(BackendKind::kGloo);
  for (int r = 0; r < 2; ++r) {
    REQUIRE_FALSE(shm[r].error);
    REQUIRE_FALSE(gloo[r].error);
    CHECK(at::equal(shm[r].result, gloo[r].result));
  }
}

TEST_CASE("shm: a rank that never joins fails the collective after the timeout, naming it",
          "[shm]") {
  const auto start = std::chrono::steady_clock::now();
  auto outcomes = run_ranks<int>(
      2,
      [](ProcessGroup& pg) {
        if (pg.rank() == 1) {
          std::this_thread::sleep_for(std::chrono::seconds(4));  // alive, but never joins
          return 0;
        }
        auto t = at::ones({10});
        pg.allreduce(t, ReduceKind::kSum);
        return 1;
      },
      std::chrono::seconds(2), kShm);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(outcomes[0].error);
  CHECK_THAT(error_text(outcomes[0].error),
             Contains("shm backend: rank 1 did not arrive within the timeout"));
  CHECK_THROWS_AS(std::rethrow_exception(outcomes[0].error), CommError);
  CHECK(took < 4 + 10);
}

TEST_CASE("shm: a rank that died is seen at once, whether or not its parent reaped it", "[shm]") {
  const std::string name = "/lockstep-test-" + random_hex(8) + "-" + std::to_string(getpid());
  auto segment = ShmSegment::create(name, 2, 4096);
  ShmSegment::unlink(name);  // the mapping is what the two processes share
  segment.publish_pid(0);
  const pid_t child = fork();
  if (child == 0) {  // rank 1: arrives once, then dies without leaving
    segment.publish_pid(1);
    segment.arrive(1, 1);
    usleep(200 * 1000);
    _exit(0);
  }
  REQUIRE(child > 0);
  for (int i = 0; i < 500 && segment.pid_of(1) != child; ++i) usleep(10 * 1000);
  REQUIRE(segment.pid_of(1) == child);
  segment.watch_peers(0);
  const std::atomic<bool> stop{false};
  segment.arrive(0, 1);
  CHECK(segment.wait_all(1, std::chrono::steady_clock::now() + std::chrono::seconds(10), stop,
                         std::chrono::microseconds(1000)) == "");
  // Generation 2 never comes: rank 1 has exited and, not yet reaped, is a
  // zombie whose pid still answers kill(pid, 0).
  const auto start = std::chrono::steady_clock::now();
  segment.arrive(0, 2);
  const std::string why =
      segment.wait_all(2, std::chrono::steady_clock::now() + std::chrono::seconds(10), stop,
                       std::chrono::microseconds(1000));
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(why == "rank 1 (pid " + std::to_string(child) + ") died");
  CHECK(took < 3);
  CHECK(kill(child, 0) == 0);  // still there to signal: a zombie
  // Without pidfds (kernels before 5.3) /proc decides, and a zombie has ended.
  CHECK_FALSE(ShmSegment::process_running(child));
  CHECK(ShmSegment::process_running(getpid()));
  int status = 0;
  CHECK(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
}

TEST_CASE("shm: a segment left by a killed job is removed by the next", "[shm]") {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);  // a pid that is gone
  const std::string orphan = "/lockstep-0123456789abcdef01234567-" + std::to_string(child);
  const int fd = shm_open(orphan.c_str(), O_CREAT | O_RDWR, 0600);
  REQUIRE(fd >= 0);
  close(fd);
  auto outcomes = run_ranks<int>(
      2, [](ProcessGroup&) { return 0; }, kTimeout, kShm);
  REQUIRE_FALSE(outcomes[0].error);
  const int again = shm_open(orphan.c_str(), O_RDWR, 0600);
  CHECK(again < 0);
  if (again >= 0) {
    close(again);
    shm_unlink(orphan.c_str());
  }
}

namespace {

// Ranks as threads, `hosts` x `per_host`, numbered host by host, on `backend`.
template <typename Result>
std::vector<testing::RankOutcome<Result>> run_hosts(
    int hosts, int per_host, BackendKind backend,
    const std::function<Result(ProcessGroup&)>& body) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const int n = hosts * per_host;
  std::vector<testing::RankOutcome<Result>> outcomes(n);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        WorldInfo world;
        world.rank = rank;
        world.world_size = n;
        world.local_rank = rank % per_host;
        world.local_world_size = per_host;
        world.node_rank = rank / per_host;
        world.master_addr = "127.0.0.1";
        ProcessGroupOptions options;
        options.backend = backend;
        options.timeout = std::chrono::seconds(60);
        options.shm_chunk_bytes = 64 * 1024;
        outcomes[rank].result = body(*ProcessGroup::create(store, world, options));
      } catch (...) {
        outcomes[rank].error = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return outcomes;
}

}  // namespace

TEST_CASE("hierarchical: shm inside hosts, gloo between them, equals the closed forms", "[shm]") {
  for (auto [hosts, per_host] : {std::pair{2, 2}, std::pair{3, 2}, std::pair{2, 3}}) {
    DYNAMIC_SECTION(hosts << " hosts x " << per_host << " ranks") {
      const int n = hosts * per_host;
      auto outcomes =
          run_hosts<std::string>(hosts, per_host, BackendKind::kAuto, [&](ProcessGroup& pg) {
            std::string wrong;
            if (pg.kind() != BackendKind::kHier)
              wrong += std::string("auto chose ") + backend_kind_name(pg.kind()) + "; ";
            for (auto dtype : {at::kFloat, at::kDouble, at::kLong}) {
              for (auto op : {ReduceKind::kSum, ReduceKind::kAvg, ReduceKind::kMin,
                              ReduceKind::kMax, ReduceKind::kProduct}) {
                for (int64_t numel : {int64_t{1}, int64_t{5}, int64_t{70001}}) {
                  auto t = values(pg.rank(), numel, dtype);
                  pg.allreduce(t, op);
                  if (!at::equal(t, closed_form(n, numel, dtype, op)))
                    wrong += std::string(c10::toString(dtype)) + " " + reduce_kind_name(op) + "; ";
                }
              }
            }
            for (int root = 0; root < n; ++root) {
              auto t = pg.rank() == root ? at::arange(1000, at::kFloat) + root
                                         : at::zeros({1000}, at::kFloat);
              pg.broadcast(t, root);
              if (!at::equal(t, at::arange(1000, at::kFloat) + root))
                wrong += "broadcast from " + std::to_string(root) + "; ";
            }
            const auto gathered = pg.allgather(at::full({3001}, pg.rank(), at::kLong));
            for (int r = 0; r < n; ++r)
              if (!at::equal(gathered[r], at::full({3001}, r, at::kLong))) wrong += "allgather; ";
            pg.barrier();
            return wrong;
          });
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r << ": " << error_text(outcomes[r].error));
        REQUIRE_FALSE(outcomes[r].error);
        CHECK(outcomes[r].result == "");
      }
    }
  }
}

// Note [Streaming into the slots], Note [Choosing the stores].
TEST_CASE("shm: streaming and plain stores give the same bits in every collective", "[shm]") {
  // 3 ranks: shares and chunk pieces start off 64-byte lines (odd sizes),
  // so the streamed copies' plain heads and tails are used too.
  const int n = 3;
  auto run = [&](const char* streaming) {
    const StreamingEnv env(streaming);
    auto outcomes = run_ranks<std::vector<at::Tensor>>(
        n,
        [&](ProcessGroup& pg) {
          auto gen = at::detail::createCPUGenerator(11 + pg.rank());
          std::vector<at::Tensor> got;
          auto sum = at::randn({300001}, gen, at::kFloat);
          pg.allreduce(sum, ReduceKind::kSum);
          got.push_back(sum);
          auto avg = at::randn({70001}, gen, at::kDouble);
          pg.allreduce(avg, ReduceKind::kAvg);
          got.push_back(avg);
          auto out = at::empty({50001}, at::kFloat);
          pg.reduce_scatter(out, at::randn({n * 50001}, gen, at::kFloat));
          got.push_back(out);
          for (const auto& t : pg.allgather(at::randn({70001}, gen, at::kFloat))) got.push_back(t);
          auto b = at::randn({100003}, gen, at::kFloat);
          pg.broadcast(b, 1);
          got.push_back(b);
          const ShmStoreCounts counts = shm_store_counts(pg.backend());
          got.push_back(at::tensor({counts.streamed, counts.measured}, at::kLong));
          return got;
        },
        kTimeout, kShm);
    return outcomes;
  };
  // What each rank drew, in the same order, for the closed forms.
  std::vector<std::vector<at::Tensor>> drawn(n);
  for (int r = 0; r < n; ++r) {
    auto gen = at::detail::createCPUGenerator(11 + r);
    drawn[r].push_back(at::randn({300001}, gen, at::kFloat));
    drawn[r].push_back(at::randn({70001}, gen, at::kDouble));
    drawn[r].push_back(at::randn({n * 50001}, gen, at::kFloat));
    drawn[r].push_back(at::randn({70001}, gen, at::kFloat));
    drawn[r].push_back(at::randn({100003}, gen, at::kFloat));
  }
  // Sums in rank order, as the backend adds.
  const auto sum = drawn[0][0] + drawn[1][0] + drawn[2][0];
  const auto avg = (drawn[0][1] + drawn[1][1] + drawn[2][1]) / n;
  // Streamed and timed operations among the four that choose (the two
  // all-reduces, the reduce-scatter, the all-gather; a broadcast does not),
  // all of 64 KiB or more: "on" streams all and times none, "off" neither;
  // "auto" times all four, and each, the first of its size class, streams.
  const std::map<std::string, std::vector<int64_t>> counts{
      {"on", {4, 0}}, {"off", {0, 0}}, {"auto", {4, 4}}};
  for (const char* streaming : {"on", "off", "auto"}) {
    INFO("LOCKSTEP_SHM_STREAMING=" << streaming);
    const auto outcomes = run(streaming);
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r << ": " << error_text(outcomes[r].error));
      REQUIRE_FALSE(outcomes[r].error);
      const auto& got = outcomes[r].result;
      REQUIRE(got.size() == static_cast<std::size_t>(5 + n));
      const auto* c = got[4 + n].data_ptr<int64_t>();
      CHECK(std::vector<int64_t>{c[0], c[1]} == counts.at(streaming));
      CHECK(at::equal(got[0], sum));
      CHECK(at::equal(got[1], avg));
      const auto piece = [&](int q) { return drawn[q][2].slice(0, r * 50001, (r + 1) * 50001); };
      CHECK(at::equal(got[2], piece(0) + piece(1) + piece(2)));
      for (int q = 0; q < n; ++q) CHECK(at::equal(got[3 + q], drawn[q][3]));
      CHECK(at::equal(got[3 + n], drawn[1][4]));
    }
  }
}

TEST_CASE("shm: a streamed copy is memcpy at every alignment and length", "[shm]") {
  std::vector<unsigned char> from(4096 + 64), to(4096 + 64 + 64);
  for (std::size_t i = 0; i < from.size(); ++i) from[i] = static_cast<unsigned char>(i * 7 + 3);
  std::string wrong;
  for (std::size_t at_to : {0, 1, 16, 63}) {
    for (std::size_t at_from : {0, 5}) {
      for (std::size_t len : {0, 1, 63, 64, 65, 128, 1000, 4096}) {
        std::fill(to.begin(), to.end(), 0xAB);
        shm_stream_copy(to.data() + at_to, from.data() + at_from, len);
        bool ok = std::memcmp(to.data() + at_to, from.data() + at_from, len) == 0;
        for (std::size_t i = 0; i < to.size(); ++i)
          if ((i < at_to || i >= at_to + len) && to[i] != 0xAB) ok = false;  // nothing else
        if (!ok)
          wrong += std::to_string(at_to) + "/" + std::to_string(at_from) + "/" +
                   std::to_string(len) + "; ";
      }
    }
  }
  CHECK(wrong == "");
  // The public form `bench allreduce` times: the same copy where the CPU
  // streams, and nothing written where it does not.
  std::fill(to.begin(), to.end(), 0xAB);
  const bool streamed = shm_copy_streaming(to.data() + 1, from.data() + 5, 4000);
  CHECK(streamed == shm_streaming_supported());
  if (streamed) {
    CHECK(std::memcmp(to.data() + 1, from.data() + 5, 4000) == 0);
    CHECK(to[0] == 0xAB);  // nothing outside the range
    CHECK(std::count(to.begin() + 4001, to.end(), 0xAB) == static_cast<long>(to.size() - 4001));
  } else {
    CHECK(std::count(to.begin(), to.end(), 0xAB) == static_cast<long>(to.size()));
  }
}

TEST_CASE("shm: a reduction with a streamed output writes the same values and nothing else",
          "[shm]") {
  // Two float inputs; outputs[0] (the streamed one, as the segment's result
  // area) and outputs[1] at byte offsets that start off a 64-byte line,
  // guarded by sentinels, against the same reduction with plain stores.
  constexpr std::size_t kMax = 1003, kPad = 64;
  std::vector<float> a(kMax), b(kMax);
  for (std::size_t i = 0; i < kMax; ++i) {
    a[i] = 0.1f * static_cast<float>(i) - 7.0f;
    b[i] = 1.0f / static_cast<float>(i + 3);
  }
  const void* inputs[2] = {a.data(), b.data()};
  std::string wrong;
  for (std::size_t shift : {0, 4, 16, 20, 60}) {
    for (std::size_t count : {0, 1, 15, 16, 17, 100, 1003}) {
      // Buffers of floats, 64-aligned; the outputs start `shift` bytes in.
      std::vector<float> plain0(kMax + 2 * kPad), plain1(kMax + 2 * kPad);
      std::vector<float> got0(kMax + 2 * kPad, -1.0f), got1(kMax + 2 * kPad, -1.0f);
      const auto at = [&](std::vector<float>& v) {
        auto base = reinterpret_cast<std::uintptr_t>(v.data() + kPad / 2);
        base = (base + 63) / 64 * 64 + shift;
        return reinterpret_cast<float*>(base);
      };
      void* plain[2] = {at(plain0), at(plain1)};
      void* streamed[2] = {at(got0), at(got1)};
      shm_reduce_lines({inputs, 2, plain, 2, 0u}, count, c10::ScalarType::Float, ShmOp::kSum, 0.5);
      shm_reduce_lines({inputs, 2, streamed, 2, 1u}, count, c10::ScalarType::Float, ShmOp::kSum,
                       0.5);
      bool ok = std::memcmp(plain[0], streamed[0], count * sizeof(float)) == 0 &&
                std::memcmp(plain[1], streamed[1], count * sizeof(float)) == 0;
      for (auto* v : {&got0, &got1}) {
        const float* first = at(*v);
        for (const float& x : *v)
          if ((&x < first || &x >= first + count) && x != -1.0f) ok = false;  // nothing else
      }
      if (!ok) wrong += std::to_string(shift) + "/" + std::to_string(count) + "; ";
    }
  }
  CHECK(wrong == "");
}

TEST_CASE("shm: the stores are chosen by measured time, and re-tried", "[shm]") {
  const std::size_t big = std::size_t{1} << 20;
  SECTION("each kind tried twice, then the faster, the other every kExplore-th time") {
    ShmStoreChoice choice;
    CHECK_FALSE(choice.stream(ShmStoreChoice::kMinBytes - 1));  // small: plain, not counted
    for (int k = 0; k < 4; ++k) {
      const bool s = choice.stream(big);
      CHECK(s == (k % 2 == 0));  // streamed, plain, streamed, plain
      choice.took(big, s, s ? 1e-3 : 3e-3);
    }
    CHECK(choice.ns_per_byte(big, true) == Approx(1e6 / big));
    CHECK(choice.ns_per_byte(big, false) == Approx(3e6 / big));
    // Calls 4..35: streaming, except calls 16 and 32, which try plain.
    std::vector<uint64_t> plain;
    for (uint64_t call = 4; call < 4 + 2 * ShmStoreChoice::kExplore; ++call) {
      const bool s = choice.stream(big);
      choice.took(big, s, s ? 1e-3 : 3e-3);
      if (!s) plain.push_back(call);
    }
    CHECK(plain == std::vector<uint64_t>{16, 32});
    // Another size class has its own record: it starts over.
    CHECK(choice.stream(4 * big));
  }
  // `host(call, streamed)`: the seconds an operation takes. Returns the
  // first call from `from` on that used `want` other than to explore.
  const auto follow = [&](ShmStoreChoice& choice, uint64_t from, bool want,
                          const std::function<double(uint64_t, bool)>& host) {
    uint64_t found = 0;
    for (uint64_t call = 0; call < 200; ++call) {
      const bool s = choice.stream(big);
      choice.took(big, s, host(call, s));
      if (found == 0 && call >= from && s == want && call % ShmStoreChoice::kExplore != 0)
        found = call;
    }
    return found;
  };
  SECTION("a kind that became faster is taken at its first exploration") {
    ShmStoreChoice choice;
    // Streaming 1 ms throughout; plain 3 ms, then 0.5 ms from call 40.
    const auto at = follow(choice, 40, false, [](uint64_t call, bool s) {
      return s ? 1e-3 : (call < 40 ? 3e-3 : 0.5e-3);
    });
    CHECK(at == 49);  // explored at 48, taken from 49
  }
  SECTION("a kind in use that became slower is left within kKept operations") {
    ShmStoreChoice choice;
    // Plain 1 ms, then 5 ms from call 40; streaming 3 ms throughout.
    const auto at = follow(choice, 40, true, [](uint64_t call, bool s) {
      return s ? 3e-3 : (call < 40 ? 1e-3 : 5e-3);
    });
    CHECK(at == 44);  // four slow times replace the four fast ones
  }
  SECTION("one slow time (interference) does not change the choice") {
    ShmStoreChoice choice;
    // Streaming 1 ms but 10 ms at call 20; plain 3 ms.
    const auto at = follow(choice, 4, false, [](uint64_t call, bool s) {
      return s ? (call == 20 ? 10e-3 : 1e-3) : 3e-3;
    });
    CHECK(at == 0);  // plain never taken but to explore
  }
  SECTION("on and off fix it") {
    ShmStoreChoice on(ShmStreaming::kOn), off(ShmStreaming::kOff);
    for (int k = 0; k < 40; ++k) {
      CHECK(on.stream(k % 2 == 0 ? big : 100));
      CHECK_FALSE(off.stream(big));
      on.took(big, true, 1.0);
      off.took(big, false, 1e-9);
    }
    CHECK(on.ns_per_byte(big, true) == 0.0);  // not measured when fixed
  }
  SECTION("LOCKSTEP_SHM_STREAMING") {
    const auto with = [](const char* v) {
      const StreamingEnv env(v);
      return shm_streaming_from_env();
    };
    CHECK(with(nullptr) == ShmStreaming::kAuto);
    CHECK(with("") == ShmStreaming::kAuto);
    CHECK(with("auto") == ShmStreaming::kAuto);
    CHECK(with("on") == ShmStreaming::kOn);
    CHECK(with("1") == ShmStreaming::kOn);
    CHECK(with("off") == ShmStreaming::kOff);
    CHECK(with("0") == ShmStreaming::kOff);
    CHECK_THROWS_WITH(with("yes"),
                      Contains("LOCKSTEP_SHM_STREAMING='yes': expected auto, on (1) or off (0)"));
  }
}

// Note [A peer on the same core]. Each rank's thread pinned to a CPU
// before its group is made (the backend's worker thread inherits the
// mask): on one CPU a waiter sleeps at once at (nearly) every barrier, as
// the rank it waits for cannot run while it spins; on two CPUs it never
// does. The sums still equal the closed form either way.
TEST_CASE("shm: a rank waits for a peer on its own CPU by sleeping and not spinning", "[shm]") {
  if (sched_getcpu() < 0) {
    WARN("sched_getcpu() fails here: the backend spins for every peer, nothing to test");
    return;
  }
  cpu_set_t mask;
  CPU_ZERO(&mask);
  REQUIRE(sched_getaffinity(0, sizeof(mask), &mask) == 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c)
    if (CPU_ISSET(c, &mask)) cpus.push_back(c);
  const int ops = 200;
  // Waits without a spin over `ops` all-reduces of 4 KiB (one chunk: two
  // barriers each), with rank r's thread on placement[r].
  auto run = [&](std::vector<int> placement) {
    const auto pin = [&](int rank) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(placement[rank], &one);
      if (pthread_setaffinity_np(pthread_self(), sizeof(one), &one) != 0)
        throw std::runtime_error("pthread_setaffinity_np failed");
    };
    return run_ranks<int64_t>(
        2,
        [&](ProcessGroup& pg) {
          // The CPUs published while the group was set up are not counted.
          const int64_t before = shm_shared_core_waits(pg.backend());
          for (int i = 0; i < ops; ++i) {
            auto t = values(pg.rank(), 1024, at::kFloat);
            pg.allreduce(t, ReduceKind::kSum);
            if (!at::equal(t, closed_form(2, 1024, at::kFloat, ReduceKind::kSum)))
              throw std::runtime_error("all-reduce " + std::to_string(i) + " is wrong");
          }
          return shm_shared_core_waits(pg.backend()) - before;
        },
        kTimeout, kShm, pin);
  };
  SECTION("both ranks on one CPU") {
    const auto outcomes = run({cpus[0], cpus[0]});
    int64_t total = 0;
    for (const auto& o : outcomes) {
      INFO(error_text(o.error));
      REQUIRE_FALSE(o.error);
      total += o.result;
    }
    // At every barrier one rank arrives first and finds the other not
    // there: ~2 x ops such waits. Half of them leaves room for a rank
    // preempted between its arrival and its look at the other's flag.
    CHECK(total >= ops);
    CHECK(total <= 2 * ops);
  }
  SECTION("ranks on two CPUs") {
    if (cpus.size() < 2) {
      WARN("one CPU in this process's affinity mask: the two-CPU case is not run");
      return;
    }
    const auto outcomes = run({cpus[0], cpus[1]});
    for (const auto& o : outcomes) {
      INFO(error_text(o.error));
      REQUIRE_FALSE(o.error);
      CHECK(o.result == 0);
    }
  }
}
