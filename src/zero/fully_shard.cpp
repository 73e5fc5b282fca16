// One state machine over the units (gather, free,
// pre-backward, ordered reduction, end of backward, recovery from a failed
// backward), as the Reducer is for DDP; its parts share all of its state.
#include "lockstep/zero/fully_shard.h"

#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <spdlog/spdlog.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "lockstep/distributed/torch_compat.h"
#include "lockstep/util/error.h"
#include "lockstep/util/unit_call.h"
#include "lockstep/zero/zero.h"

// Note [Fully sharded parameters]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// What is sharded. Whole parameters by owner (zero_partition, as stages 1
// and 2): the owner keeps its parameter as it is (the tensor its optimizer
// steps, the same kernel and the same bits as an unsharded run); the other
// ranks keep a placeholder. Dim-0 chunks (FSDP2) would balance to the
// element but cut the optimizer's tensors (Note [ZeRO]).
//
// Gathering a unit. Each rank packs the unit's parameters it owns into one
// chunk (the largest owner's share of the unit, padded), one all-gather
// fills the unit's flat buffer (world x chunk), and every parameter the rank
// does not own becomes a view into it (Tensor::set_data: the version
// counter is kept, so autograd's saved parameters stay valid). Freeing it
// releases the flat buffer's storage bytes in place (the StorageImpl stays,
// its data pointer goes) and puts the placeholder back. Why in place, as
// FSDP1 does: autograd saves views of a weight (linear saves weight.t()),
// which point at the buffer's StorageImpl, not at the parameter; a fresh
// buffer per gather would leave them reading freed or stale memory. With the
// storage reallocated in place, every saved view sees the gathered bytes
// again once the unit is gathered for backward.
//
// The placeholder is one NaN broadcast to the parameter's shape (stride 0):
// shapes and numel() stay true for code that counts, reading it gives NaN
// (loud in any loss), and writing it is an error.
//
// Backward. A hook on each unit's output gathers the unit again (and
// starts the gather of the unit before it) before the unit's own backward
// runs. Each parameter's gradient accumulator has a post hook; when every
// parameter of a unit has its gradient and every unit after it in the
// forward has been reduced (so that all ranks reduce in one order), the
// unit's gradients are packed as the gather packs weights,
// each multiplied by 1/world as DDP's Reducer does (the same kernel: a
// wrapped-number scalar), reduce-scattered (shm adds in rank order, as its
// all-reduce: the same bits as optim.zero 0), the other ranks' gradients
// dropped and the unit freed. One reduction is in flight at a time (its
// buffers are the unit's size); the owner copies its sum into .grad when the
// next one starts or at the end of backward (an engine callback, which frees
// the root; a parameter that got no gradient is reduced as zeros to keep the
// collectives paired, then every rank stops with a UsageError naming it).
// An owner's .grad from before the backward (no zero_grad between two
// backwards) is set aside at the forward and the new sum added to it, as
// PyTorch accumulates. Under no_sync (read at the forward, as DDP does)
// nothing is reduced: gradients accumulate whole on every rank, and the next
// synchronised backward reduces the sum (optim.zero 0's order of additions).
//
// Owners. fully_shard_partition balances each unit on its own (largest
// parameter first to the rank with the least of that unit), so that a
// unit's gather buffer, world x the largest share, is padded by about one
// parameter per rank at most; a partition over the whole model could give
// one rank all of a unit.

namespace lockstep {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class Sharded;

void free_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

// CPU buffers that come and go every step (gathered units, the
// reduce-scatter's) are mapped and unmapped whole, so that what a unit frees
// goes back to the kernel at once: lockstep's allocator tuning keeps freed
// heap memory for the next step (Note [Allocator tuning]), which would keep
// a unit's gathered weights resident after they are freed. The price is
// the page faults of a fresh mapping per gather.
void unmap(void* context) {
  const auto* region = static_cast<std::pair<void*, size_t>*>(context);
  munmap(region->first, region->second);
  delete region;
}

at::DataPtr mapped(size_t nbytes, at::Device device) {
  if (nbytes == 0) return at::DataPtr(nullptr, device);
  void* p = mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    const std::string what = "fully_shard: cannot map " + std::to_string(nbytes >> 20) +
                             " MiB for a gathered unit: " + std::strerror(err);
    if (err == ENOMEM) throw OutOfMemoryError(what);
    throw SystemError(what);
  }
  return at::DataPtr(p, new std::pair<void*, size_t>(p, nbytes), &unmap, device);
}

