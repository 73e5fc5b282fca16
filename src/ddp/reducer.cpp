// The Reducer is one state machine over its buckets
// (c10d's own reducer.cpp is several times larger).
// Note [Pre-divided buckets]
// Each gradient is multiplied by 1/world_size while it is copied into its
// bucket (one fused pass, as PyTorch's Reducer does), so a SUM all-reduce
// leaves the mean gradient. Every rank receives the same reduced bits from
// the collective, so the weights stay bit-identical across ranks. With the
// default hook on the shm backend, a float32/float64 bucket is instead
// all-reduced by allreduce_scaled_async: the same products, rounded the same
// way, taken inside the reduction of a bucket in shared memory (Note
// [Buckets in shared memory], shm_backend.cpp), which saves a pass over
// every gradient (or, for a private bucket, taken just before it).
//
// Note [Bucket views are storage aliases]
// With gradient_as_bucket_view, .grad is a tensor created with set_() on the
// bucket's storage, not an autograd view: LibTorch's Optimizer::zero_grad()
// calls detach_() on every grad, which autograd forbids on views. Autograd
// accumulates into an existing .grad in place, so later backwards write
// straight into the bucket. If .grad was replaced (zero_grad(set_to_none)),
// the hook copies it in and .grad is re-pointed at the bucket afterwards.
//
// Note [The last bucket runs on the waiting thread]
// The last bucket to launch is waited for next, in finalize(), with nothing
// left to overlap it with: it is launched under ProcessGroup::WaitNext, so
// the shm backend does not wake its worker thread for it and the waiting
// thread runs it (Note [Waiting runs the queue]). With one rank per core the
// worker's wake-ups (two per launch) take the core from a peer that is
// still in its backward, which shows in the small MLP's DDP step against
// its step without DDP (`scripts/bench_ddp.sh`; the measurements:
// docs/lab/ddp-overhead.md, "Note [The last bucket runs on the waiting
// thread]").
#include "lockstep/ddp/reducer.h"

#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "lockstep/util/error.h"

