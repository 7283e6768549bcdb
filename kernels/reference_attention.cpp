#include "kernels/reference_attention.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>

namespace harness::kernels {
namespace {

// Query rows per chunk: a chunk holds a few [rows, KV] tensors in the compute dtype, so the rows
// are chosen for about 2^24 elements per tensor (128 MiB in float64).
constexpr int64_t kChunkElements = int64_t{1} << 24;

//! The mask rows of batch b, head h: [Q, KV].
at::Tensor mask_of(const at::Tensor& mask, int64_t b, int64_t h) {
  if (mask.dim() == 2) return mask;
  TORCH_CHECK(mask.dim() == 4, "reference_attention: dense_mask must be [Q, KV] or [B, H, Q, KV], got ",
              mask.sizes());
  return mask[mask.size(0) == 1 ? 0 : b][mask.size(1) == 1 ? 0 : h];
}

}  // namespace

ReferenceResult reference_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& grad_out, const at::Tensor& dense_mask, double scale,
                                    ReferenceRounding rounding) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && grad_out.dim() == 4,
              "reference_attention: q, k, v and grad_out must be 4-d");
  const int64_t batch = q.size(0), heads = q.size(1), q_len = q.size(2);
  const int64_t kv_heads = k.size(1), kv_len = k.size(2);
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, "reference_attention: heads ", heads,
              " is not a multiple of kv heads ", kv_heads);
  TORCH_CHECK(v.size(2) == kv_len && grad_out.size(3) == v.size(3) && q.size(3) == k.size(3),
              "reference_attention: inconsistent shapes q ", q.sizes(), " k ", k.sizes(), " v ", v.sizes(),
              " grad_out ", grad_out.sizes());
  const int64_t group = heads / kv_heads;
  const bool flash = rounding == ReferenceRounding::flash;
  const at::ScalarType dtype = q.scalar_type();
  const at::ScalarType compute = flash ? at::kFloat : at::kDouble;
  // Rounds an fp32 operand to the step's dtype (what a flash kernel feeds its next matmul).
  const auto rounded = [&](const at::Tensor& x) { return flash ? x.to(dtype).to(compute) : x; };

  const at::Tensor qc = q.detach().to(compute), kc = k.detach().to(compute), vc = v.detach().to(compute);
  const at::Tensor doc = grad_out.detach().to(compute);
  at::Tensor out = at::zeros(grad_out.sizes(), doc.options());
  at::Tensor lse = at::empty({batch, heads, q_len}, doc.options());
  at::Tensor dq = at::zeros(q.sizes(), qc.options());
  at::Tensor dk = at::zeros(k.sizes(), kc.options());
  at::Tensor dv = at::zeros(v.sizes(), vc.options());
  const int64_t rows_per_chunk = std::max<int64_t>(1, kChunkElements / std::max<int64_t>(kv_len, 1));
  const double neg_inf = -std::numeric_limits<double>::infinity();

  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t kvh = h / group;
      const at::Tensor key = kc[b][kvh], value = vc[b][kvh];  // [KV, D], [KV, Dv]
      const at::Tensor mask_rows = mask_of(dense_mask, b, h);
      for (int64_t r0 = 0; r0 < q_len; r0 += rows_per_chunk) {
        const int64_t r1 = std::min(q_len, r0 + rows_per_chunk);
        const at::Tensor query = qc[b][h].slice(0, r0, r1);
        const at::Tensor grad = doc[b][h].slice(0, r0, r1);
        const at::Tensor visible = mask_rows.slice(0, r0, r1).to(qc.device());
        // Forward: S, the row max over visible keys, unnormalized P, its row sum.
        const at::Tensor scores = at::matmul(query, key.transpose(0, 1)).mul_(scale).masked_fill_(visible.logical_not(), neg_inf);
        const at::Tensor row_max = std::get<0>(scores.max(1, /*keepdim=*/true));
        const at::Tensor seen = row_max.isfinite();  // rows that see at least one key
        const at::Tensor shift = at::where(seen, row_max, at::zeros_like(row_max));
        const at::Tensor unnormalized = (scores - shift).exp_();  // masked keys: exp(-inf) = 0
        const at::Tensor row_sum = unnormalized.sum(1, /*keepdim=*/true);
        const at::Tensor safe_sum = at::where(seen, row_sum, at::ones_like(row_sum));
        const at::Tensor o_rows = at::matmul(rounded(unnormalized), value).div_(safe_sum);
        const at::Tensor o_kept = rounded(o_rows);  // the output as stored
        out[b][h].slice(0, r0, r1).copy_(o_kept);
        lse[b][h].slice(0, r0, r1).copy_(at::where(seen, shift + row_sum.log(), at::full_like(row_sum, neg_inf)).squeeze(1));
        // Backward: P from the LSE, delta = rowsum(dO · O) with O as stored, dS = P (dP - delta).
        const at::Tensor probabilities = unnormalized / safe_sum;
        dv[b][kvh].add_(at::matmul(rounded(probabilities).transpose(0, 1), grad));
        const at::Tensor grad_p = at::matmul(grad, value.transpose(0, 1));
        const at::Tensor delta = (grad * o_kept).sum(1, /*keepdim=*/true);
        const at::Tensor grad_s = rounded(probabilities * (grad_p - delta));
        dq[b][h].slice(0, r0, r1).copy_(at::matmul(grad_s, key).mul_(scale));
        dk[b][kvh].add_(at::matmul(grad_s.transpose(0, 1), query).mul_(scale));
      }
    }
  }
  if (!flash) return {out, lse, dq, dk, dv};
  return {out.to(dtype), lse, dq.to(dtype), dk.to(dtype), dv.to(dtype)};
}

}  // namespace harness::kernels
