// Experiment specs: the real bwd_fusion.json, profiles, --set overrides, the malformed specs of
// tests/specs/bad (each with the messages it must produce), verdict rules and quantities.

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "core/byte_size.h"
#include "experiments/spec.h"
#include "experiments/verdict.h"
#include "tests/catch.h"
#include "tests/test_paths.h"

namespace {

namespace fs = std::filesystem;
using harness::spec::LoadOptions;
using harness::spec::Spec;
using harness::spec::SpecError;
using harness::spec::SpecIssue;
using harness::spec::VariantOutcome;

const std::string kExperimentsDir = HARNESS_EXPERIMENTS_DIR;
const std::string kTestDataDir = HARNESS_TEST_DATA_DIR;
const std::string kBwdFusion = kExperimentsDir + "/bwd_fusion.json";

// A small valid spec; the variants are written in non-alphabetical order on purpose.
const std::string kSmallSpec = R"({
  "name": "small",
  "hypothesis": "A small spec for tests.",
  "kind": "attention_step",
  "dims": {"heads": 4, "kv_heads": 2, "head_dim": 64, "anchors": 8, "context": 256},
  "mask": {"type": "dflash", "documents": 2},
  "variants": {"fused": {"impl": "fused"}, "dense": {"impl": "dense"}},
  "verdict": [{"if": "!fused.match", "then": "FUSED_BUT_WRONG"},
              {"if": "fused.bwd_peak_bytes < 5GiB && fused.match", "then": "FUSED"}, {"else": "DENSE"}],
  "profiles": {"tiny": {"dims": {"anchors": 4, "context": 128}, "mask": {"documents": 1}}}
})";

//! The issues a load reports (empty when it succeeds).
std::vector<SpecIssue> issues_of(const std::function<void()>& load) {
  try {
    load();
  } catch (const SpecError& error) {
    return error.issues();
  }
  return {};
}

bool has_issue(const std::vector<SpecIssue>& issues, const std::string& path, const std::string& fragment) {
  return std::any_of(issues.begin(), issues.end(), [&](const SpecIssue& issue) {
    return issue.path == path && issue.message.find(fragment) != std::string::npos;
  });
}

std::string dump(const std::vector<SpecIssue>& issues) {
  std::string out;
  for (const auto& issue : issues) out += issue.to_string() + "\n";
  return out;
}

Spec small_spec(const std::vector<std::string>& overrides = {}) {
  LoadOptions options;
  options.overrides = overrides;
  return harness::spec::load_spec_text(kSmallSpec, "small.json", options);
}

//! The small spec without its correctness check, and with one rule clause before the else: for
//! tests of the verdict engine with conditions that read no `match` (a rule that could read a
//! failed check as a finding is rejected at load, tested in tests/test_verdict_check.cpp).
Spec unchecked_spec(const std::string& condition, const std::string& then = "FUSED") {
  return small_spec({"check.enabled=false", R"(verdict=[{"if": ")" + condition + R"(", "then": ")" + then +
                                                R"("}, {"else": "DENSE"}])"});
}

std::vector<std::string> variant_names(const Spec& spec) {
  std::vector<std::string> names;
  for (const auto& variant : spec.variants) names.push_back(variant.name);
  return names;
}

}  // namespace

TEST_CASE("bwd_fusion.json loads with the DFlash dims", "[spec]") {
  const Spec spec = harness::spec::load_spec_file(kBwdFusion);
  CHECK(spec.name == "bwd_fusion");
  CHECK(spec.kind == "attention_step");
  CHECK(spec.hypothesis.find("dense path") != std::string::npos);
  CHECK(spec.dims.batch == 1);
  CHECK(spec.dims.heads == 32);
  CHECK(spec.dims.kv_heads == 8);
  CHECK(spec.dims.head_dim == 128);
  CHECK(spec.dims.anchors == 128);
  CHECK(spec.dims.block_size == 16);
  CHECK(spec.dims.context == 8192);
  CHECK(spec.dtype == "bf16");
  CHECK(spec.layers == 1);
  CHECK(spec.mask.kind == harness::kernels::MaskKind::dflash);
  CHECK(spec.mask.context_rule == harness::kernels::ContextRule::before_anchor);
  CHECK(spec.mask.in_block == harness::kernels::InBlock::bidirectional);
  CHECK(spec.mask.documents == 4);
  CHECK(spec.mask_block == 128);
  CHECK(variant_names(spec) == std::vector<std::string>{"fused", "dense"});
  CHECK(spec.variants[0].impl == "fused");
  CHECK(spec.variants[1].impl == "dense");
  CHECK(spec.measure ==
        std::vector<std::string>{"fwd_peak_bytes", "bwd_peak_bytes", "fwd_ms", "bwd_ms", "max_abs_err", "dispatch"});
  CHECK(spec.repeats == 3);
  CHECK(spec.warmup == 1);
  CHECK(spec.timeout_s == 600.0);
  CHECK(spec.check);
  CHECK(spec.tolerance.factor == 2.0);
  CHECK(spec.tolerance.mean_factor == 1.5);
  CHECK(spec.tolerance.atol == 0.0);
  REQUIRE(spec.verdict.size() == 3);
  CHECK(spec.verdict[0].condition == "!fused.match");
  CHECK(spec.verdict[0].then == "FUSED_BUT_WRONG");
  CHECK(spec.verdict[1].condition == "fused.bwd_peak_bytes < 5GiB");
  CHECK(spec.verdict[1].then == "FUSED");
  CHECK(spec.verdict[2].condition.empty());
  CHECK(spec.verdict[2].then == "DENSE");
  CHECK(spec.profile.empty());
  CHECK(spec.source == kBwdFusion);
  CHECK(!spec.resolved.contains("profiles"));
  CHECK(spec.resolved["profile"] == "");
  CHECK(spec.resolved["variant_order"] == nlohmann::json::array({"fused", "dense"}));
  CHECK(spec.resolved["dims"]["context"] == 8192);
}

