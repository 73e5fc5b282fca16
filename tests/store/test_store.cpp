// lockstep's rendezvous store (Note [Job store]): c10d's Store semantics,
// checked against c10d's own HashStore; the address it listens on; the
// secret; and what a stray or hostile connection can (not) do to it.
#include "support/catch.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "distributed/roll_call.h"
#include "lockstep/distributed/rendezvous.h"
#include "lockstep/store/job_store.h"
#include "lockstep/util/error.h"
#include "lockstep/util/hex.h"
#include "store/store_core.h"
#include "store/store_wire.h"
#include "support/local_world.h"

using namespace lockstep;
using lockstep::testing::Contains;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kSecret = "0123456789abcdef0123456789abcdef";

std::vector<uint8_t> bytes(const std::string& s) {
  return {s.begin(), s.end()};
}
std::string text(const std::vector<uint8_t>& v) {
  return {v.begin(), v.end()};
}

// A client of whatever listens on loopback port `port` (a squatter's too).
JobStoreOptions client_at(int port, const std::string& secret = kSecret) {
  JobStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.secret = secret;
  o.timeout = std::chrono::seconds(5);
  o.connect_timeout = std::chrono::seconds(5);
  return o;
}

JobStoreOptions client_of(const StoreServer& server, const std::string& secret = kSecret) {
  return client_at(server.port(), secret);
}

// Under a flood a rank retries until its rendezvous deadline (300 s by
// default); the tests give it 30 s, far more than it needs.
JobStoreOptions flood_client(const StoreServer& server) {
  auto o = client_of(server);
  o.connect_timeout = std::chrono::seconds(30);
  return o;
}

StoreServerOptions serve(std::string secret = kSecret) {
  StoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.secret = std::move(secret);
  return o;
}

// A server whose handshake room (64) is smaller than the crowds of the
// tests, so that eviction (Note [Store admission]) is what they exercise.
StoreServerOptions serve_crowded() {
  auto o = serve();
  o.max_unauthenticated = 64;
  return o;
}

// A raw TCP connection to the server, for the stray and hostile clients.
int raw_connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  return fd;
}

// A socket listening on a free loopback port (a squatter's), its port in `port`.
int loopback_listener(int& port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  REQUIRE(listen(fd, 4) == 0);
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  port = ntohs(a.sin_port);
  return fd;
}

// True when the server closed fd within `ms` (recv returns 0 or an error).
bool closed_within(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
  while (Clock::now() < deadline) {
    if (poll(&p, 1, 50) > 0) {
      char c;
      const ssize_t n = recv(fd, &c, 1, MSG_DONTWAIT);
      if (n <= 0) return true;
    }
  }
  return false;
}

// The client's half of the handshake (Note [Store handshake]) on a raw
// socket: returns the server's verdict byte, or 0 when it closed.
char raw_handshake(int fd, const std::string& secret) {
  namespace wire = store_wire;
  const std::string nonce = random_bytes(wire::kNonce);
  const std::string hello = std::string(wire::kMagic) + nonce;
  REQUIRE(send(fd, hello.data(), hello.size(), 0) == static_cast<ssize_t>(hello.size()));
  std::string answer(wire::kServerHello, '\0');
  if (recv(fd, answer.data(), answer.size(), MSG_WAITALL) != static_cast<ssize_t>(answer.size()))
    return 0;
  const std::string proof = wire::client_proof(secret, nonce, answer.substr(9, wire::kNonce));
  REQUIRE(send(fd, proof.data(), proof.size(), 0) == static_cast<ssize_t>(proof.size()));
  char verdict = 0;
  return recv(fd, &verdict, 1, 0) == 1 ? verdict : 0;
}

