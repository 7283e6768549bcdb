// A failed correctness check never becomes a hypothesis verdict: the rule's `!` negation, the
// load-time analysis that rejects a clause a failed check can fall through to, the evaluation
// guard for rules that never read match, and the shipped specs audited by both. Also `--model`
// and a run's verdict over its sweep points.

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "experiments/models.h"
#include "experiments/run_verdict.h"
#include "experiments/spec.h"
#include "experiments/verdict.h"
#include "tests/catch.h"
#include "tests/test_paths.h"

namespace {

namespace fs = std::filesystem;
using harness::spec::LoadOptions;
using harness::spec::Spec;
using harness::spec::SpecError;
using harness::spec::VariantOutcome;
using harness::spec::VerdictClause;

const std::string kExperimentsDir = HARNESS_EXPERIMENTS_DIR;

Spec spec_with_rule(const std::string& rule) {
  return harness::spec::load_spec_text(R"({"name": "rule", "hypothesis": "h", "kind": "attention_step",
    "dims": {"heads": 4, "kv_heads": 2, "head_dim": 64, "anchors": 8, "context": 256},
    "mask": {"type": "causal"}, "variants": {"fused": {"impl": "fused"}, "dense": {"impl": "dense"}},
    "verdict": )" + rule + "}",
                                       "rule.json");
}

std::string load_error(const std::string& rule) {
  try {
    spec_with_rule(rule);
  } catch (const SpecError& error) {
    return error.what();
  }
  return "";
}

VariantOutcome outcome(double bwd_peak, double match, const std::string& failed = "") {
  VariantOutcome o;
  o.status = "ok";
  o.values = {{"bwd_peak_bytes", bwd_peak}, {"match", match}};
  o.check_failed = failed;
  return o;
}

}  // namespace

TEST_CASE("'!variant.metric' reads as == 0", "[verdict][check]") {
  const Spec spec = spec_with_rule(R"([{"if": "!fused.match", "then": "WRONG"}, {"else": "RIGHT"}])");
  CHECK(harness::spec::evaluate_verdict(spec, {{"fused", outcome(1, 0)}}).verdict == "WRONG");
  CHECK(harness::spec::evaluate_verdict(spec, {{"fused", outcome(1, 1)}}).verdict == "RIGHT");
  CHECK_THAT(load_error(R"([{"if": "!fused.match == 1", "then": "A"}, {"else": "B"}])"),
             Catch::Matchers::ContainsSubstring("\"!\" negates a bare numeric read"));
  CHECK_THAT(load_error(R"([{"if": "!fused.status == ok", "then": "A"}, {"else": "B"}])"),
             Catch::Matchers::ContainsSubstring("\"!\" negates a bare numeric read"));
}

TEST_CASE("a clause reached both with the check passed and failed is rejected, naming the fix", "[verdict][check]") {
  // The old bwd_fusion rule: a wrong fused result read as DENSE.
  const std::string old_rule = R"([{"if": "fused.bwd_peak_bytes < 5GiB && fused.match", "then": "FUSED"}, {"else": "DENSE"}])";
  const std::string error = load_error(old_rule);
  CHECK_THAT(error, Catch::Matchers::ContainsSubstring("verdict.1"));
  CHECK_THAT(error, Catch::Matchers::ContainsSubstring("\"DENSE\" is reached both when the checks passed and when fused's correctness check failed"));
  CHECK_THAT(error, Catch::Matchers::ContainsSubstring(R"({"if": "!fused.match", "then": "FUSED_BUT_WRONG"})"));
  // A clause that ignores match and comes first is reached either way.
  CHECK_THAT(load_error(R"([{"if": "fused.bwd_peak_bytes < 5GiB", "then": "FUSED"}, {"if": "!fused.match", "then": "W"}, {"else": "D"}])"),
             Catch::Matchers::ContainsSubstring("verdict.0"));
  // "||" with match: FUSED when small even if wrong.
  CHECK_THAT(load_error(R"([{"if": "fused.match || fused.bwd_peak_bytes < 5GiB", "then": "FUSED"}, {"if": "!fused.match", "then": "W"}, {"else": "D"}])"),
             Catch::Matchers::ContainsSubstring("verdict.0"));
  // The right forms load.
  CHECK(load_error(R"([{"if": "!fused.match", "then": "FUSED_BUT_WRONG"}, {"if": "fused.bwd_peak_bytes < 5GiB", "then": "FUSED"}, {"else": "DENSE"}])").empty());
  CHECK(load_error(R"([{"if": "fused.match", "then": "OK"}, {"else": "MISMATCH"}])").empty());
  CHECK(load_error(R"([{"if": "fused.match == 0 || dense.match == 0", "then": "WRONG"}, {"if": "fused.bwd_peak_bytes < 5GiB", "then": "A"}, {"else": "B"}])").empty());
  // A clause about the trial's status comes before match is recorded at all: not a fall-through.
  CHECK(load_error(R"([{"if": "fused.status != ok", "then": "FAILED"}, {"if": "!fused.match", "then": "W"}, {"if": "fused.bwd_peak_bytes < 5GiB", "then": "A"}, {"else": "B"}])").empty());
  // With check.enabled false there is no check to fall through.
  const Spec unchecked = harness::spec::load_spec_text(R"({"name": "rule", "hypothesis": "h", "kind": "attention_step",
    "dims": {"heads": 4, "kv_heads": 2, "head_dim": 64, "anchors": 8, "context": 256}, "mask": {"type": "causal"},
    "variants": {"fused": {"impl": "fused"}}, "check": {"enabled": false},
    "verdict": [{"if": "fused.bwd_peak_bytes < 5GiB", "then": "FUSED"}, {"else": "DENSE"}]})", "unchecked.json");
  CHECK(unchecked.verdict.size() == 2);
}

