// Kind autotune_race: the shared-state model reproduces the founding race, the project's autotuner
// and sequential warm-up do not, the Wilson interval, the runner's metrics and the params checks.
// scripts/tsan.sh runs the [race] tests under ThreadSanitizer.

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trials/autotune_race.h"
#include "experiments/kinds/registry.h"
#include "tests/catch.h"

using namespace harness::kinds;

namespace {

constexpr int kRounds = 200;  // the acceptance: a fix must fail in 0 of at least 200

RaceOptions options_for(const std::string& impl) {
  RaceOptions options;
  options.impl = impl;
  options.threads = 4;  // as in the founding measurement (four threads, one @triton.autotune kernel)
  options.rounds = kRounds;
  options.seed = 7;
  return options;
}

std::string describe(const RaceOutcome& outcome) {
  nlohmann::json messages = outcome.failure_messages;
  return std::to_string(outcome.failed_rounds) + " of " + std::to_string(outcome.rounds) + " rounds failed; " +
         messages.dump();
}

ParamIssues issues_of(const nlohmann::json& params) {
  ParamIssues issues;
  autotune_race_kind().check_params(params, issues);
  return issues;
}

bool has_issue(const ParamIssues& issues, const std::string& path, const std::string& needle) {
  return std::any_of(issues.begin(), issues.end(), [&](const auto& issue) {
    return issue.first == path && issue.second.find(needle) != std::string::npos;
  });
}

harness::spec::Spec race_spec(const nlohmann::json& params, int repeats) {
  harness::spec::Spec spec;
  spec.name = "warmup_race_test";
  spec.kind = "autotune_race";
  spec.variants = {{"legacy", "legacy_shared_state", ""}, {"fixed", "per_call_state", ""}};
  spec.repeats = repeats;
  spec.seed = 3;
  spec.params = params;
  return spec;
}

double metric(const TrialResult& result, const std::string& name) {
  for (const MetricValue& value : result.metrics) {
    if (value.name == name && value.repeat == -1) return value.value;
  }
  FAIL("metric " << name << " missing");
  return 0.0;
}

}  // namespace

TEST_CASE("autotune_race: the fake kernel's fastest config depends on the size", "[race]") {
  // Hand-computed from the cost model: ceil(ceil(n/block)/8) waves of (block + 16) us.
  CHECK(std::abs(race_kernel_cost_ms("block=32", 256) - 0.048) < 1e-12);   // 8 tiles, 1 wave
  CHECK(std::abs(race_kernel_cost_ms("block=64", 512) - 0.080) < 1e-12);   // 8 tiles, 1 wave
  CHECK(std::abs(race_kernel_cost_ms("block=128", 8192) - 1.152) < 1e-12); // 64 tiles, 8 waves
  CHECK(std::abs(race_kernel_cost_ms("block=32", 8192) - 1.536) < 1e-12);  // 256 tiles, 32 waves
  CHECK(race_fastest_config(256) == "block=32");
  CHECK(race_fastest_config(512) == "block=64");
  CHECK(race_fastest_config(8192) == "block=128");
}

TEST_CASE("autotune_race: Wilson interval on known values", "[race]") {
  const ProportionInterval half = wilson_interval(5, 10);  // textbook: 0.2366 .. 0.7634
  CHECK(std::abs(half.low - 0.2366) < 1e-4);
  CHECK(std::abs(half.high - 0.7634) < 1e-4);
  const ProportionInterval none = wilson_interval(0, 200);  // upper bound z^2 / (n + z^2)
  CHECK(none.low == 0.0);
  CHECK(std::abs(none.high - 3.841459 / 203.841459) < 1e-6);
  const ProportionInterval all = wilson_interval(200, 200);
  CHECK(std::abs(all.low - 200.0 / 203.841459) < 1e-6);
  CHECK(all.high == 1.0);
  const ProportionInterval empty = wilson_interval(0, 0);
  CHECK(empty.low == 0.0);
  CHECK(empty.high == 1.0);
}

