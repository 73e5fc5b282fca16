#include "lockstep/model/recompute.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <mutex>

#include "lockstep/util/torch_compat.h"

namespace lockstep {

// Note [Activation checkpointing]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// As torch.utils.checkpoint: the forward of a block runs under no_grad and
// keeps only its input; backward runs it again with grad on and
// differentiates that. Two things make the recompute the same computation:
// the default generator's state at the first run (dropout draws the same
// masks; the generator is put back afterwards, so what follows draws as
// it would have), and the autocast state of the first run (backward runs
// outside autocast). Unlike PyTorch's reentrant variant, the module's
// parameters are explicit inputs of the autograd function and their
// gradients come from torch::autograd::grad inside backward, returned to
// the outer graph: they reach the parameters' AccumulateGrad in the outer
// backward, as without checkpointing, so DDP's hooks (reducer.cpp) fire
// there and its end-of-backward callback is queued on the outer graph
// task, never on the nested one. The same graph differentiated the same
// way gives bit-identical gradients (tests/model/test_gpt.cpp's "activation
// checkpointing" cases, and a 2-rank GPT run in tests/multiproc/gpt.sh).
namespace {

struct Recompute : torch::CustomClassHolder {
  std::function<at::Tensor(const at::Tensor&)> fn;
  at::Generator generator;  // the input's device's default generator
  at::Tensor rng_state;
  at::DeviceType device = at::kCPU;
  bool autocast = false;
  at::ScalarType autocast_dtype = at::kFloat;
};

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                c10::intrusive_ptr<Recompute> recompute,
                                                at::TensorList input_and_parameters) {
    ctx->save_for_backward(input_and_parameters.vec());
    const at::Tensor& input = input_and_parameters[0];
    at::Tensor output;
    {
      std::lock_guard<std::mutex> lock(recompute->generator.mutex());
      recompute->rng_state = recompute->generator.get_state();
    }
    // Autograd is off inside a Function's forward. Autocast's cast cache
    // too: a float32 weight cast here would be cached without a gradient
    // path, and the recompute, in the same autocast region (a backward
    // inside it), would take that copy and leave the weight without a
    // gradient (at::linear casts the weight itself, a leaf, which is cached).
    const bool cache = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(false);
    try {
      output = recompute->fn(input);
    } catch (...) {
      at::autocast::set_autocast_cache_enabled(cache);
      throw;
    }
    at::autocast::set_autocast_cache_enabled(cache);
    ctx->saved_data["recompute"] = at::IValue::make_capsule(recompute);
    return {output};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto recompute =
        c10::static_intrusive_pointer_cast<Recompute>(ctx->saved_data["recompute"].toCapsule());
    const auto saved = ctx->get_saved_variables();
    const at::Tensor input = saved[0].detach().requires_grad_(saved[0].requires_grad());
    at::Tensor output;
    {
      // The first run's generator state, then back to where it is now.
      at::Generator& gen = recompute->generator;
      at::Tensor now;
      {
        std::lock_guard<std::mutex> lock(gen.mutex());
        now = gen.get_state();
        gen.set_state(recompute->rng_state);
      }
      const bool was = autocast_is_enabled(recompute->device);
      const at::ScalarType was_dtype = autocast_dtype(recompute->device);
      autocast_set(recompute->device, recompute->autocast, recompute->autocast_dtype);
      // As torch.autocast: a region of its own, whose cast cache is dropped
      // at its end (a cast weight must not outlive this step's values).
      at::autocast::increment_nesting();
      const auto leave = [] {
        if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
      };
      try {
        torch::autograd::AutoGradMode grad(true);
        output = recompute->fn(input);
      } catch (...) {
        leave();
        autocast_set(recompute->device, was, was_dtype);
        std::lock_guard<std::mutex> lock(gen.mutex());
        gen.set_state(now);
        throw;
      }
      leave();
      autocast_set(recompute->device, was, was_dtype);
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(now);
    }
    std::vector<at::Tensor> wrt;
    std::vector<size_t> where;  // index into saved of each entry of wrt
    if (input.requires_grad()) wrt.push_back(input), where.push_back(0);
    for (size_t i = 1; i < saved.size(); ++i) {
      if (saved[i].requires_grad()) wrt.push_back(saved[i]), where.push_back(i);
    }
    torch::autograd::variable_list grads(saved.size() + 1);  // [recompute, tensors...]
    if (wrt.empty() || !output.requires_grad()) return grads;
    const auto computed = torch::autograd::grad({output}, wrt, {grad_outputs[0]},
                                                /*retain_graph=*/false, /*create_graph=*/false,
                                                /*allow_unused=*/true);
    for (size_t k = 0; k < where.size(); ++k) grads[where[k] + 1] = computed[k];
    return grads;
  }
};

}  // namespace

at::Tensor recompute(torch::nn::Module& module,
                     const std::function<at::Tensor(const at::Tensor&)>& fn,
                     const at::Tensor& input) {
  if (!at::GradMode::is_enabled()) return fn(input);
  auto recompute = c10::make_intrusive<Recompute>();
  recompute->fn = fn;
  recompute->device = input.device().type();
  recompute->generator = input.is_cuda() ? at::globalContext().defaultGenerator(input.device())
                                         : at::detail::getDefaultCPUGenerator();
  recompute->autocast = autocast_is_enabled(recompute->device);
  recompute->autocast_dtype = autocast_dtype(recompute->device);
  std::vector<at::Tensor> tensors{input};
  for (const auto& p : module.parameters()) tensors.push_back(p);
  return CheckpointFunction::apply(recompute, at::TensorList(tensors))[0];
}

}  // namespace lockstep