TEST_CASE("bwd_fusion.json's cpu profile keeps the structure at CPU scale", "[spec]") {
  LoadOptions options;
  options.profile = "cpu";
  const Spec spec = harness::spec::load_spec_file(kBwdFusion, options);
  CHECK(spec.profile == "cpu");
  CHECK(spec.dims.heads == 4);
  CHECK(spec.dims.kv_heads == 2);
  CHECK(spec.dims.head_dim == 64);
  CHECK(spec.dims.anchors == 32);
  CHECK(spec.dims.context == 1024);
  // Merged, not replaced: what the profile does not mention stays as written.
  CHECK(spec.dims.block_size == 16);
  CHECK(spec.dtype == "bf16");
  CHECK(spec.mask.kind == harness::kernels::MaskKind::dflash);
  CHECK(spec.mask.documents == 4);
  CHECK(spec.dims.heads > spec.dims.kv_heads);  // still GQA
  CHECK(spec.dims.anchors <=
        harness::kernels::count_valid_anchor_positions(spec.mask, spec.dims.context, spec.dims.block_size));
  CHECK(variant_names(spec) == std::vector<std::string>{"fused", "dense"});
  REQUIRE(spec.verdict.size() == 3);
  CHECK(spec.verdict[1].condition.find("12MiB") != std::string::npos);
  CHECK(spec.resolved["profile"] == "cpu");
  CHECK(spec.resolved["dims"]["heads"] == 4);
  CHECK(spec.resolved["dims"]["kv_heads"] == 2);
  CHECK(!spec.resolved.contains("profiles"));

  nlohmann::json raw;
  std::ifstream(kBwdFusion) >> raw;
  CHECK(harness::spec::has_profile(raw, "cpu"));
  CHECK(!harness::spec::has_profile(raw, "gpu"));
}

TEST_CASE("a resolved spec parses back to the same spec, variant order included", "[spec]") {
  LoadOptions options;
  options.profile = "cpu";
  const Spec spec = harness::spec::load_spec_file(kBwdFusion, options);
  // What the db stores: sorted keys, as text.
  const nlohmann::json stored = nlohmann::json::parse(spec.resolved.dump());
  const Spec again = harness::spec::parse_spec(stored, "db");
  CHECK(variant_names(again) == std::vector<std::string>{"fused", "dense"});
  CHECK(again.profile == "cpu");
  CHECK(again.dims.anchors == spec.dims.anchors);
  CHECK(again.resolved == spec.resolved);

  nlohmann::json reordered = stored;
  reordered["variant_order"] = {"dense", "fused"};
  CHECK(variant_names(harness::spec::parse_spec(reordered, "db")) == std::vector<std::string>{"dense", "fused"});
  reordered["variant_order"] = {"dense"};
  CHECK(has_issue(issues_of([&] { harness::spec::parse_spec(reordered, "db"); }), "variant_order",
                  "expected each variant name once"));
}

