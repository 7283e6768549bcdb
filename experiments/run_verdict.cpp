#include "experiments/run_verdict.h"

#include <algorithm>

#include "experiments/scaling.h"

namespace harness::spec {
namespace {

RunVerdict scaling_verdict(const Spec& spec, const std::vector<nlohmann::json>& points, const std::vector<Spec>& point_specs,
                           const std::vector<std::map<std::string, VariantOutcome>>& outcomes) {
  RunVerdict result;
  // A wrong result at any point stops the fit from deciding (experiments/verdict.h).
  for (size_t p = 0; p < points.size(); ++p) {
    if (auto guarded = failed_check_verdict(point_specs[p], outcomes[p])) {
      guarded->evidence["point"] = points[p];
      result.verdict = *guarded;
      return result;
    }
  }
  std::vector<ScalingSample> samples;
  nlohmann::json per_point = nlohmann::json::array();
  std::map<std::string, double> match_everywhere;  // per variant: 1 when every point's check passed
  for (size_t p = 0; p < points.size(); ++p) {
    for (const auto& [variant, outcome] : outcomes[p]) {
      if (const auto match = outcome.values.find("match"); match != outcome.values.end())
        match_everywhere[variant] = std::min(match_everywhere.count(variant) ? match_everywhere[variant] : 1.0, match->second);
      per_point.push_back({{"point", points[p]}, {"variant", variant}, {"status", outcome.status}});
      const auto value = outcome.values.find(spec.scaling->metric);
      if (outcome.status != "ok" || value == outcome.values.end()) continue;
      ScalingSample sample;
      sample.variant = variant;
      sample.value = value->second;
      for (const std::string& model : spec.scaling->models) sample.regressors[model] = model_regressor(model, point_specs[p]);
      samples.push_back(std::move(sample));
    }
  }
  const auto fits = fit_scaling(*spec.scaling, samples);
  std::map<std::string, VariantOutcome> fitted;
  nlohmann::json fit_evidence = nlohmann::json::object();
  for (const Variant& variant : spec.variants) {
    VariantOutcome outcome;
    outcome.status = "ok";
    const auto found = fits.find(variant.name);
    nlohmann::json entry = {{"metric", spec.scaling->metric}, {"fits", nlohmann::json::array()}};
    if (found != fits.end()) {
      if (!found->second.growth.empty()) outcome.words["growth"] = found->second.growth;
      entry["growth"] = found->second.growth;
      for (const Fit& fit : found->second.fits) {
        entry["fits"].push_back(
            {{"model", fit.model}, {"slope", fit.slope}, {"intercept", fit.intercept}, {"r2", fit.r2}, {"points", fit.points}});
        if (fit.points < 2) continue;
        outcome.values["r2_" + fit.model] = fit.r2;
        outcome.values["slope_" + fit.model] = fit.slope;
        result.metrics.push_back({variant.name, "r2_" + fit.model, fit.r2});
        result.metrics.push_back({variant.name, "slope_" + fit.model, fit.slope});
      }
    }
    if (const auto match = match_everywhere.find(variant.name); match != match_everywhere.end())
      outcome.values["match"] = match->second;
    fit_evidence[variant.name] = std::move(entry);
    fitted[variant.name] = std::move(outcome);
  }
  result.verdict = evaluate_verdict(spec, fitted);
  result.verdict.evidence["fits"] = std::move(fit_evidence);
  result.verdict.evidence["points"] = std::move(per_point);
  return result;
}

}  // namespace

RunVerdict aggregate_verdict(const Spec& spec, const std::vector<nlohmann::json>& points, const std::vector<Spec>& point_specs,
                             const std::vector<std::map<std::string, VariantOutcome>>& outcomes) {
  if (spec.scaling) return scaling_verdict(spec, points, point_specs, outcomes);
  RunVerdict result;
  std::vector<Verdict> verdicts;
  for (size_t p = 0; p < points.size(); ++p) verdicts.push_back(evaluate_verdict(point_specs[p], outcomes[p]));
  if (verdicts.size() == 1) {
    result.verdict = verdicts.front();
    return result;
  }
  nlohmann::json per_point = nlohmann::json::array();
  bool same = true;
  for (size_t p = 0; p < verdicts.size(); ++p) {
    per_point.push_back({{"point", points[p]}, {"verdict", verdicts[p].verdict}, {"evidence", verdicts[p].evidence}});
    same = same && verdicts[p].verdict == verdicts.front().verdict;
  }
  result.verdict.verdict = same ? verdicts.front().verdict : "MIXED";
  result.verdict.evidence = {{"points", std::move(per_point)}};
  if (!same) result.verdict.evidence["reason"] = "the sweep's points reached different verdicts";
  return result;
}

}  // namespace harness::spec
