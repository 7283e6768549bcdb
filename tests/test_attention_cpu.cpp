// CPU attention: fused vs dense, outputs and the three gradients, on the real mask kinds and
// awkward sizes; rows that see nothing; dispatch records; the fused backward's memory.
// Tolerance (docs/STYLE.md): against an fp32 reference, err(fused_bf16) <= 2 * err(dense_bf16) + 1e-5.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "trials/memory.h"
#include "kernels/attention.h"
#include "kernels/cpu_exp.h"
#include "tests/catch.h"
#include "tests/mask_cases.h"

using namespace harness::kernels;

namespace {

struct Result {
  at::Tensor out, grad_q, grad_k, grad_v;
};

// One fwd + bwd through attention() on fresh leaves of the given values.
Result run(AttentionImpl impl, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& grad_out,
           MaskContext& mask, CpuTileConfig tiles = {}, DispatchTrace* trace = nullptr) {
  const at::Tensor q_leaf = q.detach().clone().requires_grad_(true);
  const at::Tensor k_leaf = k.detach().clone().requires_grad_(true);
  const at::Tensor v_leaf = v.detach().clone().requires_grad_(true);
  AttentionOptions options;
  options.impl = impl;
  options.cpu_tiles = tiles;
  options.trace = trace;
  const at::Tensor out = attention(q_leaf, k_leaf, v_leaf, mask, options);
  out.backward(grad_out);
  return {out.detach(), q_leaf.grad(), k_leaf.grad(), v_leaf.grad()};
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// DFlash over two documents, 4 heads on 2 kv heads, 5 anchors, context 150 (Q 80, KV 230): the
// strided-inputs case and the across-processes fingerprint.
ResolvedMask strided_case_mask() { return harness::test::mask_of(MaskKind::dflash, 4, 2, 5, 150, 2); }

bool all_finite(const Result& r) {
  for (const at::Tensor* t : {&r.out, &r.grad_q, &r.grad_k, &r.grad_v}) {
    if (!at::isfinite(*t).all().item<bool>()) return false;
  }
  return true;
}

struct Shape {
  int64_t batch, heads, kv_heads, head_dim, anchors;
  CpuTileConfig tiles;
};

std::vector<std::pair<std::string, MaskDesc>> mask_descs(int64_t kv_len, int64_t q_len) {
  std::vector<std::pair<std::string, MaskDesc>> descs;
  MaskDesc dflash;
  dflash.kind = MaskKind::dflash;
  dflash.doc_lengths = {100, 650, 250};
  dflash.seed = 5;
  descs.emplace_back("dflash before_anchor bidirectional", dflash);
  dflash.context_rule = ContextRule::through_anchor;
  dflash.in_block = InBlock::causal;
  descs.emplace_back("dflash through_anchor causal", dflash);
  MaskDesc other;
  other.kind = MaskKind::causal;
  descs.emplace_back("causal", other);
  other.kind = MaskKind::document_causal;
  other.doc_lengths = {100, 650, kv_len - 750};
  descs.emplace_back("document_causal", other);
  other.doc_lengths.clear();
  other.kind = MaskKind::sliding_window;
  other.window = q_len + 37;
  descs.emplace_back("sliding_window", other);
  other.kind = MaskKind::full;
  descs.emplace_back("full", other);
  return descs;
}

void compare_fused_with_dense(const Shape& shape, const std::string& name, const MaskDesc& desc) {
  AttentionGeometry geometry;
  geometry.batch = shape.batch;
  geometry.heads = shape.heads;
  geometry.kv_heads = shape.kv_heads;
  geometry.head_dim = shape.head_dim;
  geometry.anchors = shape.anchors;
  geometry.block_size = 16;
  geometry.context = 1000;
  MaskContext mask(resolve_mask(desc, geometry));
  INFO(name << ": B " << shape.batch << " H " << shape.heads << " H_KV " << shape.kv_heads << " D " << shape.head_dim << " Q "
            << geometry.q_len() << " KV " << geometry.kv_len() << " tiles " << shape.tiles.block_m << "x" << shape.tiles.block_n);

  at::manual_seed(shape.heads * 1000 + shape.head_dim + shape.anchors);
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16);
  const at::Tensor q = at::randn({shape.batch, shape.heads, geometry.q_len(), shape.head_dim}, bf16);
  const at::Tensor k = at::randn({shape.batch, shape.kv_heads, geometry.kv_len(), shape.head_dim}, bf16);
  const at::Tensor v = at::randn({shape.batch, shape.kv_heads, geometry.kv_len(), shape.head_dim}, bf16);
  const at::Tensor grad_out = at::randn({shape.batch, shape.heads, geometry.q_len(), shape.head_dim}, bf16);

  // The reference: dense on the same values in fp32.
  const Result reference = run(AttentionImpl::dense, q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat),
                               grad_out.to(at::kFloat), mask);
  const Result dense_bf16 = run(AttentionImpl::dense, q, k, v, grad_out, mask);
  const Result fused_bf16 = run(AttentionImpl::fused, q, k, v, grad_out, mask, shape.tiles);
  const Result fused_fp32 = run(AttentionImpl::fused, q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat),
                                grad_out.to(at::kFloat), mask, shape.tiles);
  REQUIRE(all_finite(fused_bf16));
  REQUIRE(all_finite(fused_fp32));
  REQUIRE(fused_bf16.out.scalar_type() == at::kBFloat16);
  REQUIRE(fused_bf16.grad_k.scalar_type() == at::kBFloat16);

  const std::pair<const char*, at::Tensor Result::*> fields[] = {
      {"out", &Result::out}, {"dq", &Result::grad_q}, {"dk", &Result::grad_k}, {"dv", &Result::grad_v}};
  for (const auto& [field, member] : fields) {
    const double err_fused = max_abs_diff(fused_bf16.*member, reference.*member);
    const double err_dense = max_abs_diff(dense_bf16.*member, reference.*member);
    const double err_fp32 = max_abs_diff(fused_fp32.*member, reference.*member);
    const double magnitude = (reference.*member).abs().max().item<double>();
    INFO(field << ": err fused bf16 " << err_fused << ", dense bf16 " << err_dense << ", fused fp32 " << err_fp32
               << ", max |ref| " << magnitude);
    CHECK(err_fused <= 2 * err_dense + 1e-5);
    CHECK(err_fp32 <= 1e-4 * magnitude + 1e-6);
  }
}

