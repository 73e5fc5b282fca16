// ProcessGroup's collectives: thin, but each one early-returns at world size
// 1, counts its sequence number and turns backend failures into CommError.
#include <ATen/ATen.h>

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <future>
#include <thread>

#include "lockstep/distributed/process_group.h"
#include "lockstep/distributed/shm_backend.h"
#include "lockstep/util/error.h"
#include "roll_call.h"
#include "serial_backend.h"

namespace lockstep {
namespace {

c10d::ReduceOp to_c10d(ReduceKind kind) {
  switch (kind) {
    case ReduceKind::kSum:
      return c10d::ReduceOp::SUM;
    case ReduceKind::kAvg:
      return c10d::ReduceOp::AVG;
    case ReduceKind::kMin:
      return c10d::ReduceOp::MIN;
    case ReduceKind::kMax:
      return c10d::ReduceOp::MAX;
    case ReduceKind::kProduct:
      return c10d::ReduceOp::PRODUCT;
  }
  return c10d::ReduceOp::SUM;
}

std::string signature_of(const std::string& op, const at::Tensor& t) {
  std::string shape;
  for (auto d : t.sizes()) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
  return op + " " + std::string(c10::toString(t.scalar_type())) + "[" + shape + "]";
}

}  // namespace

void ProcessGroup::enable_collective_check(Ptr<C10dStore> store,
                                           std::chrono::milliseconds timeout) {
  check_store_ = std::move(store);
  check_timeout_ = timeout;
}

// Note [Collective check] (process_group.h).
void ProcessGroup::check_collective(uint64_t sequence, const std::string& signature) {
  if (!check_store_ || size_ == 1) return;
  auto key = [](uint64_t seq, int r) {
    return "desync/" + std::to_string(seq) + "/" + std::to_string(r);
  };
  // Every rank has compared sequence - 2 once it published sequence - 1:
  // this rank's older key can go.
  if (sequence >= 2) check_store_->deleteKey(key(sequence - 2, rank_));
  check_store_->set(key(sequence, rank_), std::vector<uint8_t>(signature.begin(), signature.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r) keys.push_back(key(sequence, r));
  try {
    check_store_->wait(keys, check_timeout_);
  } catch (const std::exception&) {
    std::string missing;
    for (int r = 0; r < size_; ++r) {
      if (!check_store_->check({keys[r]}))
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    throw CommError(describe("collective #" + std::to_string(sequence) + " (" + signature + ")") +
                    ": rank(s) " + missing + " did not issue it within " +
                    std::to_string(check_timeout_.count() / 1000.0).substr(0, 5) +
                    " s: they issued fewer collectives, or are stuck");
  }
  std::string mismatch;
  for (int r = 0; r < size_; ++r) {
    const auto bytes = check_store_->get(keys[r]);
    const std::string theirs(bytes.begin(), bytes.end());
    if (theirs != signature) mismatch += "; rank " + std::to_string(r) + " issues " + theirs;
  }
  if (!mismatch.empty()) {
    throw CommError("collective #" + std::to_string(sequence) + " differs across ranks: rank " +
                    std::to_string(rank_) + " issues " + signature + mismatch);
  }
}

std::string ProcessGroup::describe(const std::string& what) const {
  return "rank " + std::to_string(rank_) + ": " + what + " (" + backend_kind_name(kind_) +
         ", world size " + std::to_string(size_) + ")";
}

void ProcessGroup::wait(const Ptr<C10dWork>& work, const std::string& what) {
  if (!work) return;
  try {
    work->wait();
  } catch (const std::exception& e) {
    throw CommError(describe(what) + " failed: " + what_of(e) + roll_call());
  }
}

void ProcessGroup::enable_roll_call(Ptr<C10dStore> store, std::chrono::milliseconds grace) {
  roll_call_store_ = std::move(store);
  roll_call_grace_ = grace;
}

// Note [Roll call] (process_group.h; the call itself in roll_call.cpp). Runs
// on a helper thread so that a hung store host (rank 0 stopped) cannot hang
// this rank's error path: after grace + 2 s without an answer (rank 0: + its
// linger), the store itself is reported silent.
std::string ProcessGroup::roll_call() {
  if (!roll_call_store_ || size_ == 1) return "";
  if (!roll_call_answer_.empty()) return roll_call_answer_;
  RollCallOptions options;
  options.grace = roll_call_grace_;
  auto promise = std::make_shared<std::promise<std::string>>();
  auto answer = promise->get_future();
  std::thread([store = roll_call_store_, rank = rank_, size = size_, options, promise] {
    std::string text;
    try {
      text = roll_call_answer(*store, rank, size, options);
    } catch (...) {  // out of memory building the text: a detached thread must not throw
      text = "; the roll call itself failed";
    }
    promise->set_value(text);
  }).detach();
  // Only rank 0 lingers (roll_call.h).
  const auto bound = options.grace + (rank_ == 0 ? options.linger : std::chrono::milliseconds(0)) +
                     std::chrono::seconds(2);
  if (answer.wait_for(bound) == std::future_status::ready) {
    roll_call_answer_ = answer.get();
  } else {
    roll_call_answer_ =
        "; the rendezvous store did not answer the roll call: rank 0, which hosts "
        "it, is probably hung or cut off";
  }
  return roll_call_answer_;
}

Ptr<C10dWork> ProcessGroup::allreduce_async(at::Tensor& tensor, ReduceKind op) {
  if (op == ReduceKind::kAvg && kind_ != BackendKind::kNccl) {
    throw CommError(describe("allreduce_async") +
                    ": AVG is not native to this backend; pre-divide and use SUM");
  }
  const uint64_t seq = sequence_++;
  if (size_ == 1) return {};
  check_collective(seq,
                   signature_of(std::string("allreduce(") + reduce_kind_name(op) + ")", tensor));
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = to_c10d(op);
  try {
    return backend_->allreduce(tensors, options);
  } catch (const std::exception& e) {
    throw CommError(describe("allreduce #" + std::to_string(seq)) +
                    " could not start: " + what_of(e));
  }
}

at::Tensor ProcessGroup::bucket_zeros(int64_t numel, const at::TensorOptions& options,
                                      bool* shared) {
  if (shared != nullptr) *shared = false;
  // Every rank takes part alike (numel, dtype and the backend are the same
  // everywhere); LOCKSTEP_SHM_BUCKETS=0 on any rank is that rank's vote
  // for private memory, which every rank then gets.
  if (kind_ != BackendKind::kShm || size_ == 1 || numel <= 0 || !options.device().is_cpu())
    return at::zeros({numel}, options);
  const char* setting = std::getenv("LOCKSTEP_SHM_BUCKETS");
  const bool willing = setting == nullptr || std::string(setting) != "0";
  const uint64_t seq = sequence_++;
  const at::Tensor like = at::empty({numel}, options.device(at::kCPU).pinned_memory(false));
  check_collective(seq, signature_of("bucket_zeros", like));
  std::string why;
  at::Tensor made;
  try {
    made = shm_shared_zeros(*backend_, numel, options, willing, &why);
  } catch (const std::exception& e) {
    throw CommError(describe("bucket_zeros #" + std::to_string(seq)) + " failed: " + what_of(e) +
                    roll_call());
  }
  if (made.defined()) {
    if (shared != nullptr) *shared = true;
    if (!said_buckets_) {
      said_buckets_ = true;
      spdlog::info("shm: gradient buckets in shared memory (all-reduced in place)");
    }
    return made;
  }
  if (!said_buckets_) {
    said_buckets_ = true;
    spdlog::info("shm: gradient buckets in private memory (all-reduced through the segment): {}",
                 why);
  }
  return at::zeros({numel}, options);
}

Ptr<C10dWork> ProcessGroup::allreduce_scaled_async(at::Tensor& tensor, double scale) {
  if (kind_ != BackendKind::kShm || size_ == 1) {
    tensor.mul_(scale);
    return allreduce_async(tensor, ReduceKind::kSum);
  }
  const uint64_t seq = sequence_++;
  check_collective(seq, signature_of("allreduce(sum)", tensor));
  try {
    auto work = shm_allreduce_scaled(*backend_, tensor, scale);
    if (!work) throw CommError("the shm process group's backend is not shm's");
    return work;
  } catch (const std::exception& e) {
    throw CommError(describe("allreduce #" + std::to_string(seq)) +
                    " could not start: " + what_of(e));
  }
}

ProcessGroup::WaitNext::WaitNext() : before_(SerialBackend::mark_wait_at_once(true)) {}

ProcessGroup::WaitNext::~WaitNext() {
  SerialBackend::mark_wait_at_once(before_);
}

void ProcessGroup::allreduce(at::Tensor& tensor, ReduceKind op) {
  const SerialBackend::WaitAtOnce at_once;  // Note [Waiting runs the queue]
  // Gloo has no AVG: SUM, then divide (truncating for integers, as NCCL does).
  const bool emulate_avg = op == ReduceKind::kAvg && kind_ != BackendKind::kNccl;
  const uint64_t seq = sequence_;
  wait(allreduce_async(tensor, emulate_avg ? ReduceKind::kSum : op),
       std::string("allreduce(") + reduce_kind_name(op) + ") #" + std::to_string(seq));
  if (emulate_avg && size_ > 1) {
    if (at::isIntegralType(tensor.scalar_type(), /*includeBool=*/true)) {
      tensor.div_(size_, "trunc");
    } else {
      tensor.div_(size_);
    }
  }
}

void ProcessGroup::broadcast(at::Tensor& tensor, int root) {
  const SerialBackend::WaitAtOnce at_once;  // Note [Waiting runs the queue]
  if (root < 0 || root >= size_) {
    throw CommError(describe("broadcast") + ": root " + std::to_string(root) + " is outside [0, " +
                    std::to_string(size_) + ")");
  }
  const uint64_t seq = sequence_++;
  if (size_ == 1) return;
  check_collective(seq, signature_of("broadcast(root " + std::to_string(root) + ")", tensor));
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  wait(backend_->broadcast(tensors, options),
       "broadcast(root " + std::to_string(root) + ") #" + std::to_string(seq));
}

ProcessGroup::Gathering ProcessGroup::allgather_async(const at::Tensor& tensor) {
  Gathering g;
  g.sequence = sequence_++;
  if (size_ == 1) {
    g.outputs = {tensor.clone()};
    return g;
  }
  check_collective(g.sequence, signature_of("allgather", tensor));
  std::vector<at::Tensor> inputs{tensor.contiguous()};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < size_; ++r) outputs[0].push_back(at::empty_like(inputs[0]));
  try {
    g.work = backend_->allgather(outputs, inputs);
  } catch (const std::exception& e) {
    throw CommError(describe("allgather #" + std::to_string(g.sequence)) +
                    " could not start: " + what_of(e));
  }
  g.outputs = outputs[0];
  return g;
}

std::vector<at::Tensor> ProcessGroup::allgather(const at::Tensor& tensor) {
  const SerialBackend::WaitAtOnce at_once;  // Note [Waiting runs the queue]
  auto g = allgather_async(tensor);
  wait(g.work, "allgather #" + std::to_string(g.sequence));
  return g.outputs;
}

Ptr<C10dWork> ProcessGroup::send_async(at::Tensor& tensor, int dst, int tag) {
  return start_p2p(
      "send to rank " + std::to_string(dst),
      [&](std::vector<at::Tensor>& t) { return backend_->send(t, dst, tag); }, tensor);
}

Ptr<C10dWork> ProcessGroup::recv_async(at::Tensor& tensor, int src, int tag) {
  return start_p2p(
      "recv from rank " + std::to_string(src),
      [&](std::vector<at::Tensor>& t) { return backend_->recv(t, src, tag); }, tensor);
}

Ptr<C10dWork> ProcessGroup::start_p2p(
    const std::string& what, const std::function<Ptr<C10dWork>(std::vector<at::Tensor>&)>& start,
    at::Tensor& tensor) {
  std::vector<at::Tensor> tensors{tensor};
  try {
    return start(tensors);
  } catch (const std::exception& e) {
    throw CommError(describe(what) + " could not start: " + what_of(e));
  }
}

void ProcessGroup::barrier() {
  const SerialBackend::WaitAtOnce at_once;  // Note [Waiting runs the queue]
  const uint64_t seq = sequence_++;
  if (size_ == 1) return;
  check_collective(seq, "barrier");
  wait(backend_->barrier(), "barrier #" + std::to_string(seq));
}

}  // namespace lockstep