namespace lockstep {
namespace {

int64_t type_key(const at::Tensor& t) {
  const auto device = t.device();
  return (static_cast<int64_t>(t.scalar_type()) << 32) |
         (static_cast<int64_t>(device.type()) << 16) | static_cast<int64_t>(device.index() + 1);
}

// Note [Bucket views keep the parameter's layout]: a tensor with `param`'s
// sizes on `flat`'s storage at `offset` elements. A dense parameter (any
// permutation of strides: channels_last, a transposed weight) keeps its own
// strides, so autograd accumulates into .grad without a layout change and the
// optimizer sees the layout it would without DDP, as in PyTorch; a dense
// tensor of n elements spans exactly n slots whatever its stride order. A
// non-dense parameter gets contiguous strides.
at::Tensor storage_alias(const at::Tensor& flat, int64_t offset, const at::Tensor& param) {
  const auto sizes = param.sizes();
  std::vector<int64_t> strides(sizes.size());
  if (param.is_non_overlapping_and_dense()) {
    strides.assign(param.strides().begin(), param.strides().end());
  } else {
    int64_t stride = 1;
    for (size_t d = sizes.size(); d-- > 0;) {
      strides[d] = stride;
      stride *= sizes[d];
    }
  }
  auto alias = at::empty({0}, flat.options());
  alias.set_(flat.storage(), flat.storage_offset() + offset, sizes, strides);
  return alias;
}

bool aliases(const at::Tensor& grad, const at::Tensor& view) {
  return grad.defined() && !grad.is_sparse() && grad.data_ptr() == view.data_ptr() &&
         grad.sizes() == view.sizes() && grad.strides() == view.strides();
}

}  // namespace

Reducer::Reducer(std::vector<at::Tensor> params, std::vector<std::string> names,
                 std::shared_ptr<ProcessGroup> pg, ReducerOptions options)
    : params_(std::move(params)),
      names_(std::move(names)),
      pg_(std::move(pg)),
      options_(std::move(options)) {
  if (!options_.hook) options_.hook = std::make_shared<AllReduceHook>();
  divisor_ = c10::scalar_to_tensor(at::Scalar(1.0 / pg_->size()));
  divisor_.unsafeGetTensorImpl()->set_wrapped_number(true);
  ready_.assign(params_.size(), 0);
  used_since_sync_.assign(params_.size(), 0);
  // Gradients become ready roughly in reverse registration order (the last
  // layer's first): the first iteration's buckets follow it.
  build_buckets(reverse_registration_order());
  for (size_t i = 0; i < params_.size(); ++i) {
    auto accumulator_hook = AccumulatorHook::add(params_[i], [this, i] { hook(i); });
    if (!accumulator_hook) {
      throw ConfigError("parameter '" + names_[i] + "' is not a leaf that requires grad");
    }
    accumulator_hooks_.push_back(std::move(accumulator_hook));
  }
}

Reducer::~Reducer() {
  accumulator_hooks_.clear();  // no hook fires into a Reducer being destroyed
  // Collectives still in flight write into our buckets: let them land.
  for (auto& bucket : buckets_) {
    try {
      if (bucket.work.work) bucket.work.work->wait();
    } catch (const std::exception&) {
    }
  }
}

std::vector<size_t> Reducer::reverse_registration_order() const {
  std::vector<size_t> order;
  for (size_t k = params_.size(); k-- > 0;) order.push_back(k);
  return order;
}

void Reducer::build_buckets(const std::vector<size_t>& order) {
  std::vector<BucketInput> inputs;
  for (size_t k : order) {
    inputs.push_back({static_cast<size_t>(params_[k].numel()) * params_[k].element_size(),
                      type_key(params_[k])});
  }
  at::NoGradGuard no_grad;
  // A rebuild: the gradients leave the old buckets first, so that those are
  // freed (their /dev/shm space given back) before the new ones are made.
  if (!buckets_.empty() && options_.gradient_as_bucket_view) {
    for (auto& p : params_) {
      auto& grad = p.mutable_grad();
      if (grad.defined()) grad = grad.clone();
    }
  }
  buckets_.clear();
  bucket_indices_.clear();
  locators_.assign(params_.size(), {});
  for (const auto& assigned : bucket_assign(inputs, options_.caps)) {
    Bucket bucket;
    int64_t total = 0;
    for (size_t position : assigned) {
      bucket.params.push_back(order[position]);
      total += params_[order[position]].numel();
    }
    // Note [Buckets in shared memory] (shm_backend.cpp): every rank builds
    // the same buckets in the same order, as bucket_zeros needs.
    bucket.contents =
        pg_->bucket_zeros(total, params_[bucket.params.front()].options(), &bucket.shared);
    int64_t offset = 0;
    for (size_t slot = 0; slot < bucket.params.size(); ++slot) {
      const size_t index = bucket.params[slot];
      bucket.views.push_back(storage_alias(bucket.contents, offset, params_[index]));
      bucket.offsets.push_back(offset);
      offset += params_[index].numel();
      locators_[index] = {buckets_.size(), slot};
      auto& grad = params_[index].mutable_grad();
      if (options_.gradient_as_bucket_view && grad.defined()) {
        bucket.views.back().copy_(grad);
        grad = bucket.views.back();
      }
    }
    bucket.pending = bucket.params.size();
    const auto dtype = bucket.contents.scalar_type();
    bucket.scale_in_reduce = bucket.shared && typeid(*options_.hook) == typeid(AllReduceHook) &&
                             (dtype == at::kFloat || dtype == at::kDouble);
    bucket_indices_.push_back(bucket.params);
    buckets_.push_back(std::move(bucket));
  }
  stats_.buckets = buckets_.size();
}

// Note [Interrupted backward]: hook() queues finalize() on the autograd
// engine at the first gradient; when backward throws (a user's tensor hook,
// anomaly mode, out of memory, a sparse gradient, a collective that fails to
// start) the engine drops that callback, and the iteration is left armed,
// half counted, with some buckets perhaps launched. If no gradient arrived,
// this rank exchanged nothing in it: the state is reset and training goes
// on (this is also the forward-without-backward case). Otherwise this rank
// may have issued collectives its peers did not, or the reverse, and no
// exchange can tell (it would pair with the stale ones): in-flight work is
// drained and every later forward throws, naming what happened, on this rank;
// its peers fail their own exchange with the timeout and roll call instead
// of silently pairing gradients of different iterations. PyTorch makes the
// same call ("Expected to have finished reduction in the prior iteration").
void Reducer::ensure_prior_iteration_finished() {
  std::lock_guard<std::mutex> lock(mu_);
  if (expect_hooks_) {
    const auto arrived = static_cast<size_t>(std::count(ready_.begin(), ready_.end(), 1));
    const size_t launched = next_bucket_;
    reset_iteration();  // drains launched work
    if (arrived > 0) {
      failure_ = "rank " + std::to_string(pg_->rank()) +
                 ": DistributedDataParallel cannot continue: the previous synchronised backward "
                 "stopped before its end (it threw: see the first error) after " +
                 std::to_string(arrived) + " of " + std::to_string(params_.size()) +
                 " gradients and " + std::to_string(launched) + " of " +
                 std::to_string(buckets_.size()) +
                 " buckets were exchanged, so the ranks may no longer agree on which "
                 "collectives were issued. Restart from the last checkpoint";
    }
  }
  if (!failure_.empty()) throw CommError(failure_);
}

void Reducer::prepare_for_backward() {
  ensure_prior_iteration_finished();
  std::lock_guard<std::mutex> lock(mu_);
  if (order_recorded_ && !rebuilt_) rebuild_buckets();
  if (!order_recorded_) ready_order_.clear();  // a failed first iteration starts over
  expect_hooks_ = true;
  stats_ = ReducerStats{buckets_.size(), 0, 0};
}

void Reducer::hook(size_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ignore_hooks_) return;
  const auto& grad = params_[index].grad();
  if (grad.defined() && grad.layout() != at::kStrided) {
    // Construction refuses the modules that make them (ddp.cpp); this is for
    // any other source. Thrown before anything is counted for this gradient.
    throw ConfigError("rank " + std::to_string(pg_->rank()) + ": parameter '" + names_[index] +
                      "' got a " + c10::str(grad.layout()) +
                      " gradient; DistributedDataParallel reduces dense gradients only (use a "
                      "dense layer, e.g. Embedding without sparse(true))");
  }
  used_since_sync_[index] = 1;
  if (!expect_hooks_) return;  // under no_sync: gradients only accumulate
  if (!finalize_queued_) {
    finalize_queued_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize(); });
  }
  mark_ready(index, /*from_hook=*/true);
}

