// The server's Notes (handshake, admission, bounds) sit with the
// one poll loop they describe.
// The job store's transport: one poll loop that moves bytes between
// connections and StoreCore (store_core.h: the key-value semantics, without
// sockets), with one small handler per operation.
#include "lockstep/store/store_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "lockstep/util/error.h"
#include "lockstep/util/hex.h"
#include "lockstep/util/sha256.h"
#include "store_core.h"
#include "store_wire.h"

// Note [Job store]
// ~~~~~~~~~~~~~~~~
// c10d's TCPStore listens on every interface, admits anyone who connects and
// reads whatever length a client announces, so one stray client can read the
// job's keys, or announce 512 MiB and stall the store for everyone. LibTorch
// 1.13 offers no hook to change that, so rank 0 hosts this server instead,
// behind the same c10d::Store interface (JobStore), which is all Gloo, NCCL
// and MPI ask of a store. Its rules:
//   - it listens on one address: loopback for a single-node job whose
//     MASTER_ADDR is local, MASTER_ADDR's own address otherwise
//     (store_listen_host in rendezvous.cpp);
//   - a connection must first complete the handshake (Note [Store
//     handshake]) within hello_timeout; until then it may hold only the
//     bytes of the handshake's next message;
//   - admission (Note [Store admission]) bounds connections still in their
//     handshake without ever starving the job's own;
//   - after the handshake, a request longer than max_frame_bytes is answered
//     with an error and its bytes discarded as they arrive (never held), and
//     the store holds at most max_total_bytes of keys and values;
//   - a client has one request outstanding at a time (JobStore's round
//     trip): one that sends another while more than a frame of replies waits
//     for it does not read them, and is cut off, so queued replies stay
//     under two frames per connection;
//   - one thread, poll(), non-blocking sockets: a client that stops reading
//     or writing blocks nobody. A wait is answered by the server when its
//     keys appear or its deadline passes, so the stream never desynchronises.
// It is not encryption: a peer that can read the network can read the keys
// (docs/environment.md), though never the secret.
//
// Note [Store handshake]
// ~~~~~~~~~~~~~~~~~~~~~~
// Each side proves it holds the secret without sending it: the client sends
// a fresh nonce, the server its own nonce and HMAC-SHA256(secret, "server",
// both nonces), the client checks that proof before answering with
// HMAC-SHA256(secret, "client", both nonces). A process that holds the port
// before rank 0 (a squatter) learns a random nonce and nothing else, and the
// rank refuses it (ConfigError naming the address); a client without the
// secret learns one MAC over nonces it cannot choose alone. Proofs are
// compared in constant time. A store without a secret (a job started by
// hand) proves with the empty key and says so in its flags, so a rank that
// has a secret refuses it rather than trust anyone.
//
// Note [Store admission]
// ~~~~~~~~~~~~~~~~~~~~~~
// Before its hello a rank looks like any stray socket, so the first defence
// is room: up to max_unauthenticated connections (1024 by default, at most
// half of this process's descriptor limit: admission_capacity) may be in
// their handshake at once, each costing a descriptor and a few hundred bytes
// until hello_timeout. A flood smaller than that evicts nobody, so a rank
// that connects and is then descheduled for seconds before its hello (both
// cores busy) is still admitted. (With room for 64 and 300 strays that
// reconnect as soon as they are closed, every connection lived ~64
// accepts, a few milliseconds: a rank preempted between connect() and its
// hello was evicted, and retried into the same churn until its deadline.)
//
// A flood larger than that evicts, and the newcomer's first bytes are read
// before a victim is chosen: one that has progressed least goes, the
// longest-waiting first: one that has sent nothing, then one with part of a
// hello, then one whose whole hello was answered more than kAdmissionGrace
// ago. Two kinds are never evicted: a connection taken in this round of
// accepts, and one whose hello was answered within the grace (it is
// mid-handshake). When only those are left, the newcomer is turned away.
// Either way the loser is told kHelloBusy, and JobStore retries with
// back-off (at most 250 ms apart) until its deadline. A rank sends its whole
// hello right after connect(), so it is usually past "silent" by the time it
// is accepted, and once answered no flood can push it out.
//
// Out of descriptors (EMFILE), the server evicts by the same rule to make
// room, rather than leave the listening socket readable and spin.

