// JobStore: a client of lockstep's rendezvous store (StoreServer), behind
// c10d's Store interface, which is all Gloo, NCCL and MPI ask of a store.
// Thread-safe: one request at a time on one connection, as c10d's TCPStore.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "lockstep/store/store_server.h"
#include "lockstep/util/timeouts.h"
#include "lockstep/util/torch_compat.h"

namespace lockstep {

struct JobStoreOptions {
  std::string host;  // the server's address (MASTER_ADDR)
  int port = 0;
  std::string secret;  // presented first; empty when the job has none
  std::chrono::milliseconds timeout{kCollectiveTimeout};          // each wait and get
  std::chrono::milliseconds connect_timeout{kRendezvousTimeout};  // server not up yet
};

class JobStore : public c10d::Store {
 public:
  // Connects, retrying until connect_timeout, and proves the secret while
  // the server proves it back (Note [Store handshake]). Throws TimeoutError
  // (unreachable, or never admitted), ConfigError (either side could not
  // prove the secret: names the address) or CommError. `server` is kept alive as long as this
  // client (rank 0).
  explicit JobStore(JobStoreOptions options, std::shared_ptr<StoreServer> server = nullptr);
  ~JobStore() override;

  using c10d::Store::compareSet;
  using c10d::Store::set;
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  // Waits up to the store's timeout for the key, as c10d's stores do.
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;
  // A second connection to the same server, for a thread that must not queue
  // behind this one's requests (later c10d versions ask stores for clone()).
  Ptr<c10d::Store> clone();

 private:
  class Reply;  // one request: frame, round trip, status (job_store.cpp)
  std::string where() const;
  void connect();
  bool handshake(std::chrono::steady_clock::time_point deadline, std::string& error);
  std::string round_trip(const std::string& frame, std::chrono::milliseconds limit);
  [[noreturn]] void lost(const std::string& what);

  JobStoreOptions options_;
  std::shared_ptr<StoreServer> server_;
  std::mutex mutex_;
  int fd_ = -1;
};

}  // namespace lockstep
