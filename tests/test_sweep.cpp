// Sweeps (points, --set creating and pinning sweeps, per-point specs) and scaling fits.

#include <cmath>

#include "experiments/scaling.h"
#include "experiments/spec.h"
#include "experiments/verdict.h"
#include "experiments/sweep.h"
#include "tests/catch.h"

namespace {

using harness::spec::load_spec_text;
using harness::spec::LoadOptions;
using harness::spec::SpecError;
using nlohmann::json;

std::string base_spec(const std::string& extra = "") {
  return R"({
    "name": "sweep_case", "hypothesis": "h", "kind": "attention_step",
    "dims": {"heads": 4, "kv_heads": 2, "head_dim": 64, "anchors": 8, "context": 256},
    "mask": {"type": "dflash", "documents": 2},
    "variants": {"fused": {"impl": "fused"}, "dense": {"impl": "dense"}},
    "verdict": [{"if": "fused.bwd_peak_bytes < 1MiB", "then": "FUSED"}, {"else": "DENSE"}])" +
         extra + "}";
}

std::string all_messages(const SpecError& error) {
  std::string text;
  for (const auto& issue : error.issues()) text += issue.to_string() + "\n";
  return text;
}

}  // namespace

TEST_CASE("a sweep crosses its axes, the first outermost", "[sweep]") {
  const auto spec = load_spec_text(base_spec(R"(, "sweep": {"dims.anchors": [8, 16], "dims.layers": [1, 3, 5]})"), "s.json");
  REQUIRE(spec.sweep.size() == 2);
  const auto points = harness::spec::sweep_points(spec);
  REQUIRE(points.size() == 6);
  CHECK(points[0] == json{{"dims.anchors", 8}, {"dims.layers", 1}});
  CHECK(points[2] == json{{"dims.anchors", 8}, {"dims.layers", 5}});
  CHECK(points[5] == json{{"dims.anchors", 16}, {"dims.layers", 5}});
  CHECK(harness::spec::point_label(points[5]) == "anchors=16 layers=5");

  const auto at = harness::spec::spec_at_point(spec, points[4]);
  CHECK(at.dims.anchors == 16);
  CHECK(at.layers == 3);
  CHECK(at.sweep.empty());
  CHECK_FALSE(at.resolved.contains("sweep"));
  // The stored spec keeps the sweep and its written order, so reading it back gives the same points.
  const auto again = harness::spec::parse_spec(spec.resolved, "db");
  CHECK(harness::spec::sweep_points(again) == points);
}

// Each point is resolved once, when the spec loads: spec_at_point hands out that spec, which is the
// one the point's own resolution (the sweep removed, the point's values set, validated) gives.
TEST_CASE("every point of a sweep is resolved once, at load", "[sweep]") {
  const auto spec = load_spec_text(base_spec(R"(, "sweep": {"dims.anchors": [8, 16], "dims.layers": [1, 3]})"), "s.json");
  const auto points = harness::spec::sweep_points(spec);
  REQUIRE(spec.points.size() == points.size());
  for (size_t i = 0; i < points.size(); ++i) {
    CHECK(spec.points[i].point == points[i]);
    const auto at = harness::spec::spec_at_point(spec, points[i]);
    CHECK(at.resolved == spec.points[i].spec->resolved);
    CHECK(at.source == "s.json");
    json by_hand = spec.resolved;
    by_hand.erase("sweep");
    by_hand.erase("sweep_order");
    for (const auto& [path, value] : points[i].items()) harness::spec::set_path(by_hand, path, value);
    CHECK(at.resolved == harness::spec::parse_spec(by_hand, "s.json").resolved);
    CHECK(at.dims.anchors == points[i]["dims.anchors"].get<int64_t>());
    CHECK(at.layers == points[i]["dims.layers"].get<int64_t>());
  }
  const auto with_specs = harness::spec::points_with_specs(spec);
  REQUIRE(with_specs.size() == points.size());
  for (size_t i = 0; i < points.size(); ++i) {
    CHECK(with_specs[i].first == points[i]);
    CHECK(with_specs[i].second.resolved == spec.points[i].spec->resolved);
    CHECK(with_specs[i].second.source == "s.json");
  }
  // A point outside the sweep is resolved (and validated) when asked.
  CHECK(harness::spec::spec_at_point(spec, {{"dims.anchors", 24}, {"dims.layers", 2}}).dims.anchors == 24);
  CHECK_THROWS_AS(harness::spec::spec_at_point(spec, {{"dims.anchors", -1}, {"dims.layers", 1}}), SpecError);
  // Without a sweep the spec is its own only point.
  const auto unswept = load_spec_text(base_spec(), "s.json");
  CHECK(unswept.points.empty());
  CHECK(harness::spec::spec_at_point(unswept, json::object()).resolved == unswept.resolved);
  const auto one_point = harness::spec::points_with_specs(unswept);
  REQUIRE(one_point.size() == 1);
  CHECK(one_point[0].first == json::object());
  CHECK(one_point[0].second.resolved == unswept.resolved);
}