void Reducer::mark_ready(size_t index, bool from_hook) {
  if (ready_[index]) {
    throw UsageError("rank " + std::to_string(pg_->rank()) + ": parameter '" + names_[index] +
                     "' got two gradients in one synchronised backward (backward twice after one "
                     "forward? run forward again, or use no_sync for accumulation)");
  }
  ready_[index] = 1;
  if (!order_recorded_ && from_hook) ready_order_.push_back(index);
  const Locator& loc = locators_[index];
  Bucket& bucket = buckets_[loc.bucket];
  at::Tensor& view = bucket.views[loc.slot];
  const at::Tensor& grad = params_[index].grad();
  at::NoGradGuard no_grad;
  // A parameter with no gradient since the last sync contributes zeros.
  const bool has_local_grad = grad.defined() && (from_hook || used_since_sync_[index] != 0);
  const bool divide = options_.hook->predivided() && !bucket.scale_in_reduce;
  if (has_local_grad && local_grads_) local_grads_->local_grad(index, grad);
  if (!has_local_grad) {
    view.zero_();
  } else if (aliases(grad, view)) {
    if (divide) view.mul_(divisor_);  // Note [Pre-divided buckets]
  } else if (divide) {
    at::mul_out(view, grad, divisor_);
  } else {
    view.copy_(grad);
  }
  if (--bucket.pending == 0) launch_ready_buckets(from_hook);
}