// One intra-op thread for one scope.
class SingleThreadScope {
 public:
  SingleThreadScope() : threads_(at::get_num_threads()) { at::set_num_threads(1); }
  ~SingleThreadScope() { at::set_num_threads(threads_); }
  SingleThreadScope(const SingleThreadScope&) = delete;
  SingleThreadScope& operator=(const SingleThreadScope&) = delete;

 private:
  int threads_;
};

}  // namespace

TEST_CASE("fused CPU attention matches dense: outputs and dq, dk, dv", "[attention]") {
  const Shape shapes[] = {
      {2, 8, 2, 64, 3, {16, 64}},    // GQA 4:1, Q 48: one q block per 64, ragged kv blocks
      {2, 4, 1, 128, 13, {64, 64}},  // kv_heads 1, head_dim 128, Q 208 (not a multiple of 64)
      {1, 2, 2, 64, 13, {32, 48}},   // no GQA, odd tile sizes
  };
  for (const Shape& shape : shapes) {
    const int64_t q_len = shape.anchors * 16;
    for (const auto& [name, desc] : mask_descs(1000 + q_len, q_len)) compare_fused_with_dense(shape, name, desc);
  }
}

TEST_CASE("rows that see nothing give zeros and finite gradients", "[attention]") {
  // Hand-built masks no description produces: causal with Q > KV leaves the first Q - KV rows
  // empty; a sliding window of 0 leaves every row empty.
  ResolvedMask causal;
  causal.kind = MaskKind::causal;
  causal.q_len = 100;
  causal.kv_len = 60;
  ResolvedMask nothing = causal;
  nothing.kind = MaskKind::sliding_window;
  nothing.window = 0;

  at::manual_seed(3);
  const at::Tensor q = at::randn({2, 4, 100, 64});
  const at::Tensor k = at::randn({2, 2, 60, 64});
  const at::Tensor v = at::randn({2, 2, 60, 64});
  const at::Tensor grad_out = at::randn({2, 4, 100, 64});

  SECTION("some rows empty") {
    MaskContext mask(causal);
    const Result dense = run(AttentionImpl::dense, q, k, v, grad_out, mask);
    const Result fused = run(AttentionImpl::fused, q, k, v, grad_out, mask, {32, 32});
    REQUIRE(all_finite(dense));
    REQUIRE(all_finite(fused));
    CHECK(fused.out.slice(2, 0, 40).abs().max().item<float>() == 0.0f);
    CHECK(fused.grad_q.slice(2, 0, 40).abs().max().item<float>() == 0.0f);
    CHECK(fused.out.slice(2, 40).abs().max().item<float>() > 0.0f);
    CHECK(max_abs_diff(fused.out, dense.out) < 1e-5);
    CHECK(max_abs_diff(fused.grad_q, dense.grad_q) < 1e-4);
    CHECK(max_abs_diff(fused.grad_k, dense.grad_k) < 1e-4);
    CHECK(max_abs_diff(fused.grad_v, dense.grad_v) < 1e-4);
  }
  SECTION("every row empty") {
    MaskContext mask(nothing);
    REQUIRE(mask.block_mask(32, 32, at::kCPU).partial_pairs() == 0);
    REQUIRE(mask.block_mask(32, 32, at::kCPU).full_pairs() == 0);
    for (AttentionImpl impl : {AttentionImpl::dense, AttentionImpl::fused}) {
      const Result result = run(impl, q, k, v, grad_out, mask, {32, 32});
      REQUIRE(all_finite(result));
      CHECK(result.out.abs().max().item<float>() == 0.0f);
      CHECK(result.grad_q.abs().max().item<float>() == 0.0f);
      CHECK(result.grad_k.abs().max().item<float>() == 0.0f);
      CHECK(result.grad_v.abs().max().item<float>() == 0.0f);
    }
  }
}

