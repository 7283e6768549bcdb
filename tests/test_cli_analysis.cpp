// `harness diff` and `harness writeup` end to end through the built binary, on real CPU runs of
// bwd_fusion at tiny dims: two envs (OMP_NUM_THREADS is part of the fingerprint) and two anchor
// counts, so the diff has a known component and a known memory change to find.

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/catch.h"
#include "tests/cli_support.h"
#include "tests/test_paths.h"

namespace {

namespace fs = std::filesystem;

using harness::test::has;
using harness::test::Result;
using harness::test::slurp;

// Small enough that a run (env probe and two trials, each its own process) takes seconds on the CPU.
const std::string kTinyDims =
    " --set dims.heads=2 --set dims.kv_heads=1 --set dims.head_dim=64 --set dims.context=256 --set mask.documents=1"
    " --set repeats=2";

// One scratch folder and db for every test here, with the runs made once (they are the slow part).
class Runs {
 public:
  static Runs& get() {
    static Runs runs;
    return runs;
  }
  ~Runs() {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  Runs(const Runs&) = delete;
  Runs& operator=(const Runs&) = delete;

  std::string db() const { return (dir_ / "runs.db").string(); }
  fs::path dir() const { return dir_; }

  Result harness(const std::string& args, const std::string& env = "") const {
    return harness::test::run_harness(args, dir_, env);
  }

  int64_t a = 0, b = 0, other = 0;
  std::string env_a, env_b;

 private:
  Runs() {
    dir_ = harness::test::make_scratch_dir("harness-cli-analysis");
    a = run("bwd_fusion", " --set dims.anchors=8", "OMP_NUM_THREADS=1", env_a);
    b = run("bwd_fusion", " --set dims.anchors=16", "OMP_NUM_THREADS=2", env_b);
    // The same spec under another name: a second experiment.
    auto spec = nlohmann::json::parse(slurp(fs::path(HARNESS_EXPERIMENTS_DIR) / "bwd_fusion.json"));
    spec["name"] = "bwd_fusion_copy";
    std::ofstream(dir_ / "bwd_fusion_copy.json") << spec.dump();
    std::string ignored;
    other = run((dir_ / "bwd_fusion_copy.json").string(), " --set dims.anchors=8", "OMP_NUM_THREADS=1", ignored);
  }

  int64_t run(const std::string& experiment, const std::string& sets, const std::string& env, std::string& env_id) {
    const Result result = harness("run " + experiment + " --device cpu --json" + kTinyDims + sets + " --db " + db(), env);
    if (result.exit_code != 0) throw std::runtime_error("harness run failed: " + result.err);
    const auto json = nlohmann::json::parse(result.out);
    env_id = json["run"]["env_id"].get<std::string>();
    return json["run"]["id"].get<int64_t>();
  }

  fs::path dir_;
};

std::string ids(int64_t a, int64_t b) { return std::to_string(a) + " " + std::to_string(b); }

}  // namespace

TEST_CASE("diff of two real runs names the env var that changed and the memory that grew", "[cli][analysis]") {
  Runs& runs = Runs::get();
  REQUIRE(runs.env_a != runs.env_b);

  const Result text = runs.harness("diff " + ids(runs.a, runs.b) + " --db " + runs.db());
  INFO(text.out << text.err);
  REQUIRE(text.exit_code == 0);
  CHECK(has(text.out, "env changes"));
  CHECK(has(text.out, "env vars"));
  CHECK(has(text.out, "env_vars.OMP_NUM_THREADS"));
  CHECK(has(text.out, "spec.dims.anchors"));
  CHECK(has(text.out, "bwd_peak_bytes"));
  CHECK(has(text.out, "verdict: FUSED (unchanged)"));

  const Result json_run = runs.harness("diff " + ids(runs.a, runs.b) + " --json --db " + runs.db());
  REQUIRE(json_run.exit_code == 0);
  const auto diff = nlohmann::json::parse(json_run.out);
  const auto components = diff["changed_components"].get<std::vector<std::string>>();
  CHECK(std::find(components.begin(), components.end(), "env vars") != components.end());
  // Twice the anchors: the dense backward's score-sized tensors grow, identically in every repeat,
  // so the ranges are disjoint and the change is called, for the worse.
  bool dense_bwd = false;
  for (const auto& row : diff["metrics"])
    if (row["variant"] == "dense" && row["metric"] == "bwd_peak_bytes") {
      dense_bwd = true;
      CHECK(row["called"] == true);
      CHECK(row["regression"] == true);
      CHECK(row["ratio"].get<double>() > 1.5);
    }
  CHECK(dense_bwd);
  CHECK(diff["regression"] == true);

  CHECK(runs.harness("diff " + ids(runs.a, runs.b) + " --fail-on regression --db " + runs.db()).exit_code == 1);
  CHECK(runs.harness("diff " + ids(runs.a, runs.b) + " --fail-on verdict-flip --db " + runs.db()).exit_code == 0);
  // The same run against itself: nothing called, no regression.
  const Result same = runs.harness("diff " + ids(runs.a, runs.a) + " --fail-on regression --db " + runs.db());
  CHECK(same.exit_code == 0);
  CHECK(has(same.out, "env: same"));
  CHECK(has(same.out, "0 metric changes called"));
  CHECK_FALSE(has(same.out, "trial status change"));
}

TEST_CASE("diff by env compares the latest run of each experiment under each env", "[cli][analysis]") {
  Runs& runs = Runs::get();
  const Result result = runs.harness("diff --env " + runs.env_a.substr(0, 12) + " --env " + runs.env_b.substr(0, 10) +
                                     " --json --db " + runs.db());
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  const auto diff = nlohmann::json::parse(result.out);
  REQUIRE(diff["experiments"].size() == 1);
  CHECK(diff["experiments"][0]["a"]["id"] == runs.a);
  CHECK(diff["experiments"][0]["b"]["id"] == runs.b);
  CHECK(diff["only_a"] == nlohmann::json::array({"bwd_fusion_copy"}));

  const Result one = runs.harness("diff --env " + runs.env_a + " --env " + runs.env_b +
                                  " --experiment bwd_fusion --changes-only --db " + runs.db());
  REQUIRE(one.exit_code == 0);
  CHECK(has(one.out, "=== bwd_fusion ==="));
  CHECK(has(one.out, "OMP_NUM_THREADS"));
}

TEST_CASE("writeup of real runs: Markdown on stdout, files with -o", "[cli][analysis]") {
  Runs& runs = Runs::get();
  const Result md = runs.harness("writeup bwd_fusion --db " + runs.db());
  INFO(md.err);
  REQUIRE(md.exit_code == 0);
  for (const std::string section : {"## Hypothesis", "## Setup", "## Method", "## Results", "## Verdict and evidence",
                                    "## Memory model against measured", "## Failures and replays",
                                    "## History across envs", "## Reproduce"})
    CHECK(has(md.out, section));
  CHECK(has(md.out, "# bwd_fusion: FUSED (run " + std::to_string(runs.b) + ")"));
  CHECK(has(md.out, "2 finished runs of `bwd_fusion` under 2 envs"));
  CHECK(has(md.out, "--set dims.anchors=16"));
  CHECK(has(md.out, "harness diff " + ids(runs.a, runs.b)));

  const std::string out = (runs.dir() / "report.md").string();
  const Result files = runs.harness("writeup " + std::to_string(runs.a) + " -o " + out + " --html --json --db " + runs.db());
  REQUIRE(files.exit_code == 0);
  const auto written = nlohmann::json::parse(files.out);
  CHECK(written["markdown"] == out);
  REQUIRE(written["html"].is_string());
  const std::string html = slurp(written["html"].get<std::string>());
  CHECK(has(html, "<svg"));
  CHECK(has(html, "<h2>Results</h2>"));
  REQUIRE(!written["figures"].empty());
  for (const auto& figure : written["figures"]) {
    CHECK(fs::exists(figure.get<std::string>()));
    CHECK(has(slurp(out), fs::path(figure.get<std::string>()).filename().string()));
  }
}

TEST_CASE("diff and writeup: bad input exits 2 with a clear message", "[cli][analysis]") {
  Runs& runs = Runs::get();
  const std::string db = " --db " + runs.db();
  auto expect_usage = [&](const std::string& args, const std::string& message) {
    const Result result = runs.harness(args);
    INFO(args << " -> " << result.err);
    CHECK(result.exit_code == 2);
    CHECK(has(result.err, message));
  };
  expect_usage("diff " + std::to_string(runs.a) + " 999" + db, "no run 999");
  expect_usage("diff " + ids(runs.a, runs.other) + db, "one experiment");
  expect_usage("diff abc " + std::to_string(runs.a) + db, "'abc' is not a run id");
  expect_usage("diff " + std::to_string(runs.a) + db, "two run ids");
  expect_usage("diff --env zzzz --env " + runs.env_a + db, "no env 'zzzz'");
  expect_usage("diff " + ids(runs.a, runs.b) + " --fail-on slower" + db, "--fail-on slower");
  expect_usage("writeup 999" + db, "no run 999");
  expect_usage("writeup no_such_experiment" + db, "neither a run id nor an experiment");
  expect_usage("writeup bwd_fusion -o " + (runs.dir() / "missing" / "r.md").string() + db, "does not exist");

  // A db that does not exist is not created; one without runs has nothing to compare.
  const std::string missing = (runs.dir() / "missing.db").string();
  expect_usage("diff 1 2 --db " + missing, "no db at");
  expect_usage("writeup bwd_fusion --db " + missing, "no db at");
  CHECK_FALSE(fs::exists(missing));
  // A reading command creates no db where it is pointed, and writes no schema into an empty
  // file: it says the file is not a harness database and leaves it empty.
  const std::string empty = (runs.dir() / "empty.db").string();
  std::ofstream(empty).close();
  expect_usage("runs --db " + empty, "an empty file");
  expect_usage("diff 1 2 --db " + empty, "an empty file");
  expect_usage("writeup 1 --db " + empty, "an empty file");
  CHECK(fs::file_size(empty) == 0);
}
