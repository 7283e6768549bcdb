// Kind cache_corruption: every damage is detected (where there is something to detect), re-tuned
// and repaired, nothing throws or uses a bad entry, writers racing or killed lose nothing; the
// runner's metrics and the params checks.

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trials/cache_corruption.h"
#include "experiments/kinds/registry.h"
#include "tests/catch.h"

using namespace harness::kinds;
namespace fs = std::filesystem;

namespace {

//! A fresh directory under the system temp dir, removed at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "harness_cache_test_XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

std::string describe(const CacheDamageOutcome& outcome) {
  return "problems " + nlohmann::json(outcome.problems).dump() + "; diagnostics " + nlohmann::json(outcome.diagnostics).dump();
}

double metric(const TrialResult& result, const std::string& name) {
  for (const MetricValue& value : result.metrics) {
    if (value.name == name) return value.value;
  }
  FAIL("metric " << name << " missing");
  return 0.0;
}

bool has_metric(const TrialResult& result, const std::string& name) {
  return std::any_of(result.metrics.begin(), result.metrics.end(), [&](const MetricValue& m) { return m.name == name; });
}

}  // namespace

TEST_CASE("cache_corruption: every damage is detected and recovered, nothing crashes or uses a bad entry", "[cache]") {
  const std::vector<std::string>& damages = cache_damage_kinds();
  REQUIRE(damages.size() == 13);
  CHECK(damages == cache_corruption_kind().impls);
  TempDir dir;
  constexpr int kTrials = 2;
  for (const std::string& damage : damages) {
    INFO("damage " << damage);
    const CacheDamageOutcome outcome = run_cache_damage(damage, kTrials, 11, 6, dir.path.string());
    INFO(describe(outcome));
    CHECK(outcome.trials == kTrials);
    if (cache_damage_is_detectable(damage)) {
      CHECK(outcome.detected == kTrials);
      CHECK(!outcome.diagnostics.empty());
    }
    CHECK(outcome.recovered == kTrials);
    CHECK(outcome.crashes == 0);
    CHECK(outcome.bad_entry_used == 0);
    CHECK(outcome.entries_lost == 0);
    CHECK(outcome.problems.empty());
  }
}

TEST_CASE("cache_corruption: the writer races are not damages the autotuner could report", "[cache]") {
  for (const char* damage : {"two_writer_processes", "two_writer_threads", "killed_writer"}) CHECK(!cache_damage_is_detectable(damage));
  for (const char* damage : {"truncated", "garbage", "other_device", "unknown_config"}) CHECK(cache_damage_is_detectable(damage));
}

TEST_CASE("cache_corruption: a writer killed mid-write leaves the cache valid", "[cache]") {
  TempDir dir;
  const CacheDamageOutcome outcome = run_cache_damage("killed_writer", 4, 5, 8, dir.path.string());
  INFO(describe(outcome));
  CHECK(outcome.kills >= 1);  // the kill lands while the writer still has stores to do
  CHECK(outcome.recovered == 4);
  CHECK(outcome.entries_lost == 0);
}

TEST_CASE("cache_corruption: the runner reports fractions and the evidence", "[cache]") {
  harness::spec::Spec spec;
  spec.name = "cache_corruption_test";
  spec.kind = "cache_corruption";
  spec.variants = {{"cut", "truncated", ""}, {"race", "two_writer_threads", ""}};
  spec.repeats = 2;
  spec.params = {{"keys", 4}};
  TrialRequest context;
  context.device = "cpu";
  context.variant = "cut";
  const TrialResult cut = run_cache_corruption(spec, context);
  REQUIRE(cut.status == "ok");
  CHECK(metric(cut, "trials") == 2);
  CHECK(metric(cut, "detected") == 1);
  CHECK(metric(cut, "recovered") == 1);
  CHECK(metric(cut, "crashes") == 0);
  CHECK(metric(cut, "bad_entry_used") == 0);
  CHECK(!has_metric(cut, "entries_lost"));
  CHECK(cut.details["damage"] == "truncated");
  CHECK(cut.details["problems"].empty());
  CHECK(cut.details["diagnostics"][0].get<std::string>().find("not valid JSON") != std::string::npos);

  context.variant = "race";
  const TrialResult race = run_cache_corruption(spec, context);
  REQUIRE(race.status == "ok");
  CHECK(!has_metric(race, "detected"));
  CHECK(metric(race, "entries_lost") == 0);
  CHECK(metric(race, "recovered") == 1);

  context.variant = "missing";
  CHECK_THROWS_AS(run_cache_corruption(spec, context), std::invalid_argument);
}

TEST_CASE("cache_corruption: unknown damages and too few keys are refused", "[cache]") {
  TempDir dir;
  CHECK_THROWS_AS(run_cache_damage("bit_rot", 1, 0, 4, dir.path.string()), std::invalid_argument);
  CHECK_THROWS_AS(run_cache_damage("killed_writer", 1, 0, 1, dir.path.string()), std::invalid_argument);
}

TEST_CASE("cache_corruption: params are checked with paths and what was found", "[cache]") {
  const auto issues_of = [](const nlohmann::json& params) {
    ParamIssues issues;
    cache_corruption_kind().check_params(params, issues);
    return issues;
  };
  CHECK(issues_of(nlohmann::json::object()).empty());
  CHECK(issues_of({{"keys", 16}}).empty());
  const ParamIssues few = issues_of({{"keys", 1}});
  REQUIRE(few.size() == 1);
  CHECK(few[0].first == "params.keys");
  CHECK(few[0].second == "expected an integer from 2 to 256, got 1");
  const ParamIssues unknown = issues_of({{"damage", "truncated"}});
  REQUIRE(unknown.size() == 1);
  CHECK(unknown[0].first == "params.damage");
  CHECK(unknown[0].second.find("unknown parameter of kind cache_corruption; known: keys") != std::string::npos);
  CHECK(issues_of("keys").size() == 1);
}
