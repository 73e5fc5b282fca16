#include "hier_backend.h"

#include <ATen/ATen.h>

#include "lockstep/util/error.h"
#include "serial_backend.h"

// Note [Hierarchical backend]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With L ranks on each of N hosts (rank = node * L + local rank):
//   all-reduce: shm all-reduce inside the host; the leaders (local rank 0)
//     all-reduce over Gloo; shm broadcast from the leader inside the host.
//     AVG is a SUM throughout, divided once at the end by N * L. The order
//     of additions is fixed (rank order inside a host, then Gloo's among the
//     leaders), so runs are reproducible; it is not Gloo's flat order, so
//     sums of more than two ranks may differ from a flat Gloo run in the
//     last bits.
//   broadcast from rank r on host h: inside h from r (when r is not h's
//     leader), among the leaders from h, then inside every other host (and h,
//     when r was its leader) from the leader.
//   all-gather: inside each host, then the hosts' blocks among the leaders,
//     then the whole result from each leader to its host.
//   barrier: inside, among the leaders, inside.
// Only the host's bytes cross the network once per host, not once per rank.

namespace lockstep {
namespace {

void wait(const Ptr<C10dWork>& work) {
  if (work) work->wait();
}

c10d::ReduceOp flat_op(const c10d::ReduceOp& op) {
  return op == c10d::ReduceOp::AVG ? c10d::ReduceOp(c10d::ReduceOp::SUM) : op;
}

class HierBackend : public SerialBackend {
 public:
  HierBackend(Ptr<C10dBackend> local, Ptr<C10dBackend> leaders, const WorldInfo& world, int nodes)
      : SerialBackend(world.rank, world.world_size, "hierarchical"),
        local_(std::move(local)),
        leaders_(std::move(leaders)),
        node_(world.rank / world.local_world_size),
        local_size_(world.local_world_size),
        nodes_(nodes) {}
  ~HierBackend() override { stop_worker(); }

  Ptr<C10dWork> allreduce(std::vector<at::Tensor>& tensors,
                          const c10d::AllreduceOptions& options) override {
    if (tensors.size() != 1) throw CommError("hierarchical backend: one tensor per all-reduce");
    at::Tensor t = tensors[0];
    const bool avg = options.reduceOp == c10d::ReduceOp::AVG;
    const c10d::ReduceOp op = flat_op(options.reduceOp);
    return enqueue({t}, [this, t, op, avg]() mutable {
      std::vector<at::Tensor> ts{t};
      c10d::AllreduceOptions o;
      o.reduceOp = op;
      wait(local_->allreduce(ts, o));
      if (leaders_) wait(leaders_->allreduce(ts, o));
      c10d::BroadcastOptions b;
      b.rootRank = 0;
      wait(local_->broadcast(ts, b));
      if (avg) {
        if (at::isIntegralType(t.scalar_type(), true)) {
          t.div_(size_, "trunc");
        } else {
          t.div_(size_);
        }
      }
    });
  }

  Ptr<C10dWork> broadcast(std::vector<at::Tensor>& tensors,
                          const c10d::BroadcastOptions& options) override {
    if (tensors.size() != 1) throw CommError("hierarchical backend: one tensor per broadcast");
    at::Tensor t = tensors[0];
    const int root = static_cast<int>(options.rootRank);
    return enqueue({t}, [this, t, root]() mutable {
      std::vector<at::Tensor> ts{t};
      const int root_node = root / local_size_, root_local = root % local_size_;
      c10d::BroadcastOptions o;
      if (node_ == root_node && root_local != 0) {
        o.rootRank = root_local;
        wait(local_->broadcast(ts, o));
      }
      if (leaders_) {
        o.rootRank = root_node;
        wait(leaders_->broadcast(ts, o));
      }
      if (node_ != root_node || root_local == 0) {
        o.rootRank = 0;
        wait(local_->broadcast(ts, o));
      }
    });
  }

  Ptr<C10dWork> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                          std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions&) override {
    if (inputs.size() != 1 || outputs.size() != 1 || static_cast<int>(outputs[0].size()) != size_)
      throw CommError("hierarchical backend: all-gather takes one input and one output per rank");
    at::Tensor in = inputs[0].contiguous();
    std::vector<at::Tensor> outs = outputs[0];
    return enqueue(outs, [this, in, outs]() mutable {
      // This host's block: its ranks' inputs, in local-rank order.
      std::vector<std::vector<at::Tensor>> host(1);
      for (int l = 0; l < local_size_; ++l) host[0].push_back(at::empty_like(in));
      std::vector<at::Tensor> mine{in};
      wait(local_->allgather(host, mine));
      at::Tensor all = at::empty({static_cast<int64_t>(size_) * in.numel()}, in.options());
      if (leaders_) {
        std::vector<at::Tensor> block{at::cat(host[0]).reshape({-1})};
        std::vector<std::vector<at::Tensor>> blocks(1);
        for (int n = 0; n < nodes_; ++n) blocks[0].push_back(at::empty_like(block[0]));
        wait(leaders_->allgather(blocks, block));
        all = at::cat(blocks[0]);
      }
      std::vector<at::Tensor> whole{all};
      c10d::BroadcastOptions o;
      o.rootRank = 0;
      wait(local_->broadcast(whole, o));
      const auto parts = whole[0].split(in.numel());
      for (int r = 0; r < size_; ++r) outs[r].copy_(parts[r].view(outs[r].sizes()));
    });
  }

  Ptr<C10dWork> barrier(const c10d::BarrierOptions&) override {
    return enqueue({}, [this] {
      c10d::BarrierOptions o;
      wait(local_->barrier(o));
      if (leaders_) wait(leaders_->barrier(o));
      wait(local_->barrier(o));
    });
  }

 private:
  Ptr<C10dBackend> local_;
  Ptr<C10dBackend> leaders_;
  int node_;
  int local_size_;
  int nodes_;
};

}  // namespace

Ptr<C10dBackend> hier_backend_make(Ptr<C10dBackend> local, Ptr<C10dBackend> leaders,
                                   const WorldInfo& world, int nodes) {
  return c10::make_intrusive<HierBackend>(std::move(local), std::move(leaders), world, nodes);
}

}  // namespace lockstep
