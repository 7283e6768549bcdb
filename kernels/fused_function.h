#pragma once
// One autograd node for a fused attention whose forward and backward are plain functions of
// (q, k, v) and a state kept with the node (the CPU kernel's tiles, a sliced mask's calls):
//   Forward(q, k, v, state) -> FusedForward
//   Backward(q, k, v, out, lse, grad_out, state) -> FusedGradients
// The forward saves q, k, v, out and lse; the state travels as a capsule (saved_data holds IValues
// only, and a capsule needs no registered class).

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <type_traits>

#include "kernels/attention.h"

namespace harness::kernels {

//! Forward and Backward take the state as `const State*`, or as `State*` where the call updates it
//! (the CUDA kernels' autotune picks and dispatch trace).
template <typename State, auto Forward, auto Backward>
class FusedFunction : public torch::autograd::Function<FusedFunction<State, Forward, Backward>> {
  static_assert(std::is_invocable_r_v<FusedForward, decltype(Forward), const at::Tensor&, const at::Tensor&,
                                      const at::Tensor&, State*>,
                "Forward(q, k, v, state) -> FusedForward");
  static_assert(std::is_invocable_r_v<FusedGradients, decltype(Backward), const at::Tensor&, const at::Tensor&,
                                      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, State*>,
                "Backward(q, k, v, out, lse, grad_out, state) -> FusedGradients");

 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const c10::intrusive_ptr<State>& state) {
    FusedForward result = Forward(q, k, v, state.get());
    ctx->save_for_backward({q, k, v, result.out, result.lse});
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return result.out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto state = c10::static_intrusive_pointer_cast<State>(ctx->saved_data["state"].toCapsule());
    TORCH_CHECK(grad_outputs.size() == 1, "fused attention backward: expected one gradient, got ", grad_outputs.size());
    FusedGradients grads = Backward(saved[0], saved[1], saved[2], saved[3], saved[4], grad_outputs[0], state.get());
    return {grads.grad_q, grads.grad_k, grads.grad_v, at::Tensor()};
  }
};

}  // namespace harness::kernels