TEST_CASE("fused CPU attention takes strided inputs and broadcast gradients", "[attention]") {
  // [B, L, H, D] tensors viewed as [B, H, L, D], and out.sum() whose gradient is an expanded
  // (stride 0) tensor: the layouts a model hands over.
  MaskContext mask(strided_case_mask());
  at::manual_seed(9);
  const at::Tensor q = at::randn({2, 80, 4, 64}).transpose(1, 2);
  const at::Tensor k = at::randn({2, 230, 2, 64}).transpose(1, 2);
  const at::Tensor v = at::randn({2, 230, 2, 64}).transpose(1, 2);
  const auto sum_backward = [&](AttentionImpl impl) {
    const at::Tensor q_leaf = q.detach().requires_grad_(true);
    const at::Tensor k_leaf = k.detach().requires_grad_(true);
    const at::Tensor v_leaf = v.detach().requires_grad_(true);
    AttentionOptions options;
    options.impl = impl;
    options.cpu_tiles = {32, 32};
    const at::Tensor out = attention(q_leaf, k_leaf, v_leaf, mask, options);
    out.sum().backward();
    return Result{out.detach(), q_leaf.grad(), k_leaf.grad(), v_leaf.grad()};
  };
  const Result dense = sum_backward(AttentionImpl::dense);
  const Result fused = sum_backward(AttentionImpl::fused);
  CHECK(max_abs_diff(fused.out, dense.out) < 1e-5);
  CHECK(max_abs_diff(fused.grad_q, dense.grad_q) < 1e-4);
  CHECK(max_abs_diff(fused.grad_k, dense.grad_k) < 1e-4);
  CHECK(max_abs_diff(fused.grad_v, dense.grad_v) < 1e-4);
  CHECK(fused.grad_k.abs().max().item<float>() > 0.0f);
}

