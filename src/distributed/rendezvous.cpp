#include "lockstep/distributed/rendezvous.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <spdlog/spdlog.h>

#include "lockstep/store/job_store.h"
#include "lockstep/util/error.h"

namespace lockstep {
namespace {

using Clock = std::chrono::steady_clock;

std::string seconds(std::chrono::milliseconds ms) {
  return std::to_string(ms.count() / 1000.0).substr(0, 5) + " s";
}

std::string arrival_key(int rank) {
  return "lockstep/rdzv/arrived/" + std::to_string(rank);
}

// Every rank announces itself, then waits for all others. On timeout the
// missing keys tell exactly which ranks never arrived.
void wait_for_all_ranks(C10dStore& store, const WorldInfo& world,
                        std::chrono::milliseconds timeout) {
  const std::string where = world.master_addr + ":" + std::to_string(world.master_port);
  try {
    store.set(arrival_key(world.rank), std::vector<uint8_t>{1});
    std::vector<std::string> keys;
    for (int r = 0; r < world.world_size; ++r) keys.push_back(arrival_key(r));
    try {
      store.wait(keys, timeout);
    } catch (const std::exception& e) {
      std::string missing;
      for (int r = 0; r < world.world_size; ++r) {
        if (!store.check({arrival_key(r)}))
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      throw TimeoutError("rendezvous at " + where + ": rank(s) " + missing +
                         " did not arrive within " + seconds(timeout) + " (world size " +
                         std::to_string(world.world_size) + ")");
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    // The store itself went away mid-rendezvous (rank 0 exited, say).
    throw CommError("rendezvous at " + where + ": rank " + std::to_string(world.rank) +
                    " lost the store (did the rank hosting it exit?): " + what_of(e));
  }
}

}  // namespace

std::string store_listen_host(const WorldInfo& world) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(world.master_addr.c_str(), nullptr, &hints, &found); rc != 0)
    throw EnvError("MASTER_ADDR='" + world.master_addr +
                   "' cannot be resolved: " + gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> guard(found, freeaddrinfo);
  char host[NI_MAXHOST] = {0};
  getnameinfo(found->ai_addr, found->ai_addrlen, host, sizeof(host), nullptr, 0, NI_NUMERICHOST);
  bool loopback = false;
  if (found->ai_family == AF_INET) {
    const auto a = ntohl(reinterpret_cast<const sockaddr_in*>(found->ai_addr)->sin_addr.s_addr);
    loopback = (a >> 24) == 127;
  } else if (found->ai_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6*>(found->ai_addr)->sin6_addr;
    loopback = IN6_IS_ADDR_LOOPBACK(&a);
  }
  if (loopback && world.local_world_size < world.world_size) {
    throw EnvError(
        "MASTER_ADDR='" + world.master_addr + "' is a loopback address (" + host +
        ") on rank 0's host, but the job spans several hosts (" +
        std::to_string(world.local_world_size) + " of " + std::to_string(world.world_size) +
        " ranks here): set MASTER_ADDR to an address of rank 0's host that the others can reach");
  }
  return host;
}

Ptr<C10dStore> rendezvous_connect(const WorldInfo& world, const RendezvousOptions& options) {
  if (world.is_single()) return c10::make_intrusive<c10d::HashStore>();

  const auto start = Clock::now();
  const std::string where = world.master_addr + ":" + std::to_string(world.master_port);
  const bool host = world.rank == 0 && !world.use_agent_store;
  bool hosting = false;  // rank 0's server is up: later failures are not the port's
  Ptr<C10dStore> store;
  try {
    if (world.use_agent_store) {
      c10d::TCPStoreOptions tcp = tcp_store_options();
      tcp.port = static_cast<std::uint16_t>(world.master_port);
      tcp.isServer = false;
      tcp.numWorkers = world.world_size;
      tcp.waitWorkers = false;  // wait_for_all_ranks does it, and names who is missing
      tcp.timeout = options.timeout;
      store = c10::make_intrusive<c10d::TCPStore>(world.master_addr, tcp);
    } else {
      // host, port, secret; each wait, and the connection, within options.timeout
      JobStoreOptions client{world.master_addr, world.master_port, world.store_secret,
                             options.timeout, options.timeout};
      std::shared_ptr<StoreServer> server;
      if (host) {
        StoreServerOptions serve;
        serve.host = store_listen_host(world);
        serve.port = world.master_port;
        serve.secret = world.store_secret;
        server = std::make_shared<StoreServer>(serve);
        hosting = true;
        client.host = serve.host;
        if (world.store_secret.empty()) {
          spdlog::warn(
              "rendezvous: the store on {} admits any client (LOCKSTEP_STORE_SECRET is not set; "
              "lockstep-run sets one for single-node jobs)",
              server->listen_address());
        }
      }
      store = c10::make_intrusive<JobStore>(client, std::move(server));
    }
  } catch (const ConfigError&) {
    throw;  // the secret was refused: bad input, not a network failure
  } catch (const EnvError&) {
    throw;
  } catch (const std::exception& e) {
    if (host && !hosting) {
      throw CommError("rendezvous: rank 0 could not host the store on " + where +
                      " (MASTER_ADDR:MASTER_PORT): " + what_of(e));
    }
    if (host) {
      throw CommError("rendezvous: rank 0 could not join the store it hosts on " + where + ": " +
                      what_of(e));
    }
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    throw TimeoutError("rendezvous: rank " + std::to_string(world.rank) +
                       " could not reach the store at " + where +
                       " (MASTER_ADDR:MASTER_PORT) after " + seconds(waited) + ": " + what_of(e));
  }
  if (world.use_agent_store) {
    store = c10::make_intrusive<c10d::PrefixStore>(
        "/worker/attempt_" + std::to_string(world.restart_count), store);
  }
  spdlog::debug("rendezvous: connected to {} as {}", where, host ? "host" : "client");

  const auto left =
      options.timeout - std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  wait_for_all_ranks(*store, world, std::max(left, std::chrono::milliseconds(1000)));
  return store;
}

}  // namespace lockstep