namespace lockstep {
namespace {

using Clock = std::chrono::steady_clock;
namespace wire = store_wire;

// Beyond one frame, what replies may queue for a client (headers, small
// answers) before another request of its cuts it off.
constexpr std::size_t kReplySlack = 64 * 1024;

// How long a connection in its handshake is safe from eviction after each
// step (Note [Store admission]).
constexpr auto kAdmissionGrace = std::chrono::milliseconds(250);

std::string errno_text(int err) {
  return std::strerror(err);
}

std::string numeric_address(const sockaddr_storage& addr) {
  char host[NI_MAXHOST] = {0};
  char port[NI_MAXSERV] = {0};
  getnameinfo(reinterpret_cast<const sockaddr*>(&addr), sizeof(addr), host, sizeof(host), port,
              sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV);
  const bool v6 = addr.ss_family == AF_INET6;
  return (v6 ? "[" : "") + std::string(host) + (v6 ? "]:" : ":") + port;
}

enum class Stage { kHello, kProof, kReady };

struct Conn {
  Stage stage = Stage::kHello;
  bool authed() const { return stage == Stage::kReady; }
  bool silent() const { return stage == Stage::kHello && in.empty(); }
  Clock::time_point progressed_at;  // accepted, or its hello answered
  std::uint64_t round = 0;          // the round of accepts that took it
  Clock::time_point hello_deadline;
  std::string nonces;  // the client's, then the server's, during the handshake
  std::string in;
  std::string out;
  std::size_t skip = 0;  // bytes of an oversized request still to discard
  bool close_after_flush = false;
};

}  // namespace

struct StoreServer::Impl {
  StoreServerOptions options;
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  int port = 0;
  std::string address;
  std::thread thread;

  // Owned by the server thread.
  std::map<int, Conn> conns;
  std::unique_ptr<StoreCore> core;  // waiters are connections, by descriptor

  mutable std::mutex stats_mutex;
  Stats stats;

