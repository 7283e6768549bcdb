// CPU attention at FlashAttention-3's head dims (64, 96, 128, 192, 256; 192 for q and k with 128
// for v, as DeepSeek's MLA), in fp32, bf16 and fp16, and on masks no named kind expresses (the
// blockmask kind: prefix-LM, a speculative-decoding tree of 4 branches, a dilated sliding window,
// masks that differ per batch element or per head).
//
// The rule (FlashAttention's): against an fp64 reference, a tensor's error may be at most twice
// the error of a low-precision reference plus atol. The low-precision reference is the dense path
// on the same low-precision inputs with fp32 accumulation (kernels/dense_attention.cpp), rounded to
// the dtype where its results are. Checked for out, lse, dq, dk and dv; a flipped mask bit is
// planted to show the rule catches a wrong mask.

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "tests/catch.h"
#include "tests/mask_cases.h"

using namespace harness::kernels;

namespace {

struct Outputs {
  at::Tensor out, lse, dq, dk, dv;
};

// The fp64 reference: materialized scores, GQA by repeating k and v, autograd in fp64. Rows that
// see nothing give 0 (and lse -inf). `dense` is [Q, KV] or [B or 1, H or 1, Q, KV].
Outputs reference_fp64(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& grad_out,
                       const at::Tensor& dense, double scale) {
  const at::Tensor q64 = q.detach().to(at::kDouble).requires_grad_(true);
  const at::Tensor k64 = k.detach().to(at::kDouble).requires_grad_(true);
  const at::Tensor v64 = v.detach().to(at::kDouble).requires_grad_(true);
  const int64_t group = q.size(1) / k.size(1);
  const at::Tensor scores = at::matmul(q64, k64.repeat_interleave(group, 1).transpose(-2, -1)) * scale;
  const at::Tensor masked = scores.masked_fill(dense.logical_not(), -std::numeric_limits<double>::infinity());
  const at::Tensor lse = at::logsumexp(masked, -1);
  const at::Tensor seen = lse.isfinite().unsqueeze(-1);
  const at::Tensor p = at::exp(masked - lse.masked_fill(lse.isinf(), 0).unsqueeze(-1)).masked_fill(seen.logical_not(), 0);
  const at::Tensor out = at::matmul(p, v64.repeat_interleave(group, 1));
  out.backward(grad_out.to(at::kDouble));
  return {out.detach(), lse.detach(), q64.grad(), k64.grad(), v64.grad()};
}

// The low-precision reference: the dense path on the low-precision inputs (fp32 inside), its
// outputs in the dtype; lse in fp32 from the same inputs.
Outputs reference_lowp(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& grad_out,
                       const at::Tensor& dense, double scale) {
  const at::Tensor ql = q.detach().requires_grad_(true), kl = k.detach().requires_grad_(true), vl = v.detach().requires_grad_(true);
  const at::Tensor out = dense_attention(ql, kl, vl, dense, scale);
  out.backward(grad_out);
  const int64_t group = q.size(1) / k.size(1);
  const at::Tensor scores = at::matmul(q.to(at::kFloat), k.to(at::kFloat).repeat_interleave(group, 1).transpose(-2, -1)) * scale;
  const at::Tensor lse = at::logsumexp(scores.masked_fill(dense.logical_not(), -std::numeric_limits<float>::infinity()), -1);
  return {out.detach(), lse, ql.grad(), kl.grad(), vl.grad()};
}

// dq of a flash-style backward in fp64, with delta = rowsum(dO * O) from `stored_out` (the output as
// the forward stored it, in its dtype): P and dP exact, dS = P (dP - delta), dq = scale dS k.
at::Tensor flash_dq(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& grad_out,
                    const at::Tensor& dense, double scale, const at::Tensor& stored_out) {
  const int64_t group = q.size(1) / k.size(1);
  const at::Tensor k64 = k.to(at::kDouble).repeat_interleave(group, 1), v64 = v.to(at::kDouble).repeat_interleave(group, 1);
  const at::Tensor grad64 = grad_out.to(at::kDouble);
  const at::Tensor scores = at::matmul(q.to(at::kDouble), k64.transpose(-2, -1)) * scale;
  const at::Tensor p =
      at::softmax(scores.masked_fill(dense.logical_not(), -std::numeric_limits<double>::infinity()), -1).nan_to_num(0.0);
  const at::Tensor delta = (grad64 * stored_out.to(at::kDouble)).sum(-1, true);
  const at::Tensor grad_scores = p * (at::matmul(grad64, v64.transpose(-2, -1)) - delta);
  return at::matmul(grad_scores, k64) * scale;
}

// The fused kernel's forward (out, lse) and backward (dq, dk, dv) as the torch op runs them.
Outputs fused(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& grad_out, MaskContext& mask,
              double scale, DispatchTrace* trace = nullptr) {
  AttentionOptions options;
  options.scale = scale;
  options.cpu_tiles = {32, 48};
  options.trace = trace;
  const FusedForward forward = fused_attention_forward(q, k, v, mask, options);
  const FusedGradients grads = fused_attention_backward(grad_out, q, k, v, forward.out, forward.lse, mask, options);
  return {forward.out, forward.lse, grads.grad_q, grads.grad_k, grads.grad_v};
}

// max |a - b| over the elements where the reference is finite; infinity when `a` is not finite
// there, or is finite where the reference is not (lse of a row that sees nothing is -inf in both).
double error_against(const at::Tensor& a, const at::Tensor& ref) {
  const at::Tensor a64 = a.to(at::kDouble), finite = ref.isfinite();
  if (!a64.isfinite().eq(finite).all().item<bool>()) return std::numeric_limits<double>::infinity();
  if (!finite.any().item<bool>()) return 0.0;
  return (a64 - ref).abs().masked_select(finite).max().item<double>();
}

struct Judged {
  bool pass = true;
  std::string report;
};

// The rule for the five tensors: err(got) <= 2 err(lowp) + atol, atol 1e-5 of the reference's
// largest finite magnitude (at least 1e-5).
Judged judge(const Outputs& got, const Outputs& lowp, const Outputs& ref) {
  Judged judged;
  const std::pair<const char*, at::Tensor Outputs::*> fields[] = {
      {"out", &Outputs::out}, {"lse", &Outputs::lse}, {"dq", &Outputs::dq}, {"dk", &Outputs::dk}, {"dv", &Outputs::dv}};
  for (const auto& [name, member] : fields) {
    const at::Tensor& reference = ref.*member;
    const at::Tensor finite = reference.isfinite();
    const double magnitude = finite.any().item<bool>() ? reference.abs().masked_select(finite).max().item<double>() : 0.0;
    const double atol = 1e-5 * std::max(1.0, magnitude);
    const double err = error_against(got.*member, reference), err_lowp = error_against(lowp.*member, reference);
    const bool pass = err <= 2.0 * err_lowp + atol;
    judged.pass = judged.pass && pass;
    judged.report += std::string(name) + ": err " + std::to_string(err) + ", lowp " + std::to_string(err_lowp) + ", atol " +
                     std::to_string(atol) + (pass ? "" : "  <- FAILS") + "\n";
  }
  return judged;
}

struct Inputs {
  at::Tensor q, k, v, grad_out;
};

Inputs draw(int64_t batch, int64_t heads, int64_t kv_heads, int64_t q_len, int64_t kv_len, int64_t head_dim,
            int64_t v_head_dim, at::ScalarType dtype, uint64_t seed, double q_k_scale = 1.0) {
  at::manual_seed(seed);
  return {(at::randn({batch, heads, q_len, head_dim}) * q_k_scale).to(dtype),
          (at::randn({batch, kv_heads, kv_len, head_dim}) * q_k_scale).to(dtype),
          at::randn({batch, kv_heads, kv_len, v_head_dim}).to(dtype), at::randn({batch, heads, q_len, v_head_dim}).to(dtype)};
}

Judged run_case(const Inputs& in, MaskContext& mask, double scale, DispatchTrace* trace = nullptr) {
  const at::Tensor& dense = mask.dense(at::kCPU);
  const Outputs ref = reference_fp64(in.q, in.k, in.v, in.grad_out, dense, scale);
  const Outputs lowp = reference_lowp(in.q, in.k, in.v, in.grad_out, dense, scale);
  return judge(fused(in.q, in.k, in.v, in.grad_out, mask, scale, trace), lowp, ref);
}

const char* dtype_name(at::ScalarType dtype) {
  return dtype == at::kFloat ? "fp32" : dtype == at::kBFloat16 ? "bf16" : "fp16";
}

}  // namespace