void allocate_storage(const at::Tensor& t, size_t nbytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(t.is_cpu() ? mapped(nbytes, t.device())
                                    : s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

// An uninitialised 1-d buffer of `numel` elements (mapped on CPU).
at::Tensor buffer(int64_t numel, const at::TensorOptions& options) {
  at::Tensor t = at::empty({0}, options);
  if (!t.is_cpu()) return at::empty({numel}, options);
  allocate_storage(t, static_cast<size_t>(numel) * t.element_size());
  t.unsafeGetTensorImpl()->set_sizes_contiguous({numel});
  return t;
}

struct Unit {
  const torch::nn::Module* module = nullptr;
  std::string name;
  bool root = false;
  std::vector<size_t> params;  // indices into the engine's parameters
  std::vector<int64_t> at;     // each one's place in the flat buffer
  int64_t chunk = 0;           // elements per rank in the flat buffer
  int64_t numel = 0;
  at::ScalarType dtype = at::kFloat;
  at::Tensor flat;  // world x chunk; its storage held only while gathered
  at::Tensor send;  // this rank's chunk, packed
  enum class State { kFree, kGathering, kGathered } state = State::kFree;
  Ptr<C10dWork> work;
  // Backward: the parameters whose gradients arrived in this backward.
  std::vector<char> arrived_at;
  size_t arrived = 0;
  bool ready = false;  // every gradient in
  bool reduced = false;
  bool forward_with_grad = false;  // ran forward under grad mode since the last backward
};

struct Reduction {
  size_t unit = 0;
  std::optional<ProcessGroup::Scattering> scattering;
  at::Tensor input, output;
};

std::vector<std::vector<size_t>> unit_members(
    const torch::nn::Module& root, const std::vector<std::shared_ptr<torch::nn::Module>>& units,
    const NamedTensors& named);

class Sharded : public FullyShardedParameters,
                public UnitWrapper,
                public std::enable_shared_from_this<Sharded> {
 public:
  Sharded(torch::nn::Module& root, std::shared_ptr<ProcessGroup> pg, std::vector<int> owners,
          const std::vector<std::shared_ptr<torch::nn::Module>>& units, FullyShardOptions options)
      : pg_(std::move(pg)), options_(options), named_(trainable_parameters(root)) {
    if (unit_wrapper(root))
      throw UsageError("fully_shard: this module is fully sharded already (once per root)");
    owners_ = owners.empty() ? fully_shard_partition(root, units, pg_->size()) : std::move(owners);
    if (owners_.size() != named_.size())
      throw UsageError("fully_shard: " + std::to_string(owners_.size()) + " owners for " +
                       std::to_string(named_.size()) + " trainable parameters");
    for (int owner : owners_)
      if (owner < 0 || owner >= pg_->size())
        throw UsageError("fully_shard: owner rank " + std::to_string(owner) + " outside [0, " +
                         std::to_string(pg_->size()) + ")");
    build_units(root, units);
    divisor_ = c10::scalar_to_tensor(at::Scalar(1.0 / pg_->size()));
    divisor_.unsafeGetTensorImpl()->set_wrapped_number(true);
    stash_.assign(named_.size(), at::Tensor());
    reduced_grad_.assign(named_.size(), 0);
    for (const auto& [name, p] : named_) {
      placeholders_.push_back(
          at::full({1}, std::numeric_limits<double>::quiet_NaN(), p.options()).expand(p.sizes()));
    }
    // The accumulators are made now, while every parameter has its shape
    // (their input metadata is taken from it), and held: a placeholder's
    // parameter never gets a new one.
    for (size_t i = 0; i < named_.size(); ++i) {
      auto hook = AccumulatorHook::add(named_[i].second, [this, i] { gradient_ready(i); });
      if (!hook)
        throw ConfigError("parameter '" + named_[i].first + "' is not a leaf that requires grad");
      accumulator_hooks_.push_back(std::move(hook));
    }
  }

  ~Sharded() override {
    accumulator_hooks_.clear();
    for (const auto& u : units_)
      if (unit_wrapper(*u.module).get() == static_cast<const UnitWrapper*>(this))
        set_unit_wrapper(*u.module, nullptr);
    // Collectives in flight write into our buffers: let them land.
    for (auto& u : units_) wait_quietly(u.work);
    if (reduction_ && reduction_->scattering) wait_quietly(reduction_->scattering->work);
  }

  void register_wrappers() {
    for (const auto& u : units_) set_unit_wrapper(*u.module, shared_from_this());
  }

  // From here on each parameter lives on its owner only: the others'
  // copies (whole since construction) are dropped for placeholders.
  void shard() {
    for (size_t i = 0; i < named_.size(); ++i)
      if (!owns(i)) named_[i].second.set_data(placeholders_[i]);
  }

  // UnitWrapper
  void before_forward(const torch::nn::Module& module) override {
    const size_t k = unit_index(module);
    Unit& u = units_[k];
    const bool grad = at::GradMode::is_enabled();
    if (u.root) {
      root_forwards_ += 1;
      if (grad) begin_backward_pass();
    } else if (root_forwards_ == 0) {
      // A unit called outside the root's forward (a forward without
      // call_unit on the model): the root is gathered for it as well.
      gather_now(root_);
    }
    if (grad && !u.root &&
        std::find(forward_order_.begin(), forward_order_.end(), k) == forward_order_.end())
      forward_order_.push_back(k);
    gather_now(k);
    if (options_.prefetch && !u.root) {
      const auto next = next_in(last_forward_order_, k, +1);
      if (next) start_gather(*next);
    }
  }

  at::Tensor after_forward(const torch::nn::Module& module, const at::Tensor& output) override {
    const size_t k = unit_index(module);
    Unit& u = units_[k];
    const bool backward_follows =
        at::GradMode::is_enabled() && output.defined() && output.requires_grad();
    if (u.root) {
      root_forwards_ -= 1;
      if (backward_follows) {
        u.forward_with_grad = true;
        last_forward_order_ = forward_order_;
        return output;  // kept until its gradients are reduced
      }
      // A forward without backward: free what no pending backward needs.
      const bool pending = forward_with_grad_pending();
      for (size_t j = 0; j < units_.size(); ++j)
        if (!units_[j].forward_with_grad && !(units_[j].root && pending)) free_unit(j);
      return output;
    }
    if (!backward_follows) {
      if (!u.forward_with_grad) free_unit(k);
      return output;
    }
    u.forward_with_grad = true;
    if (options_.reshard_after_forward) free_unit(k);
    // Before the unit's own backward its output's gradient arrives: a hook
    // there gathers the unit again. A hook, not an identity function, so
    // that the output stays the tensor the unit returned (in-place
    // operations on it stay legal).
    std::weak_ptr<Sharded> self = shared_from_this();
    at::Tensor out = output;
    out.register_hook([self, k](const at::Tensor& g) {
      if (auto engine = self.lock()) engine->pre_backward(k);
      return g;
    });
    return out;
  }

  // FullyShardedParameters
  void set_local_grad_observer(std::shared_ptr<LocalGradObserver> observer) override {
    local_grads_ = std::move(observer);
  }
  void set_gradient_sync(std::function<bool()> synchronised) override {
    synchronised_ = std::move(synchronised);
  }
  void unshard_all() override {
    for (size_t k = 0; k < units_.size(); ++k) gather_now(k);
  }
  void reshard_all() override {
    for (size_t k = 0; k < units_.size(); ++k) free_unit(k);
  }
  void visit_whole(const std::function<void(size_t, const at::Tensor&)>& fn) override {
    for (size_t k = 0; k < units_.size(); ++k) {
      const bool was_gathered = units_[k].state == Unit::State::kGathered;
      gather_now(k);
      try {
        for (size_t i : units_[k].params) fn(i, named_[i].second);
      } catch (...) {
        if (!was_gathered) free_unit(k);
        throw;
      }
      if (!was_gathered) free_unit(k);
    }
  }
  // Counted from the storages themselves: the parameters' own (a
  // placeholder's is one element) and the gathered buffers'.
  int64_t resident_parameter_bytes() const override {
    std::set<const c10::StorageImpl*> seen;
    int64_t bytes = 0;
    for (const auto& [name, p] : named_) {
      const c10::StorageImpl* storage = p.storage().unsafeGetStorageImpl();
      if (seen.insert(storage).second) bytes += static_cast<int64_t>(storage->nbytes());
    }
    for (const auto& u : units_) {
      const c10::StorageImpl* storage = u.flat.storage().unsafeGetStorageImpl();
      if (seen.insert(storage).second) bytes += static_cast<int64_t>(storage->nbytes());
    }
    return bytes;
  }
  int64_t peak_gathered_bytes() const override { return peak_gathered_bytes_; }
  const std::vector<int>& owners() const override { return owners_; }
  std::vector<std::string> describe_units() const override {
    std::vector<std::string> out;
    for (const auto& u : units_)
      out.push_back(u.name + " (" + std::to_string(u.params.size()) + " tensors, " +
                    std::to_string(u.numel) + " elements)");
    return out;
  }

  // The hook on unit k's output: before unit k's own backward.
  void pre_backward(size_t k) {
    gather_now(k);
    if (options_.prefetch) {
      const auto previous = next_in(last_forward_order_, k, -1);
      if (previous && !units_[*previous].ready) start_gather(*previous);
    }
  }

 private:
  void build_units(torch::nn::Module& root,
                   const std::vector<std::shared_ptr<torch::nn::Module>>& modules) {
    const auto members = unit_members(root, modules, named_);
    for (size_t k = 0; k < members.size(); ++k) {
      Unit u;
      u.root = k + 1 == members.size();
      u.module = u.root ? &root : modules[k].get();
      u.name = u.root ? std::string("root") : modules[k]->name() + " #" + std::to_string(k);
      u.params = members[k];
      units_.push_back(std::move(u));
    }
    root_ = units_.size() - 1;
    unit_of_.assign(named_.size(), 0);
    const int world = pg_->size();
    for (size_t k = 0; k < units_.size(); ++k) {
      Unit& u = units_[k];
      std::vector<int64_t> fill(static_cast<size_t>(world), 0);
      for (size_t i : u.params) {
        unit_of_[i] = k;
        fill[static_cast<size_t>(owners_[i])] += named_[i].second.numel();
        u.numel += named_[i].second.numel();
      }
      if (!u.params.empty()) {
        const at::Tensor& first = named_[u.params.front()].second;
        u.dtype = first.scalar_type();
        for (size_t i : u.params) {
          const at::Tensor& p = named_[i].second;
          if (p.scalar_type() != u.dtype || p.device() != first.device())
            throw UsageError("fully_shard: unit " + u.name + " mixes dtypes or devices ('" +
                             named_[i].first + "' is " +
                             std::string(c10::toString(p.scalar_type())) +
                             "): split it into units of one dtype");
        }
      }
      u.chunk = std::max<int64_t>(1, *std::max_element(fill.begin(), fill.end()));
      std::fill(fill.begin(), fill.end(), 0);
      for (size_t i : u.params) {
        const int owner = owners_[i];
        u.at.push_back(owner * u.chunk + fill[static_cast<size_t>(owner)]);
        fill[static_cast<size_t>(owner)] += named_[i].second.numel();
      }
      const auto options = u.params.empty() ? at::TensorOptions().dtype(at::kFloat)
                                            : named_[u.params.front()].second.options();
      u.flat = at::empty({world * u.chunk}, options.requires_grad(false));
      free_storage(u.flat);
      u.arrived_at.assign(u.params.size(), 0);
    }
  }

  size_t unit_index(const torch::nn::Module& module) const {
    for (size_t k = 0; k < units_.size(); ++k)
      if (units_[k].module == &module) return k;
    throw InternalError("fully_shard: a module that is not a unit");
  }

  static std::optional<size_t> next_in(const std::vector<size_t>& order, size_t k, int step) {
    for (size_t j = 0; j < order.size(); ++j) {
      if (order[j] != k) continue;
      const auto n = static_cast<std::ptrdiff_t>(j) + step;
      if (n < 0 || n >= static_cast<std::ptrdiff_t>(order.size())) return std::nullopt;
      return order[static_cast<size_t>(n)];
    }
    return std::nullopt;
  }

  bool owns(size_t i) const { return owners_[i] == pg_->rank(); }

  void start_gather(size_t k) {
    Unit& u = units_[k];
    if (u.state != Unit::State::kFree) return;
    const size_t bytes = static_cast<size_t>(u.flat.numel()) * u.flat.element_size();
    allocate_storage(u.flat, bytes);
    gathered_bytes_ += static_cast<int64_t>(bytes);
    peak_gathered_bytes_ = std::max(peak_gathered_bytes_, gathered_bytes_);
    u.state = Unit::State::kGathering;
    if (pg_->size() == 1) return;  // every parameter is this rank's
    at::NoGradGuard no_grad;
    u.send = buffer(u.chunk, u.flat.options()).zero_();
    const int64_t base = static_cast<int64_t>(pg_->rank()) * u.chunk;
    for (size_t j = 0; j < u.params.size(); ++j) {
      const size_t i = u.params[j];
      if (!owns(i)) continue;
      const at::Tensor& p = named_[i].second;
      u.send.narrow(0, u.at[j] - base, p.numel()).copy_(p.detach().reshape({-1}));
    }
    u.work = pg_->all_gather_into_async(u.flat, u.send);
  }

  void gather_now(size_t k) {
    Unit& u = units_[k];
    if (u.state == Unit::State::kGathered) return;
    start_gather(k);
    pg_->wait(u.work, "fully_shard all-gather of " + u.name);
    u.work = {};
    u.send = at::Tensor();
    for (size_t j = 0; j < u.params.size(); ++j) {
      const size_t i = u.params[j];
      if (owns(i)) continue;
      at::Tensor& p = named_[i].second;
      p.set_data(u.flat.narrow(0, u.at[j], p.numel()).view(p.sizes()));
    }
    u.state = Unit::State::kGathered;
  }

  void free_unit(size_t k) {
    Unit& u = units_[k];
    if (u.state == Unit::State::kFree) return;
    if (u.state == Unit::State::kGathering) {
      pg_->wait(u.work, "fully_shard all-gather of " + u.name);
      u.work = {};
      u.send = at::Tensor();
    }
    for (size_t i : u.params)
      if (!owns(i)) named_[i].second.set_data(placeholders_[i]);
    free_storage(u.flat);
    gathered_bytes_ -= static_cast<int64_t>(u.flat.numel()) * u.flat.element_size();
    u.state = Unit::State::kFree;
  }

  bool synchronised() const { return !synchronised_ || synchronised_(); }

  // At the start of a forward with grad (the root's): the state of a
  // backward that threw half-way is cleared, the owners' reduced gradients
  // are set aside to be added to the next reduction (PyTorch accumulates
  // .grad across backwards), and no_sync is read (at the forward, as DDP
  // reads it).
  void begin_backward_pass() {
    // A backward began (a gradient arrived) but never reached its end.
    bool dirty = finalize_queued_ || reduction_.has_value() || next_reduce_ != 0;
    for (const auto& u : units_) dirty = dirty || u.arrived > 0 || u.reduced || u.ready;
    if (dirty) {
      spdlog::warn(
          "fully_shard: the previous backward did not finish (an exception?): its partial "
          "gradients are dropped");
      // The reduction in flight lands (every rank issued it) but is not
      // written: the user may have cleared .grad since.
      if (reduction_ && reduction_->scattering) wait_quietly(reduction_->scattering->work);
      reduction_.reset();
      finalize_queued_ = false;
      for (size_t k = 0; k < units_.size(); ++k) reset_unit(k);
      next_reduce_ = 0;
    }
    if (forward_with_grad_pending()) return;  // a second forward before one backward
    forward_order_.clear();
    sync_this_pass_ = synchronised();
    for (size_t i = 0; i < named_.size(); ++i) {
      if (!reduced_grad_[i]) continue;
      reduced_grad_[i] = 0;
      at::Tensor& p = named_[i].second;
      if (p.grad().defined()) {
        stash_[i] = p.grad();
        p.mutable_grad().reset();
      }
    }
  }

  bool forward_with_grad_pending() const {
    for (const auto& u : units_)
      if (u.forward_with_grad) return true;
    return false;
  }

  void reset_unit(size_t k) {
    Unit& u = units_[k];
    free_unit(k);
    std::fill(u.arrived_at.begin(), u.arrived_at.end(), 0);
    u.arrived = 0;
    u.ready = false;
    u.reduced = false;
    u.forward_with_grad = false;
  }

  void gradient_ready(size_t i) {
    if (!finalize_queued_) {
      finalize_queued_ = true;
      torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_backward(); });
    }
    const size_t k = unit_of_[i];
    Unit& u = units_[k];
    size_t j = 0;
    while (u.params[j] != i) ++j;
    if (u.arrived_at[j] == 0) {
      u.arrived_at[j] = 1;
      ++u.arrived;
    }
    if (u.arrived == u.params.size() && !u.ready) {
      u.ready = true;
      reduce_in_order(false);
    }
  }

  // The reductions, strictly in the reverse of the forward's unit order
  // (the root last), whatever order the gradients arrive in: every rank
  // issues the same reduce-scatters in the same order, even when one
  // rank's unit waits for a gradient the others got earlier. A unit whose
  // turn has not come keeps its gradients (and stays gathered) until then.
  // `all`: at the end of backward, the rest too.
  void reduce_in_order(bool all) {
    std::vector<size_t> order(last_forward_order_.rbegin(), last_forward_order_.rend());
    order.push_back(root_);
    while (next_reduce_ < order.size()) {
      const size_t k = order[next_reduce_];
      Unit& u = units_[k];
      if (u.forward_with_grad) {
        if (!u.ready && !all) return;
        u.reduced = true;
        if (sync_this_pass_ && pg_->size() > 1) reduce(k);
        free_unit(k);  // its gradients are all in: backward needs it no more
      }
      ++next_reduce_;
    }
  }

  void reduce(size_t k) {
    finish_reduction();
    Unit& u = units_[k];
    const int world = pg_->size();
    at::NoGradGuard no_grad;
    Reduction r;
    r.unit = k;
    r.input = buffer(world * u.chunk, u.flat.options()).zero_();
    for (size_t j = 0; j < u.params.size(); ++j) {
      const size_t i = u.params[j];
      at::Tensor& p = named_[i].second;
      const at::Tensor& g = p.grad();
      if (g.defined() && local_grads_) local_grads_->local_grad(i, g);
      if (g.defined()) {
        at::Tensor place = r.input.narrow(0, u.at[j], g.numel()).view(g.sizes());
        at::mul_out(place, g, divisor_);  // Note [Pre-divided buckets], reducer.cpp
      }
      if (!owns(i)) p.mutable_grad().reset();
    }
    r.output = buffer(u.chunk, u.flat.options());
    r.scattering.emplace(pg_->reduce_scatter_async(r.output, r.input));
    reduction_ = std::move(r);
  }

  void finish_reduction() {
    if (!reduction_) return;
    Reduction r = std::move(*reduction_);
    reduction_.reset();
    pg_->wait(*r.scattering, "fully_shard reduce-scatter of " + units_[r.unit].name);
    const Unit& u = units_[r.unit];
    const int64_t base = static_cast<int64_t>(pg_->rank()) * u.chunk;
    at::NoGradGuard no_grad;
    for (size_t j = 0; j < u.params.size(); ++j) {
      const size_t i = u.params[j];
      if (!owns(i)) continue;
      at::Tensor& p = named_[i].second;
      const at::Tensor sum = r.output.narrow(0, u.at[j] - base, p.numel()).view(p.sizes());
      if (stash_[i].defined()) {  // .grad from before this backward: accumulated
        at::Tensor kept = std::move(stash_[i]);
        kept.add_(sum);
        p.mutable_grad() = kept;
      } else if (p.grad().defined()) {
        p.mutable_grad().copy_(sum);
      } else {
        p.mutable_grad() = sum.clone();
      }
      reduced_grad_[i] = 1;
    }
  }

  // The engine's callback at the end of backward.
  void finish_backward() {
    finalize_queued_ = false;
    // A parameter of a unit that ran forward but got no gradient: reduced
    // as zeros, so that every rank issues the same collectives; then every
    // rank learns of it and stops, as DDP without find_unused_parameters
    // does.
    int64_t missing = -1;
    for (size_t k = 0; k < units_.size() && missing < 0; ++k) {
      const Unit& u = units_[k];
      if (!u.forward_with_grad) continue;
      for (size_t j = 0; j < u.params.size(); ++j) {
        if (u.arrived_at[j] == 0) {
          missing = static_cast<int64_t>(u.params[j]);
          break;
        }
      }
    }
    const bool exchanged = sync_this_pass_ && pg_->size() > 1;
    reduce_in_order(true);
    finish_reduction();
    for (size_t k = 0; k < units_.size(); ++k) reset_unit(k);
    next_reduce_ = 0;
    int rank = missing >= 0 ? pg_->rank() : -1;
    if (exchanged) {
      // [any missing, world - the lowest rank with one]
      at::Tensor flag =
          at::tensor({missing >= 0 ? 1.0 : 0.0,
                      missing >= 0 ? static_cast<double>(pg_->size() - pg_->rank()) : 0.0},
                     at::kDouble)
              .to(pg_->device());
      pg_->allreduce(flag, ReduceKind::kMax);
      const auto f = flag.cpu();
      if (f[0].item<double>() > 0) rank = pg_->size() - static_cast<int>(f[1].item<double>());
    }
    if (rank < 0) return;
    throw UsageError(
        "optim.zero 3: " +
        (missing >= 0 && rank == pg_->rank()
             ? "parameter '" + named_[static_cast<size_t>(missing)].first + "'"
             : std::string("a parameter")) +
        " got no gradient in a backward on rank " + std::to_string(rank) +
        " although its unit ran forward; every parameter of a fully sharded unit must get one "
        "(fully sharded parameters have no find_unused_parameters)");
  }

  static void wait_quietly(const Ptr<C10dWork>& work) {
    try {
      if (work) work->wait();
    } catch (const std::exception&) {
    }
  }

  std::shared_ptr<ProcessGroup> pg_;
  FullyShardOptions options_;
  NamedTensors named_;
  std::vector<int> owners_;
  std::vector<Unit> units_;
  size_t root_ = 0;
  std::vector<size_t> unit_of_;
  std::vector<at::Tensor> placeholders_;
  std::vector<std::unique_ptr<AccumulatorHook>> accumulator_hooks_;
  at::Tensor divisor_;
  std::function<bool()> synchronised_;
  std::optional<Reduction> reduction_;
  std::vector<size_t> forward_order_, last_forward_order_;
  int root_forwards_ = 0;  // root forwards running (nested calls count)
  size_t next_reduce_ = 0;
  bool sync_this_pass_ = true;
  std::shared_ptr<LocalGradObserver> local_grads_;
  std::vector<at::Tensor> stash_;   // owners' .grad from before this backward
  std::vector<char> reduced_grad_;  // .grad holds a reduction's result
  bool finalize_queued_ = false;
  int64_t gathered_bytes_ = 0;
  int64_t peak_gathered_bytes_ = 0;
};