  void bind_and_listen();
  void run();
  void accept_clients();
  int eviction_victim(Clock::time_point now) const;
  bool evict_one(Clock::time_point now);  // false: nobody may be evicted
  std::uint64_t accept_round = 0;         // Note [Store admission]
  int capacity = 0;                       // admission_capacity(options)
  void turn_away(int fd);
  void read_from(int fd, Conn& c);
  void handle_hello(int fd, Conn& c);
  void handle_frames(int fd, Conn& c);
  void handle(int fd, Conn& c, std::string_view body);
  // One handler per operation: the request's fields in, the reply out.
  void op_set(int fd, Conn& c, wire::Reader& in);
  void op_get(int fd, Conn& c, wire::Reader& in);
  void op_add(int fd, Conn& c, wire::Reader& in);
  void op_compare_set(int fd, Conn& c, wire::Reader& in);
  void op_check(int fd, Conn& c, wire::Reader& in);
  void op_wait(int fd, Conn& c, wire::Reader& in);
  void op_delete(int fd, Conn& c, wire::Reader& in);
  void op_num_keys(int fd, Conn& c, wire::Reader& in);
  static std::vector<std::string> read_keys(wire::Reader& in);
  static wire::Writer answer(wire::Status status) {
    wire::Writer w;
    w.u8(static_cast<std::uint8_t>(status));
    return w;
  }
  static void send(Conn& c, const wire::Writer& w) { c.out += w.frame(); }
  void flush(int fd, Conn& c);
  void wake_waiters();
  void expire(Clock::time_point now);
  void close_conn(int fd, bool refused);
  void note_buffered();
  void count_stored() {
    std::lock_guard<std::mutex> lock(stats_mutex);
    stats.stored_bytes = core->stored_bytes();
  }
  void count(std::uint64_t Stats::*field) {
    std::lock_guard<std::mutex> lock(stats_mutex);
    ++(stats.*field);
  }
};

void StoreServer::Impl::bind_and_listen() {
  const std::string where = options.host + ":" + std::to_string(options.port);
  std::string error;
  const auto addresses = wire::resolve_tcp(options.host, options.port, error);
  if (!addresses) throw CommError("store: cannot resolve " + options.host + ": " + error);
  const addrinfo* found = addresses.get();

  listen_fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd < 0) throw CommError("store: socket(): " + errno_text(errno));
  const int one = 1;
  setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (found->ai_family == AF_INET6)
    setsockopt(listen_fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
  if (::bind(listen_fd, found->ai_addr, found->ai_addrlen) != 0) {
    const int err = errno;
    ::close(listen_fd);
    std::string why = errno_text(err);
    // A port in use or an address not of this host: the job's settings
    // (MASTER_PORT, MASTER_ADDR), bad input rather than a network failure.
    if (err == EADDRINUSE)
      throw ConfigError("store: cannot listen on " + where + ": " + why +
                        "; is another job using MASTER_PORT?");
    if (err == EADDRNOTAVAIL)
      throw ConfigError("store: cannot listen on " + where + ": " + why +
                        "; is MASTER_ADDR an address of rank 0's host?");
    throw CommError("store: cannot listen on " + where + ": " + why);
  }
  if (::listen(listen_fd, 1024) != 0) {
    const int err = errno;
    ::close(listen_fd);
    throw CommError("store: listen() on " + where + ": " + errno_text(err));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(listen_fd, reinterpret_cast<sockaddr*>(&bound), &len);
  port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  address = numeric_address(bound);
}

// Note [Store admission].
void StoreServer::Impl::accept_clients() {
  ++accept_round;
  for (;;) {
    const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      // Out of descriptors: make room by eviction and take the newcomer next
      // round; otherwise EAGAIN, or a client that left before we took it.
      if ((errno == EMFILE || errno == ENFILE) && evict_one(Clock::now())) continue;
      return;
    }
    if (static_cast<int>(conns.size()) >= options.max_clients) {
      turn_away(fd);
      continue;
    }
    int pending = 0;
    for (const auto& [_, c] : conns) pending += !c.authed() && !c.close_after_flush ? 1 : 0;
    if (pending >= capacity && !evict_one(Clock::now())) {
      turn_away(fd);
      continue;
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    Conn c;
    c.progressed_at = Clock::now();
    c.round = accept_round;
    c.hello_deadline = c.progressed_at + options.hello_timeout;
    Conn& taken = conns.emplace(fd, std::move(c)).first->second;
    // A rank's hello is usually here already: read it now, so that the next
    // eviction sees the newcomer's progress, not silence.
    read_from(fd, taken);
  }
}

bool StoreServer::Impl::evict_one(Clock::time_point now) {
  const int victim = eviction_victim(now);
  if (victim < 0) return false;
  conns.erase(victim);
  core->forget(victim);
  turn_away(victim);
  return true;
}

int StoreServer::Impl::eviction_victim(Clock::time_point now) const {
  // 0: has sent nothing; 1: part of a hello; 2: a whole hello, answered.
  auto progress = [](const Conn& c) { return c.silent() ? 0 : c.stage == Stage::kHello ? 1 : 2; };
  int victim = -1;
  for (const auto& [fd, c] : conns) {
    if (c.authed() || c.close_after_flush) continue;
    if (c.round == accept_round) continue;  // not read once yet
    const int p = progress(c);
    if (p == 2 && now - c.progressed_at < kAdmissionGrace) continue;  // mid-handshake
    if (victim < 0) {
      victim = fd;
      continue;
    }
    const Conn& v = conns.at(victim);
    const int pv = progress(v);
    if (p < pv || (p == pv && c.progressed_at < v.progressed_at)) victim = fd;
  }
  return victim;
}

int admission_capacity(const StoreServerOptions& options) {
  rlimit files{};
  long long half = options.max_unauthenticated;
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY)
    half = static_cast<long long>(files.rlim_cur / 2);
  return static_cast<int>(
      std::max<long long>(1, std::min<long long>(options.max_unauthenticated, half)));
}

// Closes a connection still in its handshake, telling it to try again.
void StoreServer::Impl::turn_away(int fd) {
  (void)::send(fd, &wire::kHelloBusy, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  ::close(fd);
  count(&Stats::refused);
}

void StoreServer::Impl::close_conn(int fd, bool refused) {
  ::close(fd);
  conns.erase(fd);
  core->forget(fd);
  if (refused) count(&Stats::refused);
}

void StoreServer::Impl::read_from(int fd, Conn& c) {
  char buf[65536];
  for (;;) {
    // In the handshake a connection may hold only its next message: read no more.
    const std::size_t want = c.stage == Stage::kHello ? wire::kClientHello : wire::kProof;
    const std::size_t room = c.authed() ? sizeof(buf) : want - std::min(want, c.in.size());
    if (room == 0) break;
    const ssize_t n = ::recv(fd, buf, std::min(room, sizeof(buf)), 0);
    if (n == 0) return close_conn(fd, !c.authed());
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      if (errno == EINTR) continue;
      return close_conn(fd, !c.authed());
    }
    c.in.append(buf, static_cast<std::size_t>(n));
    if (!c.authed()) {
      handle_hello(fd, c);
      if (!conns.count(fd)) return;
      if (c.close_after_flush) break;
      if (!c.authed()) continue;
    }
    handle_frames(fd, c);
    if (!conns.count(fd)) return;
    if (c.close_after_flush) break;
  }
  note_buffered();
}

void StoreServer::Impl::note_buffered() {
  std::size_t buffered = 0;
  for (const auto& [_, other] : conns) buffered += other.in.capacity() + other.out.capacity();
  std::lock_guard<std::mutex> lock(stats_mutex);
  stats.peak_buffered_bytes = std::max(stats.peak_buffered_bytes, buffered);
}

// Note [Store handshake]: the client's nonce, answered with the server's
// nonce and proof; then the client's proof, answered with the verdict.
void StoreServer::Impl::handle_hello(int fd, Conn& c) {
  if (c.stage == Stage::kHello) {
    const std::size_t have = std::min(c.in.size(), wire::kMagic.size());
    if (c.in.compare(0, have, wire::kMagic.substr(0, have)) != 0) return close_conn(fd, true);
    if (c.in.size() < wire::kClientHello) return;
    const std::string client_nonce = c.in.substr(wire::kMagic.size(), wire::kNonce);
    std::string server_nonce, proof;
    try {  // nothing may escape the server's thread
      server_nonce = random_bytes(wire::kNonce);
      proof = wire::server_proof(options.secret, client_nonce, server_nonce);
    } catch (const std::exception&) {
      return close_conn(fd, true);  // no randomness or no HMAC: no handshake (it retries)
    }
    c.in.clear();
    c.nonces = client_nonce + server_nonce;
    c.out.append(wire::kMagic.data(), wire::kMagic.size());
    c.out.push_back(static_cast<char>(options.secret.empty() ? 0 : wire::kHasSecret));
    c.out += server_nonce;
    c.out += proof;
    c.stage = Stage::kProof;
    c.progressed_at = Clock::now();
    return;
  }
  if (c.in.size() < wire::kProof) return;
  std::string expected;
  try {
    expected =
        wire::client_proof(options.secret, std::string_view(c.nonces).substr(0, wire::kNonce),
                           std::string_view(c.nonces).substr(wire::kNonce));
  } catch (const std::exception&) {
    return close_conn(fd, true);
  }
  const bool proved =
      equal_in_constant_time(std::string_view(c.in).substr(0, wire::kProof), expected);
  c.in.clear();
  c.nonces.clear();
  if (!proved) {
    c.out.push_back(wire::kHelloRefused);
    c.close_after_flush = true;
    count(&Stats::refused);
    return;
  }
  c.stage = Stage::kReady;
  c.out.push_back(wire::kHelloAccepted);
  count(&Stats::accepted);
}

void StoreServer::Impl::handle_frames(int fd, Conn& c) {
  std::size_t pos = 0;
  while (!c.close_after_flush && c.in.size() - pos > 0) {
    if (c.skip > 0) {  // the rest of an oversized request, read and dropped
      const std::size_t n = std::min(c.skip, c.in.size() - pos);
      c.skip -= n;
      pos += n;
      continue;
    }
    if (c.in.size() - pos < 4) break;
    if (c.out.size() > options.max_frame_bytes + kReplySlack) {
      // Another request while a frame of replies waits: it does not read.
      count(&Stats::cut_off);
      note_buffered();
      return close_conn(fd, false);
    }
    const std::uint32_t length = wire::read_u32(c.in.data() + pos);
    if (length == 0) return close_conn(fd, false);
    if (length > options.max_frame_bytes) {
      // Refused without buffering it; the stream stays in step.
      count(&Stats::oversized);
      auto w = answer(wire::Status::kError);
      w.bytes("a request of " + std::to_string(length) + " bytes is over the store's limit of " +
              std::to_string(options.max_frame_bytes));
      send(c, w);
      c.skip = length;
      pos += 4;
      continue;
    }
    if (c.in.size() - pos - 4 < length) break;
    handle(fd, c, std::string_view(c.in).substr(pos + 4, length));
    pos += 4 + length;
  }
  c.in.erase(0, pos);
  if (c.in.capacity() > 2 * options.max_frame_bytes && c.in.size() < options.max_frame_bytes)
    c.in.shrink_to_fit();
}

std::vector<std::string> StoreServer::Impl::read_keys(wire::Reader& in) {
  const std::uint32_t n = in.u32();
  if (n > wire::kMaxKeysPerRequest) throw wire::WireError("too many keys");
  std::vector<std::string> keys;
  for (std::uint32_t i = 0; i < n; ++i) keys.push_back(in.bytes(wire::kMaxKey));
  return keys;
}

void StoreServer::Impl::op_set(int, Conn& c, wire::Reader& in) {
  std::string key = in.bytes(wire::kMaxKey);
  core->set(key, in.bytes(options.max_frame_bytes));
  send(c, answer(wire::Status::kOk));
}

void StoreServer::Impl::op_get(int, Conn& c, wire::Reader& in) {
  const auto value = core->get(in.bytes(wire::kMaxKey));
  if (!value) return send(c, answer(wire::Status::kMissing));
  auto w = answer(wire::Status::kOk);
  w.bytes(*value);
  send(c, w);
}

void StoreServer::Impl::op_add(int, Conn& c, wire::Reader& in) {
  const std::string key = in.bytes(wire::kMaxKey);
  const std::int64_t delta = in.i64();
  auto w = answer(wire::Status::kOk);
  w.i64(core->add(key, delta));
  send(c, w);
}

void StoreServer::Impl::op_compare_set(int, Conn& c, wire::Reader& in) {
  const std::string key = in.bytes(wire::kMaxKey);
  const std::string expected = in.bytes(options.max_frame_bytes);
  std::string desired = in.bytes(options.max_frame_bytes);
  auto w = answer(wire::Status::kOk);
  w.bytes(core->compare_set(key, expected, std::move(desired)));
  send(c, w);
}

void StoreServer::Impl::op_check(int, Conn& c, wire::Reader& in) {
  auto w = answer(wire::Status::kOk);
  w.u8(core->check(read_keys(in)) ? 1 : 0);
  send(c, w);
}

// Answered now when the keys are there, else by wake_waiters or expire: the
// server always answers, so the stream never desynchronises.
void StoreServer::Impl::op_wait(int fd, Conn& c, wire::Reader& in) {
  auto keys = read_keys(in);
  const std::int64_t timeout_ms = in.i64();
  const auto deadline = timeout_ms <= 0 ? Clock::time_point::max()
                                        : Clock::now() + std::chrono::milliseconds(timeout_ms);
  if (core->wait(fd, std::move(keys), deadline)) send(c, answer(wire::Status::kOk));
}

void StoreServer::Impl::op_delete(int, Conn& c, wire::Reader& in) {
  auto w = answer(wire::Status::kOk);
  w.u8(core->erase(in.bytes(wire::kMaxKey)) ? 1 : 0);
  send(c, w);
}

void StoreServer::Impl::op_num_keys(int, Conn& c, wire::Reader&) {
  auto w = answer(wire::Status::kOk);
  w.i64(core->num_keys());
  send(c, w);
}

void StoreServer::Impl::handle(int fd, Conn& c, std::string_view body) {
  using Handler = void (Impl::*)(int, Conn&, wire::Reader&);
  const uint64_t changes = core->changes();
  wire::Reader in(body);
  try {
    // One handler per operation, indexed by its code (store_wire.h's Op).
    static constexpr Handler kHandlers[] = {
        nullptr,         &Impl::op_set,    &Impl::op_get,      &Impl::op_add, &Impl::op_compare_set,
        &Impl::op_check, &Impl::op_delete, &Impl::op_num_keys, &Impl::op_wait};
    static_assert(static_cast<int>(wire::Op::kWait) == 8 && static_cast<int>(wire::Op::kSet) == 1);
    const std::uint8_t code = in.u8();
    const Handler handler = code < std::size(kHandlers) ? kHandlers[code] : nullptr;
    if (handler == nullptr) throw wire::WireError("unknown operation " + std::to_string(code));
    (this->*handler)(fd, c, in);
  } catch (const std::exception& e) {  // WireError (the frame), StoreRefusal (the core), bad_alloc
    auto w = answer(wire::Status::kError);
    w.bytes(e.what());
    send(c, w);
  }
  if (core->changes() != changes) {  // a rescan of the waiters only after a change
    count_stored();
    wake_waiters();
  }
}

void StoreServer::Impl::wake_waiters() {
  for (int fd : core->released()) send(conns.at(fd), answer(wire::Status::kOk));
}

void StoreServer::Impl::expire(Clock::time_point now) {
  for (int fd : core->expired(now)) send(conns.at(fd), answer(wire::Status::kTimeout));
  std::vector<int> late;
  for (const auto& [fd, c] : conns)
    if (!c.authed() && !c.close_after_flush && c.hello_deadline <= now) late.push_back(fd);
  for (int fd : late) close_conn(fd, true);
}

void StoreServer::Impl::flush(int fd, Conn& c) {
  while (!c.out.empty()) {
    const ssize_t n = ::send(fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      return close_conn(fd, false);
    }
    c.out.erase(0, static_cast<std::size_t>(n));
  }
  if (c.close_after_flush) close_conn(fd, false);
}

void StoreServer::Impl::run() {
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({wake[0], POLLIN, 0});
    fds.push_back({listen_fd, POLLIN, 0});
    auto next = Clock::time_point::max();
    for (const auto& [fd, c] : conns) {
      short events = c.close_after_flush ? 0 : POLLIN;
      if (!c.out.empty()) events |= POLLOUT;
      fds.push_back({fd, events, 0});
      if (!c.authed()) next = std::min(next, c.hello_deadline);
    }
    next = std::min(next, core->next_deadline());
    int timeout_ms = 1000;
    if (next != Clock::time_point::max()) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count();
      timeout_ms = static_cast<int>(std::clamp<long long>(left + 1, 0, 1000));
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) break;
    if (fds[0].revents) break;  // asked to stop
    // Connections first, then newcomers: what arrived from a connection is
    // read (and its progress noted) before admission looks for a victim
    // (Note [Store admission]).
    for (std::size_t i = 2; i < fds.size(); ++i) {
      const int fd = fds[i].fd;
      if (!fds[i].revents || !conns.count(fd)) continue;
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_from(fd, conns.at(fd));
      if (conns.count(fd)) flush(fd, conns.at(fd));
    }
    if (fds[1].revents & POLLIN) accept_clients();
    expire(Clock::now());
    // Answers made by wake_waiters/expire for other connections go out now.
    std::vector<int> pending;
    for (const auto& [fd, c] : conns)
      if (!c.out.empty()) pending.push_back(fd);
    for (int fd : pending)
      if (conns.count(fd)) flush(fd, conns.at(fd));
  }
  for (const auto& [fd, _] : conns) ::close(fd);
  conns.clear();
}

