// `harness site` and the exports through the built binary: a site of a real run, its run page
// linking the Chrome traces (in place, or copied with --artifacts copy) with the
// Perfetto instruction; `runs|metrics|show --format json|csv|md` with their documented columns,
// `--format json` the same as `--json`; `diff --format md` for a CI comment; bad input exits 2.

#include <filesystem>
#include <regex>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/catch.h"
#include "tests/cli_db_sandbox.h"
#include "tests/cli_support.h"
#include "tests/test_paths.h"

namespace {

namespace fs = std::filesystem;
using harness::test::has;
using harness::test::Result;
using harness::test::slurp;

const std::string kReplaySmall = std::string(HARNESS_TEST_DATA_DIR) + "/cli/replay_small.json";

struct Sandbox : harness::test::DbSandbox {
  Sandbox() : harness::test::DbSandbox("harness-cli-site") {}
  // A run under another env: one OpenMP thread (a recorded env var) instead of the machine's.
  Result run_one_thread(const std::string& args) const {
    return harness::test::run_harness(args + " --db " + db(), dir, "HARNESS_ALLOW_FAULTS=1 OMP_NUM_THREADS=1");
  }
};

// The first line of an output (CSV's header row, without its CR).
std::string first_line(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return line;
}

size_t lines(const std::string& text) { return static_cast<size_t>(std::count(text.begin(), text.end(), '\n')); }

}  // namespace