// The parameters of each unit (by index into trainable_parameters(root)),
// the root's last; UsageError for a unit that is not under the root, holds
// no trainable parameter, or shares one with another unit.
std::vector<std::vector<size_t>> unit_members(
    const torch::nn::Module& root, const std::vector<std::shared_ptr<torch::nn::Module>>& units,
    const NamedTensors& named) {
  std::map<const c10::TensorImpl*, size_t> index;
  for (size_t i = 0; i < named.size(); ++i) index[named[i].second.unsafeGetTensorImpl()] = i;
  std::set<const torch::nn::Module*> under;
  for (const auto& m : root.modules(/*include_self=*/false)) under.insert(m.get());
  std::vector<int> unit_of(named.size(), -1);
  std::vector<std::vector<size_t>> members;
  for (const auto& m : units) {
    if (!m) throw UsageError("fully_shard: a unit is null");
    if (m.get() == &root) throw UsageError("fully_shard: the root cannot also be a unit");
    if (under.count(m.get()) == 0)
      throw UsageError("fully_shard: unit " + std::to_string(members.size()) + " (" + m->name() +
                       ") is not a module under the root");
    std::vector<size_t> mine;
    for (const auto& p : m->parameters(/*recurse=*/true)) {
      const auto it = index.find(p.unsafeGetTensorImpl());
      if (it == index.end()) continue;                                        // frozen
      if (unit_of[it->second] == static_cast<int>(members.size())) continue;  // tied inside
      if (unit_of[it->second] >= 0)
        throw UsageError("fully_shard: parameter '" + named[it->second].first +
                         "' is in two units; units must not nest or share parameters");
      unit_of[it->second] = static_cast<int>(members.size());
      mine.push_back(it->second);
    }
    if (mine.empty())
      throw UsageError("fully_shard: unit " + std::to_string(members.size()) + " (" + m->name() +
                       ") has no trainable parameter");
    members.push_back(std::move(mine));
  }
  std::vector<size_t> rest;
  for (size_t i = 0; i < named.size(); ++i)
    if (unit_of[i] < 0) rest.push_back(i);
  members.push_back(std::move(rest));
  return members;
}

}  // namespace

