// Every shipped spec runs end to end through the built binary at CPU scale: each attention_step
// spec on its CPU profile (a real sweep for anchor_scaling), each python spec with the test
// interpreter (HARNESS_TEST_PYTHON, the venv whose torch the harness links), recording the reason
// where that interpreter or this machine cannot run it. bwd_fusion's own findings are checked in
// test_cli.cpp; here every spec must run to a verdict.

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/catch.h"
#include "tests/cli_support.h"
#include "tests/test_paths.h"

namespace {

namespace fs = std::filesystem;
using harness::test::Result;
using harness::test::Sandbox;
using harness::test::slurp;

std::vector<std::pair<std::string, std::string>> shipped_specs_of_kind(const std::string& kind) {
  std::vector<std::pair<std::string, std::string>> specs;  // (name, path)
  for (const auto& entry : fs::directory_iterator(HARNESS_EXPERIMENTS_DIR)) {
    if (entry.path().extension() != ".json") continue;
    const auto spec = nlohmann::json::parse(slurp(entry.path()));
    if (spec.value("kind", "") == kind) specs.emplace_back(spec.value("name", ""), entry.path().string());
  }
  std::sort(specs.begin(), specs.end());
  return specs;
}

}  // namespace

TEST_CASE("every shipped attention_step spec runs on its CPU profile to a verdict", "[cli][shipped]") {
  const auto specs = shipped_specs_of_kind("attention_step");
  REQUIRE(specs.size() >= 2);  // bwd_fusion, anchor_scaling
  for (const auto& [name, path] : specs) {
    Sandbox box("harness-cli-specs");
    const Result run = box.harness("run " + name + " --device cpu --json --db " + box.db());
    INFO(name << "\n" << run.err);
    REQUIRE(run.exit_code == 0);
    const auto json = nlohmann::json::parse(run.out);
    CHECK(json["run"]["status"] == "ok");
    CHECK(json["run"]["profile"] == "cpu");
    const std::string verdict = json["run"]["verdict"];
    CHECK(verdict != "INVALID");
    CHECK(verdict != "INCONCLUSIVE");
    REQUIRE(!json["trials"].empty());
    for (const auto& trial : json["trials"]) {
      INFO(trial.dump());
      CHECK(trial["status"] == "ok");
    }
  }
}

TEST_CASE("every shipped python spec runs with the test interpreter, or records why it cannot", "[cli][shipped]") {
  const auto specs = shipped_specs_of_kind("python");
  REQUIRE(specs.size() >= 2);  // flex_fusion_py, triton_autotune_race_py
  for (const auto& [name, path] : specs) {
    Sandbox box("harness-cli-specs");
    const Result run =
        box.harness("run " + name + " --device cpu --json --python " + std::string(HARNESS_TEST_PYTHON) + " --db " + box.db());
    INFO(name << "\n" << run.err);
    REQUIRE(run.exit_code == 0);
    const auto json = nlohmann::json::parse(run.out);
    CHECK(json["run"]["status"] == "ok");
    REQUIRE(!json["trials"].empty());
    for (const auto& trial : json["trials"]) {
      INFO(trial.dump());
      const std::string status = trial["status"];
      if (status == "ok") continue;
      // Not runnable here (no GPU, no Triton, inductor on the CPU): a skip with its reason, recorded.
      CHECK(status == "unsupported");
      CHECK_FALSE(trial.value("error", "").empty());
      WARN(name << " / " << trial["variant"].get<std::string>() << " skipped: " << trial.value("error", ""));
    }
  }
}
