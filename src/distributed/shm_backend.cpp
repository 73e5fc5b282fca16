// Size (over ~400 lines): the shm backend's set-up protocol and its worker thread share
// state that splitting would have to pass around (Note [Shared-memory backend]).
#include "lockstep/distributed/shm_backend.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>

#include "lockstep/util/error.h"
#include "lockstep/util/hex.h"
#include "serial_backend.h"
#include "shm_reduce.h"
#include "shm_segment.h"

// Note [Shared-memory backend]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Ranks on one host share a segment: a slot per rank and a result area,
// each `chunk` bytes, twice (buffer sets 0 and 1), plus one arrival flag per
// rank. A collective moves its tensor through the slots chunk by chunk;
// chunk k uses set k % 2, which is what lets a rank write chunk k + 2 while a
// slow peer still reads chunk k: it cannot pass chunk k + 1's barrier first.
//   all-reduce: copy the chunk, less my 1/world share of it, into my slot;
//     barrier; reduce my share over my own tensor and the others' slots, in
//     rank order, into the result area, and copy it back into my tensor;
//     copy the previous chunk's other shares out of its result area. After
//     the last chunk one more barrier, and its other shares are copied out.
//     So k chunks take k + 1 barriers, and every rank holds the same bits.
//     Chunk k's barrier also ends chunk k - 1's reduction, which is what
//     makes chunk k - 1's result area safe to read; chunk k's result area
//     is rewritten only after chunk k + 2's barrier, which no rank passes
//     before it has copied chunk k out.
//   broadcast: the root copies into its slot; barrier; the others copy out.
//   all-gather: copy into my slot; barrier; copy every slot out.
//   reduce-scatter: copy the others' chunks (a piece of each) into my slot;
//     barrier; reduce my chunk's piece in rank order into my output.
//   barrier: a barrier.
// A barrier is a generation number every rank publishes in its flag (a futex
// word): waiters spin ~4,000 pauses, then sleep on the futex in 5 ms slices,
// checking the deadline (the process group's timeout) and whether the
// waited-for rank's process is still alive, so a dead rank fails the
// collective at once and a hung one after the timeout, never a spin forever.
// After a failure the backend is broken: later collectives fail at once.
// Collectives run in issue order on one worker thread per backend, as
// asynchronous works with futures (the Reducer overlaps them with backward).
// A rank's death is seen through a pidfd of each peer (ShmSegment::
// watch_peers), so a dead rank its parent has not reaped yet is dead too.
// The segment is named /dev/shm/lockstep-<random>-<creator pid>, created
// O_EXCL by rank 0, and unlinked as soon as every rank has mapped it: no exit
// path, SIGKILL included, leaves it behind after that. Before that, ShmName
// unlinks it on every exit path of rank 0's set-up, SIGTERM included (Note
// [Segment name]); a rank that fails to map it says so through the store,
// so rank 0 unlinks at once rather than wait out the timeout. Only a SIGKILL
// inside that window leaves a name whose creator is dead; the next job
// removes it (ShmSegment::remove_orphans).

namespace lockstep {
namespace {

using Clock = std::chrono::steady_clock;

ShmOp shm_op(const c10d::ReduceOp& op) {
  if (op == c10d::ReduceOp::SUM) return ShmOp::kSum;
  if (op == c10d::ReduceOp::AVG) return ShmOp::kAvg;
  if (op == c10d::ReduceOp::MIN) return ShmOp::kMin;
  if (op == c10d::ReduceOp::MAX) return ShmOp::kMax;
  if (op == c10d::ReduceOp::PRODUCT) return ShmOp::kProduct;
  throw CommError("shm backend: unsupported reduce operation");
}

void check_tensor(const at::Tensor& t, const char* what) {
  if (!t.device().is_cpu() || t.is_sparse())
    throw CommError(std::string("shm backend: ") + what + " needs a dense CPU tensor");
}

class ShmBackend : public SerialBackend {
 public:
  ShmBackend(ShmSegment segment, int rank, int size, std::chrono::milliseconds timeout)
      : SerialBackend(rank, size, "shm"),
        segment_(std::move(segment)),
        me_(rank),
        world_(size),
        timeout_(timeout) {}
  ~ShmBackend() override {
    segment_.depart(me_);
    stop_worker();
  }

