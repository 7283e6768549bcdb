// End to end through the built binary: run, show, runs, list, env; spec errors; trials that
// crash, abort, throw, run out of memory or hang on purpose (test-only fault injection).

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/catch.h"
#include "tests/cli_support.h"
#include "tests/test_paths.h"

namespace {

namespace fs = std::filesystem;

using harness::test::Result;
using harness::test::Sandbox;
using harness::test::slurp;

const std::string kFaults = std::string(HARNESS_TEST_DATA_DIR) + "/cli/faults.json";

const nlohmann::json* trial_of(const nlohmann::json& run, const std::string& variant) {
  for (const auto& trial : run["trials"])
    if (trial["variant"] == variant) return &trial;
  return nullptr;
}

}  // namespace

TEST_CASE("run bwd_fusion on the CPU profile gives FUSED and is stored", "[cli]") {
  Sandbox box;
  const Result run = box.harness("run bwd_fusion --device cpu --json --db " + box.db());
  INFO(run.err);
  REQUIRE(run.exit_code == 0);
  const auto json = nlohmann::json::parse(run.out);
  CHECK(json["run"]["status"] == "ok");
  CHECK(json["run"]["verdict"] == "FUSED");
  CHECK(json["run"]["profile"] == "cpu");
  CHECK(json["run"]["device"] == "cpu");
  const double fused_bwd = json["summary"]["fused"]["bwd_peak_bytes"]["median"];
  const double dense_bwd = json["summary"]["dense"]["bwd_peak_bytes"]["median"];
  CHECK(fused_bwd > 0);
  // The founding finding at CPU scale: the dense backward materializes the scores.
  CHECK(dense_bwd >= 10 * fused_bwd);
  CHECK(json["summary"]["fused"]["match"]["median"] == 1.0);
  CHECK(json["env"].contains("libtorch"));
  CHECK(json["env"].contains("git_commit"));
  const auto* fused = trial_of(json, "fused");
  REQUIRE(fused != nullptr);
  REQUIRE(!(*fused)["dispatch"].empty());
  CHECK((*fused)["dispatch"][0]["impl"] == "fused_cpu");
  const auto* dense = trial_of(json, "dense");
  REQUIRE(dense != nullptr);
  CHECK((*dense)["dispatch"][0]["impl"] == "dense_aten");

  const std::string run_id = std::to_string(json["run"]["id"].get<int64_t>());
  const Result show = box.harness("show " + run_id + " --db " + box.db());
  REQUIRE(show.exit_code == 0);
  CHECK(show.out.find("verdict: FUSED") != std::string::npos);
  CHECK(show.out.find("dispatch trace") != std::string::npos);
  CHECK(show.out.find("fused_cpu") != std::string::npos);
  CHECK(show.out.find("libtorch") != std::string::npos);

  const Result runs = box.harness("runs --json --db " + box.db());
  REQUIRE(runs.exit_code == 0);
  const auto listed = nlohmann::json::parse(runs.out);
  REQUIRE(listed.size() == 1);
  CHECK(listed[0]["experiment"] == "bwd_fusion");

  const Result list = box.harness("list --db " + box.db());
  REQUIRE(list.exit_code == 0);
  CHECK(list.out.find("bwd_fusion") != std::string::npos);
}

TEST_CASE("spec errors exit 2, name the path and write nothing", "[cli]") {
  Sandbox box;
  const Result zero = box.harness("run bwd_fusion --device cpu --set dims.heads=0 --db " + box.db());
  CHECK(zero.exit_code == 2);
  CHECK(zero.err.find("dims.heads") != std::string::npos);
  CHECK(zero.err.find("bwd_fusion.json") != std::string::npos);
  CHECK(!fs::exists(box.db()));

  const Result unknown_field = box.harness("run bwd_fusion --device cpu --set dims.anchorz=3 --db " + box.db());
  CHECK(unknown_field.exit_code == 2);
  CHECK(unknown_field.err.find("anchorz") != std::string::npos);

  const Result unknown = box.harness("run no_such_experiment --db " + box.db());
  CHECK(unknown.exit_code == 2);
  CHECK(unknown.err.find("no_such_experiment") != std::string::npos);

  const Result bad_device = box.harness("run bwd_fusion --device gpu0 --db " + box.db());
  CHECK(bad_device.exit_code == 2);
  CHECK(bad_device.err.find("gpu0") != std::string::npos);

  const Result missing_gpu = box.harness("run bwd_fusion --device cuda:99 --db " + box.db());
  CHECK(missing_gpu.exit_code == 2);
  CHECK(missing_gpu.err.find("cuda:99") != std::string::npos);
  CHECK(!fs::exists(box.db()));

  const Result bad_option = box.harness("run bwd_fusion --no-such-option");
  CHECK(bad_option.exit_code == 2);

  const Result faults_without_opt_in = box.harness("run " + kFaults + " --device cpu --db " + box.db());
  CHECK(faults_without_opt_in.exit_code == 2);
  CHECK(faults_without_opt_in.err.find("fault") != std::string::npos);
  CHECK(!fs::exists(box.db()));

  const Result no_run = box.harness("show 42 --db " + box.db());
  CHECK(no_run.exit_code == 2);
}