TEST_CASE("overrides (--set) change numbers, strings and nested fields after the profile", "[spec]") {
  SECTION("a number") {
    const Spec spec = small_spec({"dims.anchors=16"});
    CHECK(spec.dims.anchors == 16);
    CHECK(spec.resolved["dims"]["anchors"] == 16);
  }
  SECTION("a string that is not JSON") {
    const Spec spec = small_spec({"mask.type=causal"});
    CHECK(spec.mask.kind == harness::kernels::MaskKind::causal);
    CHECK(spec.resolved["mask"]["type"] == "causal");
  }
  SECTION("nested fields, array indices and new objects") {
    const Spec spec = small_spec(
        {"variants.fused.impl=dense", "verdict.1.then=OK", "block_mask.block_size=64", "mask.in_block=causal"});
    CHECK(spec.variants[0].impl == "dense");
    CHECK(spec.verdict[1].then == "OK");
    CHECK(spec.mask_block == 64);
    CHECK(spec.mask.in_block == harness::kernels::InBlock::causal);
  }
  SECTION("a JSON value replaces a whole subtree") {
    const Spec spec = small_spec({R"(mask={"type": "sliding_window", "window": 32})"});
    CHECK(spec.mask.kind == harness::kernels::MaskKind::sliding_window);
    CHECK(spec.mask.window == 32);
    CHECK(spec.mask.documents == 1);
  }
  SECTION("a new variant goes after the written ones") {
    const Spec spec = small_spec({"variants.extra.impl=dense"});
    CHECK(variant_names(spec) == std::vector<std::string>{"fused", "dense", "extra"});
  }
  SECTION("overrides apply after the profile") {
    LoadOptions options;
    options.profile = "tiny";
    options.overrides = {"dims.anchors=2"};
    const Spec spec = harness::spec::load_spec_text(kSmallSpec, "small.json", options);
    CHECK(spec.dims.anchors == 2);
    CHECK(spec.dims.context == 128);
    CHECK(spec.mask.documents == 1);
  }
  SECTION("an unknown path is an issue naming the override") {
    const auto issues = issues_of([] { small_spec({"dims.anchorz=3"}); });
    REQUIRE(issues.size() == 1);
    CHECK(issues[0].source == "small.json (--set dims.anchorz=3)");
    CHECK(issues[0].path == "dims.anchorz");
    CHECK(issues[0].message.find("unknown field \"anchorz\"; known fields of dims: batch, heads") == 0);
  }
  SECTION("every bad override is reported, with the file's own problems") {
    const auto issues = issues_of([] {
      small_spec({"dims.anchorz=3", "anchors=8", "dims.heads.x=1", "verdict.first.then=X", "dims.heads=-4", "oops",
                  "profiles.tiny.dims.anchors=1"});
    });
    CHECK(issues.size() == 7);
    CHECK(has_issue(issues, "dims.anchorz", "unknown field"));
    CHECK(has_issue(issues, "anchors", "unknown field \"anchors\"; known fields: name, hypothesis"));
    CHECK(has_issue(issues, "dims.heads.x", "dims.heads is a value"));
    CHECK(has_issue(issues, "verdict.first", "expected an index"));
    CHECK(has_issue(issues, "dims.heads", "expected a positive integer, got -4 (number)"));
    CHECK(has_issue(issues, "", "--set expects path=value"));
    CHECK(has_issue(issues, "profiles", "applied before overrides"));
  }
}

TEST_CASE("malformed specs report the expected messages", "[spec]") {
  // Each tests/specs/bad/NAME.json has NAME.expect: one expected substring of the error text per
  // line, plus directives: "@profile P", "@set path=value", "@allow_faults", "@issues N".
  const fs::path bad_dir = fs::path(kTestDataDir) / "specs" / "bad";
  std::vector<fs::path> specs;
  for (const auto& entry : fs::directory_iterator(bad_dir)) {
    if (entry.path().extension() == ".json") specs.push_back(entry.path());
  }
  std::sort(specs.begin(), specs.end());
  REQUIRE(specs.size() >= 12);
  for (const fs::path& spec_path : specs) {
    fs::path expect_path = spec_path;
    expect_path.replace_extension(".expect");
    INFO("spec: " << spec_path.string());
    REQUIRE(fs::exists(expect_path));
    LoadOptions options;
    std::vector<std::string> fragments;
    int expected_issues = -1;
    std::ifstream expect(expect_path);
    for (std::string line; std::getline(expect, line);) {
      if (line.empty() || line[0] == '#') continue;
      if (line.rfind("@profile ", 0) == 0) {
        options.profile = line.substr(9);
      } else if (line.rfind("@set ", 0) == 0) {
        options.overrides.push_back(line.substr(5));
      } else if (line == "@allow_faults") {
        options.allow_faults = true;
      } else if (line.rfind("@issues ", 0) == 0) {
        expected_issues = std::stoi(line.substr(8));
      } else {
        fragments.push_back(line);
      }
    }
    REQUIRE(!fragments.empty());
    std::string message;
    size_t issue_count = 0;
    try {
      harness::spec::load_spec_file(spec_path.string(), options);
    } catch (const SpecError& error) {
      message = error.what();
      issue_count = error.issues().size();
    }
    INFO("error text:\n" << message);
    REQUIRE(!message.empty());
    for (const std::string& fragment : fragments) {
      INFO("expected fragment: " << fragment);
      CHECK(message.find(fragment) != std::string::npos);
    }
    if (expected_issues >= 0) CHECK(issue_count == static_cast<size_t>(expected_issues));
    // One issue per line, each naming the file.
    const auto lines = static_cast<size_t>(std::count(message.begin(), message.end(), '\n') + 1);
    CHECK(lines == issue_count);
    CHECK(message.find(spec_path.string()) == 0);
  }
}

