// The server half of lockstep's rendezvous store (Note [Job store] in
// src/store/store_server.cpp). Rank 0 hosts it on a thread of its own; ranks
// reach it through JobStore (store/job_store.h). Plain POSIX, no LibTorch.
//
// Unlike c10d's TCPStore it binds one address (loopback for a single-node
// job), admits only clients that prove the job's secret first (and proves
// it to them: the secret never crosses the wire), and bounds every buffer: a
// stray or hostile connection costs a few hundred bytes and is dropped after
// `hello_timeout`; a client that does not read its replies is cut off.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace lockstep {

struct StoreServerOptions {
  std::string host = "127.0.0.1";  // the one address to listen on
  int port = 0;                    // 0: a free port (see StoreServer::port)
  std::string secret;              // empty: any client that speaks the protocol (flagged)
  std::size_t max_frame_bytes = std::size_t{16} << 20;  // one request
  std::size_t max_total_bytes = std::size_t{1} << 30;   // keys + values held
  std::chrono::milliseconds hello_timeout{10000};       // to complete the handshake
  int max_unauthenticated = 1024;  // connections still in their hello (Note [Store admission])
  int max_clients = 4096;
};

// How many connections may be in their handshake at once:
// max_unauthenticated, but at most half of this process's descriptor limit
// (RLIMIT_NOFILE), and at least 1.
int admission_capacity(const StoreServerOptions& options);

class StoreServer {
 public:
  // Binds and listens, then serves on a thread. Throws CommError naming the
  // address when it cannot bind (in use, not an address of this host).
  explicit StoreServer(StoreServerOptions options);
  ~StoreServer();  // stops the thread and closes every connection
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const;
  std::string listen_address() const;  // numeric "host:port" as bound

  struct Stats {
    std::uint64_t accepted = 0;   // clients that proved the secret
    std::uint64_t refused = 0;    // wrong proof, bad hello, too slow, turned away when busy
    std::uint64_t oversized = 0;  // requests refused for their size (never buffered)
    std::uint64_t cut_off = 0;    // clients that sent requests without reading the replies
    std::size_t stored_bytes = 0;
    std::size_t peak_buffered_bytes = 0;  // largest sum of connection buffers seen
  };
  Stats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lockstep
