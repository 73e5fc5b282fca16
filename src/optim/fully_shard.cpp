#include "lockstep/optim/fully_shard.h"

#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <spdlog/spdlog.h>
#include <sys/mman.h>

#include <limits>
#include <map>
#include <optional>

#include "lockstep/optim/zero.h"
#include "lockstep/util/error.h"
#include "lockstep/util/unit_call.h"

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
// Backward. A unit's output passes through PreBackward, an identity whose
// backward gathers the unit again (and starts the gather of the unit before
// it) before the unit's own backward runs. Each parameter's gradient
// accumulator has a post hook; when every parameter of a unit has its
// gradient, the unit's gradients are packed as the gather packs weights,
// each multiplied by 1/world as DDP's Reducer does (the same kernel: a
// wrapped-number scalar), reduce-scattered (shm adds in rank order, as its
// all-reduce: the same bits as optim.zero 0), the other ranks' gradients
// dropped and the unit freed. One reduction is in flight at a time (its
// buffers are the unit's size); the owner copies its sum into .grad when the
// next one starts or at the end of backward (an engine callback, which also
// reduces units whose parameters got no gradient: zeros, and frees the
// root). Under no_sync nothing is reduced: gradients accumulate whole on
// every rank, as DDP's, and the next synchronised backward reduces the sum
// (the same order of additions as optim.zero 0).

namespace lockstep {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class Sharded;

// Identity forward; its backward asks the engine to gather the unit.
struct PreBackward : public torch::autograd::Function<PreBackward> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& output, int64_t engine,
                            int64_t unit) {
    ctx->saved_data["engine"] = engine;
    ctx->saved_data["unit"] = unit;
    return output;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads);
};

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
  if (p == MAP_FAILED)
    throw SystemError("fully_shard: cannot map " + std::to_string(nbytes >> 20) +
                        " MiB for a gathered unit (out of memory?)");
  return at::DataPtr(p, new std::pair<void*, size_t>(p, nbytes), &unmap, device);
}

void allocate_storage(const at::Tensor& t, size_t nbytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(t.is_cpu() ? mapped(nbytes, t.device()) : s->allocator()->allocate(nbytes));
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
  std::vector<char> ready;
  size_t arrived = 0;
  bool reduced = false;
  bool forward_with_grad = false;  // ran forward under grad mode since the last backward
};

struct Reduction {
  size_t unit = 0;
  std::optional<ProcessGroup::Scattering> scattering;
  at::Tensor input, output;
};