TEST_CASE("a spec with several problems reports all of them", "[spec]") {
  const std::string text = R"({
    "name": "Many Problems",
    "kind": "attention_step",
    "dims": {"heads": 32, "kv_heads": 6, "head_dim": 80, "anchors": 0, "context": 8192, "dtype": "fp8"},
    "mask": {"type": "dflash", "in_block": "sideways", "seeed": 1},
    "variants": {"fused": {"impl": "flash"}},
    "repeats": 0,
    "verdict": [{"if": "fused.bwd_peak_bytes < 5 parsecs", "then": "FUSED"}]
  })";
  const auto issues = issues_of([&] { harness::spec::load_spec_text(text, "many.json"); });
  INFO(dump(issues));
  CHECK(has_issue(issues, "mask.seeed", "unknown field \"seeed\"; known fields of mask: type, context_rule"));
  CHECK(has_issue(issues, "name", "must match [a-z0-9_]+"));
  CHECK(has_issue(issues, "hypothesis", "required field is missing"));
  CHECK(has_issue(issues, "dims.anchors", "expected a positive integer, got 0 (number)"));
  CHECK(has_issue(issues, "dims.dtype", "unknown dtype \"fp8\""));
  CHECK(has_issue(issues, "dims.head_dim", "unsupported head_dim 80; supported: 64, 96, 128, 192, 256 (on the CPU every"));
  CHECK(has_issue(issues, "dims.heads", "heads (32) must be a multiple of kv_heads (6)"));
  CHECK(has_issue(issues, "mask.in_block", "unknown in_block \"sideways\""));
  CHECK(has_issue(issues, "variants.fused.impl", "unknown impl \"flash\" for kind attention_step; known: fused, dense"));
  CHECK(has_issue(issues, "repeats", "expected a positive integer, got 0 (number)"));
  CHECK(has_issue(issues, "verdict.0.if", "expected a number with an optional unit"));
  CHECK(has_issue(issues, "verdict", "no final {\"else\": ...} clause"));
  CHECK(issues.size() == 12);
  for (const auto& issue : issues) CHECK(issue.source == "many.json");
  try {
    harness::spec::load_spec_text(text, "many.json");
  } catch (const SpecError& error) {
    const std::string what = error.what();
    CHECK(static_cast<size_t>(std::count(what.begin(), what.end(), '\n') + 1) == issues.size());
    CHECK(what.find("many.json: dims.heads: heads (32)") != std::string::npos);
  }
}

TEST_CASE("head dims: FlashAttention-3's, v_head_dim apart from head_dim", "[spec]") {
  const Spec mla = small_spec({"dims.head_dim=192", "dims.v_head_dim=128"});
  CHECK(mla.dims.head_dim == 192);
  CHECK(mla.dims.value_head_dim() == 128);
  CHECK(small_spec({"dims.head_dim=96"}).dims.value_head_dim() == 96);  // v_head_dim defaults to head_dim
  for (const char* dim : {"64", "96", "128", "192", "256"}) CHECK_NOTHROW(small_spec({std::string("dims.head_dim=") + dim}));
  const auto issues = issues_of([] { small_spec({"dims.v_head_dim=0"}); });
  CHECK(has_issue(issues, "dims.v_head_dim", "expected a positive integer"));
}

TEST_CASE("a blockmask spec names the file of its bits, made absolute from the spec's folder", "[spec]") {
  const fs::path dir = fs::temp_directory_path() / ("harness_blockmask_spec_" + std::to_string(::getpid()));
  fs::create_directories(dir / "masks");
  std::ofstream(dir / "masks" / "tree.safetensors") << "bits";
  std::string text = kSmallSpec;
  const std::string dflash = R"("mask": {"type": "dflash", "documents": 2})";
  text.replace(text.find(dflash), dflash.size(), R"("mask": {"type": "blockmask", "file": "masks/tree.safetensors"})");
  text.replace(text.find(R"(, "mask": {"documents": 1})"), std::string(R"(, "mask": {"documents": 1})").size(), "");
  const Spec spec = harness::spec::load_spec_text(text, (dir / "spec.json").string());
  CHECK(spec.mask.kind == harness::kernels::MaskKind::blockmask);
  CHECK(spec.mask.file == (dir / "masks" / "tree.safetensors").string());
  CHECK(spec.resolved["mask"]["file"] == spec.mask.file);
  // Parsed again from anywhere (the trial child), the absolute path still names the file.
  CHECK(harness::spec::parse_spec(spec.resolved, "elsewhere").mask.file == spec.mask.file);
  const Spec from_capsule = harness::spec::parse_spec(
      [&] {
        nlohmann::json resolved = spec.resolved;
        resolved["mask"] = {{"type", "blockmask"}, {"in_capsule", true}};
        return resolved;
      }(),
      "capsule");
  CHECK(from_capsule.mask.in_capsule);
  CHECK(from_capsule.mask.file.empty());
  fs::remove_all(dir);
}

