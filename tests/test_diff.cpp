// `harness diff` in the analysis library: the Mann-Whitney test against published values and an
// independent enumeration, noise-aware calls, env diffs naming the changed component, run and
// env diffs over dbs written through db::Store, and their errors.

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <sstream>

#include "analysis/diff.h"
#include "analysis/env_diff.h"
#include "analysis/stats.h"
#include "core/errors.h"
#include "tests/analysis_test_db.h"
#include "tests/catch.h"

namespace {

using harness::UsageError;
using harness::analysis::MetricComparison;
using harness::analysis::PValueMethod;
using harness::analysis::SideValues;
using harness::analysis::spread_of;
using harness::test::RunData;
using harness::test::TrialData;
using nlohmann::json;

// Two-sided exact p by listing every way to choose which pooled ranks belong to a: the
// definition of the null distribution, independent of the recurrence the library uses.
double enumerated_p(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> pooled = a;
  pooled.insert(pooled.end(), b.begin(), b.end());
  std::sort(pooled.begin(), pooled.end());
  const size_t n = a.size(), total = pooled.size();
  auto u_of = [&](const std::vector<bool>& in_a) {
    double u = 0;
    for (size_t i = 0; i < total; ++i)
      for (size_t j = 0; j < total; ++j)
        if (in_a[i] && !in_a[j] && pooled[i] > pooled[j]) u += 1;
    return u;
  };
  std::vector<bool> observed(total, false);
  {
    std::vector<double> rest = a;
    for (size_t i = 0; i < total; ++i) {
      const auto found = std::find(rest.begin(), rest.end(), pooled[i]);
      if (found != rest.end()) {
        observed[i] = true;
        rest.erase(found);
      }
    }
  }
  const double u_observed = u_of(observed);
  std::vector<bool> mask(total, false);
  std::fill(mask.begin(), mask.begin() + static_cast<long>(n), true);
  double below = 0, above = 0, count = 0;
  std::sort(mask.begin(), mask.end());
  do {
    const double u = u_of(mask);
    below += u <= u_observed;
    above += u >= u_observed;
    count += 1;
  } while (std::next_permutation(mask.begin(), mask.end()));
  return std::min(1.0, 2.0 * std::min(below, above) / count);
}

MetricComparison compare(const std::string& metric, const std::vector<double>& a, const std::vector<double>& b,
                         bool repeated = true) {
  MetricComparison c;
  c.metric = metric;
  c.unit = harness::test::unit_for(metric);
  c.a = SideValues{spread_of(a), repeated, a};
  c.b = SideValues{spread_of(b), repeated, b};
  harness::analysis::judge(c);
  return c;
}

}  // namespace

TEST_CASE("Mann-Whitney U matches published values", "[diff][stats]") {
  // SciPy's documentation example (mannwhitneyu): U = 17, exact p = 0.1111..., asymptotic
  // (continuity-corrected) p = 0.11134688653314041.
  const std::vector<double> males = {19, 22, 16, 29, 24}, females = {20, 11, 17, 12};
  const auto exact = harness::analysis::mann_whitney_u(males, females);
  CHECK(exact.exact);
  CHECK(exact.u == 17.0);
  CHECK(std::abs(exact.p_value - 1.0 / 9.0) < 1e-12);
  const auto normal = harness::analysis::mann_whitney_u(males, females, PValueMethod::kNormal);
  CHECK_FALSE(normal.exact);
  CHECK(std::abs(normal.p_value - 0.11134688653314041) < 1e-12);

  // Complete separation of 5 and 5: U = 0, p = 2 / C(10, 5) = 2 / 252.
  const auto separated = harness::analysis::mann_whitney_u({1, 2, 3, 4, 5}, {6, 7, 8, 9, 10});
  CHECK(separated.u == 0.0);
  CHECK(std::abs(separated.p_value - 2.0 / 252.0) < 1e-12);

  // Ties: midranks give R_a = 12.5, U = 2.5; tie groups (2 ×3, 3 ×2, 4 ×2) give
  // sum(t³ - t) = 36, sigma = sqrt(20/12 · (10 - 36/72)) = 3.97911, z = (7.5 - 0.5) / sigma.
  const auto tied = harness::analysis::mann_whitney_u({1, 2, 2, 3}, {2, 3, 4, 4, 5});
  CHECK_FALSE(tied.exact);
  CHECK(tied.u == 2.5);
  CHECK(std::abs(tied.p_value - std::erfc(7.0 / std::sqrt(20.0 / 12.0 * 9.5) / std::sqrt(2.0))) < 1e-12);
  CHECK(std::abs(tied.p_value - 0.0785458509511907) < 1e-9);

  // All values equal: no evidence of a shift.
  CHECK(harness::analysis::mann_whitney_u({3, 3, 3}, {3, 3}).p_value == 1.0);
  CHECK_THROWS_AS(harness::analysis::mann_whitney_u({}, {1.0}), std::invalid_argument);
}

