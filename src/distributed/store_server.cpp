// The job store's transport: one poll loop that moves bytes between
// connections and StoreCore (store_core.h: the key-value semantics, without
// sockets), with one small handler per operation.
#include "lockstep/distributed/store_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
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
//   - a connection must first send the hello (magic, secret) within
//     hello_timeout; until then it may hold at most kMaxHello bytes, and at
//     most max_unauthenticated such connections exist (a new one evicts the
//     oldest: a rank sends its hello at once, so stalled strays cannot crowd
//     it out). A wrong secret gets kHelloRefused and is closed;
//   - after the hello, a request longer than max_frame_bytes is answered
//     with an error and its bytes discarded as they arrive (never held), and
//     the store holds at most max_total_bytes of keys and values;
//   - one thread, poll(), non-blocking sockets: a client that stops reading
//     or writing blocks nobody. A wait is answered by the server when its
//     keys appear or its deadline passes, so the stream never desynchronises.
// The secret is compared in constant time. It is not encryption: a peer that
// can read the network can read the secret and the keys (docs/environment.md).

namespace lockstep {
namespace {

using Clock = std::chrono::steady_clock;
namespace wire = store_wire;

std::string errno_text(int err) {
  return std::strerror(err);
}

bool equal_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const std::size_t n = std::min(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string numeric_address(const sockaddr_storage& addr) {
  char host[NI_MAXHOST] = {0};
  char port[NI_MAXSERV] = {0};
  getnameinfo(reinterpret_cast<const sockaddr*>(&addr), sizeof(addr), host, sizeof(host), port,
              sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV);
  const bool v6 = addr.ss_family == AF_INET6;
  return (v6 ? "[" : "") + std::string(host) + (v6 ? "]:" : ":") + port;
}

struct Conn {
  bool authed = false;
  Clock::time_point hello_deadline;
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
    if (err == EADDRINUSE) why += "; is another job using MASTER_PORT?";
    if (err == EADDRNOTAVAIL) why += "; is MASTER_ADDR an address of rank 0's host?";
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

void StoreServer::Impl::accept_clients() {
  for (;;) {
    const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN, or a client that left before we took it
    if (static_cast<int>(conns.size()) >= options.max_clients) {
      ::close(fd);
      count(&Stats::refused);
      continue;
    }
    // Too many connections still in their hello: drop the oldest. A rank
    // sends its hello at once, so stalled strays cannot crowd it out.
    int pending = 0;
    int oldest = -1;
    for (const auto& [other, c] : conns) {
      if (c.authed || c.close_after_flush) continue;
      ++pending;
      if (oldest < 0 || c.hello_deadline < conns.at(oldest).hello_deadline) oldest = other;
    }
    if (pending >= options.max_unauthenticated && oldest >= 0) close_conn(oldest, true);
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    Conn c;
    c.hello_deadline = Clock::now() + options.hello_timeout;
    conns.emplace(fd, std::move(c));
  }
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
    // Before the hello a connection may hold only kMaxHello bytes: read no more.
    const std::size_t room = c.authed ? sizeof(buf) : wire::kMaxHello + 1 - c.in.size();
    const ssize_t n = ::recv(fd, buf, std::min(room, sizeof(buf)), 0);
    if (n == 0) return close_conn(fd, !c.authed);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      if (errno == EINTR) continue;
      return close_conn(fd, !c.authed);
    }
    c.in.append(buf, static_cast<std::size_t>(n));
    if (!c.authed) {
      handle_hello(fd, c);
      if (!conns.count(fd)) return;
      if (c.close_after_flush) break;
      if (!c.authed) continue;
    }
    handle_frames(fd, c);
    if (!conns.count(fd)) return;
    if (c.close_after_flush) break;
  }
  std::size_t buffered = 0;
  for (const auto& [_, other] : conns) buffered += other.in.capacity() + other.out.capacity();
  std::lock_guard<std::mutex> lock(stats_mutex);
  stats.peak_buffered_bytes = std::max(stats.peak_buffered_bytes, buffered);
}

void StoreServer::Impl::handle_hello(int fd, Conn& c) {
  const std::size_t magic = wire::kMagic.size();
  const std::size_t have = std::min(c.in.size(), magic);
  if (c.in.compare(0, have, wire::kMagic.substr(0, have)) != 0) return close_conn(fd, true);
  if (c.in.size() < magic + 2) return;
  const std::size_t length =
      static_cast<unsigned char>(c.in[magic]) |
      (static_cast<std::size_t>(static_cast<unsigned char>(c.in[magic + 1])) << 8);
  if (length > wire::kMaxSecret) return close_conn(fd, true);
  if (c.in.size() < magic + 2 + length) return;
  const std::string secret = c.in.substr(magic + 2, length);
  c.in.erase(0, magic + 2 + length);
  if (!equal_secret(secret, options.secret)) {
    c.out.push_back(wire::kHelloRefused);
    c.close_after_flush = true;
    c.in.clear();
    count(&Stats::refused);
    return;
  }
  c.authed = true;
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
  } catch (const std::runtime_error& e) {  // wire::WireError (the frame), StoreRefusal (the core)
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
    if (!c.authed && !c.close_after_flush && c.hello_deadline <= now) late.push_back(fd);
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
      if (!c.authed) next = std::min(next, c.hello_deadline);
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
    if (fds[1].revents & POLLIN) accept_clients();
    for (std::size_t i = 2; i < fds.size(); ++i) {
      const int fd = fds[i].fd;
      if (!fds[i].revents || !conns.count(fd)) continue;
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_from(fd, conns.at(fd));
      if (conns.count(fd)) flush(fd, conns.at(fd));
    }
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