TEST_CASE("verdict rules decide from the variants' outcomes", "[spec]") {
  const Spec spec = small_spec();
  const auto ok = [](double bwd_peak_bytes, double match) {
    return VariantOutcome{"ok", "", {{"bwd_peak_bytes", bwd_peak_bytes}, {"match", match}}};
  };

  SECTION("FUSED when the fused backward stays small and matches") {
    const auto verdict = harness::spec::evaluate_verdict(spec, {{"fused", ok(1.6e8, 1)}, {"dense", ok(1.9e10, 1)}});
    CHECK(verdict.verdict == "FUSED");
    CHECK(verdict.evidence["clause"] == 1);
    REQUIRE(verdict.evidence["values"].size() == 2);
    CHECK(verdict.evidence["values"][0]["variant"] == "fused");
    CHECK(verdict.evidence["values"][0]["metric"] == "bwd_peak_bytes");
    CHECK(verdict.evidence["values"][0]["value"] == 1.6e8);
    CHECK(verdict.evidence["values"][0]["threshold"] == 5.0 * 1024 * 1024 * 1024);
    CHECK(verdict.evidence["values"][0]["held"] == true);
    CHECK(verdict.evidence["values"][1]["metric"] == "match");
    CHECK(verdict.evidence["values"][1]["held"] == true);
  }
  SECTION("DENSE when the fused backward is large; the else clause lists what was rejected") {
    const auto verdict = harness::spec::evaluate_verdict(spec, {{"fused", ok(1.785e10, 1)}, {"dense", ok(1.9e10, 1)}});
    CHECK(verdict.verdict == "DENSE");
    CHECK(verdict.evidence["else"] == true);
    REQUIRE(verdict.evidence["rejected"].size() == 2);  // the failed-check clause, then the FUSED one
    const auto& values = verdict.evidence["rejected"][1]["values"];
    REQUIRE(values.size() == 1);  // && stops at the first comparison that fails
    CHECK(values[0]["held"] == false);
  }
  SECTION("FUSED_BUT_WRONG when the fused output does not match") {
    CHECK(harness::spec::evaluate_verdict(spec, {{"fused", ok(1.6e8, 0)}, {"dense", ok(1.9e10, 1)}}).verdict ==
          "FUSED_BUT_WRONG");
  }
  SECTION("units: 5GiB is 5368709120 bytes, not 5e9") {
    CHECK(harness::spec::evaluate_verdict(spec, {{"fused", ok(5.3e9, 1)}}).verdict == "FUSED");
    CHECK(harness::spec::evaluate_verdict(spec, {{"fused", ok(5.4e9, 1)}}).verdict == "DENSE");
  }
  SECTION("INVALID when a variant the rule reads is unsupported") {
    const auto verdict = harness::spec::evaluate_verdict(
        spec,
        {{"fused", {"unsupported", "head_dim 96 is not supported by the CUDA kernel", {}}}, {"dense", ok(1e10, 1)}});
    CHECK(verdict.verdict == "INVALID");
    CHECK(verdict.evidence["variant"] == "fused");
    CHECK(verdict.evidence["status"] == "unsupported");
    CHECK(verdict.evidence["error"] == "head_dim 96 is not supported by the CUDA kernel");
    CHECK(verdict.evidence["clause"] == 0);
  }
  SECTION("INCONCLUSIVE when a variant the rule reads crashed before measuring") {
    const auto verdict = harness::spec::evaluate_verdict(
        spec, {{"fused", {"crashed", "signal 11 (SIGSEGV)", {{"fwd_peak_bytes", 1e8}}}}, {"dense", ok(1e10, 1)}});
    CHECK(verdict.verdict == "INCONCLUSIVE");
    CHECK(verdict.evidence["variant"] == "fused");
    CHECK(verdict.evidence["status"] == "crashed");
    CHECK(verdict.evidence["error"] == "signal 11 (SIGSEGV)");
    CHECK(verdict.evidence["metric"] == "match");  // the first clause reads it
    CHECK(verdict.evidence["reason"].get<std::string>().find("crashed") != std::string::npos);
  }
  SECTION("a failed variant the rule does not read does not matter") {
    const auto verdict = harness::spec::evaluate_verdict(
        spec, {{"fused", ok(1.6e8, 1)}, {"dense", {"oom", "CUDA out of memory. Tried to allocate 15.09 GiB", {}}}});
    CHECK(verdict.verdict == "FUSED");
  }
  SECTION("a clause that is false whatever the failed variant measured is rejected, not undecided") {
    const Spec both = unchecked_spec("dense.bwd_peak_bytes > 10GiB && fused.bwd_peak_bytes < 5GiB");
    const VariantOutcome crashed{"crashed", "signal 6 (SIGABRT)", {}};
    const auto rejected = harness::spec::evaluate_verdict(both, {{"fused", ok(6e9, 1)}, {"dense", crashed}});
    CHECK(rejected.verdict == "DENSE");
    const auto undecided = harness::spec::evaluate_verdict(both, {{"fused", ok(1e9, 1)}, {"dense", crashed}});
    CHECK(undecided.verdict == "INCONCLUSIVE");
    CHECK(undecided.evidence["variant"] == "dense");
    CHECK(undecided.evidence["comparison"] == "dense.bwd_peak_bytes > 10GiB");
    REQUIRE(undecided.evidence["values"].size() == 1);
    CHECK(undecided.evidence["values"][0]["variant"] == "fused");
  }
  SECTION("an alternative that holds decides the clause even when another cannot be read") {
    const Spec either = unchecked_spec("fused.fwd_ms < 1ms || dense.status == oom");
    const VariantOutcome unsupported{"unsupported", "no sm_90 device", {}};
    CHECK(harness::spec::evaluate_verdict(either, {{"fused", unsupported}, {"dense", {"oom", "out of memory", {}}}})
              .verdict == "FUSED");
    const auto invalid = harness::spec::evaluate_verdict(either, {{"fused", unsupported}, {"dense", ok(1e9, 1)}});
    CHECK(invalid.verdict == "INVALID");
    CHECK(invalid.evidence["error"] == "no sm_90 device");
  }
  SECTION("a metric a failed trial did produce can still be read") {
    const Spec fwd = unchecked_spec("fused.fwd_peak_bytes < 1GB");
    const auto verdict =
        harness::spec::evaluate_verdict(fwd, {{"fused", {"oom", "bwd ran out of memory", {{"fwd_peak_bytes", 8e7}}}}});
    CHECK(verdict.verdict == "FUSED");
  }
  SECTION("|| binds looser than &&, and status compares with a word") {
    const Spec either = unchecked_spec("fused.status == ok && fused.fwd_ms < 1.5ms || dense.status != ok", "GOOD");
    const auto timing = [](const std::string& status, double fwd_ms) {
      return VariantOutcome{status, "", {{"fwd_ms", fwd_ms}}};
    };
    CHECK(
        harness::spec::evaluate_verdict(either, {{"fused", timing("ok", 1.0)}, {"dense", timing("ok", 9.0)}}).verdict ==
        "GOOD");
    CHECK(
        harness::spec::evaluate_verdict(either, {{"fused", timing("ok", 2.0)}, {"dense", timing("ok", 9.0)}}).verdict ==
        "DENSE");
    CHECK(harness::spec::evaluate_verdict(either, {{"fused", timing("ok", 2.0)}, {"dense", timing("timeout", 0)}})
              .verdict == "GOOD");
    // fused timed out: its status is readable, so the && fails and the || reads dense.
    const auto verdict =
        harness::spec::evaluate_verdict(either, {{"fused", timing("timeout", 0)}, {"dense", timing("ok", 9.0)}});
    CHECK(verdict.verdict == "DENSE");
    CHECK(verdict.evidence["rejected"][0]["values"][0]["value"] == "timeout");
    CHECK(verdict.evidence["rejected"][0]["values"][1]["variant"] == "dense");
  }
  SECTION("times take units") {
    const Spec slow = unchecked_spec("dense.bwd_ms > 0.5s", "SLOW");
    const auto timing = [](double bwd_ms) { return VariantOutcome{"ok", "", {{"bwd_ms", bwd_ms}}}; };
    CHECK(harness::spec::evaluate_verdict(slow, {{"dense", timing(600)}}).verdict == "SLOW");
    CHECK(harness::spec::evaluate_verdict(slow, {{"dense", timing(400)}}).verdict == "DENSE");
  }
}