TEST_CASE("trials that crash, abort, throw, run out of memory or hang are recorded", "[cli]") {
  Sandbox box;
  const Result run = box.harness("run " + kFaults + " --device cpu --json --set timeout_s=8 --db " + box.db(),
                                 "HARNESS_ALLOW_FAULTS=1");
  INFO(run.err);
  REQUIRE(run.exit_code == 0);
  const auto json = nlohmann::json::parse(run.out);
  CHECK(json["run"]["status"] == "failed");
  CHECK(json["run"]["verdict"] == "OK");  // the rule reads only the healthy variant

  const auto* healthy = trial_of(json, "fused");
  REQUIRE(healthy != nullptr);
  CHECK((*healthy)["status"] == "ok");

  const auto* segfault = trial_of(json, "segfault");
  REQUIRE(segfault != nullptr);
  CHECK((*segfault)["status"] == "crashed");
  CHECK((*segfault)["signal"] == SIGSEGV);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // The child printed its native backtrace before dying (core/crash_report.h): the stderr tail
  // says where, down to the fault injection's frame.
  const std::string tail = (*segfault)["stderr_tail"].get<std::string>();
  CHECK(tail.find("harness __trial: fatal signal SEGV; native backtrace") != std::string::npos);
  CHECK(tail.find("harness(") != std::string::npos);
#endif

  const auto* aborted = trial_of(json, "abort");
  REQUIRE(aborted != nullptr);
  CHECK((*aborted)["status"] == "crashed");
  CHECK((*aborted)["signal"] == SIGABRT);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  CHECK((*aborted)["stderr_tail"].get<std::string>().find("fatal signal ABRT") != std::string::npos);
#endif

  const auto* thrown = trial_of(json, "throw");
  REQUIRE(thrown != nullptr);
  CHECK((*thrown)["status"] == "error");
  CHECK((*thrown)["error"].get<std::string>().find("fault injection") != std::string::npos);

  const auto* oom = trial_of(json, "oom");
  REQUIRE(oom != nullptr);
  CHECK((*oom)["status"] == "oom");
  CHECK((*oom)["requested_bytes"] == (int64_t{1} << 50));

  const auto* hang = trial_of(json, "hang");
  REQUIRE(hang != nullptr);
  CHECK((*hang)["status"] == "timeout");

  const Result failed = box.harness("runs --failed --json --db " + box.db());
  REQUIRE(failed.exit_code == 0);
  CHECK(nlohmann::json::parse(failed.out).size() == 1);

  const Result fail_on = box.harness("run " + kFaults + " --device cpu --set timeout_s=8 --fail-on failed --db " + box.db(),
                                     "HARNESS_ALLOW_FAULTS=1");
  CHECK(fail_on.exit_code == 1);
}

TEST_CASE("a --memory-limit makes the dense variant an OOM result, not a crash", "[cli]") {
  Sandbox box;
  // At the CPU profile the dense forward adds ~30 MiB (fp32 scores) and the fused one < 1 MiB.
  const Result run = box.harness("run bwd_fusion --device cpu --memory-limit 8MiB --json --db " + box.db());
  INFO(run.err);
  REQUIRE(run.exit_code == 0);
  const auto json = nlohmann::json::parse(run.out);
  CHECK(json["run"]["args"]["memory_limit_bytes"] == 8 * 1024 * 1024);
  const auto* dense = trial_of(json, "dense");
  REQUIRE(dense != nullptr);
  CHECK((*dense)["status"] == "oom");
  CHECK((*dense)["requested_bytes"].get<int64_t>() > 0);
  CHECK((*dense)["error"].get<std::string>().find("memory-limit") != std::string::npos);
  const auto* fused = trial_of(json, "fused");
  REQUIRE(fused != nullptr);
  CHECK((*fused)["status"] == "ok");
  CHECK(json["run"]["status"] == "ok");  // an OOM is a result
  CHECK(json["run"]["verdict"] == "FUSED");

  const Result bad = box.harness("run bwd_fusion --device cpu --memory-limit 5ms --db " + box.db());
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("--memory-limit") != std::string::npos);
}

TEST_CASE("env prints the fingerprint", "[cli]") {
  Sandbox box;
  const Result env = box.harness("env --device cpu --json");
  REQUIRE(env.exit_code == 0);
  const auto json = nlohmann::json::parse(env.out);
  CHECK(json["id"].get<std::string>().size() == 64);
  for (const char* key : {"libtorch", "cuda_runtime", "cuda_driver", "cudnn", "nvcc", "host_compiler", "os",
                          "build_type", "git_commit", "env_vars"})
    CHECK(json["env"].contains(key));
}

TEST_CASE("run bwd_fusion at the real dims on the GPU", "[cuda]") {
  Sandbox box;
  const Result run = box.harness("run bwd_fusion --device cuda:0 --json --db " + box.db());
  INFO(run.err);
  REQUIRE(run.exit_code == 0);
  const auto json = nlohmann::json::parse(run.out);
  CHECK(json["run"]["profile"] == "");
  const auto* dense = trial_of(json, "dense");
  REQUIRE(dense != nullptr);
  CHECK((*dense)["status"] == "ok");
  CHECK(json["summary"]["dense"]["bwd_peak_bytes"]["median"].get<double>() > 1e9);
  const auto* fused = trial_of(json, "fused");
  REQUIRE(fused != nullptr);
  if ((*fused)["status"] == "unsupported") {
    CHECK(json["run"]["verdict"] == "INVALID");
  } else {
    CHECK((*fused)["status"] == "ok");
    CHECK(json["run"]["verdict"] == "FUSED");
  }
}