TEST_CASE("fused CPU attention at every head dim and dtype meets the rule against fp64 (out, lse, dq, dk, dv)",
          "[attention][dims]") {
  // Q 48 (3 draft blocks), KV 248; 4 query heads on 2 kv heads; tiles 32 x 48 (ragged at both ends).
  MaskDesc desc;
  desc.kind = MaskKind::dflash;
  desc.documents = 2;
  desc.seed = 3;
  AttentionGeometry geometry;
  geometry.anchors = 3;
  geometry.context = 200;
  const std::vector<std::pair<std::string, ResolvedMask>> masks = {
      {"dflash", resolve_mask(desc, geometry)},
      {"tree (blockmask)", harness::test::tree_mask(geometry.q_len(), geometry.kv_len())}};
  const std::pair<int64_t, int64_t> dims[] = {{64, 64}, {96, 96}, {128, 128}, {192, 192}, {256, 256}, {192, 128}};
  uint64_t seed = 100;
  for (const auto& [head_dim, v_head_dim] : dims) {
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      const auto& [mask_name, resolved] = masks[seed % 2];
      MaskContext mask(resolved);
      const Inputs in = draw(1, 4, 2, geometry.q_len(), geometry.kv_len(), head_dim, v_head_dim, dtype, seed++);
      const Judged judged = run_case(in, mask, 1.0 / std::sqrt(static_cast<double>(head_dim)));
      INFO(mask_name << ", head_dim " << head_dim << " v_head_dim " << v_head_dim << ", " << dtype_name(dtype) << "\n"
                     << judged.report);
      CHECK(judged.pass);
    }
  }
}

