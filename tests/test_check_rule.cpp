// The correctness check as a trial runs it (trials/correctness.h): the fused CPU kernel passes the
// flash-kernel rule at every GQA ratio of real models, both head dims and every mask kind, and the
// check fails when the result is planted wrong (dq scaled by 1.01, one block of dk dropped).
// The CUDA kernels go through the same check in [cuda] (tests/test_attention_cuda.cpp, and
// `harness run bwd_fusion --model M` on a GPU).

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/reference_attention.h"
#include "tests/catch.h"
#include "tests/mask_cases.h"
#include "trials/correctness.h"

using namespace harness;
using kernels::AttentionGeometry;

namespace {

struct Case {
  kinds::StepInputs in;
  kinds::StepOutputs fused;
  at::Tensor dense_mask;
  double scale = 0.0;
};

// One bf16 step of the fused CPU kernel on `mask`.
Case fused_step(const AttentionGeometry& geometry, const kernels::ResolvedMask& mask, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto draw = [&](int64_t heads, int64_t length) {
    return at::randn({1, heads, length, geometry.head_dim}, gen, at::TensorOptions().dtype(at::kFloat)).to(at::kBFloat16);
  };
  Case c;
  c.in = {draw(geometry.heads, geometry.q_len()), draw(geometry.kv_heads, geometry.kv_len()),
          draw(geometry.kv_heads, geometry.kv_len()), draw(geometry.heads, geometry.q_len())};
  c.scale = 1.0 / std::sqrt(static_cast<double>(geometry.head_dim));
  kernels::MaskContext context(mask);
  c.dense_mask = context.dense(at::Device(at::kCPU));
  const at::Tensor q = c.in.q.clone().requires_grad_(true);
  const at::Tensor k = c.in.k.clone().requires_grad_(true);
  const at::Tensor v = c.in.v.clone().requires_grad_(true);
  kernels::AttentionOptions options;
  options.impl = kernels::AttentionImpl::fused;
  options.scale = c.scale;
  options.cpu_tiles = {32, 32};
  const at::Tensor out = kernels::attention(q, k, v, context, options);
  out.backward(c.in.grad_out);
  c.fused = {out.detach(), q.grad(), k.grad(), v.grad()};
  return c;
}

std::string failing_tensors(const kinds::CheckResult& check) {
  std::string names;
  for (const auto& [tensor, judged] : check.judged.items())
    if (!judged["match"].get<bool>()) names += (names.empty() ? "" : ",") + tensor;
  return names;
}

}  // namespace

// Every GQA ratio and head dim on the DFlash mask and a document mask; every mask kind at one of them
// (the rule's outcome depends on the ratio and head dim, the mask only changes which blocks run).
TEST_CASE("the fused CPU kernel passes the flash-kernel rule at every GQA ratio, head dim and mask, and planted errors fail it",
          "[torch][check]") {
  const spec::Tolerance tolerance;  // the shipped specs' rule: factor 2, mean_factor 1.5
  int cases = 0;
  int every_mask_cases = 0;  // the mask kinds at GQA 4, head dim 128
  for (const int64_t ratio : {1, 2, 4, 7, 8, 16}) {
    for (const int64_t head_dim : {64, 128}) {
      AttentionGeometry geometry;
      geometry.kv_heads = ratio >= 8 ? 1 : 2;
      geometry.heads = geometry.kv_heads * ratio;
      geometry.head_dim = head_dim;
      geometry.anchors = 6;
      geometry.block_size = 16;
      geometry.context = 200;  // Q 96, KV 296: no length a multiple of the tiles
      for (const auto& named : harness::test::every_mask_kind(geometry, {120, 80})) {
        const bool every_mask = ratio == 4 && head_dim == 128;
        if (!every_mask && named.name != "dflash before_anchor bidirectional" && named.name != "document_causal") continue;
        INFO("heads " << geometry.heads << " / kv " << geometry.kv_heads << ", head_dim " << head_dim << ", "
                      << named.name);
        Case c = fused_step(geometry, named.mask, 1000 + static_cast<uint64_t>(cases));
        const kinds::StepReferences references = kinds::step_references(c.in, c.dense_mask, c.scale);
        const kinds::CheckResult check = kinds::judge_step(tolerance, references, c.fused);
        INFO(check.failures);
        CHECK(check.match);

        kinds::StepOutputs scaled = c.fused;
        kinds::plant_wrong_result("wrong_dq", scaled);
        const kinds::CheckResult scaled_check = kinds::judge_step(tolerance, references, scaled);
        CHECK_FALSE(scaled_check.match);
        CHECK(failing_tensors(scaled_check) == "dq");

        kinds::StepOutputs dropped = c.fused;
        kinds::plant_wrong_result("wrong_dk_block", dropped);
        const kinds::CheckResult dropped_check = kinds::judge_step(tolerance, references, dropped);
        CHECK_FALSE(dropped_check.match);
        CHECK(failing_tensors(dropped_check) == "dk");
        ++cases;
        if (every_mask) ++every_mask_cases;
      }
    }
  }
  CHECK(every_mask_cases >= 6);
  CHECK(cases == 6 * 2 * 2 - 2 + every_mask_cases);
}

