// Flat reduce-scatter and all-gather (ZeRO's collectives), with the
// all-reduce fallback where a backend has no reduce-scatter.
#include <ATen/ATen.h>

#include <spdlog/spdlog.h>

#include <atomic>

#include "lockstep/distributed/process_group.h"
#include "lockstep/util/error.h"
#include "serial_backend.h"

namespace lockstep {
namespace {

std::string shape_text(const at::Tensor& t) {
  return std::string(c10::toString(t.scalar_type())) + "[" + std::to_string(t.numel()) + "]";
}

}  // namespace

bool ProcessGroup::reduce_scatter_native() const {
  if (reduce_scatter_refused_) return false;
  switch (kind_) {
    case BackendKind::kShm:
    case BackendKind::kNccl:
    case BackendKind::kMpi:
      return true;
    case BackendKind::kGloo:
      return kTorchVersionMajor >= 2;
    default:
      return false;
  }
}

ProcessGroup::Scattering ProcessGroup::reduce_scatter_async(at::Tensor& output,
                                                            const at::Tensor& input) {
  Scattering s;
  s.output = output;
  s.sequence = sequence_++;
  const std::string what = "reduce_scatter #" + std::to_string(s.sequence);
  if (input.numel() != output.numel() * size_ || input.scalar_type() != output.scalar_type() ||
      !output.is_contiguous()) {
    throw UsageError(describe(what) + ": the input " + shape_text(input) + " must hold " +
                     std::to_string(size_) + " chunks of the contiguous output " +
                     shape_text(output));
  }
  at::Tensor flat = input.contiguous().view({-1});
  if (size_ == 1) {
    output.view({-1}).copy_(flat);
    return s;
  }
  check_collective(s.sequence, "reduce_scatter " + shape_text(input));
  try {
    if (!reduce_scatter_native()) {
      static std::atomic<bool> said{false};
      if (!said.exchange(true)) {
        spdlog::info(
            "{} has no reduce-scatter: an all-reduce of the whole bucket, then this "
            "rank's slice (twice the traffic of a reduce-scatter)",
            backend_->getBackendName());
      }
      s.staged = flat.clone();
      std::vector<at::Tensor> tensors{s.staged};
      c10d::AllreduceOptions options;
      options.reduceOp = c10d::ReduceOp::SUM;
      s.work = backend_->allreduce(tensors, options);
    } else if (kind_ == BackendKind::kMpi) {
      std::vector<at::Tensor> outputs{output};
      std::vector<std::vector<at::Tensor>> inputs{flat.view({size_, -1}).unbind(0)};
      c10d::ReduceScatterOptions options;
      options.reduceOp = c10d::ReduceOp::SUM;
      try {
        s.work = backend_->reduce_scatter(outputs, inputs, options);
      } catch (const std::exception& e) {
        // Older ProcessGroupMPI refuses at the call, on every rank alike.
        if (what_of(e).find("does not support") == std::string::npos) throw;
        reduce_scatter_refused_ = true;
        spdlog::info("mpi refused the reduce-scatter ({}): all-reduce and slice from now on",
                     what_of(e).substr(0, 80));
        s.staged = flat.clone();
        std::vector<at::Tensor> tensors{s.staged};
        c10d::AllreduceOptions all;
        all.reduceOp = c10d::ReduceOp::SUM;
        s.work = backend_->allreduce(tensors, all);
      }
    } else {
      at::Tensor out = output;
      c10d::ReduceScatterOptions options;
      options.reduceOp = c10d::ReduceOp::SUM;
      s.work = backend_->_reduce_scatter_base(out, flat, options);
    }
  } catch (const std::exception& e) {
    throw CommError(describe(what) + " could not start: " + what_of(e));
  }
  return s;
}

void ProcessGroup::wait(Scattering& s, const std::string& what) {
  wait(s.work, what);
  s.work = {};
  if (s.staged.defined()) {
    const int64_t n = s.output.numel();
    s.output.view({-1}).copy_(s.staged.narrow(0, rank_ * n, n));
    s.staged = at::Tensor();
  }
}

void ProcessGroup::reduce_scatter(at::Tensor& output, const at::Tensor& input) {
  const SerialBackend::WaitAtOnce at_once;  // Note [Waiting runs the queue]
  auto s = reduce_scatter_async(output, input);
  wait(s, "reduce_scatter #" + std::to_string(s.sequence));
}

Ptr<C10dWork> ProcessGroup::all_gather_into_async(at::Tensor& output, const at::Tensor& input) {
  const uint64_t seq = sequence_++;
  const std::string what = "all_gather #" + std::to_string(seq);
  if (output.numel() != input.numel() * size_ || input.scalar_type() != output.scalar_type() ||
      !output.is_contiguous()) {
    throw UsageError(describe(what) + ": the output " + shape_text(output) + " must hold " +
                     std::to_string(size_) + " copies of the input " + shape_text(input) +
                     ", contiguous");
  }
  at::Tensor in = input.contiguous().view({-1});
  if (size_ == 1) {
    output.view({-1}).copy_(in);
    return {};
  }
  check_collective(seq, "all_gather " + shape_text(input));
  std::vector<at::Tensor> inputs{in};
  std::vector<std::vector<at::Tensor>> outputs{output.view({size_, -1}).unbind(0)};
  try {
    return backend_->allgather(outputs, inputs);
  } catch (const std::exception& e) {
    throw CommError(describe(what) + " could not start: " + what_of(e));
  }
}

void ProcessGroup::all_gather_into(at::Tensor& output, const at::Tensor& input) {
  const SerialBackend::WaitAtOnce at_once;  // Note [Waiting runs the queue]
  const uint64_t seq = sequence_;
  wait(all_gather_into_async(output, input), "all_gather #" + std::to_string(seq));
}

}  // namespace lockstep