  Ptr<C10dWork> allreduce(std::vector<at::Tensor>& tensors,
                          const c10d::AllreduceOptions& options) override {
    if (tensors.size() != 1) throw CommError("shm backend: one tensor per all-reduce");
    check_tensor(tensors[0], "all-reduce");
    const ShmOp op = shm_op(options.reduceOp);
    at::Tensor t = tensors[0];
    return enqueue({t}, [this, t, op]() mutable { do_allreduce(t, op); });
  }

  Ptr<C10dWork> broadcast(std::vector<at::Tensor>& tensors,
                          const c10d::BroadcastOptions& options) override {
    if (tensors.size() != 1) throw CommError("shm backend: one tensor per broadcast");
    check_tensor(tensors[0], "broadcast");
    at::Tensor t = tensors[0];
    const int root = static_cast<int>(options.rootRank);
    return enqueue({t}, [this, t, root]() mutable { do_broadcast(t, root); });
  }

  Ptr<C10dWork> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                          std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions&) override {
    if (inputs.size() != 1 || outputs.size() != 1 || static_cast<int>(outputs[0].size()) != world_)
      throw CommError("shm backend: all-gather takes one input and one output per rank");
    check_tensor(inputs[0], "all-gather");
    for (const auto& o : outputs[0]) {
      if (o.numel() != inputs[0].numel() || o.scalar_type() != inputs[0].scalar_type())
        throw CommError("shm backend: all-gather outputs must match the input");
    }
    at::Tensor in = inputs[0];
    std::vector<at::Tensor> outs = outputs[0];
    return enqueue(outs, [this, in, outs]() mutable { do_allgather(in, outs); });
  }

  Ptr<C10dWork> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                     const c10d::ReduceScatterOptions& options) override {
    check_tensor(input, "reduce-scatter");
    check_tensor(output, "reduce-scatter");
    if (input.numel() != output.numel() * world_ || input.scalar_type() != output.scalar_type())
      throw CommError(
          "shm backend: reduce-scatter input must hold one output-sized chunk per rank");
    const ShmOp op = shm_op(options.reduceOp);
    if (output.numel() > 0 && segment_.chunk() / output.element_size() / world_ == 0)
      throw CommError("shm backend: dist.shm_chunk_mb too small for a reduce-scatter of " +
                      std::to_string(world_) + " ranks");
    at::Tensor in = input, out = output;
    return enqueue({out}, [this, in, out, op]() mutable { do_reduce_scatter(out, in, op); });
  }

  Ptr<C10dWork> reduce_scatter(std::vector<at::Tensor>& outputs,
                               std::vector<std::vector<at::Tensor>>& inputs,
                               const c10d::ReduceScatterOptions& options) override {
    if (outputs.size() != 1 || inputs.size() != 1 || static_cast<int>(inputs[0].size()) != world_)
      throw CommError("shm backend: reduce-scatter takes one output and one input per rank");
    at::Tensor flat = at::cat(inputs[0]);
    return _reduce_scatter_base(outputs[0], flat, options);
  }

  Ptr<C10dWork> barrier(const c10d::BarrierOptions&) override {
    return enqueue({}, [this] { sync(); });
  }

 private:
  // Every rank arrives at the next generation, then waits for the others.
  void sync() {
    ++generation_;
    segment_.arrive(me_, generation_);
    const std::string why = segment_.wait_all(generation_, Clock::now() + timeout_, stop_);
    if (!why.empty()) throw CommError("shm backend: " + why);
  }

  // Rank r's share of an n-element chunk: [begin, begin + len).
  struct Share {
    std::size_t begin, len;
  };
  Share share_of(std::size_t n, int r) const {
    const std::size_t share = (n + world_ - 1) / world_;
    const std::size_t begin = std::min(n, share * r);
    return {begin, std::min(n, begin + share) - begin};
  }