void Reducer::launch_ready_buckets(bool during_backward) {
  // Strictly in bucket order: bucket k+1 waits for bucket k even if it filled
  // first, so every rank issues the same collectives in the same order.
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    Bucket& bucket = buckets_[next_bucket_];
    const auto launched = Tracer::Clock::now();
    auto view = grad_bucket(next_bucket_, bucket.contents);
    {
      // The last bucket is waited for next, by finalize() (Note [The last
      // bucket runs on the waiting thread]).
      std::optional<ProcessGroup::WaitNext> last;
      if (next_bucket_ + 1 == buckets_.size() && typeid(*options_.hook) == typeid(AllReduceHook))
        last.emplace();
      if (bucket.scale_in_reduce) {  // Note [Pre-divided buckets]
        bucket.work = {pg_->allreduce_scaled_async(bucket.contents, 1.0 / pg_->size()), nullptr,
                       nullptr, static_cast<int64_t>(bucket.contents.nbytes())};
      } else {
        bucket.work = options_.hook->run_bucket(*pg_, view);
      }
    }
    stats_.bytes += bucket.work.bytes;
    if (tracer_ && bucket.work.work) {
      // Completion is stamped by the backend's future, on its thread.
      auto tracer = tracer_;
      const std::string name = "allreduce bucket " + std::to_string(next_bucket_) + " (" +
                               std::to_string(bucket.contents.nbytes()) + " B)";
      try {
        bucket.work.work->getFuture()->addCallback([tracer, name, launched](c10::ivalue::Future&) {
          tracer->complete(name, "comm", launched, Tracer::Clock::now(), Tracer::kCommLane);
        });
      } catch (const std::exception&) {
        // A backend without futures: the bucket is simply not traced.
      }
    }
    bucket.launched = true;
    if (during_backward) ++stats_.launched_during_backward;
    ++next_bucket_;
  }
}

void Reducer::finalize() {
  std::lock_guard<std::mutex> lock(mu_);
  const auto start = std::chrono::steady_clock::now();
  struct ResetOnExit {
    Reducer* self;
    ~ResetOnExit() { self->reset_iteration(); }
  } reset{this};

  std::vector<size_t> missing;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!ready_[i]) missing.push_back(i);
  }
  if (!missing.empty() && !options_.find_unused_parameters) {
    std::string list;
    for (size_t k = 0; k < missing.size() && k < 10; ++k) {
      list += (k ? ", " : "") + ("'" + names_[missing[k]] + "'");
    }
    if (missing.size() > 10) list += ", ... (" + std::to_string(missing.size()) + " in all)";
    throw UsageError("rank " + std::to_string(pg_->rank()) + ": " + std::to_string(missing.size()) +
                     " parameter(s) got no gradient in this backward: " + list +
                     ". If parts of the model are unused in some iterations, construct "
                     "DistributedDataParallel with find_unused_parameters = true; otherwise make "
                     "the loss depend on every parameter");
  }
  for (size_t i : missing) mark_ready(i, /*from_hook=*/false);

  std::vector<int> used_anywhere;
  if (options_.find_unused_parameters) {
    // Issued after every bucket, identically on all ranks.
    auto used = at::tensor(used_since_sync_, at::kInt).to(pg_->device());
    pg_->allreduce(used, ReduceKind::kMax);
    used = used.cpu();
    used_anywhere.assign(used.data_ptr<int>(), used.data_ptr<int>() + used.numel());
  }
  std::vector<HookWork> works;
  for (auto& bucket : buckets_) works.push_back(bucket.work);
  complete_works(works, "gradient bucket");
  write_back(used_anywhere);
  if (tracer_) tracer_->complete("wait for buckets", "comm", start, Tracer::Clock::now());
  stats_.wait_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::fill(used_since_sync_.begin(), used_since_sync_.end(), 0);
  order_recorded_ = true;
}