TEST_CASE("attention records which implementation ran, forward and backward", "[attention]") {
  MaskContext mask(harness::test::mask_of(MaskKind::dflash, 4, 2, 4, 200));
  const at::Tensor q = at::randn({1, 4, 64, 64});
  const at::Tensor k = at::randn({1, 2, 264, 64});
  const at::Tensor grad_out = at::randn({1, 4, 64, 64});

  DispatchTrace trace;
  run(AttentionImpl::fused, q, k, k, grad_out, mask, {32, 64}, &trace);
  auto records = trace.records();
  REQUIRE(records.size() == 2);
  CHECK(records[0].op == "attention_fwd");
  CHECK(records[0].impl == "fused_cpu");
  CHECK(records[0].device == "cpu");
  CHECK(records[0].config == "block_m=32 block_n=64");
  CHECK(records[1].op == "attention_bwd");
  CHECK(records[1].impl == "fused_cpu");

  trace.clear();
  run(AttentionImpl::dense, q, k, k, grad_out, mask, {}, &trace);
  records = trace.records();
  REQUIRE(records.size() == 2);
  CHECK(records[0].op == "attention_fwd");
  CHECK(records[0].impl == "dense_aten");
  CHECK(records[0].reason.find("[B,H,Q,KV]") != std::string::npos);
  CHECK(records[1].op == "attention_bwd");
  CHECK(records[1].impl == "dense_aten");

  SECTION("a forward without backward records only the forward") {
    trace.clear();
    AttentionOptions options;
    options.trace = &trace;
    attention(q, k, k, mask, options);
    CHECK(trace.records().size() == 1);
  }
}

TEST_CASE("attention checks shapes, dtypes and devices at its boundary", "[attention]") {
  AttentionGeometry geometry;
  geometry.anchors = 2;
  geometry.context = 30;  // Q 32, KV 62
  MaskContext mask(resolve_mask(MaskDesc{}, geometry));
  const at::Tensor q = at::randn({1, 4, 32, 16});
  const at::Tensor k = at::randn({1, 2, 62, 16});
  const AttentionOptions options;
  const auto message = [&](const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in) -> std::string {
    try {
      attention(q_in, k_in, v_in, mask, options);
    } catch (const c10::Error& error) {
      return error.what();
    }
    return "";
  };
  CHECK(message(q, k, k).empty());
  CHECK(message(q[0], k, k).find("must be 4-D") != std::string::npos);
  CHECK(message(q, k.to(at::kDouble), k).find("share a dtype") != std::string::npos);
  CHECK(message(q, at::randn({1, 3, 62, 16}), at::randn({1, 3, 62, 16})).find("multiple of the kv heads") != std::string::npos);
  CHECK(message(q, at::randn({1, 2, 62, 8}), at::randn({1, 2, 62, 8})).find("head_dim") != std::string::npos);
  CHECK(message(q, at::randn({1, 2, 61, 16}), at::randn({1, 2, 61, 16})).find("do not match the mask") != std::string::npos);
  CHECK(message(q, k, at::randn({1, 2, 61, 16})).find("k and v must have one batch, kv heads and KV_LEN") != std::string::npos);
  CHECK(message(q, k, at::randn({1, 2, 62, 8})).empty());  // v's head dim may differ (v_head_dim)
  CHECK(message(q.to(at::kInt), k.to(at::kInt), k.to(at::kInt)).find("floating point") != std::string::npos);
  // A device with no fused kernels is an unsupported configuration, not a crash.
  // The trace says why no fused kernel ran.
  const auto meta = at::TensorOptions().device(at::kMeta);
  DispatchTrace trace;
  AttentionOptions traced = options;
  traced.trace = &trace;
  CHECK_THROWS_AS(attention(at::empty({1, 4, 32, 16}, meta), at::empty({1, 2, 62, 16}, meta),
                            at::empty({1, 2, 62, 16}, meta), mask, traced),
                  UnsupportedError);
  const auto records = trace.records();
  REQUIRE(records.size() == 1);
  CHECK(records[0].impl == "unsupported");
  CHECK(records[0].reason.find("no fused kernel ran: fused attention on meta: only CPU and CUDA have fused kernels") !=
        std::string::npos);
}