  // Copies the parts of an n-element chunk outside my share, [0, begin) and
  // [begin + len, n), from `from` to `to` (elements of `elem` bytes).
  void copy_others(char* to, const char* from, std::size_t n, std::size_t elem) const {
    const Share mine = share_of(n, me_);
    std::memcpy(to, from, mine.begin * elem);
    const std::size_t end = mine.begin + mine.len;
    std::memcpy(to + end * elem, from + end * elem, (n - end) * elem);
  }

  // Pipelined: chunk i's copy-in shares a barrier with chunk i - 1's
  // copy-out, so a message of k chunks takes k + 1 barriers (Note
  // [Shared-memory backend]).
  void do_allreduce(at::Tensor& tensor, ShmOp op) {
    at::Tensor flat = tensor.is_contiguous() ? tensor : tensor.contiguous();
    char* data = static_cast<char*>(flat.data_ptr());
    const std::size_t elem = flat.element_size();
    const std::size_t count = static_cast<std::size_t>(flat.numel());
    const std::size_t per_chunk = segment_.chunk() / elem;
    std::vector<const void*> inputs(world_);
    int previous_set = -1;  // the chunk whose result is still to copy out
    std::size_t previous_off = 0, previous_n = 0;
    for (std::size_t off = 0; off < count; off += per_chunk) {
      const std::size_t n = std::min(per_chunk, count - off);
      const int set = static_cast<int>(step_++ % 2);
      // My share is reduced from my own tensor: the others need only the rest.
      copy_others(segment_.slot(set, me_), data + off * elem, n, elem);
      sync();
      const Share mine = share_of(n, me_);
      if (mine.len > 0) {
        for (int r = 0; r < world_; ++r)
          inputs[r] = (r == me_ ? data + off * elem : segment_.slot(set, r)) + mine.begin * elem;
        char* result = segment_.result(set) + mine.begin * elem;
        shm_reduce(result, inputs.data(), world_, mine.len, flat.scalar_type(), op);
        std::memcpy(data + (off + mine.begin) * elem, result, mine.len * elem);
      }
      if (previous_set >= 0)
        copy_others(data + previous_off * elem, segment_.result(previous_set), previous_n, elem);
      previous_set = set;
      previous_off = off;
      previous_n = n;
    }
    if (previous_set >= 0) {
      sync();
      copy_others(data + previous_off * elem, segment_.result(previous_set), previous_n, elem);
    }
    if (!tensor.is_contiguous()) tensor.copy_(flat);
  }

  // Each step moves m elements of every rank's chunk: I copy the others'
  // chunks' pieces into my slot (piece d at d * m); barrier; I reduce my
  // chunk's piece over my own input and the others' slots, in rank order,
  // straight into my output - the same order, so the same bits, as the
  // all-reduce. Slot sets alternate as in the all-reduce.
  void do_reduce_scatter(at::Tensor& output, const at::Tensor& input, ShmOp op) {
    const at::Tensor in = input.contiguous();
    at::Tensor out = output.is_contiguous() ? output : output.contiguous();
    const char* data = static_cast<const char*>(in.data_ptr());
    char* result = static_cast<char*>(out.data_ptr());
    const std::size_t elem = out.element_size();
    const std::size_t n = static_cast<std::size_t>(out.numel());
    const std::size_t per = segment_.chunk() / elem / world_;
    std::vector<const void*> inputs(world_);
    for (std::size_t off = 0; off < n; off += per) {
      const std::size_t m = std::min(per, n - off);
      const int set = static_cast<int>(step_++ % 2);
      char* slot = segment_.slot(set, me_);
      for (int d = 0; d < world_; ++d) {
        if (d != me_) std::memcpy(slot + d * m * elem, data + (d * n + off) * elem, m * elem);
      }
      sync();
      for (int r = 0; r < world_; ++r) {
        inputs[r] = r == me_ ? data + (me_ * n + off) * elem
                             : static_cast<const char*>(segment_.slot(set, r)) + me_ * m * elem;
      }
      shm_reduce(result + off * elem, inputs.data(), world_, m, out.scalar_type(), op);
    }
    if (!output.is_contiguous()) output.copy_(out);
  }