TEST_CASE("a rule that never reads match gives INCONCLUSIVE when a variant it reads failed the check", "[verdict][check]") {
  const Spec spec = spec_with_rule(R"([{"if": "fused.bwd_peak_bytes < 5GiB", "then": "FUSED"}, {"else": "DENSE"}])");
  const auto good = harness::spec::evaluate_verdict(spec, {{"fused", outcome(1e6, 1)}, {"dense", outcome(1e10, 1)}});
  CHECK(good.verdict == "FUSED");
  const auto wrong = harness::spec::evaluate_verdict(
      spec, {{"fused", outcome(1e6, 0, "dq max 0.03 > 0.0098, mean 0.005 > 0.0015")}, {"dense", outcome(1e10, 1)}});
  CHECK(wrong.verdict == "INCONCLUSIVE");
  CHECK_THAT(wrong.evidence["reason"].get<std::string>(), Catch::Matchers::ContainsSubstring("fused: dq max 0.03 > 0.0098"));
  // A variant the rule does not read may fail without changing the verdict.
  const auto dense_wrong = harness::spec::evaluate_verdict(spec, {{"fused", outcome(1e6, 1)}, {"dense", outcome(1e10, 0)}});
  CHECK(dense_wrong.verdict == "FUSED");
  // The shipped bwd_fusion reads match itself: FUSED_BUT_WRONG, never DENSE.
  const Spec shipped = harness::spec::load_spec_file(kExperimentsDir + "/bwd_fusion.json");
  CHECK(harness::spec::evaluate_verdict(shipped, {{"fused", outcome(1e6, 0)}, {"dense", outcome(1e10, 1)}}).verdict ==
        "FUSED_BUT_WRONG");
  CHECK(harness::spec::evaluate_verdict(shipped, {{"fused", outcome(1e11, 0)}, {"dense", outcome(1e10, 1)}}).verdict ==
        "FUSED_BUT_WRONG");
  CHECK(harness::spec::evaluate_verdict(shipped, {{"fused", outcome(1e6, 1)}, {"dense", outcome(1e10, 1)}}).verdict == "FUSED");
  CHECK(harness::spec::evaluate_verdict(shipped, {{"fused", outcome(1e11, 1)}, {"dense", outcome(1e10, 1)}}).verdict == "DENSE");
}

TEST_CASE("every shipped spec and profile loads: no verdict a failed check can fall through to", "[verdict][check][shipped]") {
  int loaded = 0;
  for (const auto& entry : fs::directory_iterator(kExperimentsDir)) {
    if (entry.path().extension() != ".json") continue;
    INFO(entry.path().string());
    CHECK_NOTHROW(harness::spec::load_spec_file(entry.path().string()));
    LoadOptions cpu;
    cpu.profile = "cpu";
    const std::string text = [&] {
      std::ifstream in(entry.path());
      return std::string(std::istreambuf_iterator<char>(in), {});
    }();
    if (text.find("\"cpu\"") != std::string::npos) CHECK_NOTHROW(harness::spec::load_spec_file(entry.path().string(), cpu));
    ++loaded;
  }
  CHECK(loaded >= 6);
}

