#include "lockstep/ddp/batch_stats_exchange.h"

#include <ATen/ATen.h>

#include <exception>

#include "lockstep/util/error.h"

namespace lockstep {
namespace {

class ProcessGroupExchange : public StatsExchange {
 public:
  explicit ProcessGroupExchange(std::shared_ptr<ProcessGroup> pg) : pg_(std::move(pg)) {}

  int size() const override { return pg_->size(); }

  at::Tensor all_gather(const at::Tensor& local, const std::string& what) override {
    const at::Tensor input = local.to(pg_->device()).contiguous();
    at::Tensor out = at::empty({pg_->size(), input.numel()}, input.options());
    run(what, [&] { pg_->all_gather_into(out, input); });
    return out.to(local.device());
  }

  void all_reduce_sum(at::Tensor& tensor, const std::string& what) override {
    at::Tensor t = tensor.to(pg_->device()).contiguous();
    run(what, [&] { pg_->allreduce(t, ReduceKind::kSum); });
    if (!t.is_same(tensor)) tensor.copy_(t);
  }

 private:
  template <typename Fn>
  void run(const std::string& what, Fn&& fn) {
    const auto context = [&](const std::exception& e) {
      return what + " failed on rank " + std::to_string(pg_->rank()) +
             " (does every rank run the same layers in training mode, with the same "
             "channels?): " +
             what_of(e);
    };
    try {
      fn();
    } catch (const TimeoutError& e) {
      throw TimeoutError(context(e));
    } catch (const std::exception& e) {
      throw CommError(context(e));
    }
  }

  std::shared_ptr<ProcessGroup> pg_;
};

}  // namespace

std::shared_ptr<StatsExchange> batch_stats_exchange(std::shared_ptr<ProcessGroup> pg) {
  if (!pg) throw UsageError("batch_stats_exchange: no process group");
  return std::make_shared<ProcessGroupExchange>(std::move(pg));
}

}  // namespace lockstep
