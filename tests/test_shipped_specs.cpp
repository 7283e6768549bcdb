// Every spec shipped in experiments/ loads and validates: as written, under each of its profiles,
// and (for sweeps) at every sweep point. The specs are the project's declarative test inputs
// (docs/STYLE.md 5): a shipped spec that stops validating fails here, naming the file and the problem.

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/files.h"
#include "experiments/spec.h"
#include "experiments/sweep.h"
#include "tests/catch.h"
#include "tests/test_paths.h"

namespace {

namespace fs = std::filesystem;
using harness::spec::LoadOptions;
using harness::spec::Spec;
using harness::spec::SpecError;

std::vector<fs::path> shipped_specs() {
  std::vector<fs::path> paths;
  for (const auto& entry : fs::directory_iterator(HARNESS_EXPERIMENTS_DIR))
    if (entry.path().extension() == ".json") paths.push_back(entry.path());
  std::sort(paths.begin(), paths.end());
  return paths;
}

// Loads `path` with `profile`, turning a SpecError into a readable failure.
Spec load(const fs::path& path, const std::string& profile) {
  LoadOptions options;
  options.profile = profile;
  try {
    return harness::spec::load_spec_file(path.string(), options);
  } catch (const SpecError& error) {
    FAIL(path.filename().string() << (profile.empty() ? "" : " (profile " + profile + ")") << ":\n" << error.what());
  }
  throw std::logic_error("unreachable");
}

}  // namespace

TEST_CASE("every shipped spec loads and validates, under every profile and at every sweep point", "[spec][shipped]") {
  const std::vector<fs::path> paths = shipped_specs();
  REQUIRE(paths.size() >= 6);  // bwd_fusion, anchor_scaling, warmup_race, cache_corruption, two python probes
  std::set<std::string> names, kinds;
  for (const fs::path& path : paths) {
    INFO(path.string());
    const nlohmann::json raw = nlohmann::json::parse(harness::read_file(path.string()));
    std::vector<std::string> profiles = {""};
    const nlohmann::json declared = raw.value("profiles", nlohmann::json::object());
    for (const auto& [profile, ignored] : declared.items()) profiles.push_back(profile);
    for (const std::string& profile : profiles) {
      const Spec spec = load(path, profile);
      CHECK(spec.name == path.stem().string());  // `harness run NAME` finds NAME.json
      CHECK_FALSE(spec.hypothesis.empty());
      CHECK_FALSE(spec.variants.empty());
      CHECK_FALSE(spec.verdict.empty());
      CHECK(spec.profile == profile);
      for (const nlohmann::json& point : harness::spec::sweep_points(spec)) {
        INFO("point " << point.dump());
        CHECK_NOTHROW(harness::spec::spec_at_point(spec, point));
      }
      names.insert(spec.name);
      kinds.insert(spec.kind);
    }
  }
  // Each kind the registry knows has at least one shipped spec.
  CHECK(kinds == std::set<std::string>{"attention_step", "autotune_race", "cache_corruption", "python"});
  CHECK(names.count("bwd_fusion") == 1);
}