TEST_CASE("fp16 inputs whose logits overflow fp16 give finite results that meet the rule", "[attention][dims]") {
  // Every element of q and k about 30 (plus noise 0.1): q.k reaches ~115000, past fp16's 65504, so
  // a kernel that formed scores in fp16 would give Inf and NaN; scaled, the logits are ~1e4 and
  // differ by ~16 along a row, so the softmax is spread over several keys (not one-hot, where the
  // dense reference's backward is trivially exact).
  const ResolvedMask resolved = harness::test::prefix_lm_mask(64, 192, 50);
  MaskContext mask(resolved);
  Inputs in = draw(1, 2, 1, 64, 192, 128, 128, at::kHalf, 7, /*q_k_scale=*/0.1);
  in.q = (in.q.to(at::kFloat) + 30.0).to(at::kHalf);
  in.k = (in.k.to(at::kFloat) + 30.0).to(at::kHalf);
  const double scale = 1.0 / std::sqrt(128.0);
  const at::Tensor scores_fp16 = at::matmul(in.q, in.k.transpose(-2, -1)) * scale;  // what fp16 scores would be
  REQUIRE_FALSE(scores_fp16.isfinite().all().item<bool>());
  const Outputs got = fused(in.q, in.k, in.v, in.grad_out, mask, scale);
  for (const at::Tensor* t : {&got.out, &got.lse, &got.dq, &got.dk, &got.dv}) CHECK(t->isfinite().all().item<bool>());
  const at::Tensor& dense = mask.dense(at::kCPU);
  const Outputs ref = reference_fp64(in.q, in.k, in.v, in.grad_out, dense, scale);
  Outputs lowp = reference_lowp(in.q, in.k, in.v, in.grad_out, dense, scale);
  // dq's yardstick is the flash backward's own: delta = rowsum(dO * O) from the output as stored
  // (fp16), everything else exact. Its rounding (~5e-4 of delta) no longer cancels in dq = scale *
  // dS k when the keys share a large component (30 here): about 0.02 on dq of magnitude 0.2, which
  // every flash-style backward has, while the dense path (softmax backward on its own P) has not.
  lowp.dq = flash_dq(in.q, in.k, in.v, in.grad_out, dense, scale, ref.out.to(at::kHalf));
  const Judged judged = judge(got, lowp, ref);
  INFO(judged.report);
  CHECK(judged.pass);
}

TEST_CASE("fused CPU attention on masks no named kind expresses meets the rule", "[attention][dims]") {
  using namespace harness::test;
  const std::vector<std::pair<std::string, ResolvedMask>> masks = {
      {"prefix-LM", prefix_lm_mask(70, 300, 120)},
      {"tree of 4 branches", tree_mask(53, 253)},
      {"dilated sliding window", dilated_window_mask(90, 190, 20, 3)},
  };
  uint64_t seed = 200;
  for (const auto& [name, resolved] : masks) {
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      MaskContext mask(resolved);
      const Inputs in = draw(2, 4, 2, resolved.q_len, resolved.kv_len, 64, 64, dtype, seed++);
      const Judged judged = run_case(in, mask, 0.125);
      INFO(name << ", " << dtype_name(dtype) << "\n" << judged.report);
      CHECK(judged.pass);
    }
  }
}