std::vector<int> fully_shard_partition(const torch::nn::Module& root,
                                       const std::vector<std::shared_ptr<torch::nn::Module>>& units,
                                       int world) {
  if (world < 1) throw UsageError("fully_shard_partition: world size " + std::to_string(world));
  const NamedTensors named = trainable_parameters(root);
  std::vector<int> owners(named.size(), 0);
  std::vector<int64_t> total(static_cast<size_t>(world), 0);
  for (const auto& members : unit_members(root, units, named)) {
    // Within the unit: largest first, to the rank holding the least of this
    // unit (ties: the least overall, then the lower rank).
    std::vector<size_t> order = members;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return named[a].second.numel() > named[b].second.numel();
    });
    std::vector<int64_t> load(static_cast<size_t>(world), 0);
    for (size_t i : order) {
      size_t best = 0;
      for (size_t r = 1; r < load.size(); ++r) {
        if (load[r] < load[best] || (load[r] == load[best] && total[r] < total[best])) best = r;
      }
      owners[i] = static_cast<int>(best);
      load[best] += named[i].second.numel();
      total[best] += named[i].second.numel();
    }
  }
  return owners;
}

std::shared_ptr<FullyShardedParameters> fully_shard(
    torch::nn::Module& root, std::shared_ptr<ProcessGroup> pg, const std::vector<int>& owners,
    const std::vector<std::shared_ptr<torch::nn::Module>>& units, FullyShardOptions options) {
  auto sharded = std::make_shared<Sharded>(root, std::move(pg), owners, units, options);
  sharded->register_wrappers();
  sharded->shard();
  return sharded;
}

}  // namespace lockstep
