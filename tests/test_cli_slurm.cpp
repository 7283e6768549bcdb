// `harness run --slurm` end to end on a real Slurm: the one-node cluster of scripts/slurm_local.sh,
// started by tests/slurm_test.sh (which runs these [slurm] cases with SLURM_CONF set, and skips
// with the reason where Slurm cannot start). Faults are real: scancel of running and pending tasks.

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>

#include <nlohmann/json.hpp>

#include "tests/catch.h"
#include "tests/cli_support.h"
#include "tests/test_paths.h"

namespace {

namespace fs = std::filesystem;
using harness::test::Result;
using harness::test::Sandbox;
using nlohmann::json;

const std::string kSlow = std::string(HARNESS_TEST_DATA_DIR) + "/cli/slurm_slow.json";

bool contains(const std::string& text, const std::string& part) { return harness::test::has(text, part); }

// The last result of each (point, variant): what the run's verdict was computed from.
std::map<std::pair<std::string, std::string>, json> final_trials(const json& run) {
  std::map<std::pair<std::string, std::string>, json> trials;
  for (const auto& trial : run["trials"]) {
    if (trial["status"] == "interrupted") continue;  // an attempt Slurm stopped, kept as history
    trials[{trial["point"].dump(), trial["variant"].get<std::string>()}] = trial;
  }
  return trials;
}

json status_of(const Sandbox& box, int64_t run_id) {
  const Result status = box.harness("slurm status " + std::to_string(run_id) + " --json --db " + box.db());
  INFO(status.err);
  REQUIRE(status.exit_code == 0);
  return json::parse(status.out);
}

// Whether the trial child of `variant` runs: a `harness __trial --request <...>.<variant>.request.json`
// process (the one-node Slurm runs on this machine). Only tests/cli/slurm_slow.json has these
// variant names.
bool trial_child_running(const std::string& variant) {
  std::error_code error;
  for (fs::directory_iterator entry("/proc", error), end; !error && entry != end; entry.increment(error)) {
    std::string cmdline = harness::test::slurp(entry->path() / "cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (contains(cmdline, " __trial ") && contains(cmdline, "." + variant + ".request.json ")) return true;
  }
  return false;
}

// Waits until array task `task` runs and is inside the trial of `variant`, so that a scancel lands
// mid-trial (its shard alone is not enough: a scancel between the shard's creation and the trial's
// start left no interrupted trial to find, and the requeue test failed once on a loaded machine).
// Fails the test after two minutes.
void wait_until_running(const Sandbox& box, int64_t run_id, int task, const std::string& variant) {
  for (int i = 0; i < 240; ++i) {
    const json status = status_of(box, run_id);
    const std::string shard = status["run_dir"].get<std::string>() + "/shards/task-" + std::to_string(task) + ".attempt-0.db";
    if (status["tasks"][task]["state"] == "RUNNING" && fs::exists(shard) && trial_child_running(variant)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  FAIL("array task " << task << " never started its trial " << variant);
}

int64_t submit_no_wait(const Sandbox& box, const std::string& args, std::string& job_id) {
  const Result submit = box.harness("run " + args + " --slurm --no-wait --json --db " + box.db(), "HARNESS_ALLOW_FAULTS=1");
  INFO(submit.err);
  REQUIRE(submit.exit_code == 0);
  const json submitted = json::parse(submit.out);
  job_id = submitted["job_id"].get<std::string>();
  return submitted["runs"][0].get<int64_t>();
}

}  // namespace

TEST_CASE("anchor_scaling's CPU profile through --slurm stores what a local run stores", "[slurm]") {
  Sandbox box;
  const Result local = box.harness("run anchor_scaling --device cpu --json --db " + box.db());
  INFO(local.err);
  REQUIRE(local.exit_code == 0);
  const json local_run = json::parse(local.out);

  const Result slurm =
      box.harness("run anchor_scaling --device cpu --slurm --trials-per-task 3 --json --db " + box.db());
  INFO(slurm.err);
  REQUIRE(slurm.exit_code == 0);
  const json slurm_run = json::parse(slurm.out);

  CHECK(slurm_run["run"]["status"] == local_run["run"]["status"]);
  CHECK(slurm_run["run"]["verdict"] == local_run["run"]["verdict"]);
  CHECK(slurm_run["run"]["profile"] == "cpu");
  const auto local_trials = final_trials(local_run);
  const auto slurm_trials = final_trials(slurm_run);
  REQUIRE(local_trials.size() == 12);  // 3 anchor counts × 2 layer counts × 2 variants
  REQUIRE(slurm_trials.size() == local_trials.size());
  for (const auto& [key, trial] : local_trials) {
    const auto found = slurm_trials.find(key);
    REQUIRE(found != slurm_trials.end());
    CHECK(found->second["status"] == trial["status"]);
    const json& where = found->second["details"]["slurm"];
    CHECK(where["state"] == "COMPLETED");
    CHECK(where["attempt"] == 0);
    CHECK(!where["node"].get<std::string>().empty());
    CHECK(where["task"].get<int>() >= 0);
    CHECK(where["task"].get<int>() < 4);
  }
  // The same measured metrics were stored for each trial (values differ run to run; names do not).
  std::set<std::string> local_names, slurm_names;
  for (const auto& metric : local_run["metrics"]) local_names.insert(metric["name"].get<std::string>());
  for (const auto& metric : slurm_run["metrics"]) slurm_names.insert(metric["name"].get<std::string>());
  CHECK(slurm_names == local_names);
  CHECK(slurm_run["env"].contains("libtorch"));

  const std::string run_id = std::to_string(slurm_run["run"]["id"].get<int64_t>());
  const std::string job_id = slurm_run["run"]["args"]["slurm"]["job_id"];
  const Result runs = box.harness("runs --db " + box.db());
  CHECK(contains(runs.out, "slurm job " + job_id));
  const Result show = box.harness("show " + run_id + " --db " + box.db());
  CHECK(contains(show.out, "slurm: job " + job_id));
  CHECK(contains(show.out, "COMPLETED"));

  // Merging the shards again adds nothing.
  const std::string run_dir = slurm_run["run"]["args"]["slurm"]["run_dir"];
  std::string shards;
  for (const auto& entry : fs::directory_iterator(run_dir + "/shards")) shards += " " + entry.path().string();
  const Result again = box.harness("db merge" + shards + " --json --into " + box.db());
  INFO(again.err);
  REQUIRE(again.exit_code == 0);
  const json merged = json::parse(again.out);
  REQUIRE(merged["merged"].size() == 4);
  for (const auto& entry : merged["merged"]) CHECK(entry["already_merged"] == true);
  const Result after = box.harness("show " + run_id + " --json --db " + box.db());
  CHECK(json::parse(after.out)["trials"].size() == slurm_run["trials"].size());

  {  // a truncated shard or a shard of another db is refused, and the db is untouched
    const std::string first_shard = run_dir + "/shards/task-0.attempt-0.db";
    const std::string truncated = (box.dir / "truncated.db").string();
    fs::copy_file(first_shard, truncated);
    fs::resize_file(truncated, fs::file_size(truncated) / 2);
    const Result bad = box.harness("db merge " + truncated + " --into " + box.db());
    CHECK(bad.exit_code == 2);
    CHECK(contains(bad.err, "truncated.db"));
    const std::string other_db = (box.dir / "other.db").string();
    std::ofstream(other_db).close();  // an empty file: the merge opens it as a db of its own, without the run
    const Result foreign = box.harness("db merge " + first_shard + " --into " + other_db);
    CHECK(foreign.exit_code == 2);
    CHECK(contains(foreign.err, "task-0.attempt-0.db"));
    CHECK(contains(foreign.err, "does not have"));
    const Result untouched = box.harness("show " + run_id + " --json --db " + box.db());
    CHECK(json::parse(untouched.out)["trials"].size() == slurm_run["trials"].size());
    const Result other_runs = box.harness("runs --json --db " + other_db);
    CHECK(json::parse(other_runs.out).empty());
  }
}

TEST_CASE("a task cancelled mid-run is requeued and the run completes, --no-wait then slurm collect", "[slurm]") {
  Sandbox box;
  std::string job_id;
  const int64_t run_id = submit_no_wait(box, kSlow + " --device cpu --retries 1", job_id);
  wait_until_running(box, run_id, 1, "stall");  // inside a trial that hangs until its timeout
  REQUIRE(std::system(("scancel " + job_id + "_1").c_str()) == 0);

  const Result collect = box.harness("slurm collect " + std::to_string(run_id) + " --json --db " + box.db());
  INFO(collect.err);
  REQUIRE(collect.exit_code == 0);
  CHECK(contains(collect.err, "requeued"));
  const json run = json::parse(collect.out);
  CHECK(run["run"]["error"] == "");
  const auto trials = final_trials(run);
  REQUIRE(trials.size() == 2);
  const json& untouched = trials.at({"{}", "hang"});
  const json& requeued = trials.at({"{}", "stall"});
  CHECK(untouched["status"] == "timeout");  // the trials hang until their own timeout: a result
  CHECK(untouched["details"]["slurm"]["attempt"] == 0);
  CHECK(requeued["status"] == "timeout");
  CHECK(requeued["details"]["slurm"]["task"] == 1);
  CHECK(requeued["details"]["slurm"]["attempt"] == 1);
  CHECK(requeued["details"]["slurm"]["state"] == "COMPLETED");
  // The stopped first run of the task is kept: its trial is recorded as interrupted (slurm attempt index 0).
  bool saw_first_attempt = false;
  for (const auto& trial : run["trials"])
    if (trial["variant"] == "stall" && trial["details"]["slurm"]["attempt"] == 0) {
      saw_first_attempt = true;
      CHECK(trial["status"] == "interrupted");
      CHECK(trial["details"]["slurm"]["state"] == "CANCELLED");
    }
  CHECK(saw_first_attempt);
  const json status = status_of(box, run_id);
  CHECK(status["tasks"][1]["restarts"] == 1);
  CHECK(status["tasks"][1]["shards"].size() == 2);
}

TEST_CASE("tasks cancelled beyond their retries leave not_run trials with Slurm's reason", "[slurm]") {
  Sandbox box;
  std::string job_id;
  // One task at a time: task 1 waits (JobArrayTaskLimit) while task 0 runs.
  const int64_t run_id = submit_no_wait(box, kSlow + " --device cpu --retries 0 --array-parallel 1", job_id);
  const json pending = status_of(box, run_id);
  REQUIRE(pending["tasks"].size() == 2);
  wait_until_running(box, run_id, 0, "hang");
  REQUIRE(std::system(("scancel " + job_id + "_1").c_str()) == 0);  // never ran
  REQUIRE(std::system(("scancel " + job_id + "_0").c_str()) == 0);  // killed mid-trial

  const Result collect =
      box.harness("slurm collect " + std::to_string(run_id) + " --fail-on failed --json --db " + box.db());
  INFO(collect.err);
  CHECK(collect.exit_code == 1);
  const json run = json::parse(collect.out);
  CHECK(run["run"]["status"] == "failed");
  CHECK(contains(run["run"]["error"], "2 of 2 trials not run"));
  const auto trials = final_trials(run);
  REQUIRE(trials.size() == 2);
  for (const auto& [key, trial] : trials) {
    CHECK(trial["status"] == "not_run");
    CHECK(trial["details"]["slurm"]["state"] == "CANCELLED");
    CHECK(contains(trial["error"], "CANCELLED"));
  }
  // The task that never ran says why Slurm held it.
  CHECK(contains(trials.at({"{}", "stall"})["error"], "JobArrayTaskLimit"));
  const Result show = box.harness("show " + std::to_string(run_id) + " --db " + box.db());
  CHECK(contains(show.out, "not_run"));
}

TEST_CASE("a --slurm-dry-run prints a commented batch script and writes nothing", "[cli]") {
  Sandbox box;
  const Result dry = box.harness("run anchor_scaling --device cpu --slurm-dry-run --partition gpu --time 00:30:00 "
                                 "--gpus-per-task 1 --mem 32G --array-parallel 4 --trials-per-task 2 --db " + box.db());
  INFO(dry.err);
  REQUIRE(dry.exit_code == 0);
  CHECK(contains(dry.out, "#!/bin/bash"));
  CHECK(contains(dry.out, "#SBATCH --array=0-5%4"));
  CHECK(contains(dry.out, "#SBATCH --partition=gpu"));
  CHECK(contains(dry.out, "#SBATCH --gpus-per-task=1"));
  CHECK(contains(dry.out, "#SBATCH --time=00:30:00"));
  CHECK(contains(dry.out, "CUDA_VISIBLE_DEVICES"));
  CHECK(contains(dry.out, "__slurm-task --manifest"));
  CHECK(contains(dry.out, "task 5:"));
  CHECK_FALSE(fs::exists(box.db()));
  CHECK_FALSE(fs::exists(box.dir / "slurm"));

  const Result misuse = box.harness("run anchor_scaling --device cpu --retries 3 --db " + box.db());
  CHECK(misuse.exit_code == 2);
  CHECK(contains(misuse.err, "go with --slurm"));
  const Result devices = box.harness("run anchor_scaling --slurm --devices cuda:0,cuda:1 --db " + box.db());
  CHECK(devices.exit_code == 2);
  CHECK(contains(devices.err, "--gpus-per-task"));
}

TEST_CASE("a --db path with a newline is refused before it reaches a batch script", "[cli]") {
  Sandbox box;
  const fs::path folder = box.dir / "a\ntouch pwned";
  fs::create_directories(folder);
  const Result dry =
      box.harness("run anchor_scaling --device cpu --slurm-dry-run --db '" + (folder / "x.db").string() + "'");
  INFO(dry.out);
  CHECK(dry.exit_code == 2);
  CHECK(contains(dry.err, "--db"));
  CHECK_FALSE(contains(dry.out, "\ntouch pwned"));
  CHECK_FALSE(fs::exists(folder / "slurm"));
}
