#pragma once
// Whether a variant's tensor matches the fp32 reference, and which bound decided. Torch-free:
// the trial measures the errors (trials/attention_step), this judges them.
//
// Two bounds, either one admits the tensor:
//  - dense: err <= factor * dense_err + atol. The unfused path in the same low precision is the
//    yardstick of what this computation costs in that precision (flash-attention's test rule).
//  - dtype: |got - ref| <= atol + rtol * |ref| for every element, rtol from the dtype as
//    torch.testing.assert_close has it. The dense path alone is not a sound yardstick: on a
//    bf16 step saved from PyTorch (compiled flex_attention, 8 heads / 1 KV head, Q 1000, KV 3000)
//    the dense path's dq error was 0.88e-3 while PyTorch's own fused kernel had 2.04e-3 against
//    fp32, i.e. what bf16 cannot resolve at those magnitudes; 2 x 0.88e-3 called that MISMATCH.

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "experiments/spec.h"

namespace harness::spec {

//! torch.testing.assert_close's default rtol for a dtype (bf16 1.6e-2, fp16 1e-3, fp32 1.3e-6).
double dtype_rtol(const std::string& dtype);

//! What the trial measured of one tensor.
struct TensorErrors {
  double err = 0.0;           //!< max |got - ref|
  double dense_err = 0.0;     //!< max |dense in low precision - ref|
  //! max over elements of |got - ref| - rtol * |ref| with the rtol of judge_tensor (the dtype bound
  //! holds when this is <= atol); NaN/Inf when any element is non-finite.
  double worst_excess = 0.0;
};

//! The judgement of one tensor.
struct TensorJudgement {
  bool match = false;
  std::string decided_by;   //!< "dense", "dtype", or "none" (neither bound holds)
  double dense_bound = 0.0; //!< factor * dense_err + atol
  double rtol = 0.0;        //!< the rtol of the dtype bound
  nlohmann::json to_json(const TensorErrors& errors) const;
};

//! The rtol a spec's check uses: check.rtol, else the dtype's.
double check_rtol(const Tolerance& tolerance, const std::string& dtype);

//! Judges one tensor: the dense bound first (the stricter, usual case), then the dtype bound.
TensorJudgement judge_tensor(const TensorErrors& errors, const Tolerance& tolerance, const std::string& dtype);

}  // namespace harness::spec