// Note [Join]: a rank that ran out of inputs (DdpCore::Join) issues, for each
// synchronised iteration of the others, exactly the collectives an active
// rank's backward would: the one-time bucket rebuild broadcast, one
// all-reduce per bucket in bucket order (through the comm hook, so the
// message sizes and dtypes match), and the used-parameter all-reduce of
// find_unused_parameters. It contributes zero gradients (a stateful hook
// may add its own state to them, as PowerSGD adds its error feedback, as in
// PyTorch), so the mean is over the initial world size, as PyTorch's Join
// does by default. Its own .grad is left alone (fresh zero buffers, not the
// buckets).
void Reducer::shadow_iteration() {
  ensure_prior_iteration_finished();
  std::lock_guard<std::mutex> lock(mu_);
  if (order_recorded_ && !rebuilt_) rebuild_buckets();
  stats_ = ReducerStats{buckets_.size(), 0, 0};
  std::vector<HookWork> works;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    auto view = grad_bucket(b, at::zeros_like(buckets_[b].contents));
    works.push_back(options_.hook->run_bucket(*pg_, view));
  }
  if (options_.find_unused_parameters) {
    auto used = at::zeros({static_cast<int64_t>(params_.size())}, at::kInt).to(pg_->device());
    pg_->allreduce(used, ReduceKind::kMax);
  }
  complete_works(works, "joined rank's shadow of gradient bucket");
  order_recorded_ = true;
}

GradBucket Reducer::grad_bucket(size_t b, const at::Tensor& buffer) const {
  const Bucket& bucket = buckets_[b];
  GradBucket view;
  view.index = b;
  view.count = buckets_.size();
  view.buffer = buffer;
  view.offsets = bucket.offsets;
  view.params.assign(bucket.params.begin(), bucket.params.end());
  if (buffer.is_same(bucket.contents)) {
    view.gradients = bucket.views;
  } else {
    for (size_t slot = 0; slot < bucket.params.size(); ++slot) {
      view.gradients.push_back(
          storage_alias(buffer, bucket.offsets[slot], params_[bucket.params[slot]]));
    }
  }
  return view;
}

// Every first-stage exchange was issued before any second stage (a hook's
// then()), so all ranks issue the second stages in the same order whatever
// the timing; they overlap one another and the waits for later buckets.
void Reducer::complete_works(std::vector<HookWork>& works, const std::string& what) {
  const std::string hook =
      " of " + std::to_string(works.size()) + " (" + options_.hook->name() + ")";
  try {
    for (size_t b = 0; b < works.size(); ++b) {
      if (!works[b].then) continue;
      if (works[b].finish) {
        throw UsageError("comm hook '" + options_.hook->name() +
                         "': a HookWork with then() must leave finish() to the second stage");
      }
      pg_->wait(works[b].work, what + " " + std::to_string(b) + hook);
      works[b] = works[b].then();
      stats_.bytes += works[b].bytes;
      if (works[b].then) {
        throw UsageError("comm hook '" + options_.hook->name() +
                         "': a second stage's HookWork has a then(); two stages at most");
      }
    }
    for (size_t b = 0; b < works.size(); ++b) {
      pg_->wait(works[b].work, what + " " + std::to_string(b) + hook);
      if (works[b].finish) works[b].finish();
    }
  } catch (...) {
    for (auto& w : works) {  // never leave a write in flight
      try {
        if (w.work && !w.work->isCompleted()) w.work->wait();
      } catch (const std::exception&) {
      }
    }
    // Some of this exchange's collectives may not have been issued here
    // while the peers issued them (a second stage that threw on this rank
    // only): as after an interrupted backward, nothing later can pair up.
    failure_ = "rank " + std::to_string(pg_->rank()) +
               ": DistributedDataParallel cannot continue: the gradient exchange of the last "
               "backward failed part way (see the first error), so the ranks may no longer agree "
               "on which collectives were issued. Restart from the last checkpoint";
    throw;
  }
}