TEST_CASE("verdict conditions are checked for syntax, metrics and units", "[spec]") {
  const std::vector<std::string> variants = {"fused", "dense"};
  CHECK(harness::spec::check_verdict_condition("fused.bwd_peak_bytes < 5GiB && fused.match", variants).empty());
  CHECK(
      harness::spec::check_verdict_condition("dense.status == oom || fused.dq_max_abs_err <= 1e-2", variants).empty());
  CHECK(harness::spec::check_verdict_condition("fused.bwd_ms >= 250us", variants).empty());
  CHECK(harness::spec::check_verdict_condition("fused.bwd_ms < 5GiB", variants).size() == 1);
  CHECK(harness::spec::check_verdict_condition("fused.max_abs_err < 3ms", variants).size() == 1);
  CHECK(harness::spec::check_verdict_condition("fused.status < 3", variants).size() == 1);
  CHECK(harness::spec::check_verdict_condition("fused.status", variants).size() == 1);
  CHECK(harness::spec::check_verdict_condition("", variants).size() == 1);
  CHECK(harness::spec::check_verdict_condition("fused", variants).size() == 1);
  CHECK(harness::spec::check_verdict_condition("other.match && another.match", variants).size() == 2);
  const auto reads =
      harness::spec::verdict_condition_reads("fused.bwd_peak_bytes < 5GiB && dense.match || fused.status == ok");
  CHECK(reads == std::vector<std::pair<std::string, std::string>>{
                     {"fused", "bwd_peak_bytes"}, {"dense", "match"}, {"fused", "status"}});
  CHECK_THROWS_AS(harness::spec::verdict_condition_reads("fused.bwd_peak_bytes <"), std::invalid_argument);
}