TEST_CASE("without CUDA kernels, fused on a CUDA tensor is unsupported", "[attention][cuda]") {
  if (cuda_kernels_built()) HARNESS_SKIP("this build has the CUDA kernels: the fused_cuda cases test them");
  if (!at::hasCUDA()) HARNESS_SKIP("no CUDA backend: nothing to call fused attention on");
  AttentionGeometry geometry;
  geometry.anchors = 2;
  geometry.context = 30;
  MaskContext mask(resolve_mask(MaskDesc{}, geometry));
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  const at::Tensor q = at::randn({1, 1, 32, 64}, cuda);
  const at::Tensor k = at::randn({1, 1, 62, 64}, cuda);
  CHECK_THROWS_AS(attention(q, k, k, mask, AttentionOptions{}), UnsupportedError);
}

TEST_CASE("the fused backward allocates no Q x KV tensor, the dense one does", "[attention]") {
  // 8 heads sharing one kv head, Q 512, KV 4608: one fp32 score tensor is 75.5 MB, the fp32
  // inputs and output together 4.4 MB.
  const ResolvedMask resolved = harness::test::mask_of(MaskKind::dflash, 8, 1, 32, 4096, 4);
  MaskContext mask(resolved);
  mask.block_mask(64, 64, at::kCPU);  // built outside the measurement, as the experiments do
  mask.dense(at::kCPU);
  const int64_t q_len = resolved.q_len, kv_len = resolved.kv_len;
  const int64_t score_bytes = 8 * q_len * kv_len * 4;
  const int64_t linear_bytes = (2 * 8 * q_len * 64 + 2 * kv_len * 64) * 4;

  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16);
  const at::Tensor q = at::randn({1, 8, q_len, 64}, bf16).requires_grad_(true);
  const at::Tensor k = at::randn({1, 1, kv_len, 64}, bf16).requires_grad_(true);
  const at::Tensor v = at::randn({1, 1, kv_len, 64}, bf16).requires_grad_(true);
  const at::Tensor grad_out = at::randn({1, 8, q_len, 64}, bf16);

  // One intra-op thread, so that the peak does not depend on the core count; the harness's own
  // tracking CPU allocator (the one trials measure with) counts the bytes.
  SingleThreadScope single_thread;
  harness::kinds::MemoryMeter meter(at::kCPU);
  const auto measure = [&](AttentionImpl impl) {
    AttentionOptions options;
    options.impl = impl;
    meter.reset_peak();
    int64_t base = meter.current();
    at::Tensor out = attention(q, k, v, mask, options);
    const int64_t fwd_peak = meter.peak() - base;
    meter.reset_peak();
    base = meter.current();
    out.backward(grad_out);
    const int64_t bwd_peak = meter.peak() - base;
    q.mutable_grad().reset();
    k.mutable_grad().reset();
    v.mutable_grad().reset();
    return std::make_pair(fwd_peak, bwd_peak);
  };
  const auto [fused_fwd, fused_bwd] = measure(AttentionImpl::fused);
  const auto [dense_fwd, dense_bwd] = measure(AttentionImpl::dense);
  INFO("score tensor " << score_bytes << " B, linear " << linear_bytes << " B; fused fwd " << fused_fwd << " bwd "
                       << fused_bwd << "; dense fwd " << dense_fwd << " bwd " << dense_bwd);
  // Positive control: the tracker sees the dense path's Q x KV tensors.
  CHECK(dense_fwd >= score_bytes);
  CHECK(dense_bwd >= score_bytes);
  CHECK(fused_fwd <= 2 * linear_bytes);
  CHECK(fused_bwd <= 4 * linear_bytes);
  CHECK(fused_bwd < score_bytes / 4);
}