TEST_CASE("Mann-Whitney exact p equals the enumerated null distribution", "[diff][stats]") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> value(0.0, 10.0);
  for (int sample = 0; sample < 25; ++sample) {
    const size_t n = 1 + rng() % 6, m = 1 + rng() % 6;
    std::vector<double> a(n), b(m);
    for (auto& v : a) v = value(rng);
    for (auto& v : b) v = value(rng) + (sample % 3);  // some shifted, some not
    const auto result = harness::analysis::mann_whitney_u(a, b);
    INFO("n=" << n << " m=" << m << " sample " << sample);
    REQUIRE(result.exact);
    CHECK(std::abs(result.p_value - enumerated_p(a, b)) < 1e-12);
    // U of a and U of b add up to n·m, and the two-sided p does not depend on the order.
    const auto swapped = harness::analysis::mann_whitney_u(b, a);
    CHECK(std::abs(result.u + swapped.u - static_cast<double>(n * m)) < 1e-12);
    CHECK(std::abs(result.p_value - swapped.p_value) < 1e-12);
  }
}

TEST_CASE("Wilson interval", "[diff][stats]") {
  // 0 of 200: the interval still has width (upper ≈ 1.88 %); 193 of 200 sits inside (0, 1).
  const auto none = harness::analysis::wilson_interval(0, 200);
  CHECK(none.low == 0.0);
  CHECK(std::abs(none.high - 0.018847) < 1e-5);
  const auto most = harness::analysis::wilson_interval(193, 200);
  CHECK(most.low < 0.965);
  CHECK(most.high > 0.965);
  CHECK(most.high < 1.0);
}

TEST_CASE("a change is called only outside the noise", "[diff]") {
  SECTION("few repeats: overlapping ranges are not called, even with different medians") {
    const auto c = compare("bwd_ms", {10.0, 12.0, 14.0}, {11.5, 13.0, 15.0});
    CHECK(c.rule == "range");
    CHECK(*c.delta > 0);
    CHECK_FALSE(c.called);
    CHECK_FALSE(c.regression);
  }
  SECTION("few repeats: disjoint ranges are called, and bytes up is a regression") {
    const auto c = compare("bwd_peak_bytes", {100, 101, 102}, {150, 151, 152});
    CHECK(c.called);
    CHECK(c.regression);
    CHECK_FALSE(c.improvement);
    CHECK(std::abs(*c.ratio - 151.0 / 101.0) < 1e-12);
  }
  SECTION("eight repeats: a consistent shift is called by the test despite one outlier") {
    // The outlier (13.0) makes the ranges overlap; U = 8 of 64, exact p = 0.0104.
    const auto c = compare("fwd_ms", {10.0, 10.1, 10.2, 10.3, 10.4, 10.5, 10.6, 13.0},
                           {12.0, 12.1, 12.2, 12.3, 12.4, 12.5, 12.6, 12.7});
    CHECK(harness::analysis::ranges_overlap(c.a->spread, c.b->spread));
    CHECK(c.rule == "mann-whitney");
    REQUIRE(c.test);
    CHECK(c.test->p_value < 0.05);
    CHECK(c.called);
    CHECK(c.regression);
  }
  SECTION("five repeats: interleaved samples are not called") {
    const auto c = compare("fwd_ms", {10.0, 10.4, 10.8, 11.2, 11.6}, {10.2, 10.6, 11.0, 11.4, 11.8});
    REQUIRE(c.test);
    CHECK(c.test->p_value > 0.05);
    CHECK_FALSE(c.called);
  }
  SECTION("times down and match up are improvements; match down is a regression") {
    CHECK(compare("bwd_ms", {20, 21, 22}, {10, 11, 12}).improvement);
    CHECK(compare("match", {0}, {1}, false).improvement);
    CHECK(compare("match", {1}, {0}, false).regression);
    CHECK(compare("failure_rate", {0.0}, {0.4}, false).regression);
  }
  SECTION("predictions and unknown metrics change without a direction") {
    const auto model = compare("model_bwd_peak_bytes", {100}, {200}, false);
    CHECK(model.called);
    CHECK_FALSE(model.regression);
    CHECK_FALSE(model.improvement);
    const auto error = compare("max_abs_err", {0.0045}, {0.0051}, false);
    CHECK(error.called);
    CHECK_FALSE(error.regression);
    const auto unknown = compare("dispatch_calls", {1}, {2}, false);
    CHECK(unknown.called);
    CHECK_FALSE(unknown.regression);
  }
  SECTION("equal single values are not a change") { CHECK_FALSE(compare("bwd_peak_bytes", {64}, {64}, false).called); }
}

