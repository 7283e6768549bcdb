#include "trials/correctness.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "kernels/reference_attention.h"

namespace harness::kinds {
namespace {

// max|(ref + 0.3) - 0.3 - ref| in fp32: the reference's own rounding noise (FlashAttention's atol).
double rounding_noise(const at::Tensor& exact) {
  if (exact.numel() == 0) return 0.0;
  const at::Tensor ref = exact.to(at::kFloat);
  return ((ref + 0.3) - 0.3 - ref).abs().max().item<double>();
}

// The errors of `got` against the exact reference, with the flash-style reference's for scale.
spec::TensorErrors measure_errors(const at::Tensor& got, const at::Tensor& lowp, const at::Tensor& exact,
                                  const std::optional<double>& rtol) {
  spec::TensorErrors errors;
  errors.finite = got.isfinite().all().item<bool>();
  if (got.numel() == 0) return errors;
  const at::Tensor diff = (got.to(at::kDouble) - exact).abs();
  const at::Tensor lowp_diff = (lowp.to(at::kDouble) - exact).abs();
  errors.err = errors.finite ? diff.max().item<double>() : std::numeric_limits<double>::infinity();
  errors.mean_err = errors.finite ? diff.mean().item<double>() : std::numeric_limits<double>::infinity();
  errors.lowp_err = lowp_diff.max().item<double>();
  errors.lowp_mean_err = lowp_diff.mean().item<double>();
  errors.noise = rounding_noise(exact);
  if (rtol) errors.worst_excess = (diff - *rtol * exact.abs()).max().item<double>();
  return errors;
}

}  // namespace

StepReferences step_references(const StepInputs& in, const at::Tensor& dense_mask, double scale) {
  using kernels::ReferenceRounding;
  const auto outputs = [](const kernels::ReferenceResult& r) { return StepOutputs{r.out, r.dq, r.dk, r.dv}; };
  return {outputs(kernels::reference_attention(in.q, in.k, in.v, in.grad_out, dense_mask, scale, ReferenceRounding::exact)),
          outputs(kernels::reference_attention(in.q, in.k, in.v, in.grad_out, dense_mask, scale, ReferenceRounding::flash))};
}

CheckResult check_step(const spec::Tolerance& tolerance, const StepInputs& in, const StepOutputs& got,
                       const at::Tensor& dense_mask, double scale) {
  return judge_step(tolerance, step_references(in, dense_mask, scale), got);
}

CheckResult judge_step(const spec::Tolerance& tolerance, const StepReferences& references, const StepOutputs& got) {
  const StepOutputs& exact = references.exact;
  const StepOutputs& lowp = references.lowp;
  const struct {
    const char* name;
    const at::Tensor& got;
    const at::Tensor& lowp;
    const at::Tensor& exact;
  } rows[] = {{"out", got.out, lowp.out, exact.out},
              {"dq", got.dq, lowp.dq, exact.dq},
              {"dk", got.dk, lowp.dk, exact.dk},
              {"dv", got.dv, lowp.dv, exact.dv}};
  CheckResult result;
  result.match = true;
  result.judged = nlohmann::json::object();
  double worst = 0.0;
  for (const auto& row : rows) {
    const std::string name = row.name;
    const spec::TensorErrors errors = measure_errors(row.got, row.lowp, row.exact, tolerance.rtol);
    const spec::TensorJudgement judgement = spec::judge_tensor(errors, tolerance);
    result.match = result.match && judgement.match;
    worst = std::max(worst, errors.err);
    result.metrics.push_back({name + "_max_abs_err", errors.err, "", -1});
    result.metrics.push_back({name + "_mean_abs_err", errors.mean_err, "", -1});
    result.metrics.push_back({name + "_lowp_err", errors.lowp_err, "", -1});
    result.metrics.push_back({name + "_lowp_mean_err", errors.lowp_mean_err, "", -1});
    result.judged[name] = judgement.to_json(name, errors);
    if (!judgement.match) result.failures += (result.failures.empty() ? "" : "; ") + judgement.describe(name, errors);
  }
  result.metrics.push_back({"max_abs_err", worst, "", -1});
  result.metrics.push_back({"match", result.match ? 1.0 : 0.0, "", -1});
  return result;
}

void plant_wrong_result(const std::string& fault, StepOutputs& got) {
  if (fault == "wrong_dq") got.dq = got.dq * 1.01;
  if (fault == "wrong_dk_block") {
    constexpr int64_t kBlock = 128;
    const int64_t kv_len = got.dk.size(2);
    const at::Tensor per_key = got.dk.abs().to(at::kFloat).amax({0, 1, 3});  // [KV]
    const int64_t heaviest = per_key.argmax().item<int64_t>() / kBlock;
    got.dk = got.dk.clone();
    got.dk.slice(2, heaviest * kBlock, std::min(kv_len, (heaviest + 1) * kBlock)).zero_();
  }
}

}  // namespace harness::kinds