TEST_CASE("site of a real run: pages, its traces linked or copied, bad output folders", "[cli][site]") {
  Sandbox box;
  const auto first = box.json("run " + kReplaySmall + " --device cpu --trace");
  const int64_t run_a = first["run"]["id"];

  const fs::path site = box.dir / "site";
  const Result built = box.harness("site -o " + site.string());
  INFO(built.out << built.err);
  REQUIRE(built.exit_code == 0);
  CHECK(has(built.out, "site of 1 runs, 1 experiments"));
  for (const std::string page : {"index.html", "experiments.html", "regressions.html", "envs.html", "bisects.html",
                                 "experiment/replay_small/index.html"})
    CHECK(fs::exists(site / page));
  const std::string run_page = slurp(site / "run" / (std::to_string(run_a) + ".html"));
  CHECK(has(run_page, "https://ui.perfetto.dev"));
  CHECK(has(run_page, "Dispatch trace"));
  // Each trace is linked where it lies, relative to the page.
  const std::regex trace_link(R"re(<a href="([^"]+\.trace\.json)">)re");
  int traces = 0;
  for (auto it = std::sregex_iterator(run_page.begin(), run_page.end(), trace_link); it != std::sregex_iterator(); ++it) {
    ++traces;
    INFO((*it)[1]);
    CHECK(fs::exists((site / "run" / std::string((*it)[1])).lexically_normal()));
  }
  CHECK(traces == 2);
  // --artifacts copy: the traces travel with the site (a static host), content-addressed.
  const fs::path copied = box.dir / "copied";
  const auto json = box.json("site -o " + copied.string() + " --artifacts copy");
  std::set<std::string> files;  // content-addressed: one file per distinct content
  for (const auto& artifact : first["artifacts"]) files.insert(artifact["path"].get<std::string>());
  CHECK(files.size() >= 3);  // two traces and the failing variant's capsule
  CHECK(json["artifacts_copied"] == files.size());
  const std::string copied_page = slurp(copied / "run" / (std::to_string(run_a) + ".html"));
  int copied_traces = 0;
  for (auto it = std::sregex_iterator(copied_page.begin(), copied_page.end(), trace_link); it != std::sregex_iterator(); ++it) {
    ++copied_traces;
    const std::string target = (*it)[1];
    CHECK(target.rfind("../artifacts/", 0) == 0);
    CHECK(fs::exists((copied / "run" / target).lexically_normal()));
  }
  CHECK(copied_traces == 2);

  // Rebuilt in place; a file, a foreign folder, a missing db: exit 2, nothing written.
  CHECK(box.harness("site -o " + site.string()).exit_code == 0);
  std::ofstream(box.dir / "a_file") << "x";
  const Result on_file = box.harness("site -o " + (box.dir / "a_file").string());
  CHECK(on_file.exit_code == 2);
  CHECK(has(on_file.err, "is not a folder"));
  fs::create_directories(box.dir / "mine");
  std::ofstream(box.dir / "mine" / "notes.txt") << "keep";
  const Result foreign = box.harness("site -o " + (box.dir / "mine").string());
  CHECK(foreign.exit_code == 2);
  CHECK(has(foreign.err, "holds other files"));
  CHECK(slurp(box.dir / "mine" / "notes.txt") == "keep");
  const Result no_db = harness::test::run_harness("site -o " + (box.dir / "x").string() + " --db " + (box.dir / "none.db").string(), box.dir);
  CHECK(no_db.exit_code == 2);
  CHECK_FALSE(fs::exists(box.dir / "x"));
  CHECK(box.harness("site").exit_code == 2);  // -o is required
}

TEST_CASE("exports: runs, metrics and show as json, csv and md, diff as md", "[cli][export]") {
  Sandbox box;
  const auto first = box.json("run " + kReplaySmall + " --device cpu");
  const Result second = box.run_one_thread("run " + kReplaySmall + " --device cpu --json");
  REQUIRE(second.exit_code == 0);
  const std::string run_a = std::to_string(first["run"]["id"].get<int64_t>());
  const std::string run_b = std::to_string(nlohmann::json::parse(second.out)["run"]["id"].get<int64_t>());

  // runs: --format json is --json; csv and md carry the documented columns.
  const Result runs_json = box.harness("runs --json");
  const Result runs_format = box.harness("runs --format json");
  REQUIRE(runs_json.exit_code == 0);
  CHECK(runs_format.out == runs_json.out);
  const auto runs = nlohmann::json::parse(runs_json.out);
  REQUIRE(runs.size() == 2);
  CHECK(runs[0].contains("replay_of"));
  CHECK(runs[0].contains("error"));
  const Result runs_csv = box.harness("runs --format csv");
  REQUIRE(runs_csv.exit_code == 0);
  CHECK(first_line(runs_csv.out) ==
        "id,experiment,device,profile,status,verdict,env_id,started_at,finished_at,replay_of,slurm_job_id,error");
  CHECK(lines(runs_csv.out) == 3);
  const Result runs_md = box.harness("runs --format md");
  CHECK(first_line(runs_md.out) ==
        "| id | experiment | device | profile | status | verdict | env_id | started_at | finished_at | replay_of | "
        "slurm_job_id | error |");
  CHECK(lines(runs_md.out) == 4);
  const Result both = box.harness("runs --json --format csv");
  CHECK(both.exit_code == 2);
  CHECK(has(both.out, "\"exit_code\": 2"));  // --json: the error as JSON too
  CHECK(box.harness("runs --format xml").exit_code == 2);

  // metrics: one row per stored value, the same rows in every format.
  const auto show = box.json("show " + run_a);
  const size_t stored = show["metrics"].size();
  REQUIRE(stored > 0);
  const Result metrics_csv = box.harness("metrics --run " + run_a + " --format csv");
  REQUIRE(metrics_csv.exit_code == 0);
  CHECK(first_line(metrics_csv.out) == "run,experiment,variant,point,name,value,unit,repeat");
  CHECK(lines(metrics_csv.out) == stored + 1);
  const auto metrics = box.json("metrics --run " + run_a + " --format json");
  REQUIRE(metrics.size() == stored);
  CHECK(metrics[0]["run"] == first["run"]["id"]);
  CHECK(metrics[0]["experiment"] == "replay_small");
  CHECK(box.json("metrics").size() == stored + box.json("show " + run_b)["metrics"].size());
  CHECK(box.json("metrics --name fwd_ms").size() == 4);  // fused and dense, in both runs
  CHECK(lines(box.harness("metrics --run " + run_a + " --format md").out) == stored + 2);
  const Result no_run = box.harness("metrics --run 99");
  CHECK(no_run.exit_code == 2);
  CHECK(has(no_run.err, "--run 99"));

  // show: csv is the run's metrics, md the whole view.
  const Result show_csv = box.harness("show " + run_a + " --format csv");
  CHECK(show_csv.out == metrics_csv.out);
  const Result show_md = box.harness("show " + run_a + " --format md");
  REQUIRE(show_md.exit_code == 0);
  CHECK(has(show_md.out, "## run " + run_a + " · replay_small"));
  CHECK(has(show_md.out, "### Trials"));
  CHECK(has(show_md.out, "| variant | status | time | exit | error |"));
  CHECK(has(show_md.out, "### Dispatch trace"));
  CHECK(box.harness("show " + run_a + " --format json").out == box.harness("show " + run_a + " --json").out);

  // diff: Markdown for a CI comment, by runs and by envs; csv is refused.
  const Result diff_md = box.harness("diff " + run_a + " " + run_b + " --format md");
  REQUIRE(diff_md.exit_code == 0);
  CHECK(has(diff_md.out, "### harness diff: replay_small, run " + run_a + " → run " + run_b));
  CHECK(has(diff_md.out, "<details><summary>Env changes (2; changed: env vars, host)</summary>"));
  CHECK(has(diff_md.out, "| env vars | env_vars.OMP_NUM_THREADS | (absent) | 1 |"));
  const std::string env_a = first["run"]["env_id"].get<std::string>().substr(0, 12);
  const std::string env_b = nlohmann::json::parse(second.out)["run"]["env_id"].get<std::string>().substr(0, 12);
  const Result env_md = box.harness("diff --env " + env_a + " --env " + env_b + " --format md");
  REQUIRE(env_md.exit_code == 0);
  CHECK(has(env_md.out, "### harness diff: env " + env_a + " → env " + env_b));
  CHECK(has(env_md.out, "#### replay_small: run " + run_a + " → run " + run_b));
  CHECK(box.harness("diff " + run_a + " " + run_b + " --format csv").exit_code == 2);
}