TEST_CASE("env diff names the component that changed", "[diff][env]") {
  using harness::test::fingerprint;
  const auto a = fingerprint("2.10.0", "12.8", {}, "2.10.0", "3.5.1");
  auto b = fingerprint("2.11.0", "12.8", {{"CUDA_LAUNCH_BLOCKING", "1"}}, "2.10.0", "3.6.0");
  b["nvcc"] = "13.0.48";
  b["cuda_driver"] = "590.10";
  b["gpu_name"] = "NVIDIA H100";
  b["git_commit"] = "0123456789ab";
  const auto changes = harness::analysis::diff_envs(a, b);
  auto find = [&](const std::string& key) -> const harness::analysis::JsonChange* {
    for (const auto& c : changes)
      if (c.key == key) return &c;
    return nullptr;
  };
  REQUIRE(find("libtorch"));
  CHECK(find("libtorch")->component == "LibTorch");
  CHECK(find("libtorch")->before == "2.10.0");
  CHECK(find("libtorch")->after == "2.11.0");
  CHECK(find("python.triton")->component == "Python triton");
  CHECK(find("nvcc")->component == "nvcc");
  CHECK(find("cuda_driver")->component == "CUDA runtime/driver");
  CHECK(find("gpu_name")->component == "GPU");
  CHECK(find("git_commit")->component == "build");
  REQUIRE(find("env_vars.CUDA_LAUNCH_BLOCKING"));
  CHECK(find("env_vars.CUDA_LAUNCH_BLOCKING")->component == "env vars");
  CHECK(find("env_vars.CUDA_LAUNCH_BLOCKING")->before == "(absent)");
  // Unchanged leaves are not listed, and an empty env_vars object is no leaf of its own.
  CHECK_FALSE(find("python.torch"));
  CHECK_FALSE(find("env_vars"));
  CHECK(changes.size() == 7);
  // Grouped in component order: LibTorch first, build after env vars.
  CHECK(changes.front().component == "LibTorch");
  const auto components = harness::analysis::changed_components(changes);
  CHECK(components == std::vector<std::string>{"LibTorch", "CUDA runtime/driver", "nvcc", "GPU", "Python triton",
                                               "env vars", "build"});
  CHECK(harness::analysis::diff_envs(a, a).empty());
  CHECK(harness::analysis::env_component("python.torch") == "Python torch");
  CHECK(harness::analysis::env_component("something_new") == "other");
}

