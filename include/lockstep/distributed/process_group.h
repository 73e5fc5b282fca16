// lockstep::ProcessGroup: a c10d backend (Gloo, NCCL, MPI, lockstep's shared
// memory or hierarchical backend) plus the things every
// caller needs around it: the device its tensors live on, AVG where the
// backend lacks it, early return at world size 1, and errors that name the
// rank, the operation and its sequence number.
//
// Threads: like c10d backends, one thread issues collectives, in the same
// order on every rank. Async work may complete on backend threads.
#pragma once

#include "lockstep/util/names.h"

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/distributed/backend_kind.h"
#include "lockstep/distributed/shm_options.h"
#include "lockstep/distributed/torch_compat.h"
#include "lockstep/distributed/world.h"
#include "lockstep/util/timeouts.h"

namespace lockstep {

const char* backend_kind_name(BackendKind kind);

enum class ReduceKind { kSum, kAvg, kMin, kMax, kProduct };
inline constexpr NameTable<ReduceKind, 5> kReduceKindNames{{{ReduceKind::kSum, "sum"},
                                                            {ReduceKind::kAvg, "avg"},
                                                            {ReduceKind::kMin, "min"},
                                                            {ReduceKind::kMax, "max"},
                                                            {ReduceKind::kProduct, "product"}}};
const char* reduce_kind_name(ReduceKind kind);

struct ProcessGroupOptions {
  BackendKind backend = BackendKind::kAuto;
  // shm: bytes per step through each rank's slot (dist.shm_chunk_mb).
  std::size_t shm_chunk_bytes = ShmOptions{}.chunk_bytes;
  // Per collective: a peer that does not take part within this time makes
  // the collective fail instead of hanging.
  std::chrono::milliseconds timeout{kCollectiveTimeout};
  // The backend's keys live under lockstep/pg/<name>/ in the store. Every
  // rank must use the same name; two groups on one store need two names.
  std::string name = "default";
};

class ProcessGroup : public std::enable_shared_from_this<ProcessGroup> {
 public:
  // Creates the backend over `store` (its keys under a private prefix).
  // Gloo honours GLOO_SOCKET_IFNAME (comma-separated interfaces). NCCL needs
  // a CUDA build of LibTorch, MPI one built with MPI and a start by mpirun;
  // elsewhere they throw ConfigError saying so. MPI wires its own ranks; the
  // store still serves the roll call and lockstep's own agreement keys.
  static std::shared_ptr<ProcessGroup> create(const Ptr<C10dStore>& store, const WorldInfo& world,
                                              const ProcessGroupOptions& options);

  ProcessGroup(Ptr<C10dBackend> backend, BackendKind kind, int rank, int size, int local_rank);
  ~ProcessGroup();

  int rank() const { return rank_; }
  int size() const { return size_; }
  BackendKind kind() const { return kind_; }
  // Where this backend's tensors live: CPU for Gloo and MPI, cuda:<local rank> for NCCL.
  at::Device device() const;
  C10dBackend& backend() { return *backend_; }

  // Blocking collectives; each returns when the result is in place.
  void allreduce(at::Tensor& tensor, ReduceKind op);
  void broadcast(at::Tensor& tensor, int root);
  std::vector<at::Tensor> allgather(const at::Tensor& tensor);
  void barrier();

  // Starts an all-reduce; the result is in `tensor` after wait(). AVG is only
  // accepted where the backend has it natively (NCCL); pre-divide otherwise.
  // Returns nullptr at world size 1 (nothing to wait for).
  Ptr<C10dWork> allreduce_async(at::Tensor& tensor, ReduceKind op);
  // A SUM all-reduce of each rank's tensor times `scale`: the same bits as
  // tensor.mul_(scale) and then allreduce_async(SUM), which is what it does
  // on every backend but shm; there, when every rank all-reduces the same
  // range of a float32/float64 tensor made by bucket_zeros with the same
  // scale, the scale is applied inside the in-place reduction (DDP's default
  // hook: Note [Pre-divided buckets], reducer.cpp).
  Ptr<C10dWork> allreduce_scaled_async(at::Tensor& tensor, double scale);
  // Zeros for a flat buffer all-reduced again and again (DDP's buckets). On
  // the shm backend, memory every rank maps, so that its all-reduces move
  // nothing through the segment (Note [Buckets in shared memory],
  // shm_backend.cpp), and `*shared` is set; elsewhere, where that cannot be
  // made on every rank, or with LOCKSTEP_SHM_BUCKETS=0 on any rank,
  // at::zeros (which of the two is said once, at info level). On shm a
  // collective: every rank calls it alike, same numel and options, same
  // place among its collectives.
  at::Tensor bucket_zeros(int64_t numel, const at::TensorOptions& options, bool* shared = nullptr);

  // Starts an all-gather; after wait(work, ...) `outputs[r]` holds rank r's
  // tensor. At world size 1 work is nullptr and outputs[0] a copy.
  struct Gathering {
    Ptr<C10dWork> work;
    std::vector<at::Tensor> outputs;
    uint64_t sequence = 0;
  };
  Gathering allgather_async(const at::Tensor& tensor);