TEST_CASE("the --model option fills heads, kv_heads and head_dim after the profile and before --set", "[spec][model]") {
  REQUIRE(harness::spec::known_models().size() >= 10);
  for (const char* name : {"Llama-3.1-8B", "Llama-3.1-70B", "Qwen2.5-7B", "Qwen2.5-0.5B", "Qwen3-8B", "Mistral-7B",
                           "Gemma-2-9B", "Phi-3-mini", "Falcon-7B", "DeepSeek-V2-Lite"}) {
    INFO(name);
    CHECK(harness::spec::find_model(name));
  }
  const std::string bwd_fusion = kExperimentsDir + "/bwd_fusion.json";
  LoadOptions options;
  options.profile = "cpu";
  options.model = "qwen2.5-7b";  // case does not matter
  Spec spec = harness::spec::load_spec_file(bwd_fusion, options);
  CHECK(spec.dims.heads == 28);
  CHECK(spec.dims.kv_heads == 4);
  CHECK(spec.dims.head_dim == 128);
  CHECK(spec.model == "Qwen2.5-7B");
  CHECK(spec.dims.context == 1024);  // the profile's
  CHECK(spec.resolved["model"] == "Qwen2.5-7B");
  // Resolved once, loaded again (what a trial child and replay do): the same dims.
  const Spec again = harness::spec::parse_spec(spec.resolved, "resolved");
  CHECK(again.dims.heads == 28);
  // --set after the model wins, and the shape is no longer the model's.
  options.overrides = {"dims.heads=56"};
  spec = harness::spec::load_spec_file(bwd_fusion, options);
  CHECK(spec.dims.heads == 56);
  CHECK(spec.model.empty());
  // --set model=NAME is the same as --model.
  LoadOptions by_set;
  by_set.overrides = {"model=Falcon-7B"};
  spec = harness::spec::load_spec_file(bwd_fusion, by_set);
  CHECK(spec.dims.heads == 71);
  CHECK(spec.dims.kv_heads == 1);
  CHECK(spec.dims.head_dim == 64);
  // Unknown: the error names the known ones.
  LoadOptions unknown;
  unknown.model = "GPT-5";
  try {
    harness::spec::load_spec_file(bwd_fusion, unknown);
    FAIL("an unknown model loaded");
  } catch (const SpecError& error) {
    CHECK_THAT(std::string(error.what()), Catch::Matchers::ContainsSubstring("unknown model \"GPT-5\""));
    CHECK_THAT(std::string(error.what()), Catch::Matchers::ContainsSubstring("Llama-3.1-8B"));
  }
  // A python spec has no dims for a model.
  LoadOptions python;
  python.model = "Llama-3.1-8B";
  CHECK_THROWS_WITH(harness::spec::load_spec_file(kExperimentsDir + "/flex_fusion_py.json", python),
                    Catch::Matchers::ContainsSubstring("only attention specs have"));
}

TEST_CASE("a run's verdict over its points: one point's own, the points' common one, or MIXED", "[verdict][run]") {
  const Spec spec = spec_with_rule(
      R"([{"if": "!fused.match", "then": "WRONG"}, {"if": "fused.bwd_peak_bytes < 100", "then": "FUSED"}, {"else": "DENSE"}])");
  const std::vector<nlohmann::json> points = {{{"dims.anchors", 8}}, {{"dims.anchors", 16}}};
  const std::vector<Spec> point_specs = {spec, spec};
  using Outcomes = std::map<std::string, VariantOutcome>;
  const auto one = harness::spec::aggregate_verdict(spec, {points[0]}, {spec}, {Outcomes{{"fused", outcome(10, 1)}}});
  CHECK(one.verdict.verdict == "FUSED");
  CHECK(one.metrics.empty());
  const auto same = harness::spec::aggregate_verdict(
      spec, points, point_specs, {Outcomes{{"fused", outcome(10, 1)}}, Outcomes{{"fused", outcome(20, 1)}}});
  CHECK(same.verdict.verdict == "FUSED");
  REQUIRE(same.verdict.evidence["points"].size() == 2);
  const auto mixed = harness::spec::aggregate_verdict(
      spec, points, point_specs, {Outcomes{{"fused", outcome(10, 1)}}, Outcomes{{"fused", outcome(500, 1)}}});
  CHECK(mixed.verdict.verdict == "MIXED");
  CHECK(mixed.verdict.evidence["points"][1]["verdict"] == "DENSE");
  CHECK(mixed.verdict.evidence["reason"] == "the sweep's points reached different verdicts");
  const auto wrong = harness::spec::aggregate_verdict(
      spec, points, point_specs, {Outcomes{{"fused", outcome(10, 1)}}, Outcomes{{"fused", outcome(10, 0, "dq")}}});
  CHECK(wrong.verdict.verdict == "MIXED");
  CHECK(wrong.verdict.evidence["points"][1]["verdict"] == "WRONG");
}