TEST_CASE("diff of two runs: env, metrics, regression, JSON", "[diff]") {
  harness::test::ScratchDir dir;
  harness::test::write_demo_db(dir.file("demo.db"));
  harness::db::Store store(dir.file("demo.db"));
  harness::db::RunFilter filter;
  filter.experiment = "bwd_fusion";
  const auto runs = store.list_runs(filter);
  REQUIRE(runs.size() == 2);
  const auto old_run = store.get_run(runs[1].id), new_run = store.get_run(runs[0].id);
  const auto diff = harness::analysis::diff_runs(*old_run, *new_run);

  const auto components = harness::analysis::changed_components(diff.env_changes);
  for (const std::string expected : {"LibTorch", "CUDA runtime/driver", "Python torch", "Python triton", "env vars"})
    CHECK(std::find(components.begin(), components.end(), expected) != components.end());
  CHECK(diff.setup_changes.empty());
  CHECK_FALSE(diff.verdict_flipped);

  auto row = [&](const std::string& variant, const std::string& metric) -> const MetricComparison& {
    for (const auto& c : diff.metrics)
      if (c.variant == variant && c.metric == metric) return c;
    FAIL("no row " << variant << "." << metric);
    throw std::logic_error("unreachable");
  };
  // dense bwd_ms went from ~23 ms to ~27.5 ms over 5 repeats each: the test calls it.
  const auto& dense_bwd = row("dense", "bwd_ms");
  CHECK(dense_bwd.rule == "mann-whitney");
  CHECK(dense_bwd.called);
  CHECK(dense_bwd.regression);
  CHECK(std::abs(dense_bwd.test->p_value - 2.0 / 252.0) < 1e-12);
  // Identical memory is not a change; fused times are within their noise.
  CHECK_FALSE(row("fused", "bwd_peak_bytes").called);
  CHECK_FALSE(row("fused", "bwd_ms").called);
  CHECK(diff.regressed());

  const auto json_out = harness::analysis::to_json(diff);
  CHECK(json_out["regression"] == true);
  CHECK(json_out["verdict"]["flipped"] == false);
  CHECK(json_out["a"]["id"] == old_run->run.id);
  bool found = false;
  for (const auto& m : json_out["metrics"])
    if (m["variant"] == "dense" && m["metric"] == "bwd_ms") {
      found = true;
      CHECK(m["called"] == true);
      CHECK(m["a"]["count"] == 5);
      CHECK(m["p_value"].is_number());
    }
  CHECK(found);

  std::ostringstream text;
  harness::analysis::print_run_diff(text, diff, true, false);
  CHECK(text.str().find("LibTorch") != std::string::npos);
  CHECK(text.str().find("2.10.0") != std::string::npos);
  CHECK(text.str().find("WORSE") != std::string::npos);
  CHECK(text.str().find("verdict: FUSED (unchanged)") != std::string::npos);
}

TEST_CASE("diff: verdict flips, trial status changes, different experiments", "[diff]") {
  harness::test::ScratchDir dir;
  harness::db::Store store(dir.file("flip.db"));
  const auto env = store.put_env(harness::test::fingerprint("2.11.0", "12.9"));
  const auto experiment = store.put_experiment("bwd_fusion", harness::test::bwd_fusion_spec());
  const auto other = store.put_experiment("other", json{{"name", "other"}});
  TrialData fused{"fused"}, dense{"dense"};
  fused.repeats["bwd_peak_bytes"] = {1e6, 1e6, 1e6};
  dense.repeats["bwd_peak_bytes"] = {8e9, 8e9, 8e9};
  RunData fused_run{env, experiment};
  fused_run.verdict = "FUSED";
  const int64_t a = harness::test::record_run(store, fused_run, {fused, dense});
  TrialData dense_oom{"dense"};
  dense_oom.status = "oom";
  TrialData fused_dense{"fused"};
  fused_dense.repeats["bwd_peak_bytes"] = {6e9, 6e9, 6e9};
  RunData dense_run{env, experiment};
  dense_run.verdict = "DENSE";
  const int64_t b = harness::test::record_run(store, dense_run, {fused_dense, dense_oom});
  const int64_t c = harness::test::record_run(store, RunData{env, other, "cpu", "", "X"}, {});

  const auto diff = harness::analysis::diff_runs(*store.get_run(a), *store.get_run(b));
  CHECK(diff.verdict_flipped);
  REQUIRE(diff.trial_changes.size() == 1);
  CHECK(diff.trial_changes[0].variant == "dense");
  CHECK(diff.trial_changes[0].before == "ok");
  CHECK(diff.trial_changes[0].after == "oom");
  CHECK(diff.trial_changes[0].regression);
  CHECK(diff.env_changes.empty());
  // dense has no bwd_peak_bytes in B: a one-sided row, never called.
  for (const auto& m : diff.metrics)
    if (m.variant == "dense") {
      CHECK(m.a);
      CHECK_FALSE(m.b);
      CHECK_FALSE(m.called);
    }
  std::ostringstream text;
  harness::analysis::print_run_diff(text, diff, true, false);
  CHECK(text.str().find("VERDICT FLIP") != std::string::npos);
  CHECK(text.str().find("only in A") != std::string::npos);

  CHECK_THROWS_AS(harness::analysis::diff_runs(*store.get_run(a), *store.get_run(c)), UsageError);
  try {
    harness::analysis::diff_runs(*store.get_run(a), *store.get_run(c));
  } catch (const UsageError& e) {
    CHECK(std::string(e.what()).find("one experiment") != std::string::npos);
    CHECK(std::string(e.what()).find("'bwd_fusion'") != std::string::npos);
    CHECK(std::string(e.what()).find("'other'") != std::string::npos);
  }
}