// Polls `done` for up to `ms`: the server counts what it sees on its thread.
template <class F>
bool eventually(F done, int ms = 3000) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The same sequence of operations, answers recorded as text.
std::vector<std::string> exercise(C10dStore& s) {
  std::vector<std::string> out;
  s.set("a", bytes("alpha"));
  out.push_back(text(s.get("a")));
  out.push_back(std::to_string(s.add("n", 3)));
  out.push_back(std::to_string(s.add("n", 5)));
  out.push_back(std::to_string(s.add("n", -10)));
  out.push_back(text(s.get("n")));
  out.push_back(text(s.compareSet("c", bytes(""), bytes("first"))));  // missing, empty expected
  out.push_back(text(s.compareSet("c", bytes("wrong"), bytes("second"))));  // mismatch: current
  out.push_back(text(s.compareSet("c", bytes("first"), bytes("third"))));   // match: desired
  out.push_back(text(s.compareSet("m", bytes("x"), bytes("y"))));           // missing, non-empty
  out.push_back(s.check({"a", "n"}) ? "both" : "not both");
  out.push_back(s.check({"a", "nope"}) ? "both" : "not both");
  out.push_back(std::to_string(s.getNumKeys()));
  out.push_back(s.deleteKey("a") ? "deleted" : "absent");
  out.push_back(s.deleteKey("a") ? "deleted" : "absent");
  out.push_back(std::to_string(s.getNumKeys()));
  s.set("a", bytes(std::string("\0\xff", 2)));
  out.push_back(text(s.get("a")));
  return out;
}

}  // namespace

TEST_CASE("job store: every operation answers as c10d's HashStore does", "[store]") {
  StoreServer server(serve());
  auto client = c10::make_intrusive<JobStore>(client_of(server));
  auto reference = c10::make_intrusive<c10d::HashStore>();
  const auto ours = exercise(*client);
  const auto theirs = exercise(*reference);
  CHECK(ours == theirs);
  CHECK(ours.at(2) == "8");
  CHECK(ours.at(4) == "-2");
  CHECK(ours.at(7) == "third");
  CHECK(ours.at(8) == "x");
  CHECK(server.stats().accepted == 1);
  CHECK(server.stats().refused == 0);
}

TEST_CASE("job store: a wait returns when another client sets the key, and times out naming it",
          "[store]") {
  StoreServer server(serve());
  auto waiter = c10::make_intrusive<JobStore>(client_of(server));
  auto setter = c10::make_intrusive<JobStore>(client_of(server));
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    setter->set("ready", bytes("1"));
  });
  auto start = Clock::now();
  waiter->wait({"ready"}, std::chrono::seconds(5));
  const double waited = seconds_since(start);
  later.join();
  CHECK(waited >= 0.15);
  CHECK(waited < 3);
  // get() waits too, as c10d's stores do.
  std::thread later2([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    setter->set("value", bytes("v"));
  });
  CHECK(text(waiter->get("value")) == "v");
  later2.join();

  start = Clock::now();
  try {
    waiter->wait({"never", "ready"}, std::chrono::milliseconds(300));
    FAIL("a wait for a key nobody sets returned");
  } catch (const TimeoutError& e) {
    CHECK_THAT(e.what(), Contains("never"));
  }
  CHECK(seconds_since(start) >= 0.25);
  CHECK(seconds_since(start) < 3);
  // The connection is still in step after a timed-out wait.
  CHECK(text(waiter->get("ready")) == "1");
  // A clone is a second connection to the same data.
  auto copy = waiter->clone();
  CHECK(text(copy->get("value")) == "v");
}

TEST_CASE("job store: refuses a client without the job's secret and serves the job", "[store]") {
  StoreServer server(serve());
  try {
    JobStore wrong(client_of(server, "ffffffffffffffffffffffffffffffff"));
    FAIL("a wrong secret was admitted");
  } catch (const ConfigError& e) {
    CHECK_THAT(e.what(), Contains("the secret differs from rank 0's"));
  }
  try {
    JobStore none(client_of(server, ""));
    FAIL("no secret was admitted");
  } catch (const ConfigError& e) {
    CHECK_THAT(e.what(), Contains("has none"));
  }
  // A secret that shares a prefix with the job's is no better.
  CHECK_THROWS_AS(JobStore(client_of(server, kSecret.substr(0, 31))), ConfigError);
  CHECK_THROWS_AS(JobStore(client_of(server, kSecret + "0")), ConfigError);
  CHECK(eventually([&] { return server.stats().refused == 4; }));
  CHECK(server.stats().refused == 4);
  JobStore good(client_of(server));
  good.set("k", bytes("v"));
  CHECK(text(good.get("k")) == "v");
  CHECK(server.stats().accepted == 1);
}