// One fused CPU forward and backward whose bits tests/cpu_attention_processes.sh compares across
// fresh processes: the kernel's result must not depend on the process's thread timing. Hidden: it
// asserts nothing by itself. The size is the case that failed CI once (tests above): there, before
// the kernel computed exp itself, ~2% of processes got a different output (MKL's VML exp, split over
// MKL's own threads inside at::parallel_for, lost accuracy on one thread's part).
TEST_CASE("fused CPU attention fingerprint of one process", "[.processes]") {
  MaskContext mask(strided_case_mask());
  at::manual_seed(9);
  const at::Tensor q = at::randn({2, 4, 80, 64});
  const at::Tensor k = at::randn({2, 2, 230, 64});
  const at::Tensor v = at::randn({2, 2, 230, 64});
  const at::Tensor grad_out = at::randn({2, 4, 80, 64});
  const Result fused = run(AttentionImpl::fused, q, k, v, grad_out, mask, {32, 32});
  // tests/cpu_attention_processes.sh compares the printed sums across processes; each process's
  // result must be a real one to compare.
  REQUIRE(all_finite(fused));
  REQUIRE(fused.out.abs().sum().item<double>() > 0.0);
  std::printf("fingerprint");
  for (const at::Tensor* t : {&fused.out, &fused.grad_q, &fused.grad_k, &fused.grad_v}) {
    // Every element's bits, position-weighted: equal sums mean equal tensors in practice.
    const at::Tensor bits = t->contiguous().view(at::kInt).to(at::kLong);
    const at::Tensor weights = at::arange(1, bits.numel() + 1, bits.options()).view(bits.sizes());
    std::printf(" %lld", static_cast<long long>((bits * weights).sum().item<int64_t>()));
  }
  std::printf("\n");
}

TEST_CASE("exp_f32 is within 2 ulp of exp over the normal range and exact at the edges", "[attention]") {
  using harness::kernels::exp_f32;
  // Every 61st float bit pattern (70 million), of which the ~37 million whose exp is a normal float.
  double worst_ulp = 0.0;
  float worst_x = 0.0f;
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 61) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(bits));
    if (!(x >= -87.33f && x <= 88.72f)) continue;
    const double exact = std::exp(static_cast<double>(x));
    const double ulp = std::ldexp(1.0, std::ilogb(exact) - 23);
    const double err = std::abs(static_cast<double>(exp_f32(x)) - exact) / ulp;
    if (err > worst_ulp) {
      worst_ulp = err;
      worst_x = x;
    }
  }
  INFO("worst error " << worst_ulp << " ulp at x = " << worst_x);
  CHECK(worst_ulp <= 2.0);
  constexpr float inf = std::numeric_limits<float>::infinity();
  CHECK(exp_f32(0.0f) == 1.0f);
  CHECK(exp_f32(-inf) == 0.0f);
  CHECK(exp_f32(-100.0f) == 0.0f);
  CHECK(exp_f32(inf) == inf);
  CHECK(exp_f32(100.0f) == inf);
  CHECK(std::isnan(exp_f32(std::numeric_limits<float>::quiet_NaN())));
  CHECK(std::isfinite(exp_f32(88.72f)));
  CHECK(exp_f32(-87.3f) > 0.0f);
}