TEST_CASE("parse_quantity reads sizes and durations in base units", "[spec]") {
  const auto near = [](const std::optional<double>& got, double expected) {
    return got && std::abs(*got - expected) <= 1e-9 * std::max(1.0, std::abs(expected));
  };
  CHECK(near(harness::spec::parse_quantity("5GiB"), 5.0 * 1024 * 1024 * 1024));
  CHECK(near(harness::spec::parse_quantity("512MiB"), 512.0 * 1024 * 1024));
  CHECK(near(harness::spec::parse_quantity("4KiB"), 4096));
  CHECK(near(harness::spec::parse_quantity("3e9"), 3e9));
  CHECK(near(harness::spec::parse_quantity("17.85GB"), 17.85e9));
  CHECK(near(harness::spec::parse_quantity("2MB"), 2e6));
  CHECK(near(harness::spec::parse_quantity("1KB"), 1e3));
  CHECK(near(harness::spec::parse_quantity("100B"), 100));
  CHECK(near(harness::spec::parse_quantity("2.5ms"), 2.5));
  CHECK(near(harness::spec::parse_quantity("1s"), 1000));
  CHECK(near(harness::spec::parse_quantity("250us"), 0.25));
  CHECK(near(harness::spec::parse_quantity(" 5 GiB "), 5.0 * 1024 * 1024 * 1024));
  CHECK(near(harness::spec::parse_quantity("-1"), -1));
  CHECK(!harness::spec::parse_quantity(""));
  CHECK(!harness::spec::parse_quantity("GiB"));
  CHECK(!harness::spec::parse_quantity("5 parsecs"));
  CHECK(!harness::spec::parse_quantity("5gib"));
  CHECK(!harness::spec::parse_quantity("inf"));
  CHECK(!harness::spec::parse_quantity("nan"));
  CHECK(!harness::spec::parse_quantity("5GiB5"));
}

TEST_CASE("find_spec searches directories in order and accepts paths", "[spec]") {
  const fs::path root = fs::temp_directory_path() / ("harness_find_spec_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "first");
  fs::create_directories(root / "second");
  std::ofstream(root / "second" / "alpha.json") << "{}";
  std::ofstream(root / "first" / "beta.json") << "{}";
  std::ofstream(root / "second" / "beta.json") << "{}";
  const std::vector<std::string> dirs = {(root / "first").string(), (root / "second").string()};

  CHECK(harness::spec::find_spec("alpha", dirs) == (root / "second" / "alpha.json").string());
  CHECK(harness::spec::find_spec("alpha.json", dirs) == (root / "second" / "alpha.json").string());
  CHECK(harness::spec::find_spec("beta", dirs) == (root / "first" / "beta.json").string());
  CHECK(harness::spec::find_spec((root / "second" / "beta.json").string(), {}) ==
        (root / "second" / "beta.json").string());
  CHECK(!harness::spec::find_spec("gamma", dirs));
  CHECK(!harness::spec::find_spec((root / "missing.json").string(), dirs));
  CHECK(harness::spec::find_spec("bwd_fusion", {kExperimentsDir}) == kExperimentsDir + "/bwd_fusion.json");
  fs::remove_all(root);
}

TEST_CASE("a missing spec file is a SpecError naming it", "[spec]") {
  const auto issues = issues_of([] { harness::spec::load_spec_file("/nonexistent/spec.json"); });
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].source == "/nonexistent/spec.json");
  CHECK(issues[0].message.find("cannot open") != std::string::npos);
}

TEST_CASE("parse_byte_size accepts sizes and refuses durations", "[spec]") {
  REQUIRE(harness::parse_byte_size("96GiB").has_value());
  CHECK(*harness::parse_byte_size("96GiB") == 96.0 * 1024 * 1024 * 1024);
  CHECK(*harness::parse_byte_size("512MiB") == 512.0 * 1024 * 1024);
  CHECK(*harness::parse_byte_size("3e9") == 3e9);
  CHECK_FALSE(harness::parse_byte_size("5ms").has_value());
  CHECK_FALSE(harness::parse_byte_size("2s").has_value());
  CHECK_FALSE(harness::parse_byte_size("lots").has_value());
}

