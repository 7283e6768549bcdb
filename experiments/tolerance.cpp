#include "experiments/tolerance.h"

#include <cmath>

namespace harness::spec {

double dtype_rtol(const std::string& dtype) {
  // torch.testing._comparison's default_tolerances: bfloat16 1.6e-2, float16 1e-3, float32 1.3e-6.
  if (dtype == "bf16") return 1.6e-2;
  if (dtype == "fp16") return 1e-3;
  return 1.3e-6;
}

double check_rtol(const Tolerance& tolerance, const std::string& dtype) {
  return tolerance.rtol.value_or(dtype_rtol(dtype));
}

TensorJudgement judge_tensor(const TensorErrors& errors, const Tolerance& tolerance, const std::string& dtype) {
  TensorJudgement judgement;
  judgement.rtol = check_rtol(tolerance, dtype);
  judgement.dense_bound = tolerance.factor * errors.dense_err + tolerance.atol;
  if (std::isfinite(errors.err) && errors.err <= judgement.dense_bound) {
    judgement.match = true;
    judgement.decided_by = "dense";
  } else if (std::isfinite(errors.err) && std::isfinite(errors.worst_excess) && errors.worst_excess <= tolerance.atol) {
    judgement.match = true;
    judgement.decided_by = "dtype";
  } else {
    judgement.decided_by = "none";
  }
  return judgement;
}

nlohmann::json TensorJudgement::to_json(const TensorErrors& errors) const {
  return {{"match", match},
          {"decided_by", decided_by},
          {"max_abs_err", errors.err},
          {"dense_lowp_err", errors.dense_err},
          {"dense_bound", dense_bound},
          {"rtol", rtol},
          {"worst_excess_over_rtol", errors.worst_excess}};
}

}  // namespace harness::spec
