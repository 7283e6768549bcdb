// The specs of the torch-free race and cache experiments, experiments/warmup_race.json and
// experiments/cache_corruption.json: they load, their verdict rules mean what their hypotheses
// say, and run in-process they reach RACE and RECOVERS (the acceptance of `harness run`).
// Not in scripts/tsan.sh's subset: these need the spec loader.

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "trials/autotune_race.h"
#include "trials/cache_corruption.h"
#include "experiments/spec.h"
#include "experiments/verdict.h"
#include "tests/catch.h"
#include "tests/test_paths.h"

using namespace harness;

namespace {

const std::string kExperiments = HARNESS_EXPERIMENTS_DIR;

//! What the verdict sees of a trial: its status and each metric's median over repeats (or the
//! value measured once).
spec::VariantOutcome outcome_of(const kinds::TrialResult& result) {
  spec::VariantOutcome outcome;
  outcome.status = result.status;
  outcome.error = result.error;
  std::map<std::string, std::vector<double>> repeats;
  for (const kinds::MetricValue& metric : result.metrics) {
    if (metric.repeat >= 0) {
      repeats[metric.name].push_back(metric.value);
    } else {
      outcome.values[metric.name] = metric.value;
    }
  }
  for (auto& [name, values] : repeats) {
    std::sort(values.begin(), values.end());
    outcome.values[name] = values[values.size() / 2];
  }
  return outcome;
}

spec::VariantOutcome race_outcome(double failure_rate, double failures) {
  spec::VariantOutcome outcome;
  outcome.status = "ok";
  outcome.values = {{"failure_rate", failure_rate}, {"failures", failures}};
  return outcome;
}

}  // namespace

TEST_CASE("warmup_race.json: loads, and its verdict separates RACE, FIX-RACES and NO-RACE", "[race]") {
  const spec::Spec spec = spec::load_spec_file(kExperiments + "/warmup_race.json");
  CHECK(spec.kind == "autotune_race");
  REQUIRE(spec.variants.size() == 3);
  CHECK(spec.params["trials"].get<int>() * spec.repeats >= 200);  // the acceptance: 0 of at least 200

  const auto verdict = [&](double legacy_rate, double per_call_failures, double sequential_failures) {
    return spec::evaluate_verdict(spec, {{"legacy_shared_state", race_outcome(legacy_rate, legacy_rate * 200)},
                                         {"per_call_state", race_outcome(per_call_failures / 200, per_call_failures)},
                                         {"sequential_warmup", race_outcome(sequential_failures / 200, sequential_failures)}})
        .verdict;
  };
  CHECK(verdict(1.0, 0, 0) == "RACE");
  CHECK(verdict(0.9, 0, 0) == "RACE");
  CHECK(verdict(1.0, 1, 0) == "FIX-RACES");
  CHECK(verdict(1.0, 0, 3) == "FIX-RACES");
  CHECK(verdict(0.5, 2, 0) == "FIX-RACES");
  CHECK(verdict(0.85, 0, 0) == "NO-RACE");
}

TEST_CASE("warmup_race.json: run in-process, the race is reproduced and both fixes hold", "[race]") {
  const spec::Spec spec = spec::load_spec_file(kExperiments + "/warmup_race.json");
  std::map<std::string, spec::VariantOutcome> outcomes;
  for (const spec::Variant& variant : spec.variants) {
    kinds::TrialRequest context;
    context.device = "cpu";
    context.variant = variant.name;
    outcomes[variant.name] = outcome_of(kinds::run_autotune_race(spec, context));
  }
  INFO("legacy failure rate " << outcomes["legacy_shared_state"].values["failure_rate"]);
  CHECK(spec::evaluate_verdict(spec, outcomes).verdict == "RACE");
}

TEST_CASE("cache_corruption.json: one variant per damage, run in-process every damage is recovered", "[cache]") {
  const spec::Spec spec = spec::load_spec_file(kExperiments + "/cache_corruption.json");
  CHECK(spec.kind == "cache_corruption");
  std::vector<std::string> impls;
  for (const spec::Variant& variant : spec.variants) impls.push_back(variant.impl);
  CHECK(impls == kinds::cache_damage_kinds());

  // One trial per damage instead of the spec's three: every write fsyncs, and CI's disk is slow.
  spec::Spec once = spec;
  once.repeats = 1;
  std::map<std::string, spec::VariantOutcome> outcomes;
  for (const spec::Variant& variant : spec.variants) {
    kinds::TrialRequest context;
    context.device = "cpu";
    context.variant = variant.name;
    outcomes[variant.name] = outcome_of(kinds::run_cache_corruption(once, context));
  }
  const spec::Verdict verdict = spec::evaluate_verdict(spec, outcomes);
  INFO(verdict.evidence.dump());
  CHECK(verdict.verdict == "RECOVERS");

  // One damage not detected: no crash, so NOT-RECOVERED; one crash: CRASHES.
  outcomes["truncated"].values["detected"] = 0.5;
  CHECK(spec::evaluate_verdict(spec, outcomes).verdict == "NOT-RECOVERED");
  outcomes["killed_writer"].values["crashes"] = 1;
  CHECK(spec::evaluate_verdict(spec, outcomes).verdict == "CRASHES");
}
