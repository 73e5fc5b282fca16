// The store client's handshake, retry and every c10d::Store
// operation over one request helper.
#include "lockstep/store/job_store.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>

#include "lockstep/util/error.h"
#include "lockstep/util/hex.h"
#include "lockstep/util/sha256.h"
#include "store_wire.h"

namespace lockstep {
namespace {

using Clock = std::chrono::steady_clock;
namespace wire = store_wire;

// Milliseconds left until `deadline` for poll(); -1 for no deadline.
int poll_ms(Clock::time_point deadline) {
  if (deadline == Clock::time_point::max()) return -1;
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

// Waits for `events` on fd; false when the deadline passed first.
bool ready(int fd, short events, Clock::time_point deadline) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int rc = ::poll(&p, 1, poll_ms(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return false;
  }
}

// One non-blocking connect to one address, bounded by `deadline`.
int connect_one(const addrinfo& a, Clock::time_point deadline, std::string& error) {
  const int fd = ::socket(a.ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    error = std::strerror(errno);
    return -1;
  }
  int rc = ::connect(fd, a.ai_addr, a.ai_addrlen);
  if (rc != 0 && errno == EINPROGRESS) {
    if (!ready(fd, POLLOUT, deadline)) {
      error = "connect timed out";
      ::close(fd);
      return -1;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    rc = err == 0 ? 0 : -1;
    errno = err;
  }
  if (rc != 0) {
    error = std::strerror(errno);
    ::close(fd);
    return -1;
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

// Sends all of `data` before `deadline`; false (errno set) when it could not.
bool send_exact(int fd, std::string_view data, Clock::time_point deadline) {
  std::size_t sent = 0;
  while (sent < data.size()) {
    if (!ready(fd, POLLOUT, deadline)) {
      errno = ETIMEDOUT;
      return false;
    }
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return false;
    sent += static_cast<std::size_t>(n);
  }
  return true;
}

// Reads up to `size` bytes before `deadline`; returns how many arrived
// before the peer closed, failed or the deadline passed.
std::size_t recv_exact(int fd, char* out, std::size_t size, Clock::time_point deadline) {
  std::size_t got = 0;
  while (got < size && ready(fd, POLLIN, deadline)) {
    const ssize_t n = ::recv(fd, out + got, size - got, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  return got;
}

}  // namespace

JobStore::JobStore(JobStoreOptions options, std::shared_ptr<StoreServer> server)
    : c10d::Store(options.timeout), options_(std::move(options)), server_(std::move(server)) {
  connect();
}

JobStore::~JobStore() {
  if (fd_ >= 0) ::close(fd_);
}

std::string JobStore::where() const {
  const bool v6 = options_.host.find(':') != std::string::npos;
  return (v6 ? "[" + options_.host + "]" : options_.host) + ":" + std::to_string(options_.port);
}

void JobStore::lost(const std::string& what) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  throw CommError("store at " + where() + ": " + what);
}

// Connects and completes the handshake, retrying with back-off until
// connect_timeout while the server is not up, busy (Note [Store admission])
// or the connection drops; a server that cannot prove the secret is refused
// at once.
void JobStore::connect() {
  const auto start = Clock::now();
  const auto deadline = start + options_.connect_timeout;
  std::string error = "no address";
  auto pause = std::chrono::milliseconds(50);
  for (;;) {
    const auto addresses = wire::resolve_tcp(options_.host, options_.port, error);
    if (!addresses) {
      error = "cannot resolve the host: " + error;
    } else {
      for (const addrinfo* a = addresses.get(); a && fd_ < 0; a = a->ai_next)
        fd_ = connect_one(*a, deadline, error);
    }
    if (fd_ >= 0) {
      bool admitted = false;
      try {
        admitted = handshake(deadline, error);
      } catch (...) {  // refused: the constructor throws, so no destructor closes it
        ::close(fd_);
        fd_ = -1;
        throw;
      }
      if (admitted) return;
      ::close(fd_);
      fd_ = -1;
    }
    if (Clock::now() + pause >= deadline) {
      const double waited = std::chrono::duration<double>(Clock::now() - start).count();
      throw TimeoutError("store at " + where() + " not reachable after " +
                         std::to_string(waited).substr(0, 5) + " s: " + error);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(250));
  }
}

// Note [Store handshake], the client's half. True when admitted; false, with
// `error` saying why, when worth another try; throws ConfigError when either
// side cannot prove the secret to the other.
bool JobStore::handshake(Clock::time_point deadline, std::string& error) {
  const auto limit = std::min(deadline, Clock::now() + std::chrono::seconds(10));
  const std::string client_nonce = random_bytes(wire::kNonce);
  std::string hello(wire::kMagic);
  hello += client_nonce;
  if (!send_exact(fd_, hello, limit)) {
    error = "could not send the hello: " + std::string(std::strerror(errno));
    return false;
  }
  std::string answer(wire::kServerHello, '\0');
  const std::size_t got = recv_exact(fd_, answer.data(), answer.size(), limit);
  if (got >= 1 && answer[0] == wire::kHelloBusy) {
    error = "it was busy with other connections";
    return false;
  }
  const std::size_t seen = std::min(got, wire::kMagic.size());
  if (answer.compare(0, seen, wire::kMagic.substr(0, seen)) == 0 && got < answer.size()) {
    error = got == 0 ? "no hello from it (is it lockstep's store?)"
                     : "it closed the connection during the hello";
    return false;
  }
  if (answer.compare(0, wire::kMagic.size(), wire::kMagic) != 0) {
    throw ConfigError("store at " + where() +
                      " does not speak lockstep's store protocol: another program holds "
                      "MASTER_PORT on rank 0's host");
  }
  const bool has_secret = (static_cast<std::uint8_t>(answer[8]) & wire::kHasSecret) != 0;
  const std::string_view server_nonce = std::string_view(answer).substr(9, wire::kNonce);
  const std::string_view proof = std::string_view(answer).substr(9 + wire::kNonce, wire::kProof);
  if (has_secret && options_.secret.empty())
    throw ConfigError("store at " + where() +
                      " refused this process: the job requires LOCKSTEP_STORE_SECRET and this "
                      "process has none");
  if (!has_secret && !options_.secret.empty())
    throw ConfigError("store at " + where() +
                      " has no secret while this process has LOCKSTEP_STORE_SECRET: rank 0 was "
                      "started without it, or the process on that port is not this job's store");
  if (!equal_in_constant_time(proof,
                              wire::server_proof(options_.secret, client_nonce, server_nonce)))
    throw ConfigError("store at " + where() +
                      " could not prove it holds this process's LOCKSTEP_STORE_SECRET: the "
                      "secret differs from rank 0's, or the process on that port is not this "
                      "job's store (is another job using MASTER_PORT?)");
  if (!send_exact(fd_, wire::client_proof(options_.secret, client_nonce, server_nonce), limit)) {
    error = "could not send the proof: " + std::string(std::strerror(errno));
    return false;
  }
  char verdict = 0;
  if (recv_exact(fd_, &verdict, 1, limit) != 1 || verdict == wire::kHelloBusy) {
    error = "it closed the connection before admitting this process";
    return false;
  }
  if (verdict == wire::kHelloRefused)
    throw ConfigError("store at " + where() + " refused this process's proof of the secret");
  if (verdict != wire::kHelloAccepted)
    throw CommError("store at " + where() + " answered the handshake with an unknown byte");
  return true;
}

std::string JobStore::round_trip(const std::string& frame, std::chrono::milliseconds limit) {
  const auto deadline = limit.count() <= 0 ? Clock::time_point::max() : Clock::now() + limit;
  if (fd_ < 0) throw CommError("store at " + where() + ": the connection was lost earlier");
  std::size_t sent = 0;
  while (sent < frame.size()) {
    if (!ready(fd_, POLLOUT, deadline)) lost("timed out sending a request");
    const ssize_t n =
        ::send(fd_, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0)
      lost("connection lost (did rank 0, which hosts the store, exit?): " +
           std::string(std::strerror(errno)));
    sent += static_cast<std::size_t>(n);
  }
  auto read_exact = [&](char* out, std::size_t size) {
    std::size_t got = 0;
    while (got < size) {
      if (!ready(fd_, POLLIN, deadline))
        lost("no answer within " + std::to_string(limit.count() / 1000.0).substr(0, 5) + " s");
      const ssize_t n = ::recv(fd_, out + got, size - got, MSG_DONTWAIT);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) lost("connection lost (did rank 0, which hosts the store, exit?)");
      got += static_cast<std::size_t>(n);
    }
  };
  char header[4];
  read_exact(header, 4);
  const std::uint32_t length = wire::read_u32(header);
  // Replies are at most one value plus a few bytes; the server bounds values.
  if (length == 0 || length > (std::size_t{1} << 30)) lost("sent a malformed reply");
  std::string body(length, '\0');
  read_exact(body.data(), length);
  return body;
}

namespace {

std::string key_list(const std::vector<std::string>& keys) {
  std::string out;
  for (std::size_t i = 0; i < keys.size() && i < 4; ++i) out += (i ? ", " : "") + keys[i];
  if (keys.size() > 4) out += ", ... (" + std::to_string(keys.size()) + " keys)";
  return out;
}

std::string_view text_of(const std::vector<uint8_t>& bytes) {
  return std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

std::vector<uint8_t> bytes_of(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

}  // namespace

// One request's boilerplate: its frame (the op, then `fields`), one round
// trip under the lock, the reply's status (a refusal is a CommError naming
// the store); the reply's other fields are read from `in`.
class JobStore::Reply {
 public:
  Reply(JobStore& store, wire::Op op, const std::function<void(wire::Writer&)>& fields,
        std::chrono::milliseconds limit) {
    wire::Writer w;
    w.u8(static_cast<std::uint8_t>(op));
    fields(w);
    {
      std::lock_guard<std::mutex> lock(store.mutex_);
      body_ = store.round_trip(w.frame(), limit);
    }
    in_.emplace(body_);
    status_ = static_cast<wire::Status>(in_->u8());
    if (status_ == wire::Status::kError)
      throw CommError("store at " + store.where() + " refused a request: " + in_->bytes(1 << 16));
  }
  // in_ reads body_: never copied or moved.
  Reply(const Reply&) = delete;
  Reply& operator=(const Reply&) = delete;
  wire::Status status() const { return status_; }
  wire::Reader& in() { return *in_; }
  std::string bytes() { return in_->bytes(body_.size()); }

 private:
  std::string body_;
  std::optional<wire::Reader> in_;  // reads body_
  wire::Status status_ = wire::Status::kOk;
};

void JobStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  Reply(
      *this, wire::Op::kSet,
      [&](wire::Writer& w) {
        w.bytes(key);
        w.bytes(text_of(value));
      },
      timeout_);
}

std::vector<uint8_t> JobStore::compareSet(const std::string& key,
                                          const std::vector<uint8_t>& expected,
                                          const std::vector<uint8_t>& desired) {
  Reply reply(
      *this, wire::Op::kCompareSet,
      [&](wire::Writer& w) {
        w.bytes(key);
        w.bytes(text_of(expected));
        w.bytes(text_of(desired));
      },
      timeout_);
  return bytes_of(reply.bytes());
}

std::vector<uint8_t> JobStore::get(const std::string& key) {
  wait({key}, timeout_);
  Reply reply(
      *this, wire::Op::kGet, [&](wire::Writer& w) { w.bytes(key); }, timeout_);
  if (reply.status() == wire::Status::kMissing)
    throw CommError("store at " + where() + ": key '" + key + "' was deleted while being read");
  return bytes_of(reply.bytes());
}

int64_t JobStore::add(const std::string& key, int64_t value) {
  Reply reply(
      *this, wire::Op::kAdd,
      [&](wire::Writer& w) {
        w.bytes(key);
        w.i64(value);
      },
      timeout_);
  return reply.in().i64();
}

bool JobStore::deleteKey(const std::string& key) {
  Reply reply(
      *this, wire::Op::kDelete, [&](wire::Writer& w) { w.bytes(key); }, timeout_);
  return reply.in().u8() != 0;
}

bool JobStore::check(const std::vector<std::string>& keys) {
  Reply reply(
      *this, wire::Op::kCheck,
      [&](wire::Writer& w) {
        w.u32(static_cast<std::uint32_t>(keys.size()));
        for (const auto& k : keys) w.bytes(k);
      },
      timeout_);
  return reply.in().u8() != 0;
}

int64_t JobStore::getNumKeys() {
  Reply reply(
      *this, wire::Op::kNumKeys, [](wire::Writer&) {}, timeout_);
  return reply.in().i64();
}

void JobStore::wait(const std::vector<std::string>& keys) {
  wait(keys, timeout_);
}

void JobStore::wait(const std::vector<std::string>& keys,
                    const std::chrono::milliseconds& timeout) {
  // The server answers when the keys appear or the timeout passes; allow it
  // some slack before calling the store itself silent.
  const auto limit = timeout.count() <= 0 ? timeout : timeout + std::chrono::seconds(30);
  Reply reply(
      *this, wire::Op::kWait,
      [&](wire::Writer& w) {
        w.u32(static_cast<std::uint32_t>(keys.size()));
        for (const auto& k : keys) w.bytes(k);
        w.i64(timeout.count());
      },
      limit);
  if (reply.status() == wire::Status::kTimeout)
    throw TimeoutError("store at " + where() + ": waited " +
                       std::to_string(timeout.count() / 1000.0).substr(0, 5) + " s for " +
                       key_list(keys));
}

Ptr<c10d::Store> JobStore::clone() {
  auto copy = c10::make_intrusive<JobStore>(options_, server_);
  copy->setTimeout(timeout_);
  return copy;
}

}  // namespace lockstep
