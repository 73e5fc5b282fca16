// The shm backend's collectives, its shared buffers (which
// run as its collectives, on its slots and barriers) and its set-up protocol
// share the segment and the backend's state; a split would pass both around.
// The POSIX parts live apart: shm_segment, shm_buffers, shm_reduce.
#include "lockstep/distributed/shm_backend.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "lockstep/util/error.h"
#include "lockstep/util/hex.h"
#include "serial_backend.h"
#include "shm_buffers.h"
#include "shm_reduce.h"
#include "shm_segment.h"
#include "shm_store_choice.h"

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
// word): waiters spin 100 us, then sleep on the futex in 5 ms slices,
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
//
// Note [Buckets in shared memory]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Through the segment an all-reduce moves ~4.5 bytes per byte on each rank
// (its data into its slot, the reduction, the result back, the others'
// results out). DDP all-reduces the same buckets every step, so they are
// made where every rank can reach them (shm_shared_zeros): each rank
// creates a /dev/shm file for its copy (named as the segment is, so that
// remove_orphans finds what a SIGKILL left), the names are all-gathered,
// every rank maps every copy, the outcome is all-gathered again (any
// failure, on any rank: every rank falls back to private memory, the same
// decision everywhere) and the names are unlinked. An all-reduce of a tensor
// inside such a buffer then reduces in place: each rank reduces its share
// (whole 64-byte lines) over every rank's copy, in rank order, one line at
// a time, and writes the line's result into every copy before the next
// (Note [Reducing a line into every copy], shm_reduce.cpp; the arithmetic of
// the segment's kernel, so the same bits): ~2 bytes per byte and two
// barriers. Which path an all-reduce takes is decided alike on every
// rank: each publishes a descriptor (the buffer, byte range, dtype and op;
// zeros for private memory) with its first arrival, and reads the others'
// after it. All equal and in a buffer: in place. Any other mix: every rank
// starts over through the segment (its data copied again; one barrier
// lost), so a tensor in a buffer may meet a private one or one elsewhere in
// a buffer and still sum right. A descriptor is rewritten only at the next
// all-reduce's first arrival, after the barriers that follow its reading.
// A rank's mappings of a buffer (its own copy and the others') go when its
// tensor is freed, not before: a tensor (a .grad viewing a bucket) may
// outlive the backend, and then is plain memory. An all-reduce on another
// backend's group does not know it and goes through that group's segment.
//
// Note [How long to spin]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A rank that reaches a barrier first spins for 100 us (by the clock: how
// long a pause instruction lasts differs between CPUs), then sleeps on the
// futex; for a peer on its own CPU it sleeps at once (Note [A peer on the
// same core], shm_segment.cpp). A spin much shorter than that pays a futex
// wake-up at most barriers; a longer one made no difference to the small
// MLP's DDP step (`scripts/bench_ddp.sh`). (The experiments behind this
// choice: docs/lab/shm-allreduce.md, "Note [How long to spin]".)
//
// Note [The chunk's size]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A tensor of private memory crosses the segment in chunks (Note
// [Shared-memory backend]). Per byte of tensor the cores move ~4 bytes
// (copy in, a reduction reading two inputs and writing two outputs, copy
// out) where a copy moves 2, but memory itself need only see the tensor
// read once and written once, if the slot and result lines a step writes
// are still in the caches when the peer reads them, one barrier later. At
// 1 MiB a step's lines (two ranks' slots, results and tensor pieces) are
// more than a 1 MiB L2 holds, and (inferred from timings) the tensors
// streaming past push them out of the L3 first. Hence 256 KiB chunks
// (ShmOptions::chunk_bytes): on 2 ranks of a guest with a 1 MiB L2 per core
// and an 8 MiB L3, `lockstep bench allreduce --shm-chunk-mb` gave the
// private path 0.76-1.24 of the same run's memory copy at 1-64 MiB with
// 256 KiB chunks against 0.32-0.83 with 1 MiB; 128 KiB was no better (more
// barriers). Collectives on bucket memory do not use chunks; reduce-scatter
// and all-gather showed no difference between 256 KiB and 1 MiB chunks.
// (The experiments behind this choice: docs/lab/shm-allreduce.md, "Note
// [The chunk's size]".)

