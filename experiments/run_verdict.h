#pragma once
// The verdict of a whole run, from what its trials gave at every point of its sweep: per point by
// the spec's rule (points that disagree: MIXED), or, with a `scaling` block, by the rule over the
// fits across points (a failed correctness check at any point decides first). Torch-free; the
// command line stores what it returns (runner/run_plan.cpp).

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiments/spec.h"
#include "experiments/verdict.h"

namespace harness::spec {

//! A value the aggregation derives per variant (a scaling fit's r2_MODEL and slope_MODEL), to store
//! beside the trials' own metrics.
struct DerivedMetric {
  std::string variant;
  std::string name;
  double value = 0.0;
};

struct RunVerdict {
  Verdict verdict;
  std::vector<DerivedMetric> metrics;
};

//! points[i], point_specs[i] and outcomes[i] (variant -> outcome) describe sweep point i.
RunVerdict aggregate_verdict(const Spec& spec, const std::vector<nlohmann::json>& points,
                             const std::vector<Spec>& point_specs,
                             const std::vector<std::map<std::string, VariantOutcome>>& outcomes);

}  // namespace harness::spec
