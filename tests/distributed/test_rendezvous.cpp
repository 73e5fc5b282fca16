// Rendezvous through a real TCPStore: success, an unreachable master, and a
// rank that never arrives. Each failure must come within the timeout and
// name what was wrong.
#include "support/catch.h"

#include <chrono>
#include <thread>

#include "lockstep/distributed/rendezvous.h"
#include "lockstep/util/error.h"
#include "support/local_world.h"

using namespace lockstep;
using lockstep::testing::two_local_ranks;
using Clock = std::chrono::steady_clock;

namespace {

// A port nobody listens on: bind to 0, read it, close.
int unused_port() {
  c10d::TCPStoreOptions options = tcp_store_options();
  options.port = 0;
  options.isServer = true;
  options.waitWorkers = false;
  c10d::TCPStore probe("127.0.0.1", options);
  return probe.getPort();
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

TEST_CASE("two ranks meet through rank 0's TCPStore", "[rendezvous]") {
  const int port = unused_port();
  Ptr<C10dStore> stores[2];
  std::thread client([&] { stores[1] = rendezvous_connect(two_local_ranks(1, port), {}); });
  stores[0] = rendezvous_connect(two_local_ranks(0, port), {});
  client.join();
  stores[0]->set("k", std::vector<uint8_t>{42});
  CHECK(stores[1]->get("k") == std::vector<uint8_t>{42});
}

TEST_CASE("an unreachable master fails within the timeout, naming host:port", "[rendezvous]") {
  const int port = unused_port();
  RendezvousOptions options;
  options.timeout = std::chrono::seconds(2);
  const auto start = Clock::now();
  try {
    rendezvous_connect(two_local_ranks(1, port), options);
    FAIL("rendezvous with nobody listening succeeded");
  } catch (const TimeoutError& e) {
    CHECK_THAT(e.what(), lockstep::testing::Contains("127.0.0.1:" + std::to_string(port)));
    CHECK_THAT(e.what(), lockstep::testing::Contains("rank 1 could not reach the store"));
  }
  CHECK(seconds_since(start) < 2 + 10);
}

TEST_CASE("a rank that never arrives is named when the rendezvous times out", "[rendezvous]") {
  RendezvousOptions options;
  options.timeout = std::chrono::seconds(2);
  const auto start = Clock::now();
  try {
    rendezvous_connect(two_local_ranks(0, unused_port()), options);
    FAIL("rendezvous without rank 1 succeeded");
  } catch (const TimeoutError& e) {
    CHECK_THAT(e.what(), lockstep::testing::Contains("rank(s) 1 did not arrive"));
  }
  CHECK(seconds_since(start) < 2 + 10);
}

TEST_CASE("world size 1 needs no network", "[rendezvous]") {
  WorldInfo single;
  auto store = rendezvous_connect(single, {});
  store->set("k", std::vector<uint8_t>{1});
  CHECK(store->check({"k"}));
}