TEST_CASE("a blockmask that differs per batch element or per head runs one call per slice and meets the rule",
          "[attention][dims]") {
  const int64_t q_len = 40, kv_len = 130;
  const auto visible = [](int64_t slice, int64_t q, int64_t kv) { return kv <= q + 90 && (kv + 2 * q + slice) % (slice + 2) != 0; };
  for (const bool per_batch : {true, false}) {
    INFO((per_batch ? "per batch element" : "per query head (4 heads on 2 kv heads)"));
    const ResolvedMask resolved = harness::test::bits_of(q_len, kv_len, visible, per_batch ? 2 : 4, per_batch);
    REQUIRE(resolved.sliced());
    MaskContext mask(resolved);
    DispatchTrace trace;
    const Inputs in = draw(2, 4, 2, q_len, kv_len, 64, 64, at::kBFloat16, per_batch ? 11 : 12);
    const Judged judged = run_case(in, mask, 0.125, &trace);
    INFO(judged.report);
    CHECK(judged.pass);
    const auto records = trace.records();
    REQUIRE(records.size() >= 2);
    CHECK(records.front().impl == "sliced");
    // The slices really differ: the first slice's mask alone gives another result.
    MaskContext first_only(resolved.slice(0, 0));
    const at::Tensor& dense = mask.dense(at::kCPU);
    CHECK(dense.dim() == 4);
    const Outputs ref = reference_fp64(in.q, in.k, in.v, in.grad_out, dense, 0.125);
    const Outputs lowp = reference_lowp(in.q, in.k, in.v, in.grad_out, dense, 0.125);
    CHECK_FALSE(judge(fused(in.q, in.k, in.v, in.grad_out, first_only, 0.125), lowp, ref).pass);
  }
}

TEST_CASE("planted: one flipped bit of a blockmask is caught by the rule", "[attention][dims]") {
  // A dilated window row sees 20 keys; hiding one of them moves its output by ~1/20 of v's scale.
  const ResolvedMask right = harness::test::dilated_window_mask(90, 190, 20, 3);
  std::vector<uint32_t> bits(right.bits->begin(), right.bits->end());
  const int64_t row = 50, key = 50 + 100 - 9;  // q_abs = 150: keys 150, 147, 144, 141 ... are visible
  REQUIRE(right.visible(row, key));
  bits[static_cast<size_t>(row * right.bit_words + key / 32)] ^= uint32_t{1} << (key % 32);
  const ResolvedMask flipped = blockmask_mask(right.q_len, right.kv_len, std::move(bits));
  REQUIRE_FALSE(flipped.visible(row, key));

  MaskContext right_mask(right), flipped_mask(flipped);
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    INFO(dtype_name(dtype));
    const Inputs in = draw(1, 2, 1, right.q_len, right.kv_len, 64, 64, dtype, 31);
    const at::Tensor& dense = right_mask.dense(at::kCPU);
    const Outputs ref = reference_fp64(in.q, in.k, in.v, in.grad_out, dense, 0.125);
    const Outputs lowp = reference_lowp(in.q, in.k, in.v, in.grad_out, dense, 0.125);
    CHECK(judge(fused(in.q, in.k, in.v, in.grad_out, right_mask, 0.125), lowp, ref).pass);
    const Judged wrong = judge(fused(in.q, in.k, in.v, in.grad_out, flipped_mask, 0.125), lowp, ref);
    INFO(wrong.report);
    CHECK_FALSE(wrong.pass);
  }
}

TEST_CASE("blockmask bits: visible() reads them, bits past KV_LEN are cleared, sizes are checked", "[attention][dims]") {
  const ResolvedMask tree = harness::test::tree_mask(21, 70);
  CHECK(tree.kind == MaskKind::blockmask);
  CHECK(tree.bit_words == 3);
  const at::Tensor dense = dense_mask(tree);
  for (int64_t q = 0; q < tree.q_len; ++q)
    for (int64_t kv = 0; kv < tree.kv_len; ++kv) REQUIRE(dense[q][kv].item<bool>() == tree.visible(q, kv));
  // Every bit set, including those past KV_LEN 70 in each row's last word: those are cleared.
  const ResolvedMask all = blockmask_mask(2, 70, std::vector<uint32_t>(6, 0xffffffffu));
  CHECK(count_visible_pairs(all) == 140);
  CHECK((*all.bits)[2] == (uint32_t{1} << 6) - 1);
  CHECK_THROWS_AS(blockmask_mask(2, 70, std::vector<uint32_t>(5, 0)), std::invalid_argument);
  CHECK_THROWS_AS(blockmask_mask(2, 70, std::vector<uint32_t>(6, 0), 2), std::invalid_argument);
  MaskDesc desc;
  desc.kind = MaskKind::blockmask;
  CHECK_THROWS_AS(resolve_mask(desc, AttentionGeometry{}), std::invalid_argument);
  CHECK(parse_mask_kind("blockmask") == MaskKind::blockmask);
  CHECK(mask_kind_name(MaskKind::blockmask) == "blockmask");
}