TEST_CASE("job store: a stray that announces a huge value and stalls costs bytes and blocks nobody",
          "[store]") {
  auto options = serve_crowded();
  options.hello_timeout = std::chrono::milliseconds(500);
  StoreServer server(options);

  // 1. Not our protocol: a 512 MiB length prefix, as if to c10d's TCPStore.
  const int stray = raw_connect(server.port());
  const uint32_t huge = 512u << 20;
  REQUIRE(send(stray, &huge, 4, 0) == 4);
  CHECK(closed_within(stray, 2000));
  close(stray);

  // 2. Our handshake with a proof made under another secret: refused.
  const int impostor = raw_connect(server.port());
  CHECK(raw_handshake(impostor, "another-secret-of-another-job") == store_wire::kHelloRefused);
  CHECK(closed_within(impostor, 2000));
  close(impostor);

  // 3. A hello begun and never finished: the job is served meanwhile, and the
  //    stray is cut off after hello_timeout.
  const int stalled = raw_connect(server.port());
  const std::string part = std::string(store_wire::kMagic) + "0123";
  REQUIRE(send(stalled, part.data(), part.size(), 0) == static_cast<ssize_t>(part.size()));
  const auto start = Clock::now();
  JobStore good(client_of(server));
  good.set("k", std::vector<uint8_t>(1 << 20, 7));
  CHECK(good.get("k").size() == (1u << 20));
  CHECK(seconds_since(start) < 0.4);  // before the stray's hello timeout
  CHECK(closed_within(stalled, 3000));
  close(stalled);

  // 4. Connections still in their hello are bounded: the oldest go first.
  std::vector<int> crowd;
  for (int i = 0; i < 100; ++i) crowd.push_back(raw_connect(server.port()));
  JobStore second(client_of(server));
  CHECK(text(second.get("k")).size() == (1u << 20));
  for (int fd : crowd) close(fd);

  // What the strays made the server hold: the job's own 1 MiB and its
  // buffers, nothing in proportion to what they announced.
  CHECK(server.stats().peak_buffered_bytes < (std::size_t{8} << 20));
  CHECK(server.stats().refused >= 3 + 36);
}

TEST_CASE("job store: an oversized request is refused without being held, and the client goes on",
          "[store]") {
  auto options = serve();
  options.max_frame_bytes = 4096;
  options.max_total_bytes = 10000;
  StoreServer server(options);
  JobStore good(client_of(server));

  // A request announced at 1 GiB whose bytes keep coming: answered with an
  // error at once, its bytes discarded as they arrive.
  const int fd = raw_connect(server.port());
  CHECK(raw_handshake(fd, kSecret) == store_wire::kHelloAccepted);
  const uint32_t big = 1u << 30;
  REQUIRE(send(fd, &big, 4, 0) == 4);
  const std::string chunk(1 << 20, 'z');
  for (int i = 0; i < 16; ++i)
    REQUIRE(send(fd, chunk.data(), chunk.size(), 0) == static_cast<ssize_t>(chunk.size()));
  char reply[5];
  REQUIRE(recv(fd, reply, 5, MSG_WAITALL) == 5);
  CHECK(reply[4] == 3);  // Status::kError
  close(fd);
  CHECK(server.stats().oversized == 1);
  CHECK(server.stats().peak_buffered_bytes < (std::size_t{2} << 20));

  // Through the client: the server's reason, and the connection still works.
  try {
    good.set("big", std::vector<uint8_t>(5000, 1));
    FAIL("a value over the frame limit was stored");
  } catch (const CommError& e) {
    CHECK_THAT(e.what(), Contains("over the store's limit of 4096"));
  }
  CHECK_FALSE(good.check({"big"}));
  // The store's total is bounded too.
  good.set("a", std::vector<uint8_t>(3000, 1));
  good.set("b", std::vector<uint8_t>(3000, 1));
  good.set("c", std::vector<uint8_t>(3000, 1));
  try {
    good.set("d", std::vector<uint8_t>(3000, 1));
    FAIL("the store took more than its limit");
  } catch (const CommError& e) {
    CHECK_THAT(e.what(), Contains("full"));
  }
  good.set("a", std::vector<uint8_t>(10, 1));  // replacing frees room
  good.set("d", std::vector<uint8_t>(2000, 1));
  CHECK(server.stats().stored_bytes == 4 + 10 + 3000 + 3000 + 2000);  // keys a-d and values
  good.set("text", bytes("x"));
  try {
    good.add("text", 1);
    FAIL("add on a non-integer succeeded");
  } catch (const CommError& e) {
    CHECK_THAT(e.what(), Contains("does not hold an integer"));
  }
}

