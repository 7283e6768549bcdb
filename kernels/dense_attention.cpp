#include <ATen/ATen.h>

#include <limits>

#include "kernels/attention.h"

namespace harness::kernels {

// The unfused path, kept deliberately naive: every step materializes a [B, H, Q, KV] fp32 tensor
// (scores, masked scores, probabilities) and autograd saves them for the backward, which adds
// dP and dS of the same size. At the real dims (32 heads, Q=2048, KV=10240) one such tensor is
// 2.7 GB; this is the memory the experiments expose, so nothing here may be fused away.
at::Tensor dense_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& dense_mask, double scale) {
  const int64_t group = q.size(1) / k.size(1);
  const at::Tensor k_expanded = group == 1 ? k : k.repeat_interleave(group, 1);
  const at::Tensor v_expanded = group == 1 ? v : v.repeat_interleave(group, 1);

  at::Tensor scores = at::matmul(q.to(at::kFloat), k_expanded.to(at::kFloat).transpose(-2, -1)) * scale;
  // A row that sees nothing would be softmax over all -inf = NaN (and NaN gradients). Such rows
  // instead see everything (finite softmax) and their probabilities are multiplied by 0 below.
  const at::Tensor row_has_visible = dense_mask.any(-1, /*keepdim=*/true);
  const bool has_empty_rows = !row_has_visible.all().item<bool>();
  const at::Tensor effective_mask = has_empty_rows ? dense_mask.logical_or(row_has_visible.logical_not()) : dense_mask;
  scores = scores.masked_fill(effective_mask.logical_not(), -std::numeric_limits<float>::infinity());
  at::Tensor probabilities = at::softmax(scores, -1);
  if (has_empty_rows) probabilities = probabilities * row_has_visible.to(at::kFloat);
  return at::matmul(probabilities, v_expanded.to(at::kFloat)).to(q.scalar_type());
}

}  // namespace harness::kernels