TEST_CASE("a variant chooses the CUDA kernels and the deterministic backward", "[spec]") {
  const Spec spec = small_spec({"variants.fused.kernel.fwd=wgmma_m64_n64", "variants.fused.kernel.bwd=mma",
                                "variants.fused.deterministic=true"});
  REQUIRE(spec.variants[0].name == "fused");
  CHECK(spec.variants[0].fwd_kernel == "wgmma_m64_n64");
  CHECK(spec.variants[0].bwd_kernel == "mma");
  CHECK(spec.variants[0].deterministic);
  CHECK(harness::spec::kernel_choice_text(spec.variants[0]) == "fwd=wgmma_m64_n64 bwd=mma deterministic=true");
  // Unset: autotuned, not deterministic, nothing to record.
  CHECK(spec.variants[1].fwd_kernel.empty());
  CHECK_FALSE(spec.variants[1].deterministic);
  CHECK(harness::spec::kernel_choice_text(spec.variants[1]).empty());
  const Spec only_bwd = small_spec({"variants.fused.kernel.bwd=wgmma", "variants.fused.deterministic=false"});
  CHECK(harness::spec::kernel_choice_text(only_bwd.variants[0]) == "fwd=autotuned bwd=wgmma deterministic=false");
  // Every name the CUDA kernels know is accepted.
  for (const auto& name : harness::spec::known_fwd_kernels()) {
    CHECK(small_spec({"variants.fused.kernel.fwd=" + name}).variants[0].fwd_kernel == name);
  }
  for (const auto& name : harness::spec::known_bwd_kernels()) {
    CHECK(small_spec({"variants.fused.kernel.bwd=" + name}).variants[0].bwd_kernel == name);
  }
}

TEST_CASE("a wrong kernel choice names the field and the known kernels", "[spec]") {
  const auto load = [](const std::vector<std::string>& overrides) {
    return issues_of([&] { small_spec(overrides); });
  };
  auto issues = load({"variants.fused.kernel.fwd=wgmma_m256"});
  INFO(dump(issues));
  // The list comes from kernels/cuda/attention_config.h, so a new kernel joins it by itself.
  const auto listed = [](const std::vector<std::string>& names) {
    std::string text;
    for (const auto& name : names) text += (text.empty() ? "" : ", ") + name;
    return text;
  };
  const auto fwd = harness::spec::known_fwd_kernels(), bwd = harness::spec::known_bwd_kernels();
  CHECK(std::find(fwd.begin(), fwd.end(), "wgmma_m64_n64") != fwd.end());
  CHECK(std::find(fwd.begin(), fwd.end(), "mma_m128_n64") != fwd.end());
  CHECK(std::find(bwd.begin(), bwd.end(), "wgmma") != bwd.end());
  CHECK(has_issue(issues, "variants.fused.kernel.fwd", "unknown fwd kernel \"wgmma_m256\"; known: " + listed(fwd)));
  CHECK(issues.size() == 1);
  issues = load({"variants.fused.kernel.bwd=fast"});
  CHECK(has_issue(issues, "variants.fused.kernel.bwd", "unknown bwd kernel \"fast\"; known: " + listed(bwd)));
  issues = load({"variants.dense.kernel.fwd=wgmma_m64_n64"});
  CHECK(has_issue(issues, "variants.dense.kernel", "applies to the fused CUDA kernels; impl \"dense\" runs none"));
  issues = load({"variants.dense.deterministic=true"});
  CHECK(has_issue(issues, "variants.dense.deterministic", "impl \"dense\" runs none"));
  CHECK(load({"variants.dense.deterministic=false"}).empty());
  issues = load({"variants.fused.deterministic=\"yes\""});
  CHECK(has_issue(issues, "variants.fused.deterministic", "expected true or false"));
  issues = load({"variants.fused.kernel.forward=wgmma_m64_n64"});
  CHECK(has_issue(issues, "variants.fused.kernel.forward", "unknown field \"forward\""));
  const std::string text = R"({
    "name": "k", "hypothesis": "h", "kind": "attention_step",
    "dims": {"heads": 4, "kv_heads": 2, "head_dim": 64, "anchors": 8, "context": 256},
    "mask": {"type": "dflash"}, "variants": {"fused": {"impl": "fused", "kernel": "wgmma_m64_n64"}},
    "verdict": [{"else": "DONE"}]})";
  issues = issues_of([&] { harness::spec::load_spec_text(text, "k.json"); });
  CHECK(has_issue(issues, "variants.fused.kernel", "expected an object such as {\"fwd\": \"wgmma_m64_n64\""));
}
