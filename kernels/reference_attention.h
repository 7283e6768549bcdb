#pragma once
// The two references a fused attention result is judged by (experiments/tolerance.h has the rule):
//   exact:  every product, the softmax and every sum in float64; nothing rounded. The truth.
//   flash:  rounded the way a flash kernel in the step's dtype rounds: q, k, v, dO as given
//           (bf16/fp16), the matmul inputs P (unnormalized, forward), P (backward) and dS rounded
//           to that dtype, fp32 accumulation, fp32 softmax, out, dq, dk and dv rounded at the end.
//           Its error against `exact` is what a correct flash kernel cannot avoid; FlashAttention's
//           own tests judge their kernels by it (err <= 2 · err(low-precision reference) + atol).
// Both compute forward and backward explicitly (no autograd), a chunk of query rows at a time, so
// the extra memory is O(rows · KV) per chunk whatever the sequence lengths.
//
// Shapes: q [B, H, Q, D], k [B, H_KV, KV, D], v [B, H_KV, KV, Dv], grad_out [B, H, Q, Dv], H a
// multiple of H_KV; dense_mask [Q, KV] bool (or [B|1, H|1, Q, KV]), true = visible. A row that sees
// no key has out 0, lse -inf and no gradient.

#include <ATen/ATen.h>

namespace harness::kernels {

//! How a reference rounds.
enum class ReferenceRounding {
  exact,  //!< float64 throughout; results in float64
  flash,  //!< a flash kernel's rounding in the inputs' dtype; results in that dtype (lse fp32)
};

//! The forward and backward of one attention call.
struct ReferenceResult {
  at::Tensor out;  //!< [B, H, Q, Dv]
  at::Tensor lse;  //!< [B, H, Q], natural log of the row's sum of exp(scaled scores); -inf when empty
  at::Tensor dq, dk, dv;
};

//! Computes the reference on the inputs' device. `scale` multiplies q·k.
ReferenceResult reference_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& grad_out, const at::Tensor& dense_mask, double scale,
                                    ReferenceRounding rounding);

}  // namespace harness::kernels