TEST_CASE("job store: a client whose server is gone fails at once, naming the store", "[store]") {
  auto server = std::make_unique<StoreServer>(serve());
  JobStore client(client_of(*server));
  client.set("k", bytes("v"));
  server.reset();
  const auto start = Clock::now();
  try {
    client.get("k");
    FAIL("a store without a server answered");
  } catch (const CommError& e) {
    CHECK_THAT(e.what(), Contains("store at 127.0.0.1:"));
  }
  CHECK(seconds_since(start) < 2);
}

TEST_CASE("job store: listens on the one address given, loopback for a one-host job", "[store]") {
  StoreServer server(serve());
  CHECK_THAT(server.listen_address(), Contains("127.0.0.1:"));

  // Another address of this machine does not reach it (when there is one).
  ifaddrs* list = nullptr;
  REQUIRE(getifaddrs(&list) == 0);
  std::string other;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    const auto a = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr;
    if ((ntohl(a.s_addr) >> 24) == 127) continue;
    char buf[INET_ADDRSTRLEN];
    other = inet_ntop(AF_INET, &a, buf, sizeof(buf));
    break;
  }
  freeifaddrs(list);
  if (!other.empty()) {
    auto options = client_of(server);
    options.host = other;
    options.connect_timeout = std::chrono::milliseconds(500);
    CHECK_THROWS_AS(JobStore(options), TimeoutError);
  } else {
    WARN("no non-loopback IPv4 address here: the cross-address check is skipped");
  }

  WorldInfo w;
  w.world_size = 4;
  w.local_world_size = 4;
  w.master_addr = "127.0.0.1";
  CHECK(store_listen_host(w) == "127.0.0.1");
  w.master_addr = "127.0.0.2";
  CHECK(store_listen_host(w) == "127.0.0.2");
  w.master_addr = "192.0.2.7";  // a configured address is used as given
  CHECK(store_listen_host(w) == "192.0.2.7");
  w.local_world_size = 2;  // two hosts: loopback cannot be reached from the other
  w.master_addr = "127.0.0.1";
  try {
    store_listen_host(w);
    FAIL("a loopback MASTER_ADDR was accepted for a job on two hosts");
  } catch (const EnvError& e) {
    CHECK_THAT(e.what(), Contains("MASTER_ADDR='127.0.0.1' is a loopback address"));
  }
  w.master_addr = "no-such-host.invalid";
  CHECK_THROWS_AS(store_listen_host(w), EnvError);
}

TEST_CASE("job store: the rendezvous admits ranks with the job's secret only",
          "[store][rendezvous]") {
  int port = 0;
  {
    StoreServer probe(serve());  // a free port, released at once
    port = probe.port();
  }
  auto world = [&](int rank, const std::string& secret) {
    return lockstep::testing::two_local_ranks(rank, port, secret);
  };
  RendezvousOptions options;
  options.timeout = std::chrono::seconds(20);
  Ptr<C10dStore> host;
  std::thread rank0([&] { host = rendezvous_connect(world(0, kSecret), options); });
  try {
    rendezvous_connect(world(1, "not-the-secret-of-this-job"), options);
    FAIL("rank 1 with another secret joined");
  } catch (const ConfigError& e) {
    CHECK_THAT(e.what(), Contains("the secret differs from rank 0's"));
  }
  auto joined = rendezvous_connect(world(1, kSecret), options);
  rank0.join();
  REQUIRE(host);
  host->set("from0", bytes("hello"));
  CHECK(text(joined->get("from0")) == "hello");
}

