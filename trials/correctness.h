#pragma once
// The correctness check of an attention step: a variant's output and gradients judged against the
// float64 reference of the same inputs, with the flash-style low-precision reference as the
// yardstick (kernels/reference_attention.h computes both, experiments/tolerance.h judges).

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiments/kinds/trial.h"
#include "experiments/tolerance.h"

namespace harness::kinds {

//! One call's inputs: q [B, H, Q, D], k [B, H_KV, KV, D], v [B, H_KV, KV, Dv], grad_out [B, H, Q, Dv].
struct StepInputs {
  at::Tensor q, k, v, grad_out;
};

//! What a variant returned for them.
struct StepOutputs {
  at::Tensor out, dq, dk, dv;
};

//! The check's outcome.
struct CheckResult {
  bool match = false;
  //! Per tensor t in out, dq, dk, dv: t_max_abs_err, t_mean_abs_err, t_lowp_err, t_lowp_mean_err;
  //! then max_abs_err (the largest) and match (1 or 0).
  std::vector<MetricValue> metrics;
  nlohmann::json judged;  //!< per tensor: TensorJudgement::to_json (the trial's details "tolerance")
  std::string failures;   //!< "" or one line per failing tensor, "; "-separated
};

//! The two references of a step (kernels/reference_attention.h): float64 and flash-style.
struct StepReferences {
  StepOutputs exact, lowp;
};

//! Computes both references from `in` with `dense_mask` ([Q, KV] bool, true = visible) and `scale`,
//! on the inputs' device.
StepReferences step_references(const StepInputs& in, const at::Tensor& dense_mask, double scale);

//! Judges `got` against references of its step.
CheckResult judge_step(const spec::Tolerance& tolerance, const StepReferences& references, const StepOutputs& got);

//! step_references, then judge_step.
CheckResult check_step(const spec::Tolerance& tolerance, const StepInputs& in, const StepOutputs& got,
                       const at::Tensor& dense_mask, double scale);

//! Test-only planted errors (a variant's "fault": "wrong_dq" | "wrong_dk_block"): the result made
//! wrong after its step, as a faulty kernel would return it, so that tests show the check rejects
//! it. wrong_dq scales dq by 1.01; wrong_dk_block zeroes dk over the 128 keys of the block with the
//! largest |dk| (a dropped block). Other faults leave the result as it is.
void plant_wrong_result(const std::string& fault, StepOutputs& got);

}  // namespace harness::kinds