TEST_CASE("diff by env: latest runs per experiment, env prefixes", "[diff][env]") {
  harness::test::ScratchDir dir;
  harness::test::write_demo_db(dir.file("demo.db"));
  harness::db::Store store(dir.file("demo.db"));
  const auto ids = store.list_env_ids();
  REQUIRE(ids.size() == 2);
  // list_env_ids is oldest first: the demo writes the old toolchain first.
  const std::string old_env = ids[0], new_env = ids[1];
  CHECK(harness::analysis::resolve_env_id(store, old_env.substr(0, 10)) == old_env);
  CHECK(harness::analysis::resolve_env_id(store, new_env) == new_env);
  CHECK_THROWS_AS(harness::analysis::resolve_env_id(store, "zz"), UsageError);
  CHECK_THROWS_AS(harness::analysis::resolve_env_id(store, ""), UsageError);

  const auto diff = harness::analysis::diff_envs_latest(store, old_env, new_env, std::nullopt);
  REQUIRE(diff.experiments.size() == 1);  // only bwd_fusion ran under both
  CHECK(diff.experiments[0].a.experiment == "bwd_fusion");
  CHECK(diff.only_b == std::vector<std::string>{"anchor_scaling", "warmup_race"});
  CHECK(diff.regressed());
  CHECK_FALSE(diff.verdict_flipped());
  const auto json_out = harness::analysis::to_json(diff);
  CHECK(json_out["changed_components"][0] == "LibTorch");
  CHECK(json_out["experiments"].size() == 1);

  CHECK_THROWS_AS(harness::analysis::diff_envs_latest(store, old_env, new_env, std::string("anchor_scaling")),
                  UsageError);
  const auto only = harness::analysis::diff_envs_latest(store, old_env, new_env, std::string("bwd_fusion"));
  CHECK(only.experiments.size() == 1);
}

TEST_CASE("an ambiguous env prefix is an error", "[diff][env]") {
  harness::test::ScratchDir dir;
  harness::db::Store store(dir.file("envs.db"));
  // 17 envs: two of them share a first hex digit (pigeonhole).
  std::map<char, int> first_digits;
  char shared = 0;
  for (int i = 0; i < 17; ++i) {
    const auto id = store.put_env(json{{"libtorch", "2." + std::to_string(i)}});
    if (++first_digits[id[0]] == 2) shared = id[0];
  }
  REQUIRE(shared != 0);
  try {
    harness::analysis::resolve_env_id(store, std::string(1, shared));
    FAIL("no error for an ambiguous prefix");
  } catch (const UsageError& e) {
    CHECK(std::string(e.what()).find("ambiguous") != std::string::npos);
  }
}