class Sharded : public FullyShardedParameters,
                public UnitWrapper,
                public std::enable_shared_from_this<Sharded> {
 public:
  Sharded(torch::nn::Module& root, std::shared_ptr<ProcessGroup> pg, std::vector<int> owners,
          const std::vector<std::shared_ptr<torch::nn::Module>>& units, FullyShardOptions options)
      : pg_(std::move(pg)), options_(options), named_(trainable_parameters(root)) {
    owners_ = std::move(owners);
    if (owners_.empty()) {
      std::vector<at::Tensor> params;
      for (const auto& [name, p] : named_) params.push_back(p);
      owners_ = zero_partition(params, pg_->size());
    }
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
    for (const auto& [name, p] : named_) {
      placeholders_.push_back(
          at::full({1}, std::numeric_limits<double>::quiet_NaN(), p.options()).expand(p.sizes()));
    }
    // The accumulators are made now, while every parameter has its shape
    // (their input metadata is taken from it), and held: a placeholder's
    // parameter never gets a new one.
    for (size_t i = 0; i < named_.size(); ++i) {
      auto accumulator = torch::autograd::impl::grad_accumulator(named_[i].second);
      if (!accumulator)
        throw ConfigError("parameter '" + named_[i].first + "' is not a leaf that requires grad");
      hook_keys_.push_back(
          accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
              [this, i](const variable_list& outputs, const variable_list&) {
                gradient_ready(i);
                return outputs;
              })));
      accumulators_.push_back(std::move(accumulator));
    }
  }

  ~Sharded() override {
    for (size_t i = 0; i < accumulators_.size(); ++i)
      accumulators_[i]->del_post_hook(hook_keys_[i]);
    for (const auto& u : units_) set_unit_wrapper(*u.module, nullptr);
    // Collectives in flight write into our buffers: let them land.
    for (auto& u : units_) wait_quietly(u.work);
    if (reduction_ && reduction_->scattering) wait_quietly(reduction_->scattering->work);
  }

  void register_wrappers() {
    for (const auto& u : units_) set_unit_wrapper(*u.module, shared_from_this());
  }

  // Frees every unit: from here on each parameter lives on its owner only.
  void shard() { reshard_all(); }

  // UnitWrapper
  void before_forward(const torch::nn::Module& module) override {
    const size_t k = unit_index(module);
    Unit& u = units_[k];
    if (!u.root && !in_forward_) {
      // A unit called outside the root's forward (a forward without
      // call_unit on the model): the root is gathered for it as well.
      gather_now(root_);
    }
    if (u.root) {
      in_forward_ = true;
      forward_order_.clear();
    } else {
      forward_order_.push_back(k);
    }
    gather_now(k);
    if (options_.prefetch && !u.root) {
      const auto next = next_in(last_forward_order_, k, +1);
      if (next) start_gather(*next);
    }
  }

  at::Tensor after_forward(const torch::nn::Module& module, const at::Tensor& output) override {
    const size_t k = unit_index(module);
    Unit& u = units_[k];
    const bool backward_follows = at::GradMode::is_enabled() && output.defined() &&
                                  output.requires_grad();
    if (u.root) {
      in_forward_ = false;
      last_forward_order_ = forward_order_;
      if (!backward_follows) {
        for (size_t j = 0; j < units_.size(); ++j) free_unit(j);
        return output;
      }
      u.forward_with_grad = true;
      return output;  // kept until its gradients are reduced
    }
    if (!backward_follows) {
      free_unit(k);
      return output;
    }
    u.forward_with_grad = true;
    if (options_.reshard_after_forward) free_unit(k);
    return PreBackward::apply(output, reinterpret_cast<int64_t>(this), static_cast<int64_t>(k));
  }

  // FullyShardedParameters
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
  int64_t resident_parameter_bytes() const override {
    int64_t bytes = 0;
    for (size_t i = 0; i < named_.size(); ++i)
      if (owners_[i] == pg_->rank()) bytes += static_cast<int64_t>(named_[i].second.nbytes());
    return bytes + gathered_bytes_;
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

  // PreBackward's backward: before unit k's own backward.
  void pre_backward(size_t k) {
    gather_now(k);
    if (options_.prefetch) {
      const auto previous = next_in(last_forward_order_, k, -1);
      if (previous && !units_[*previous].reduced) start_gather(*previous);
    }
  }

 private:
  void build_units(torch::nn::Module& root,
                   const std::vector<std::shared_ptr<torch::nn::Module>>& modules) {
    std::map<const c10::TensorImpl*, size_t> index;
    for (size_t i = 0; i < named_.size(); ++i)
      index[named_[i].second.unsafeGetTensorImpl()] = i;
    std::vector<int> unit_of(named_.size(), -1);
    for (const auto& m : modules) {
      if (!m) throw UsageError("fully_shard: a unit is null");
      if (m.get() == &root) throw UsageError("fully_shard: the root cannot also be a unit");
      Unit u;
      u.module = m.get();
      u.name = m->name() + " #" + std::to_string(units_.size());
      for (const auto& p : m->parameters(/*recurse=*/true)) {
        const auto it = index.find(p.unsafeGetTensorImpl());
        if (it == index.end()) continue;  // frozen, or not under the root
        if (unit_of[it->second] >= 0) {
          if (unit_of[it->second] == static_cast<int>(units_.size())) continue;  // tied inside
          throw UsageError("fully_shard: parameter '" + named_[it->second].first +
                           "' is in two units (" + units_[static_cast<size_t>(unit_of[it->second])].name +
                           " and " + u.name + "); units must not nest or share parameters");
        }
        unit_of[it->second] = static_cast<int>(units_.size());
        u.params.push_back(it->second);
      }
      units_.push_back(std::move(u));
    }
    Unit r;
    r.module = &root;
    r.name = "root";
    r.root = true;
    for (size_t i = 0; i < named_.size(); ++i)
      if (unit_of[i] < 0) r.params.push_back(i);
    root_ = units_.size();
    units_.push_back(std::move(r));
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
                             named_[i].first + "' is " + std::string(c10::toString(p.scalar_type())) +
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
      u.ready.assign(u.params.size(), 0);
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

  void gradient_ready(size_t i) {
    if (!finalize_queued_) {
      finalize_queued_ = true;
      torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_backward(); });
    }
    const size_t k = unit_of_[i];
    Unit& u = units_[k];
    size_t j = 0;
    while (u.params[j] != i) ++j;
    if (u.ready[j] == 0) {
      u.ready[j] = 1;
      ++u.arrived;
    }
    if (u.arrived == u.params.size() && !u.reduced) unit_done(k);
  }

  // Every gradient of unit k is in (or backward ended without some).
  void unit_done(size_t k) {
    Unit& u = units_[k];
    u.reduced = true;
    if (synchronised() && pg_->size() > 1) reduce(k);
    free_unit(k);  // its gradients are all in: backward needs it no more
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
      if (p.grad().defined()) {
        p.mutable_grad().copy_(sum);
      } else {
        p.mutable_grad() = sum.clone();
      }
    }
  }

  // The engine's callback at the end of backward.
  void finish_backward() {
    finalize_queued_ = false;
    for (size_t k = 0; k < units_.size(); ++k) {
      Unit& u = units_[k];
      // A unit that ran forward but some of whose parameters got no
      // gradient: they count as zeros (every rank runs the same model, so
      // every rank takes this branch for the same units).
      if (u.forward_with_grad && !u.reduced) unit_done(k);
    }
    finish_reduction();
    for (size_t k = 0; k < units_.size(); ++k) {
      Unit& u = units_[k];
      free_unit(k);
      std::fill(u.ready.begin(), u.ready.end(), 0);
      u.arrived = 0;
      u.reduced = false;
      u.forward_with_grad = false;
    }
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
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;
  at::Tensor divisor_;
  std::function<bool()> synchronised_;
  std::optional<Reduction> reduction_;
  std::vector<size_t> forward_order_, last_forward_order_;
  bool in_forward_ = false;
  bool finalize_queued_ = false;
  int64_t gathered_bytes_ = 0;
  int64_t peak_gathered_bytes_ = 0;
};

variable_list PreBackward::backward(AutogradContext* ctx, variable_list grads) {
  auto* engine = reinterpret_cast<Sharded*>(ctx->saved_data["engine"].toInt());
  engine->pre_backward(static_cast<size_t>(ctx->saved_data["unit"].toInt()));
  return {grads[0], at::Tensor(), at::Tensor()};
}

}  // namespace

std::shared_ptr<FullyShardedParameters> fully_shard(
    torch::nn::Module& root, std::shared_ptr<ProcessGroup> pg, const std::vector<int>& owners,
    const std::vector<std::shared_ptr<torch::nn::Module>>& units, FullyShardOptions options) {
  auto sharded = std::make_shared<Sharded>(root, std::move(pg), owners, units, options);
  sharded->register_wrappers();
  sharded->shard();
  return sharded;
}

}  // namespace lockstep