TEST_CASE("store core: c10d's key-value semantics and waits, without sockets", "[store]") {
  StoreCore core(64);
  CHECK_FALSE(core.get("a"));
  core.set("a", "xyz");
  CHECK(core.get("a") == std::optional<std::string>("xyz"));
  CHECK(core.stored_bytes() == 4);
  CHECK(core.add("n", 5) == 5);  // a missing counter counts from 0
  CHECK(core.add("n", -7) == -2);
  CHECK(core.get("n") == std::optional<std::string>("-2"));  // decimal text, as c10d
  REQUIRE_THROWS_WITH(core.add("a", 1), Contains("key 'a' does not hold an integer"));
  core.set("big", std::to_string(INT64_MAX));
  REQUIRE_THROWS_WITH(core.add("big", 1), Contains("would overflow"));
  // compare_set: swaps on a match, a missing key matches "", returns what is held.
  CHECK(core.compare_set("a", "nope", "new") == "xyz");
  CHECK(core.compare_set("a", "xyz", "new") == "new");
  CHECK(core.compare_set("fresh", "", "v") == "v");
  CHECK(core.compare_set("absent", "e", "v") == "e");
  CHECK_FALSE(core.check({"absent"}));
  CHECK(core.check({"a", "fresh"}));
  CHECK(core.num_keys() == 4);  // a, n, big, fresh
  // a=new 4, n=-2 3, big=INT64_MAX 22, fresh=v 6: replaced values counted once.
  CHECK(core.stored_bytes() == 35);
  const auto changes = core.changes();
  CHECK(core.get("a"));
  CHECK(core.changes() == changes);  // reads change nothing
  // Bounded: a value that would pass 64 bytes in all is refused, nothing changes.
  const auto held = core.stored_bytes();
  REQUIRE_THROWS_WITH(core.set("huge", std::string(60, 'x')), Contains("the store is full (64"));
  CHECK(core.stored_bytes() == held);
  core.set("edge", std::string(64 - 35 - 4, 'x'));  // exactly full: allowed
  CHECK(core.stored_bytes() == 64);
  REQUIRE_THROWS(core.set("e", ""));  // one byte over
  CHECK(core.erase("edge"));
  CHECK(core.erase("a"));
  CHECK_FALSE(core.erase("a"));
  CHECK(core.stored_bytes() == held - 4);

  // Waits: present now, released by a set, expired by the clock, forgotten.
  const auto now = StoreCore::Clock::now();
  CHECK(core.wait(1, {"fresh"}, now));
  CHECK_FALSE(core.wait(2, {"k1", "k2"}, StoreCore::Clock::time_point::max()));
  CHECK_FALSE(core.wait(3, {"k3"}, now + std::chrono::seconds(5)));
  CHECK_FALSE(core.wait(4, {"k4"}, now + std::chrono::seconds(9)));
  CHECK(core.next_deadline() == now + std::chrono::seconds(5));
  core.set("k1", "");
  CHECK(core.released().empty());  // k2 still missing
  core.set("k2", "");
  CHECK(core.released() == std::vector<int>{2});
  core.forget(4);
  CHECK(core.expired(now + std::chrono::seconds(4)).empty());
  CHECK(core.expired(now + std::chrono::seconds(10)) == std::vector<int>{3});
  CHECK(core.next_deadline() == StoreCore::Clock::time_point::max());
}

TEST_CASE(
    "job store: the secret never crosses the wire, and a squatter that cannot prove it is "
    "refused at once, naming the address",
    "[store]") {
  // A process that took the port before rank 0: it records what a rank
  // sends and answers with lockstep's magic and a proof it made up.
  int port = 0;
  const int listener = loopback_listener(port);
  std::string heard;
  std::thread squatter([&] {
    const int fd = accept(listener, nullptr, nullptr);
    char buf[4096];
    pollfd p{fd, POLLIN, 0};
    while (poll(&p, 1, 500) > 0) {  // everything the rank sends within half a second
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      heard.append(buf, static_cast<std::size_t>(n));
      if (heard.size() >= store_wire::kClientHello) {
        const std::string fake = std::string(store_wire::kMagic) + char(store_wire::kHasSecret) +
                                 random_bytes(store_wire::kNonce + store_wire::kProof);
        (void)!send(fd, fake.data(), fake.size(), MSG_NOSIGNAL);
      }
    }
    close(fd);
  });
  const JobStoreOptions options = client_at(port);
  const auto start = Clock::now();
  try {
    JobStore rank(options);
    FAIL("a rank trusted a store that could not prove the secret");
  } catch (const ConfigError& e) {
    CHECK_THAT(e.what(), Contains("store at 127.0.0.1:" + std::to_string(port)));
    CHECK_THAT(e.what(), Contains("could not prove it holds this process's LOCKSTEP_STORE_SECRET"));
  }
  CHECK(seconds_since(start) < 2);  // at once, not after the connect timeout
  squatter.join();
  close(listener);
  // All it learnt: the magic and a random nonce. No secret, nor any
  // function of it.
  CHECK(heard.size() == store_wire::kClientHello);
  CHECK(heard.find(kSecret) == std::string::npos);
  CHECK(heard.find(kSecret.substr(0, 8)) == std::string::npos);
  CHECK(heard.compare(0, 8, std::string(store_wire::kMagic)) == 0);
}