// Note [Bucket rebuild]: after the first synchronised iteration the buckets
// are laid out again in the order gradients actually arrived, so each bucket
// fills (and its all-reduce starts) as early as it can. Arrival order may
// differ between ranks, and bucket layouts must not: rank 0's order is
// broadcast and every rank uses it. Done once, at the next synchronised
// forward (a point every rank reaches in the same order), as PyTorch does;
// not with find_unused_parameters, whose iterations may each differ.
void Reducer::rebuild_buckets() {
  rebuilt_ = true;
  if (options_.find_unused_parameters) return;
  std::vector<int64_t> order(ready_order_.begin(), ready_order_.end());
  std::vector<char> seen(params_.size(), 0);
  for (auto i : order) seen[i] = 1;
  for (size_t k : reverse_registration_order()) {
    if (!seen[k]) order.push_back(static_cast<int64_t>(k));
  }
  auto shared = at::tensor(order, at::kLong).to(pg_->device());
  pg_->broadcast(shared, /*root=*/0);
  shared = shared.cpu();
  std::vector<size_t> chosen(shared.data_ptr<int64_t>(),
                             shared.data_ptr<int64_t>() + shared.numel());
  build_buckets(chosen);
  spdlog::debug("ddp: buckets rebuilt in rank 0's gradient arrival order ({} buckets)",
                buckets_.size());
}

std::vector<int64_t> Reducer::bucket_order() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> order;
  if (!rebuilt_) return order;
  for (const auto& bucket : bucket_indices_)
    order.insert(order.end(), bucket.begin(), bucket.end());
  return order;
}

// Note [Restored bucket order]: a stateful comm hook (PowerSGD) keeps state
// per bucket. A resumed run's DDP would lay its buckets out in registration
// order for its first iteration and rebuild them after it; where gradients
// arrive in another order (a LayerNorm's weight before its bias) the buckets
// would hold other parameters than the state was made for. The saved order
// is laid out at once instead, and kept: the run goes on as if never
// interrupted. Every rank reads the same order from the same checkpoint.
void Reducer::restore_bucket_order(const std::vector<int64_t>& order) {
  std::lock_guard<std::mutex> lock(mu_);
  if (expect_hooks_ || order_recorded_ || !ready_order_.empty()) {
    throw UsageError("restore_bucket_order: only before the first forward");
  }
  std::vector<char> seen(params_.size(), 0);
  bool permutation = order.size() == params_.size();
  for (size_t k = 0; permutation && k < order.size(); ++k) {
    permutation = order[k] >= 0 && static_cast<size_t>(order[k]) < params_.size() &&
                  !seen[static_cast<size_t>(order[k])];
    if (permutation) seen[static_cast<size_t>(order[k])] = 1;
  }
  if (!permutation) {
    throw DataError("the saved bucket order is not a permutation of this model's " +
                    std::to_string(params_.size()) + " parameters");
  }
  build_buckets(std::vector<size_t>(order.begin(), order.end()));
  order_recorded_ = true;
  rebuilt_ = true;
}

void Reducer::write_back(const std::vector<int>& used_anywhere) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    // Like PyTorch: a parameter no rank used keeps its .grad as it was.
    if (!used_anywhere.empty() && used_anywhere[i] == 0) continue;
    const Locator& loc = locators_[i];
    const at::Tensor& view = buckets_[loc.bucket].views[loc.slot];
    auto& grad = params_[i].mutable_grad();
    if (options_.gradient_as_bucket_view) {
      if (!aliases(grad, view)) grad = view;  // Note [Bucket views are storage aliases]
    } else if (grad.defined()) {
      grad.copy_(view);
    } else {
      grad = view.clone();
    }
  }
}

void Reducer::reset_iteration() {
  for (auto& bucket : buckets_) {
    if (bucket.launched && bucket.work.work && !bucket.work.work->isCompleted()) {
      try {
        bucket.work.work->wait();  // after an error: never leave a write in flight
      } catch (const std::exception&) {
      }
    }
    bucket.pending = bucket.params.size();
    bucket.launched = false;
    bucket.work = {};
  }
  std::fill(ready_.begin(), ready_.end(), 0);
  next_bucket_ = 0;
  expect_hooks_ = false;
  finalize_queued_ = false;
}

ReducerStats Reducer::last_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace lockstep