TEST_CASE("autotune_race: the shared-state model is correct when nothing races", "[race]") {
  RaceOptions options = options_for("legacy_shared_state");
  options.threads = 1;
  options.rounds = 20;
  for (int64_t n : {256, 512, 8192}) {
    options.sizes = {n};
    const RaceOutcome outcome = run_race(options);
    INFO(describe(outcome));
    CHECK(outcome.calls == 20);
    CHECK(outcome.failed_calls == 0);
  }
}

TEST_CASE("autotune_race: legacy_shared_state reproduces the founding race", "[race][control]") {
  const RaceOutcome outcome = run_race(options_for("legacy_shared_state"));
  INFO(describe(outcome));
  CHECK(outcome.rounds == kRounds);
  CHECK(outcome.failed_rounds >= kRounds * 9 / 10);
  CHECK(outcome.exceptions > 0);
  CHECK(outcome.failure_messages.count("TypeError: 'NoneType' object is not a mapping") == 1);
  CHECK(outcome.failed_calls == outcome.exceptions + outcome.wrong_configs + outcome.wrong_results);
}

TEST_CASE("autotune_race: per_call_state fails in none of 200 rounds", "[race]") {
  const RaceOutcome outcome = run_race(options_for("per_call_state"));
  INFO(describe(outcome));
  CHECK(outcome.rounds == kRounds);
  CHECK(outcome.calls == 4 * kRounds);
  CHECK(outcome.failed_calls == 0);
  CHECK(outcome.failed_rounds == 0);
}

TEST_CASE("autotune_race: sequential_warmup fails in none of 200 rounds", "[race]") {
  const RaceOutcome outcome = run_race(options_for("sequential_warmup"));
  INFO(describe(outcome));
  CHECK(outcome.rounds == kRounds);
  CHECK(outcome.calls == 4 * kRounds);
  CHECK(outcome.failed_calls == 0);
  CHECK(outcome.failed_rounds == 0);
}

TEST_CASE("autotune_race: run_race rejects what it cannot run", "[race]") {
  RaceOptions options = options_for("shared_nothing");
  CHECK_THROWS_AS(run_race(options), std::invalid_argument);
  options = options_for("per_call_state");
  options.threads = 0;
  CHECK_THROWS_AS(run_race(options), std::invalid_argument);
  options = options_for("per_call_state");
  options.bench_launches = 0;
  CHECK_THROWS_AS(run_race(options), std::invalid_argument);
}

TEST_CASE("autotune_race: the runner reports counts over all batches, the rate and its interval", "[race]") {
  const harness::spec::Spec spec = race_spec({{"threads", 3}, {"trials", 25}, {"jitter_us", 50}, {"kernel_us", 50}}, 2);
  TrialRequest context;
  context.device = "cpu";
  context.variant = "legacy";
  const TrialResult legacy = run_autotune_race(spec, context);
  REQUIRE(legacy.status == "ok");
  CHECK(metric(legacy, "threads") == 3);
  CHECK(metric(legacy, "rounds") == 50);
  CHECK(metric(legacy, "calls") == 150);
  const double failures = metric(legacy, "failures");
  CHECK(metric(legacy, "failure_rate") == failures / 50);
  const ProportionInterval interval = wilson_interval(static_cast<int64_t>(failures), 50);
  CHECK(metric(legacy, "failure_rate_ci_low") == interval.low);
  CHECK(metric(legacy, "failure_rate_ci_high") == interval.high);
  CHECK(std::count_if(legacy.metrics.begin(), legacy.metrics.end(),
                      [](const MetricValue& m) { return m.name == "elapsed_ms" && m.repeat >= 0 && m.unit == "ms"; }) == 2);
  CHECK(legacy.details["impl"] == "legacy_shared_state");
  CHECK(legacy.details["thread_sizes"] == nlohmann::json({256, 512, 8192}));
  CHECK(legacy.details["fastest_configs"]["512"] == "block=64");
  int64_t listed = 0;
  for (const auto& failure : legacy.details["failure_messages"]) listed += failure["count"].get<int64_t>();
  CHECK(listed == static_cast<int64_t>(metric(legacy, "failed_calls")));

  context.variant = "fixed";
  const TrialResult fixed = run_autotune_race(spec, context);
  REQUIRE(fixed.status == "ok");
  CHECK(metric(fixed, "failures") == 0);
  CHECK(fixed.details["failure_messages"].empty());
}

