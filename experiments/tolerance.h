#pragma once
// Whether a variant's tensor (out, dq, dk, dv) is right, judged the way flash-attention kernels are
// judged. Torch-free: the trial measures the errors (trials/attention_step.cpp with
// kernels/reference_attention.h), this judges them.
//
// Two references of the same step: `exact` (float64, nothing rounded) and `lowp`, the step computed
// the way a flash kernel in the step's dtype rounds (matmul inputs, P and dS in bf16/fp16, fp32
// accumulation and softmax). A tensor matches when every element is finite and
//   max:  max|got - exact|  <= factor      · max|lowp - exact|  + atol
//   mean: mean|got - exact| <= mean_factor · mean|lowp - exact| + atol
// with atol = 2 · noise + check.atol, where noise = max|(exact + 0.3) - 0.3 - exact| in fp32 is the
// reference's own rounding noise. The max rule is FlashAttention's test rule (factor 2 against
// its low-precision reference, atol twice that noise); the mean rule is PyTorch's flex_attention
// tests' (mean error against fp64 within a fudge factor of the low-precision reference's). A bf16
// flash kernel cannot do better than `lowp` by construction, so a yardstick that keeps P in fp32
// (the dense path) is no yardstick: it rejected correct kernels (ours and compiled flex) whenever the
// largest error sat in a gradient.
// check.rtol, when a spec sets it, admits a tensor also when every element is within
// atol + rtol · |exact| (torch.testing's form); no rtol is applied unless the spec asks.

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace harness::spec {

//! Tolerance for outputs and gradients (a spec's "check" section).
struct Tolerance {
  double factor = 2.0;       //!< check.factor: times the low-precision reference's max error
  double mean_factor = 1.5;  //!< check.mean_factor: times the low-precision reference's mean error
  double atol = 0.0;         //!< check.atol: added to twice the reference's rounding noise
  std::optional<double> rtol;  //!< check.rtol: the elementwise alternative (off unless given)
};

//! What the trial measured of one tensor.
struct TensorErrors {
  double err = 0.0;             //!< max |got - exact|
  double mean_err = 0.0;        //!< mean |got - exact|
  double lowp_err = 0.0;        //!< max |lowp - exact|
  double lowp_mean_err = 0.0;   //!< mean |lowp - exact|
  double noise = 0.0;           //!< max |(exact + 0.3) - 0.3 - exact| in fp32
  bool finite = true;           //!< every element of got is finite
  //! With check.rtol: max over elements of |got - exact| - rtol · |exact| (the elementwise
  //! alternative holds when this is <= atol). Unused otherwise.
  double worst_excess = 0.0;
};

//! The judgement of one tensor.
struct TensorJudgement {
  bool match = false;
  //! "" when it matches; else what failed: "nonfinite", "max", "mean" or "max and mean"
  std::string failed;
  //! "rule" (max and mean), "rtol" (the elementwise alternative), or "none"
  std::string decided_by;
  double atol = 0.0;         //!< 2 · noise + check.atol
  double bound = 0.0;        //!< factor · lowp_err + atol
  double mean_bound = 0.0;   //!< mean_factor · lowp_mean_err + atol
  //! The errors, bounds and describe()'s line ("summary"), for the trial's details.
  nlohmann::json to_json(const std::string& tensor, const TensorErrors& errors) const;
  //! One line: "dq 1.44e-02 <= 3.31e-02 (max), mean 1.2e-03 <= 1.9e-03" or what failed.
  std::string describe(const std::string& tensor, const TensorErrors& errors) const;
};

//! Judges one tensor by the rule above.
TensorJudgement judge_tensor(const TensorErrors& errors, const Tolerance& tolerance);

}  // namespace harness::spec