  void do_broadcast(at::Tensor& tensor, int root) {
    if (root < 0 || root >= world_)
      throw CommError("shm backend: broadcast root " + std::to_string(root));
    at::Tensor flat = tensor.is_contiguous() ? tensor : tensor.contiguous();
    char* data = static_cast<char*>(flat.data_ptr());
    const std::size_t bytes = flat.nbytes();
    for (std::size_t off = 0; off < bytes; off += segment_.chunk()) {
      const std::size_t n = std::min(segment_.chunk(), bytes - off);
      const int set = static_cast<int>(step_++ % 2);
      if (me_ == root) std::memcpy(segment_.slot(set, root), data + off, n);
      sync();
      if (me_ != root) std::memcpy(data + off, segment_.slot(set, root), n);
    }
    if (!tensor.is_contiguous()) tensor.copy_(flat);
  }

  void do_allgather(const at::Tensor& input, std::vector<at::Tensor>& outputs) {
    const at::Tensor in = input.contiguous();
    const char* data = static_cast<const char*>(in.data_ptr());
    const std::size_t bytes = in.nbytes();
    std::vector<at::Tensor> flats;
    for (auto& o : outputs) flats.push_back(o.is_contiguous() ? o : o.contiguous());
    for (std::size_t off = 0; off < bytes; off += segment_.chunk()) {
      const std::size_t n = std::min(segment_.chunk(), bytes - off);
      const int set = static_cast<int>(step_++ % 2);
      std::memcpy(segment_.slot(set, me_), data + off, n);
      sync();
      for (int r = 0; r < world_; ++r)
        std::memcpy(static_cast<char*>(flats[r].data_ptr()) + off, segment_.slot(set, r), n);
    }
    for (int r = 0; r < world_; ++r)
      if (!outputs[r].is_contiguous()) outputs[r].copy_(flats[r]);
  }

  ShmSegment segment_;
  int me_;
  int world_;
  std::chrono::milliseconds timeout_;
  uint32_t generation_ = 0;
  uint64_t step_ = 0;
};

std::string text(const std::vector<uint8_t>& v) {
  return std::string(v.begin(), v.end());
}
std::vector<uint8_t> bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

// A set-up failure as the others read it from the store: "!", the kind
// ('c' bad input, exit 2; 'm' otherwise), the message. Every rank then fails
// with the same kind, so a too-small /dev/shm is exit 2 on all of them.
std::string failure_text(const Error& e) {
  return std::string("!") + (dynamic_cast<const ConfigError*>(&e) ? 'c' : 'm') + e.what();
}

bool is_failure(const std::string& value) {
  return value.size() >= 2 && value[0] == '!';
}

[[noreturn]] void throw_failure(const std::string& value, const std::string& who) {
  std::string why = value.substr(2);
  const std::string prefix = "shm backend: ";
  if (why.rfind(prefix, 0) == 0) why.erase(0, prefix.size());
  const std::string text = prefix + who + ": " + why;
  if (value[1] == 'c') throw ConfigError(text);
  throw CommError(text);
}

// A set-up failure is read from rank 0's store, which goes when rank 0
// exits: each other rank says it has read it (shm/seen/<rank>), and rank 0
// waits for them (a few seconds at most) before it throws, so that they
// report the failure rather than a lost store.
void acknowledge(C10dStore& store, int rank) {
  try {
    store.set("shm/seen/" + std::to_string(rank), bytes("1"));
  } catch (const std::exception&) {  // the store is gone already: nothing to tell
  }
}