TEST_CASE("autotune_race: per_device threads follow --devices and need two", "[race]") {
  const harness::spec::Spec spec = race_spec({{"threads", "per_device"}, {"trials", 5}}, 1);
  TrialRequest context;
  context.variant = "fixed";
  context.device = "cuda:0";
  context.devices = {"cuda:0"};
  const TrialResult one = run_autotune_race(spec, context);
  CHECK(one.status == "error");
  CHECK(one.error.find("needs at least 2 devices") != std::string::npos);
  context.devices = {"cuda:0", "cuda:1", "cuda:2"};
  const TrialResult three = run_autotune_race(spec, context);
  REQUIRE(three.status == "ok");
  CHECK(metric(three, "threads") == 3);
  CHECK(three.details["thread_devices"] == nlohmann::json({"cuda:0", "cuda:1", "cuda:2"}));
}

TEST_CASE("autotune_race: params are checked with paths and what was found", "[race]") {
  CHECK(issues_of(nlohmann::json::object()).empty());
  CHECK(issues_of({{"threads", 4}, {"trials", 200}, {"jitter_us", 0}, {"kernel_us", 100}, {"sizes", {256, 8192}}}).empty());
  CHECK(issues_of({{"threads", "per_device"}}).empty());
  CHECK(has_issue(issues_of(nlohmann::json::array()), "params", "expected an object"));
  CHECK(has_issue(issues_of({{"threads", 1}}), "params.threads", "from 2 to 256 or \"per_device\""));
  CHECK(has_issue(issues_of({{"threads", 1}}), "params.threads", "got 1"));
  CHECK(has_issue(issues_of({{"threads", "four"}}), "params.threads", "got the string \"four\""));
  CHECK(has_issue(issues_of({{"trials", 0}}), "params.trials", "from 1 to 1000000, got 0"));
  CHECK(has_issue(issues_of({{"trials", 2.5}}), "params.trials", "got 2.5"));
  CHECK(has_issue(issues_of({{"jitter_us", -1}}), "params.jitter_us", "got -1"));
  CHECK(has_issue(issues_of({{"kernel_us", "fast"}}), "params.kernel_us", "got the string \"fast\""));
  CHECK(has_issue(issues_of({{"bench_launches", 0}}), "params.bench_launches", "from 1 to 1000, got 0"));
  CHECK(has_issue(issues_of({{"sizes", nlohmann::json::array()}}), "params.sizes", "1 to 64 problem sizes"));
  CHECK(has_issue(issues_of({{"sizes", {256, 0}}}), "params.sizes[1]", "got 0"));
  CHECK(has_issue(issues_of({{"sizes", {300, 400}}}), "params.sizes[1]", "bucket 2^9"));
  CHECK(has_issue(issues_of({{"thread", 4}}), "params.thread", "unknown parameter"));
  CHECK(issues_of({{"threads", 1}, {"trials", 0}, {"bogus", true}}).size() == 3);  // every problem at once
}

TEST_CASE("autotune_race: the kind lists its impls and verdict metrics", "[race]") {
  const KindInfo kind = autotune_race_kind();
  CHECK(kind.impls == std::vector<std::string>{"legacy_shared_state", "per_call_state", "sequential_warmup"});
  for (const char* name : {"failure_rate", "failures", "failure_rate_ci_high", "wrong_configs", "elapsed_ms"}) {
    CHECK(std::find(kind.verdict_metrics.begin(), kind.verdict_metrics.end(), name) != kind.verdict_metrics.end());
  }
}