  // Flat reduce-scatter (SUM): `input` holds size() equal chunks of
  // output.numel() elements; after wait(), `output` is the sum over ranks of
  // chunk rank(). shm reduces natively in rank order (the same bits as its
  // all-reduce); NCCL, MPI and LibTorch 2's Gloo use their own; LibTorch 1's
  // Gloo and the hierarchical backend have none: an all-reduce of the whole
  // input, then the slice (twice the traffic; said once per process). At
  // world size 1 the chunk is copied and work is nullptr.
  struct Scattering {
    Ptr<C10dWork> work;
    at::Tensor output;
    at::Tensor staged;  // the fallback's all-reduced copy of the input
    uint64_t sequence = 0;
  };
  Scattering reduce_scatter_async(at::Tensor& output, const at::Tensor& input);
  void wait(Scattering& scattering, const std::string& what);
  void reduce_scatter(at::Tensor& output, const at::Tensor& input);
  // Whether reduce_scatter_async is native here (false: the fallback).
  bool reduce_scatter_native() const;
  // Flat all-gather: `output` (size() x input.numel() elements, contiguous)
  // receives every rank's `input` in rank order.
  Ptr<C10dWork> all_gather_into_async(at::Tensor& output, const at::Tensor& input);
  void all_gather_into(at::Tensor& output, const at::Tensor& input);

  // Point to point (Gloo and NCCL both have them); `tag` tells concurrent
  // messages between the same pair apart.
  Ptr<C10dWork> send_async(at::Tensor& tensor, int dst, int tag);
  Ptr<C10dWork> recv_async(at::Tensor& tensor, int src, int tag);

  // Around the launch of an asynchronous collective that this thread waits
  // for next, with nothing left to overlap it with (DDP's last bucket): a
  // backend that runs collectives on a worker thread (shm, hierarchical)
  // leaves it to the waiting thread and does not wake the worker (Note
  // [Waiting runs the queue]). The work must be waited for: an unbounded
  // wait runs it, a bounded one wakes the worker; a work never waited for
  // runs only when a later collective of the group wakes the worker.
  class WaitNext {
   public:
    WaitNext();
    ~WaitNext();
    WaitNext(const WaitNext&) = delete;
    WaitNext& operator=(const WaitNext&) = delete;

   private:
    bool before_;
  };

  // Waits for `work` (no-op for nullptr); failures become CommError naming
  // this rank, `what` and the sequence number.
  void wait(const Ptr<C10dWork>& work, const std::string& what);

  // Number of collectives issued so far (the next one's sequence number).
  uint64_t sequence() const { return sequence_; }

  // Note [Roll call]: when a collective fails, the surviving ranks tell dead
  // from alive through the store: each sets rollcall/<rank> and waits up to
  // `grace` for the others. The ranks that never answer are named in the
  // error (dead, hung or cut off). Done once per process: later failures
  // repeat the first answer. create() enables it; without a store it is off.
  void enable_roll_call(Ptr<C10dStore> store, std::chrono::milliseconds grace);

  // Note [Collective check]: a debug mode (LOCKSTEP_DEBUG_COLLECTIVES=1, read
  // by create(); like PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL). Before each
  // collective every rank publishes its signature (op, dtype, shape, root)
  // under desync/<sequence>/<rank> and compares with all others': a
  // mismatch, or a rank that never issues the collective within the
  // timeout, is a CommError naming the ranks and what each issued, instead
  // of a hang or garbage. Costs store round trips per collective.
  void enable_collective_check(Ptr<C10dStore> store, std::chrono::milliseconds timeout);

 private:
  std::string describe(const std::string& what) const;
  // A send or recv started by `start` on {tensor}; a failure to start is a
  // CommError naming `what`.
  Ptr<C10dWork> start_p2p(const std::string& what,
                          const std::function<Ptr<C10dWork>(std::vector<at::Tensor>&)>& start,
                          at::Tensor& tensor);
  std::string roll_call();
  void check_collective(uint64_t sequence, const std::string& signature);

  Ptr<C10dBackend> backend_;
  BackendKind kind_;
  bool said_buckets_ = false;  // where bucket_zeros put them, said once
  int rank_;
  int size_;
  int local_rank_;
  uint64_t sequence_ = 0;
  Ptr<C10dStore> roll_call_store_;
  std::chrono::milliseconds roll_call_grace_{0};
  std::string roll_call_answer_;
  Ptr<C10dStore> check_store_;
  std::chrono::milliseconds check_timeout_{0};
  // A backend that refused a reduce-scatter at run time (MPI before
  // PyTorch implemented it): the fallback from then on.
  bool reduce_scatter_refused_ = false;
};

// Implemented by process_group_nccl.cpp (CUDA LibTorch) or
// process_group_nccl_absent.cpp (CPU LibTorch): CMake picks one.
Ptr<C10dBackend> nccl_backend_create(const Ptr<C10dStore>& store, int rank, int size,
                                     std::chrono::milliseconds timeout);
bool nccl_available();
// Releases NCCL's communicators before the backend is destroyed (2.4+ warns
// and aborts them when a ProcessGroupNCCL dies without it); a no-op where
// LibTorch has no such call or no NCCL. ~ProcessGroup calls it.
void nccl_backend_shutdown(C10dBackend& backend);

// Implemented by process_group_mpi.cpp (LibTorch built with MPI, e.g.
// Debian 13's) or process_group_mpi_absent.cpp: CMake picks one. The world
// must be the one mpirun started (its rank and size are checked against MPI's).
Ptr<C10dBackend> mpi_backend_create(const WorldInfo& world);
bool mpi_available();
// Throws ConfigError unless `world` can use MPI (a LibTorch with MPI, ranks
// started by mpirun). init_distributed calls it before the rendezvous, so
// that every rank fails alone, at once, instead of racing its peers.
void mpi_check_world(const WorldInfo& world);

}  // namespace lockstep
