#include "lockstep/dist/rendezvous.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <spdlog/spdlog.h>

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

Ptr<C10dStore> rendezvous_connect(const WorldInfo& world, const RendezvousOptions& options) {
  if (world.is_single()) return c10::make_intrusive<c10d::HashStore>();

  const auto start = Clock::now();
  const std::string where = world.master_addr + ":" + std::to_string(world.master_port);
  c10d::TCPStoreOptions tcp = tcp_store_options();
  tcp.port = static_cast<std::uint16_t>(world.master_port);
  tcp.isServer = world.rank == 0 && !world.use_agent_store;
  tcp.numWorkers = world.world_size;
  tcp.waitWorkers = false;  // wait_for_all_ranks does it, and names who is missing
  tcp.timeout = options.timeout;

  Ptr<C10dStore> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(world.master_addr, tcp);
  } catch (const std::exception& e) {
    if (tcp.isServer) {
      throw CommError("rendezvous: rank 0 could not host the store on " + where +
                      " (MASTER_ADDR:MASTER_PORT; is the port in use?): " + what_of(e));
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
  spdlog::debug("rendezvous: connected to {} as {}", where, tcp.isServer ? "host" : "client");

  const auto left =
      options.timeout - std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  wait_for_all_ranks(*store, world, std::max(left, std::chrono::milliseconds(1000)));
  return store;
}

}  // namespace lockstep