TEST_CASE("job store: a proof can be neither reflected nor replayed", "[store]") {
  namespace wire = store_wire;
  StoreServer server(serve());
  // Reflection: a client without the secret echoes the server's own proof
  // as its answer. The roles differ, so it is refused.
  {
    const int fd = raw_connect(server.port());
    const std::string nonce = random_bytes(wire::kNonce);
    const std::string hello = std::string(wire::kMagic) + nonce;
    REQUIRE(send(fd, hello.data(), hello.size(), 0) == static_cast<ssize_t>(hello.size()));
    std::string answer(wire::kServerHello, '\0');
    REQUIRE(recv(fd, answer.data(), answer.size(), MSG_WAITALL) ==
            static_cast<ssize_t>(answer.size()));
    const std::string reflected = answer.substr(9 + wire::kNonce);
    REQUIRE(send(fd, reflected.data(), reflected.size(), 0) == static_cast<ssize_t>(wire::kProof));
    char verdict = 0;
    REQUIRE(recv(fd, &verdict, 1, 0) == 1);
    CHECK(verdict == wire::kHelloRefused);
    close(fd);
  }
  // Replay: a squatter records the real store's nonce and proof for a nonce
  // of its own choosing, then serves them to a rank. The rank's nonce is
  // fresh, so the recorded proof does not answer it.
  const int spy = raw_connect(server.port());
  const std::string spy_hello = std::string(wire::kMagic) + random_bytes(wire::kNonce);
  REQUIRE(send(spy, spy_hello.data(), spy_hello.size(), 0) ==
          static_cast<ssize_t>(spy_hello.size()));
  std::string recorded(wire::kServerHello, '\0');
  REQUIRE(recv(spy, recorded.data(), recorded.size(), MSG_WAITALL) ==
          static_cast<ssize_t>(recorded.size()));
  close(spy);
  int port = 0;
  const int listener = loopback_listener(port);
  std::thread squatter([&] {
    const int fd = accept(listener, nullptr, nullptr);
    std::string hello(wire::kClientHello, '\0');
    if (recv(fd, hello.data(), hello.size(), MSG_WAITALL) == static_cast<ssize_t>(hello.size()))
      (void)!send(fd, recorded.data(), recorded.size(), MSG_NOSIGNAL);
    char sink[64];
    (void)!recv(fd, sink, sizeof(sink), 0);
    close(fd);
  });
  const JobStoreOptions options = client_at(port);
  CHECK_THROWS_WITH(JobStore(options), Contains("could not prove it holds"));
  squatter.join();
  close(listener);
}

TEST_CASE("job store: admission room is max_unauthenticated, at most half the descriptor limit",
          "[store]") {
  StoreServerOptions o;
  rlimit files{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &files) == 0);
  o.max_unauthenticated = 3;
  CHECK(admission_capacity(o) == 3);
  o.max_unauthenticated = 1 << 30;
  CHECK(admission_capacity(o) == static_cast<int>(files.rlim_cur / 2));
  CHECK(StoreServerOptions{}.max_unauthenticated == 1024);
}

