#include "experiments/tolerance.h"

#include <cmath>
#include <cstdio>

namespace harness::spec {

TensorJudgement judge_tensor(const TensorErrors& errors, const Tolerance& tolerance) {
  TensorJudgement judgement;
  judgement.atol = 2.0 * errors.noise + tolerance.atol;
  judgement.bound = tolerance.factor * errors.lowp_err + judgement.atol;
  judgement.mean_bound = tolerance.mean_factor * errors.lowp_mean_err + judgement.atol;
  if (!errors.finite || !std::isfinite(errors.err) || !std::isfinite(errors.mean_err)) {
    judgement.failed = "nonfinite";
    judgement.decided_by = "none";
    return judgement;
  }
  const bool max_ok = errors.err <= judgement.bound;
  const bool mean_ok = errors.mean_err <= judgement.mean_bound;
  if (max_ok && mean_ok) {
    judgement.match = true;
    judgement.decided_by = "rule";
    return judgement;
  }
  if (tolerance.rtol && std::isfinite(errors.worst_excess) && errors.worst_excess <= judgement.atol) {
    judgement.match = true;
    judgement.decided_by = "rtol";
    return judgement;
  }
  judgement.failed = !max_ok && !mean_ok ? "max and mean" : !max_ok ? "max" : "mean";
  judgement.decided_by = "none";
  return judgement;
}

nlohmann::json TensorJudgement::to_json(const std::string& tensor, const TensorErrors& errors) const {
  nlohmann::json json = {{"match", match},
                         {"failed", failed},
                         {"decided_by", decided_by},
                         {"max_abs_err", errors.err},
                         {"lowp_err", errors.lowp_err},
                         {"bound", bound},
                         {"mean_abs_err", errors.mean_err},
                         {"lowp_mean_err", errors.lowp_mean_err},
                         {"mean_bound", mean_bound},
                         {"noise", errors.noise},
                         {"atol", atol},
                         {"finite", errors.finite},
                         {"summary", describe(tensor, errors)}};
  if (decided_by == "rtol") json["worst_excess_over_rtol"] = errors.worst_excess;
  return json;
}

std::string TensorJudgement::describe(const std::string& tensor, const TensorErrors& errors) const {
  if (failed == "nonfinite") return tensor + " has NaN/Inf";
  const bool max_ok = errors.err <= bound;
  const bool mean_ok = errors.mean_err <= mean_bound;
  char line[160];
  std::snprintf(line, sizeof line, " max %.3g %s %.3g, mean %.3g %s %.3g", errors.err, max_ok ? "<=" : ">", bound,
                errors.mean_err, mean_ok ? "<=" : ">", mean_bound);
  std::string text = tensor + line;
  if (decided_by == "rtol") text += " (admitted by check.rtol)";
  return text;
}

}  // namespace harness::spec