TEST_CASE("a --set list sweeps a field and a --set value pins a swept one", "[sweep]") {
  LoadOptions sweep_it;
  sweep_it.overrides = {"dims.anchors=[8,12,16]"};
  const auto swept = load_spec_text(base_spec(), "s.json", sweep_it);
  REQUIRE(swept.sweep.size() == 1);
  CHECK(swept.sweep[0].path == "dims.anchors");
  CHECK(swept.sweep[0].values.size() == 3);

  LoadOptions pin;
  pin.overrides = {"dims.anchors=12"};
  const auto pinned = load_spec_text(base_spec(R"(, "sweep": {"dims.anchors": [8, 16], "dims.layers": [1, 2]})"), "s.json", pin);
  REQUIRE(pinned.sweep.size() == 1);
  CHECK(pinned.sweep[0].path == "dims.layers");
  CHECK(pinned.dims.anchors == 12);

  LoadOptions pin_all;
  pin_all.overrides = {"dims.anchors=12"};
  const auto single = load_spec_text(base_spec(R"(, "sweep": {"dims.anchors": [8, 16]})"), "s.json", pin_all);
  CHECK(single.sweep.empty());
  CHECK(harness::spec::sweep_points(single).size() == 1);
}

TEST_CASE("bad sweeps are rejected before anything runs, naming the axis and point", "[sweep]") {
  LoadOptions bad_value;
  bad_value.overrides = {"dims.anchors=[8,\"lots\"]"};
  try {
    load_spec_text(base_spec(), "s.json", bad_value);
    FAIL("expected a SpecError");
  } catch (const SpecError& error) {
    const std::string text = all_messages(error);
    INFO(text);
    CHECK(text.find("s.json (--set dims.anchors=[8,\"lots\"]): sweep.dims.anchors.1: at anchors=lots: expected a "
                    "positive integer") != std::string::npos);
  }
  LoadOptions unknown;
  unknown.overrides = {"dims.anchorz=[8,16]"};
  CHECK_THROWS_AS(load_spec_text(base_spec(), "s.json", unknown), SpecError);
  // One problem shared by every point is reported once.
  try {
    load_spec_text(base_spec(R"(, "repeats": 0, "sweep": {"dims.anchors": [8, 16, 24]})"), "s.json");
    FAIL("expected a SpecError");
  } catch (const SpecError& error) {
    REQUIRE(error.issues().size() == 1);
    CHECK(error.issues()[0].path == "repeats");
  }
}

TEST_CASE("scaling fits name the model that explains the growth", "[sweep][scaling]") {
  const auto line = harness::spec::fit_line({1, 2, 3, 4}, {3, 5, 7, 9});
  CHECK(std::abs(line.slope - 2.0) < 1e-12);
  CHECK(std::abs(line.intercept - 1.0) < 1e-12);
  CHECK(std::abs(line.r2 - 1.0) < 1e-12);
  const auto noisy = harness::spec::fit_line({1, 2, 3, 4}, {1, 3, 2, 4});
  CHECK(std::abs(noisy.r2 - 0.64) < 1e-12);  // r = 0.8

  const auto spec = load_spec_text(
      base_spec(R"(, "sweep": {"dims.anchors": [4, 8, 16], "dims.layers": [1, 3]},
                    "scaling": {"metric": "bwd_peak_bytes", "models": ["q_kv", "q_plus_kv"]})"),
      "s.json");
  std::vector<harness::spec::ScalingSample> samples;
  for (const auto& point : harness::spec::sweep_points(spec)) {
    const auto at = harness::spec::spec_at_point(spec, point);
    const double qkv = harness::spec::model_regressor("q_kv", at);
    const double linear = harness::spec::model_regressor("q_plus_kv", at);
    CHECK(qkv == at.dims.heads * at.dims.q_len() * at.dims.kv_len());
    CHECK(harness::spec::model_regressor("layers_q_kv", at) == at.layers * qkv);
    samples.push_back({"dense", {{"q_kv", qkv}, {"q_plus_kv", linear}}, 4.0 * qkv + 1000.0});
    samples.push_back({"fused", {{"q_kv", qkv}, {"q_plus_kv", linear}}, 2.0 * linear + 5000.0});
  }
  const auto fits = harness::spec::fit_scaling(*spec.scaling, samples);
  CHECK(fits.at("dense").growth == "q_kv");
  CHECK(fits.at("fused").growth == "q_plus_kv");
  CHECK(std::abs(fits.at("dense").fits[0].slope - 4.0) < 1e-9);

  // The rule of a scaling spec reads growth with the models as words.
  const auto vocabulary = harness::spec::vocabulary_for("attention_step", spec.scaling);
  CHECK(harness::spec::check_verdict_condition("dense.growth == q_kv && fused.r2_q_plus_kv > 0.9", {"dense", "fused"},
                                               vocabulary)
            .empty());
  CHECK_FALSE(harness::spec::check_verdict_condition("dense.growth == cubic", {"dense"}, vocabulary).empty());
  CHECK_FALSE(harness::spec::check_verdict_condition("dense.growth == q_kv", {"dense"}).empty());
}