void settle(C10dStore& store, const WorldInfo& world, std::chrono::milliseconds timeout) {
  std::vector<std::string> keys;
  for (int r = 1; r < world.world_size; ++r) keys.push_back("shm/seen/" + std::to_string(r));
  if (keys.empty()) return;
  try {
    store.wait(keys, std::min(timeout, std::chrono::milliseconds(10000)));
  } catch (const std::exception&) {  // a rank that died meanwhile: go anyway
  }
}

std::string this_host() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(boot, id);
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  return id + "/" + name;
}

}  // namespace

bool all_ranks_on_one_host(C10dStore& store, const WorldInfo& world,
                           std::chrono::milliseconds timeout) {
  if (world.local_world_size != world.world_size) return false;
  const std::string mine = this_host();
  store.set("host/" + std::to_string(world.rank), bytes(mine));
  std::vector<std::string> keys;
  for (int r = 0; r < world.world_size; ++r) keys.push_back("host/" + std::to_string(r));
  store.wait(keys, timeout);
  for (const auto& key : keys)
    if (text(store.get(key)) != mine) return false;
  return true;
}

Ptr<C10dBackend> shm_backend_create(const Ptr<C10dStore>& store, const WorldInfo& world,
                                    const ShmOptions& options) {
  if (world.local_world_size != world.world_size)
    throw ConfigError("dist.backend: shm needs every rank on one host (" +
                      std::to_string(world.local_world_size) + " of " +
                      std::to_string(world.world_size) + " are here); use gloo or auto");
  if (options.chunk_bytes < 4096 || options.chunk_bytes % 64 != 0)
    throw ConfigError("shm backend: a chunk of " + std::to_string(options.chunk_bytes) +
                      " bytes (at least 4096, a multiple of 64)");
  const std::vector<std::string> all = [&] {
    std::vector<std::string> keys;
    for (int r = 0; r < world.world_size; ++r) keys.push_back("shm/mapped/" + std::to_string(r));
    return keys;
  }();
  std::optional<ShmSegment> segment;
  if (world.rank == 0) {
    ShmSegment::remove_orphans();
    const std::string name = "/lockstep-" + random_hex(12) + "-" + std::to_string(getpid());
    try {
      segment.emplace(ShmSegment::create(name, world.world_size, options.chunk_bytes));
    } catch (const Error& e) {
      store->set("shm/name", bytes(failure_text(e)));
      settle(*store, world, options.timeout);
      throw;
    }
    const ShmName held(name);  // unlinked on every way out of this block
    store->set("shm/name", bytes(name));
    segment->publish_pid(0);
    store->set(all[0], bytes("1"));
    try {
      store->wait(all, options.timeout);
    } catch (const std::exception& e) {
      throw CommError("shm backend: not every rank mapped the segment within the timeout: " +
                      what_of(e));
    }
  } else {
    store->wait({"shm/name"}, options.timeout);
    const std::string name = text(store->get("shm/name"));
    if (is_failure(name)) {
      acknowledge(*store, world.rank);
      throw_failure(name, "rank 0 could not create the segment");
    }
    try {
      segment.emplace(ShmSegment::open(name, world.world_size, options.chunk_bytes));
    } catch (const Error& e) {
      store->set(all[world.rank], bytes(failure_text(e)));  // rank 0 unlinks at once
      acknowledge(*store, world.rank);
      throw;
    }
    segment->publish_pid(world.rank);
    store->set(all[world.rank], bytes("1"));
  }
  // Every rank's pid is published (or its failure) before anyone waits on it.
  store->wait(all, options.timeout);
  for (int r = 0; r < world.world_size; ++r) {
    if (r == world.rank) continue;
    const std::string mapped = text(store->get(all[r]));
    if (is_failure(mapped)) {
      if (world.rank == 0) {
        settle(*store, world, options.timeout);
      } else {
        acknowledge(*store, world.rank);
      }
      throw_failure(mapped, "rank " + std::to_string(r) + " could not map the segment");
    }
  }
  segment->watch_peers(world.rank);
  return c10::make_intrusive<ShmBackend>(std::move(*segment), world.rank, world.world_size,
                                         options.timeout);
}

}  // namespace lockstep