TEST_CASE(
    "job store: a rank silent for a second after connect() is admitted while 300 strays "
    "connect, reconnect and sit idle",
    "[store]") {
  // The CI failure (faults.store_hostile, both cores busy): a rank
  // descheduled between connect() and its hello was evicted by the churn of
  // strays reconnecting as fast as they were closed.
  StoreServer server(serve());
  std::atomic<bool> stop{false};
  std::thread flood([&] {
    std::vector<int> socks;
    while (!stop) {
      for (auto it = socks.begin(); it != socks.end();) {
        pollfd p{*it, POLLIN, 0};
        if (poll(&p, 1, 0) > 0) {
          close(*it);
          it = socks.erase(it);
        } else {
          ++it;
        }
      }
      while (socks.size() < 300 && !stop) socks.push_back(raw_connect(server.port()));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    for (int fd : socks) close(fd);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::vector<int> slow;
  for (int k = 0; k < 3; ++k) slow.push_back(raw_connect(server.port()));
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // "descheduled"
  std::vector<char> verdicts;
  for (int fd : slow) verdicts.push_back(raw_handshake(fd, kSecret));
  JobStore prompt(flood_client(server));
  stop = true;
  flood.join();
  for (int fd : slow) close(fd);
  CHECK(verdicts == std::vector<char>(3, store_wire::kHelloAccepted));
  CHECK(server.stats().accepted == 4);
}

TEST_CASE("job store: a flood of 300 idle sockets during start-up never keeps a rank out",
          "[store]") {
  StoreServer server(serve_crowded());
  for (int round = 0; round < 3; ++round) {
    // The ranks connect while the flood arrives: some before, some amid it.
    std::vector<int> flood;
    std::vector<std::thread> ranks;
    std::atomic<int> joined{0};
    std::vector<std::string> failures(4);
    for (int i = 0; i < 300; ++i) {
      if (i % 75 == 0) {
        ranks.emplace_back([&, k = i / 75] {
          try {
            JobStore rank(flood_client(server));
            rank.add("round" + std::to_string(round), 1);
            ++joined;
          } catch (const std::exception& e) {
            failures[k] = e.what();
          }
        });
      }
      flood.push_back(raw_connect(server.port()));
    }
    for (auto& t : ranks) t.join();
    for (const auto& f : failures) CHECK(f == "");
    CHECK(joined == 4);
    for (int fd : flood) close(fd);
  }
  // The strays were turned away or evicted, never admitted.
  CHECK(server.stats().accepted == 12);
  CHECK(server.stats().refused >= 3 * (300 - 64));
}

TEST_CASE(
    "job store: sockets that send a byte and reconnect when turned away never push a rank "
    "out of its handshake",
    "[store]") {
  StoreServer server(serve_crowded());
  std::atomic<bool> stop{false};
  std::atomic<int> churned{0};
  // 130 sockets, each sending one byte of the magic (so none is silent),
  // reopened as soon as the store closes them: more than 64 newcomers in
  // every round of accepts.
  std::thread flood([&] {
    std::vector<int> socks;
    while (!stop) {
      for (auto it = socks.begin(); it != socks.end();) {
        pollfd p{*it, POLLIN, 0};
        if (poll(&p, 1, 0) > 0) {
          close(*it);
          it = socks.erase(it);
          ++churned;
        } else {
          ++it;
        }
      }
      while (socks.size() < 130 && !stop) {
        const int fd = raw_connect(server.port());
        (void)!send(fd, "L", 1, MSG_NOSIGNAL);
        socks.push_back(fd);
      }
    }
    for (int fd : socks) close(fd);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::vector<std::thread> ranks;
  std::vector<std::string> failures(4);
  for (int k = 0; k < 4; ++k) {
    ranks.emplace_back([&, k] {
      try {
        JobStore rank(flood_client(server));
        rank.add("joined", 1);
      } catch (const std::exception& e) {
        failures[k] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  stop = true;
  flood.join();
  for (const auto& f : failures) CHECK(f == "");
  CHECK(server.stats().accepted == 4);
  CHECK(churned > 130);  // the flood did churn
}

TEST_CASE(
    "job store: a client that sends requests without reading the replies is cut off, and "
    "what it made the store hold stays under two frames",
    "[store]") {
  StoreServer server(serve());
  JobStore setter(client_of(server));
  setter.set("big", std::vector<uint8_t>((16 << 20) - 64, 1));  // a frame's worth
  const auto baseline = server.stats().peak_buffered_bytes;

  // 30 GETs of the 16 MiB value, sent at once and never read.
  const int fd = raw_connect(server.port());
  REQUIRE(raw_handshake(fd, kSecret) == store_wire::kHelloAccepted);
  std::string requests;
  for (int i = 0; i < 30; ++i) {
    store_wire::Writer w;
    w.u8(static_cast<std::uint8_t>(store_wire::Op::kGet));
    w.bytes("big");
    requests += w.frame();
  }
  REQUIRE(send(fd, requests.data(), requests.size(), 0) == static_cast<ssize_t>(requests.size()));
  CHECK(eventually([&] { return server.stats().cut_off == 1; }));
  // Unbounded, the queue would reach 30 x 16 MiB = 480 MiB.
  CHECK(server.stats().peak_buffered_bytes < baseline + (std::size_t{40} << 20));
  close(fd);
  // The job's own client is served meanwhile and after.
  CHECK(setter.get("big").size() == (16u << 20) - 64);
}

// Note [Roll call] (roll_call.cpp): rank 1 never answers.
namespace {
RollCallOptions short_roll_call(std::chrono::milliseconds grace, std::chrono::milliseconds linger) {
  RollCallOptions o;
  o.grace = grace;
  o.linger = linger;
  return o;
}

// c10d's HashStore whose check() fails after `checks` calls, as a client
// whose server has gone does: the failure lands at a chosen point.
class FailingStore : public c10d::HashStore {
 public:
  explicit FailingStore(int checks) : checks_(checks) {}
  bool check(const std::vector<std::string>& keys) override {
    if (checks_-- <= 0) throw std::runtime_error("connection lost");
    return c10d::HashStore::check(keys);
  }

 private:
  int checks_;
};
}  // namespace

TEST_CASE("roll call: rank 0, hosting the store, stays until a later survivor has its answer",
          "[store]") {
  StoreServer server(serve());
  JobStore c0(client_of(server));
  JobStore c2(client_of(server));
  // Rank 2 starts 0.3 s late, with 1.7 s of rank 0's grace left to answer.
  const auto options = short_roll_call(std::chrono::seconds(2), std::chrono::seconds(10));
  std::string answer0, answer2;
  double took0 = 0, took2 = 0;
  const auto start = Clock::now();
  std::thread host([&] {
    answer0 = roll_call_answer(c0, 0, 3, options);
    took0 = seconds_since(start);
  });
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    answer2 = roll_call_answer(c2, 2, 3, options);
    took2 = seconds_since(start);
  });
  host.join();
  late.join();
  const std::string want =
      "; rank(s) 1 did not answer the roll call within 2.00 s: dead, hung or cut off";
  CHECK(answer0 == want);
  CHECK(answer2 == want);
  // Rank 2 polls until 0.3 + 2 s; rank 0 leaves only after that (without
  // the linger it would leave at 2 s), and not the whole linger later.
  CHECK(took0 >= 2.3);
  CHECK(took0 < took2 + 2.0);
}

TEST_CASE("roll call: a survivor whose store stops answering mid-call names the ranks missing then",
          "[store]") {
  const auto options = short_roll_call(std::chrono::seconds(30), std::chrono::seconds(2));
  SECTION("after a complete poll: the ranks missing in it") {
    FailingStore store(3 + 2);  // one pass over 3 ranks, and 2 checks of the next
    store.set("rollcall/0", bytes("1"));
    const auto start = Clock::now();
    const auto answer = roll_call_answer(store, 2, 3, options);
    CHECK_THAT(answer, Contains("; rank(s) 1 did not answer the roll call in "));
    CHECK_THAT(answer, Contains("until the store stopped answering (connection lost; rank 0, which "
                                "hosts it, has probably left)"));
    CHECK(seconds_since(start) < 5);  // not the 30 s grace
  }
  SECTION("within the first poll: the store's failure") {
    FailingStore store(2);
    const auto answer = roll_call_answer(store, 2, 3, options);
    CHECK(answer ==
          "; the rendezvous store is unreachable too (connection lost): rank 0, which hosts it, "
          "has left, or is dead or cut off");
  }
  SECTION("the real store, its server gone before the call") {
    auto server = std::make_unique<StoreServer>(serve());
    JobStore c2(client_of(*server));
    server.reset();
    const auto answer = roll_call_answer(c2, 2, 3, options);
    CHECK_THAT(answer, Contains("; the rendezvous store is unreachable too (store at 127.0.0.1:"));
    CHECK_THAT(answer, Contains("rank 0, which hosts it, has left, or is dead or cut off"));
  }
}