TEST_CASE("the flash-style reference rounds where a flash kernel does, the exact one nowhere", "[torch][check]") {
  AttentionGeometry geometry;
  geometry.heads = 4;
  geometry.kv_heads = 2;
  geometry.head_dim = 64;
  geometry.anchors = 4;
  geometry.context = 100;
  const auto mask = harness::test::mask_of(kernels::MaskKind::causal, 4, 2, 4, 100);
  Case c = fused_step(geometry, mask, 7);
  using kernels::ReferenceRounding;
  const auto exact = kernels::reference_attention(c.in.q, c.in.k, c.in.v, c.in.grad_out, c.dense_mask, c.scale,
                                                  ReferenceRounding::exact);
  const auto flash = kernels::reference_attention(c.in.q, c.in.k, c.in.v, c.in.grad_out, c.dense_mask, c.scale,
                                                  ReferenceRounding::flash);
  CHECK(exact.out.scalar_type() == at::kDouble);
  CHECK(flash.out.scalar_type() == at::kBFloat16);
  CHECK(flash.dq.scalar_type() == at::kBFloat16);
  // The exact reference agrees with the dense path computed in float64 by autograd.
  const at::Tensor q = c.in.q.to(at::kDouble).requires_grad_(true);
  const at::Tensor k = c.in.k.to(at::kDouble).requires_grad_(true);
  const at::Tensor v = c.in.v.to(at::kDouble).requires_grad_(true);
  const int64_t group = q.size(1) / k.size(1);
  const at::Tensor scores = at::matmul(q, k.repeat_interleave(group, 1).transpose(-2, -1)) * c.scale;
  const at::Tensor probabilities =
      at::softmax(scores.masked_fill(c.dense_mask.logical_not(), -std::numeric_limits<double>::infinity()), -1);
  const at::Tensor out = at::matmul(probabilities, v.repeat_interleave(group, 1));
  out.backward(c.in.grad_out.to(at::kDouble));
  CHECK((out - exact.out).abs().max().item<double>() < 1e-12);
  CHECK((q.grad() - exact.dq).abs().max().item<double>() < 1e-12);
  CHECK((k.grad() - exact.dk).abs().max().item<double>() < 1e-12);
  CHECK((v.grad() - exact.dv).abs().max().item<double>() < 1e-12);
  // The flash-style reference errs by what bf16 rounding of P and dS costs on top of the output's
  // rounding (on average: the largest error can be the output's rounding alone), and far less
  // than a wrong result.
  const at::Tensor flash_err = (flash.dq.to(at::kDouble) - exact.dq).abs();
  const at::Tensor rounding_err = (exact.dq.to(at::kBFloat16).to(at::kDouble) - exact.dq).abs();
  CHECK(flash_err.mean().item<double>() > rounding_err.mean().item<double>());
  CHECK(flash_err.max().item<double>() < 0.05 * exact.dq.abs().max().item<double>());
  // A row that sees nothing: out 0, lse -inf, no gradient.
  at::Tensor blind = c.dense_mask.clone();
  blind[0].fill_(false);
  const auto empty = kernels::reference_attention(c.in.q, c.in.k, c.in.v, c.in.grad_out, blind, c.scale,
                                                  ReferenceRounding::flash);
  CHECK(empty.out[0][0][0].abs().max().item<float>() == 0.0f);
  CHECK(std::isinf(empty.lse[0][0][0].item<float>()));
  CHECK(empty.dq[0][0][0].abs().max().item<float>() == 0.0f);
  CHECK(empty.out.isfinite().all().item<bool>());
}