namespace lockstep {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::microseconds kSpin{100};  // Note [How long to spin]

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
  ShmBackend(ShmSegment segment, int rank, int size, std::chrono::milliseconds timeout,
             ShmStreaming streaming)
      : SerialBackend(rank, size, "shm"),
        segment_(std::move(segment)),
        me_(rank),
        world_(size),
        timeout_(timeout) {
    stores_.fill(ShmStoreChoice(streaming));
  }
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
    return enqueue({t}, [this, t, op]() mutable { do_allreduce(t, op, 1.0); });
  }

  // A SUM of each rank's tensor times `scale` (shm_allreduce_scaled).
  Ptr<C10dWork> allreduce_scaled(at::Tensor& tensor, double scale) {
    check_tensor(tensor, "all-reduce");
    at::Tensor t = tensor;
    return enqueue({t}, [this, t, scale]() mutable { do_allreduce(t, ShmOp::kSum, scale); });
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

  // Note [Buckets in shared memory]: a collective job, waited for here.
  // `willing` false: this rank votes for private memory (every rank then
  // gets it). The tensor holds its mappings: they outlive the backend.
  at::Tensor shared_zeros(int64_t numel, const at::TensorOptions& options, bool willing,
                          std::string* why) {
    const std::size_t bytes = static_cast<std::size_t>(numel) *
                              c10::elementSize(c10::typeMetaToScalarType(options.dtype()));
    struct Made {
      std::shared_ptr<ShmBuffer> buffer;
      uint64_t id = 0;
      std::string failure;
    };
    auto made = std::make_shared<Made>();  // the job may outlive a wait that throws
    {
      const SerialBackend::WaitAtOnce at_once;
      auto work = enqueue({}, [this, made, bytes, willing] {
        made->buffer = make_shared_buffer(bytes, willing, made->id, made->failure);
      });
      work->wait(std::chrono::milliseconds(0));
    }
    if (!made->buffer) {
      if (why != nullptr) *why = made->failure;
      return {};
    }
    buffers_->add(made->id, made->buffer);
    std::weak_ptr<ShmBuffers> registry = buffers_;
    return at::from_blob(
        made->buffer->base(me_), {numel},
        [registry, id = made->id, keep = made->buffer](void*) {
          if (auto r = registry.lock()) r->remove(id);
        },
        options.device(at::kCPU));
  }

 private:
  // Every rank arrives at the next generation, then waits for the others.
  void sync() {
    ++generation_;
    segment_.arrive(me_, generation_);
    const auto arrived = Clock::now();
    int64_t shared_core = 0;
    const std::string why =
        segment_.wait_all(generation_, arrived + timeout_, stop_, kSpin, &shared_core);
    if (shared_core > 0) shared_core_.fetch_add(shared_core, std::memory_order_relaxed);
    waited_ += Clock::now() - arrived;
    if (!why.empty()) throw CommError("shm backend: " + why);
  }

  // The collectives that choose their stores, each with its own record.
  enum class Stores { kAllReduce, kReduceScatter, kAllGather, kCount };

  // One collective's choice of stores for what it writes into the segment
  // (Note [Choosing the stores], shm_store_choice.cpp) and its timing: its
  // time less its barrier waits, reported by done() at its normal end.
  class StoreTimer {
   public:
    StoreTimer(ShmBackend& backend, Stores kind, std::size_t bytes)
        : choice_(backend.stores_[static_cast<int>(kind)]),
          waited_(backend.waited_),
          bytes_(bytes),
          stream_(choice_.stream(bytes)),
          start_(Clock::now()),
          waited_at_start_(waited_),
          streamed_(backend.streamed_),
          measured_(backend.measured_) {
      if (stream_) streamed_.fetch_add(1, std::memory_order_relaxed);
    }
    bool stream() const { return stream_; }
    void copy(void* to, const void* from, std::size_t n) const {
      if (stream_) return shm_stream_copy(to, from, n);
      std::memcpy(to, from, n);
    }
    void done() {
      const auto worked = (Clock::now() - start_) - (waited_ - waited_at_start_);
      if (choice_.took(bytes_, stream_, std::chrono::duration<double>(worked).count()))
        measured_.fetch_add(1, std::memory_order_relaxed);
    }

   private:
    ShmStoreChoice& choice_;
    const Clock::duration& waited_;
    std::size_t bytes_;
    bool stream_;
    Clock::time_point start_;
    Clock::duration waited_at_start_;
    std::atomic<int64_t>& streamed_;
    std::atomic<int64_t>& measured_;
  };

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
  // `stream`: with streaming stores (into a slot the peers read next).
  void copy_others(char* to, const char* from, std::size_t n, std::size_t elem,
                   bool stream = false) const {
    const Share mine = share_of(n, me_);
    const std::size_t end = mine.begin + mine.len;
    if (stream) {
      shm_stream_copy(to, from, mine.begin * elem);
      shm_stream_copy(to + end * elem, from + end * elem, (n - end) * elem);
      return;
    }
    std::memcpy(to, from, mine.begin * elem);
    std::memcpy(to + end * elem, from + end * elem, (n - end) * elem);
  }

  // Every rank's text (at most kRecord - 1 bytes of it), in rank order.
  static constexpr int64_t kRecord = 512;
  std::vector<std::string> exchange_text(const std::string& mine) {
    auto in = at::zeros({kRecord}, at::kByte);
    std::memcpy(in.data_ptr(), mine.data(), std::min<std::size_t>(mine.size(), kRecord - 1));
    std::vector<at::Tensor> outs;
    for (int r = 0; r < world_; ++r) outs.push_back(at::zeros({kRecord}, at::kByte));
    do_allgather(in, outs);
    std::vector<std::string> texts;
    for (auto& o : outs) texts.emplace_back(static_cast<const char*>(o.data_ptr()));
    return texts;
  }

  // The first failure among `answers` ("+..." fine, "-why" not), or "".
  static std::string first_failure(const std::vector<std::string>& answers) {
    for (std::size_t r = 0; r < answers.size(); ++r)
      if (answers[r].empty() || answers[r][0] != '+')
        return "rank " + std::to_string(r) + ": " +
               (answers[r].empty() ? std::string("no answer") : answers[r].substr(1));
    return "";
  }

  // Runs as a job on every rank (Note [Buckets in shared memory]).
  std::shared_ptr<ShmBuffer> make_shared_buffer(std::size_t bytes, bool willing, uint64_t& id,
                                                std::string& failure) {
    id = ++buffers_made_;
    const std::string name = "/lockstep-" + random_hex(12) + "-" + std::to_string(getpid());
    std::shared_ptr<ShmBuffer> buffer;
    std::string mine;
    // Armed before the file exists: unlinked on every way out, SIGTERM included.
    const ShmName held(name);
    try {
      if (!willing) throw ConfigError("LOCKSTEP_SHM_BUCKETS=0 is set here");
      if (bytes == 0) throw ConfigError("an empty buffer");
      buffer = ShmBuffer::create(name, bytes, world_, me_);
      mine = "+" + name;
    } catch (const Error& e) {
      mine = std::string("-") + e.what();
    }
    auto names = exchange_text(mine);
    failure = first_failure(names);
    if (failure.empty()) {
      try {
        for (int r = 0; r < world_; ++r)
          if (r != me_) buffer->map_peer(r, names[r].substr(1));
        mine = "+";
      } catch (const Error& e) {
        mine = std::string("-") + e.what();
      }
      failure = first_failure(exchange_text(mine));
    }
    if (!failure.empty()) return nullptr;
    return buffer;
  }

  // `kind` holds the dtype and the op, `scale` the scale's bits: ranks that
  // scale differently meet through the segment, each scaling its own.
  ShmDescriptor locate(const at::Tensor& tensor, ShmOp op, double scale,
                       std::shared_ptr<ShmBuffer>& buffer) {
    if (!tensor.is_contiguous() || tensor.numel() == 0) return {};
    auto found = buffers_->find(tensor.data_ptr(), tensor.nbytes(), me_);
    if (!found) return {};
    buffer = found->buffer;
    uint64_t scale_bits = 0;
    static_assert(sizeof(scale_bits) == sizeof(scale), "a double's bits");
    std::memcpy(&scale_bits, &scale, sizeof(scale));
    return {found->id, found->offset, tensor.nbytes(),
            (static_cast<uint64_t>(tensor.scalar_type()) << 8) | static_cast<uint64_t>(op),
            scale_bits};
  }

  // Every rank's copy at `offset`: my share reduced over all of them in rank
  // order and written into each, line by line (Note [Buckets in shared
  // memory], Note [Reducing a line into every copy]). Shares are whole
  // 64-byte lines, so no line is written by two ranks.
  void allreduce_in_place(const ShmBuffer& buffer, std::size_t offset, std::size_t count,
                          c10::ScalarType dtype, ShmOp op, double scale) {
    const std::size_t elem = c10::elementSize(dtype);
    constexpr std::size_t kLine = 64;
    const std::size_t first_line = offset / kLine;
    const std::size_t lines = (offset + count * elem + kLine - 1) / kLine - first_line;
    const Share share = share_of(lines, me_);
    const std::size_t from = std::max(offset, (first_line + share.begin) * kLine);
    const std::size_t to =
        std::min(offset + count * elem, (first_line + share.begin + share.len) * kLine);
    if (to <= from) return;
    std::vector<void*> copies(world_);
    for (int r = 0; r < world_; ++r) copies[r] = buffer.base(r) + from;
    shm_reduce_copies(copies.data(), world_, (to - from) / elem, dtype, op, scale);
  }

  // `scale` != 1 (a SUM): each rank's tensor times `scale`, summed. In
  // place, the scale is applied inside the reduction; otherwise first.
  void do_allreduce(at::Tensor& tensor, ShmOp op, double scale) {
    if (scale != 1.0 && !scaled_sum_supported(tensor.scalar_type())) {
      tensor.mul_(scale);
      scale = 1.0;
    }
    std::shared_ptr<ShmBuffer> buffer;
    const ShmDescriptor want = locate(tensor, op, scale, buffer);
    segment_.describe(me_, want);
    if (want.region == 0) {
      if (scale != 1.0) tensor.mul_(scale);
      return allreduce_through_segment(tensor, op, /*may_restart=*/true);
    }
    ++step_;  // as a first chunk would: every rank's slot sets stay in step
    sync();
    bool same = true;
    for (int r = 0; r < world_ && same; ++r) same = segment_.described(r) == want;
    if (!same) {
      if (scale != 1.0) tensor.mul_(scale);
      return allreduce_through_segment(tensor, op, /*may_restart=*/false);
    }
    allreduce_in_place(*buffer, want.offset, static_cast<std::size_t>(tensor.numel()),
                       tensor.scalar_type(), op, scale);
    sync();
    in_place_.fetch_add(1, std::memory_order_relaxed);
  }

 public:
  int64_t in_place_count() const { return in_place_.load(std::memory_order_relaxed); }
  int64_t shared_core_waits() const { return shared_core_.load(std::memory_order_relaxed); }
  ShmStoreCounts store_counts() const {
    return {streamed_.load(std::memory_order_relaxed), measured_.load(std::memory_order_relaxed)};
  }

 private:
  // Pipelined: chunk i's copy-in shares a barrier with chunk i - 1's
  // copy-out, so a message of k chunks takes k + 1 barriers (Note
  // [Shared-memory backend]). After the first barrier, a rank whose tensor
  // is private sees whether another's was in a shared buffer: then every
  // rank starts over here (Note [Buckets in shared memory]).
  // `restarted`: the timer of the attempt that started over (its choice
  // kept, so that every rank asks the chooser once per all-reduce).
  void allreduce_through_segment(at::Tensor& tensor, ShmOp op, bool may_restart,
                                 StoreTimer* restarted = nullptr) {
    at::Tensor flat = tensor.is_contiguous() ? tensor : tensor.contiguous();
    char* data = static_cast<char*>(flat.data_ptr());
    const std::size_t elem = flat.element_size();
    const std::size_t count = static_cast<std::size_t>(flat.numel());
    const std::size_t per_chunk = segment_.chunk() / elem;
    std::vector<const void*> inputs(world_);
    std::optional<StoreTimer> own;
    StoreTimer& stores =
        restarted != nullptr ? *restarted : own.emplace(*this, Stores::kAllReduce, flat.nbytes());
    int previous_set = -1;  // the chunk whose result is still to copy out
    std::size_t previous_off = 0, previous_n = 0;
    for (std::size_t off = 0; off < count; off += per_chunk) {
      const std::size_t n = std::min(per_chunk, count - off);
      const int set = static_cast<int>(step_++ % 2);
      // My share is reduced from my own tensor: the others need only the
      // rest. Streamed: the peers read it (Note [Streaming into the slots]).
      copy_others(segment_.slot(set, me_), data + off * elem, n, elem, stores.stream());
      sync();
      if (may_restart && off == 0) {
        bool any_shared = false;
        for (int r = 0; r < world_; ++r) any_shared |= segment_.described(r).region != 0;
        if (any_shared)
          return allreduce_through_segment(tensor, op, /*may_restart=*/false, &stores);
      }
      const Share mine = share_of(n, me_);
      if (mine.len > 0) {
        for (int r = 0; r < world_; ++r)
          inputs[r] = (r == me_ ? data + off * elem : segment_.slot(set, r)) + mine.begin * elem;
        // Into the shared result and my tensor, line by line (Note
        // [Reducing a line into every copy]).
        void* outputs[2] = {segment_.result(set) + mine.begin * elem,
                            data + (off + mine.begin) * elem};
        // The shared result as the slot, my tensor plainly (Note
        // [Streaming into the slots]).
        shm_reduce_lines({inputs.data(), world_, outputs, 2, stores.stream() ? 1u : 0u}, mine.len,
                         flat.scalar_type(), op, 1.0);
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
    stores.done();
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
    StoreTimer stores(*this, Stores::kReduceScatter, in.nbytes());
    for (std::size_t off = 0; off < n; off += per) {
      const std::size_t m = std::min(per, n - off);
      const int set = static_cast<int>(step_++ % 2);
      char* slot = segment_.slot(set, me_);
      for (int d = 0; d < world_; ++d) {
        if (d != me_) stores.copy(slot + d * m * elem, data + (d * n + off) * elem, m * elem);
      }
      sync();
      for (int r = 0; r < world_; ++r) {
        inputs[r] = r == me_ ? data + (me_ * n + off) * elem
                             : static_cast<const char*>(segment_.slot(set, r)) + me_ * m * elem;
      }
      shm_reduce(result + off * elem, inputs.data(), world_, m, out.scalar_type(), op);
    }
    stores.done();
    if (!output.is_contiguous()) output.copy_(out);
  }

  void do_broadcast(at::Tensor& tensor, int root) {
    if (root < 0 || root >= world_)
      throw CommError("shm backend: broadcast root " + std::to_string(root));
    at::Tensor flat = tensor.is_contiguous() ? tensor : tensor.contiguous();
    char* data = static_cast<char*>(flat.data_ptr());
    const std::size_t bytes = flat.nbytes();
    // Plain stores (Note [Choosing the stores]).
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
    StoreTimer stores(*this, Stores::kAllGather, bytes);
    for (std::size_t off = 0; off < bytes; off += segment_.chunk()) {
      const std::size_t n = std::min(segment_.chunk(), bytes - off);
      const int set = static_cast<int>(step_++ % 2);
      stores.copy(segment_.slot(set, me_), data + off, n);
      sync();
      for (int r = 0; r < world_; ++r)
        std::memcpy(static_cast<char*>(flats[r].data_ptr()) + off, segment_.slot(set, r), n);
    }
    stores.done();
    for (int r = 0; r < world_; ++r)
      if (!outputs[r].is_contiguous()) outputs[r].copy_(flats[r]);
  }

  ShmSegment segment_;
  std::shared_ptr<ShmBuffers> buffers_ = std::make_shared<ShmBuffers>();
  uint64_t buffers_made_ = 0;  // the same count on every rank: an id per buffer
  std::atomic<int64_t> in_place_{0};
  int me_;
  int world_;
  std::chrono::milliseconds timeout_;
  uint32_t generation_ = 0;
  Clock::duration waited_{0};                       // in barriers, all told (StoreTimer)
  std::atomic<int64_t> streamed_{0}, measured_{0};  // shm_store_counts
  std::atomic<int64_t> shared_core_{0};             // shm_shared_core_waits
  std::array<ShmStoreChoice, static_cast<int>(Stores::kCount)> stores_;
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

at::Tensor shm_shared_zeros(C10dBackend& backend, int64_t numel, const at::TensorOptions& options,
                            bool willing, std::string* why) {
  auto* shm = dynamic_cast<ShmBackend*>(&backend);
  if (shm == nullptr) {
    if (why != nullptr) *why = "the backend is not shm";
    return {};
  }
  return shm->shared_zeros(numel, options, willing, why);
}

int64_t shm_shared_core_waits(C10dBackend& backend) {
  auto* shm = dynamic_cast<ShmBackend*>(&backend);
  return shm == nullptr ? 0 : shm->shared_core_waits();
}

ShmStoreCounts shm_store_counts(C10dBackend& backend) {
  auto* shm = dynamic_cast<ShmBackend*>(&backend);
  return shm == nullptr ? ShmStoreCounts{} : shm->store_counts();
}

int64_t shm_in_place_count(C10dBackend& backend) {
  auto* shm = dynamic_cast<ShmBackend*>(&backend);
  return shm == nullptr ? 0 : shm->in_place_count();
}

Ptr<C10dWork> shm_allreduce_scaled(C10dBackend& backend, at::Tensor& tensor, double scale) {
  auto* shm = dynamic_cast<ShmBackend*>(&backend);
  if (shm == nullptr) return {};
  return shm->allreduce_scaled(tensor, scale);
}

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

bool shm_copy_streaming(void* to, const void* from, std::size_t bytes) {
  if (!shm_streaming_supported()) return false;
  shm_stream_copy(to, from, bytes);
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
  const ShmStreaming streaming =
      shm_streaming_supported() ? shm_streaming_from_env() : ShmStreaming::kOff;
  const std::vector<std::string> all = [&] {
    std::vector<std::string> keys;
    for (int r = 0; r < world.world_size; ++r) keys.push_back("shm/mapped/" + std::to_string(r));
    return keys;
  }();
  std::optional<ShmSegment> segment;
  if (world.rank == 0) {
    ShmSegment::remove_orphans();
    const std::string name = "/lockstep-" + random_hex(12) + "-" + std::to_string(getpid());
    // Armed before the file exists: unlinked on every way out of this block,
    // a SIGTERM while the segment is being made included.
    const ShmName held(name);
    try {
      segment.emplace(ShmSegment::create(name, world.world_size, options.chunk_bytes));
    } catch (const Error& e) {
      store->set("shm/name", bytes(failure_text(e)));
      settle(*store, world, options.timeout);
      throw;
    }
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
                                         options.timeout, streaming);
}

}  // namespace lockstep