StoreServer::StoreServer(StoreServerOptions options) : impl_(std::make_unique<Impl>()) {
  if (!options.secret.empty() && options.secret.size() > wire::kMaxSecret)
    throw ConfigError("store: the secret is longer than " + std::to_string(wire::kMaxSecret) +
                      " bytes");
  impl_->options = std::move(options);
  impl_->core = std::make_unique<StoreCore>(impl_->options.max_total_bytes);
  impl_->capacity = admission_capacity(impl_->options);
  impl_->bind_and_listen();
  if (::pipe2(impl_->wake, O_CLOEXEC) != 0) {
    ::close(impl_->listen_fd);
    throw CommError("store: pipe(): " + errno_text(errno));
  }
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

StoreServer::~StoreServer() {
  const char stop = 1;
  (void)!::write(impl_->wake[1], &stop, 1);
  if (impl_->thread.joinable()) impl_->thread.join();
  ::close(impl_->listen_fd);
  ::close(impl_->wake[0]);
  ::close(impl_->wake[1]);
}

int StoreServer::port() const {
  return impl_->port;
}
std::string StoreServer::listen_address() const {
  return impl_->address;
}

StoreServer::Stats StoreServer::stats() const {
  std::lock_guard<std::mutex> lock(impl_->stats_mutex);
  return impl_->stats;
}

}  // namespace lockstep
