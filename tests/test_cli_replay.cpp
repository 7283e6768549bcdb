// `harness replay` end to end: a run whose variants fail in every way the CPU can (segfault,
// abort, exception, OOM, NaN) is replayed trial by trial and each failure reproduces; a damaged
// capsule is exit code 2 naming the problem; a kept passing trial replays bit for bit; a step
// saved from Python with replay/save_step.py imports and matches the reference.

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/catch.h"
#include "tests/cli_db_sandbox.h"
#include "tests/cli_support.h"
#include "tests/test_paths.h"

namespace {

namespace fs = std::filesystem;

using harness::test::Result;
using harness::test::slurp;

// A scratch folder per test holding the db, its artifacts and the captured output.
struct Sandbox : harness::test::DbSandbox {
  Sandbox() : harness::test::DbSandbox("harness-cli-replay") {}
};

const std::string kReplayFaults = std::string(HARNESS_TEST_DATA_DIR) + "/cli/replay_faults.json";
const std::string kReplaySmall = std::string(HARNESS_TEST_DATA_DIR) + "/cli/replay_small.json";

const nlohmann::json* trial_of(const nlohmann::json& run, const std::string& variant) {
  for (const auto& trial : run["trials"])
    if (trial["variant"] == variant) return &trial;
  return nullptr;
}

}  // namespace

TEST_CASE("replay reproduces each failure class of a recorded run", "[cli][replay]") {
  Sandbox box;
  const auto run = box.json("run " + kReplayFaults + " --device cpu");
  const int64_t run_id = run["run"]["id"].get<int64_t>();
  const std::vector<std::string> failing = {"segfault", "abort", "throw", "oom", "nan"};
  for (const auto& variant : failing) {
    const auto* trial = trial_of(run, variant);
    REQUIRE(trial != nullptr);
    CHECK((*trial)["status"] != "ok");
  }
  CHECK(trial_of(run, "fused")->at("status") == "ok");
  int capsules = 0;
  for (const auto& artifact : run["artifacts"]) {
    CHECK(fs::exists(box.dir / artifact["path"].get<std::string>()));
    capsules += artifact["kind"] == "capsule";
  }
  CHECK(capsules == 5);  // the failed trials' (the passing one dropped its own)

  for (const auto& variant : failing) {
    const auto report = box.json("replay " + std::to_string(run_id) + " --variant " + variant + " --device cpu");
    INFO(variant << ": " << report.dump(2));
    CHECK(report["reproduced"] == true);
    CHECK(report["verdict"] == "REPRODUCED");
    CHECK(report["replay_of"] == run_id);
    CHECK(report["replay"]["status"] == report["original"]["status"]);
    if (variant == "oom") {
      CHECK(report["replay"]["requested_bytes"] == report["original"]["requested_bytes"]);
      CHECK(report["replay"]["requested_bytes"].get<int64_t>() == int64_t{1} << 50);
      const auto stored = box.json("show " + std::to_string(report["run"].get<int64_t>()));
      CHECK(stored["run"]["replay_of"] == run_id);
      CHECK(stored["run"]["verdict"] == "REPRODUCED");
    }
    if (variant == "segfault") CHECK(report["replay"]["signal"] == "SIGSEGV");
    if (variant == "abort") CHECK(report["replay"]["signal"] == "SIGABRT");
    if (variant == "nan") {
      CHECK(report["replay"]["nonfinite"]["tensor"] == "out");
      CHECK(report["replay"]["nonfinite"]["phase"] == "fwd");
      CHECK(report["replay"]["nonfinite"]["layer"] == 0);
      // Outputs up to the NaN were recorded both times, and agree bit for bit.
      REQUIRE(report["outputs"].size() == 2);
      for (const auto& c : report["outputs"]) CHECK(c["bitwise_equal"] == true);
    }
  }

  // The OOM step replayed with the fused implementation passes: a different outcome, said so.
  const std::string oom_trial = std::to_string(trial_of(run, "oom")->at("id").get<int64_t>());
  const Result fused = box.harness("replay " + std::to_string(run_id) + " --trial " + oom_trial + " --variant fused --device cpu");
  INFO(fused.err);
  CHECK(fused.exit_code == 0);
  CHECK(fused.out.find("NOT_REPRODUCED: status ok where the original was oom") != std::string::npos);
  CHECK(fused.out.find("recorded with oom") != std::string::npos);

  // A passing trial dropped its capsule; an unknown run is named. Neither writes anything.
  const auto runs_before = box.json("runs");
  Result refused = box.harness("replay " + std::to_string(run_id) + " --trial " +
                               std::to_string(trial_of(run, "fused")->at("id").get<int64_t>()) + " --device cpu");
  CHECK(refused.exit_code == 2);
  CHECK(refused.err.find("has no capsule") != std::string::npos);
  refused = box.harness("replay 999 --device cpu");
  CHECK(refused.exit_code == 2);
  CHECK(refused.err.find("run 999") != std::string::npos);
  CHECK(box.json("runs").size() == runs_before.size());
}

TEST_CASE("kept capsules replay bit for bit or within tolerance, damaged ones are exit code 2", "[cli][replay]") {
  Sandbox box;
  const auto run = box.json("run " + kReplaySmall + " --device cpu --keep-capsules --memory-limit 1GiB");
  const std::string run_id = std::to_string(run["run"]["id"].get<int64_t>());
  const auto same = box.json("replay " + run_id + " --variant fused --device cpu");
  CHECK(same["verdict"] == "REPRODUCED");
  CHECK(same["memory_limit_bytes"] == int64_t{1} << 30);  // the recorded run's cap, unless overridden
  REQUIRE(same["outputs"].size() == 8);  // out, dq, dk, dv of 2 layers
  for (const auto& c : same["outputs"]) CHECK(c["bitwise_equal"] == true);

  const auto other = box.json("replay " + run_id + " --trial " +
                              std::to_string(trial_of(run, "fused")->at("id").get<int64_t>()) +
                              " --variant dense --device cpu --memory-limit none");
  CHECK(other["replay"]["status"] == "ok");
  CHECK(other["memory_limit_bytes"] == 0);
  REQUIRE(other["outputs"].size() == 8);
  int differing = 0;
  for (const auto& c : other["outputs"]) {
    if (c["bitwise_equal"] == true) continue;  // bf16 roundings may agree for a whole tensor
    ++differing;
    REQUIRE(c.contains("max_rel_err"));
    CHECK(c["max_rel_err"].get<double>() < 0.05);
  }
  CHECK(differing > 0);

  // The capsules, damaged three ways: the thrown trial's replay is refused before anything runs
  // or is written, naming the problem.
  const std::string throw_trial = std::to_string(trial_of(run, "throw")->at("id").get<int64_t>());
  std::vector<fs::path> capsules;
  for (const auto& artifact : run["artifacts"])
    if (artifact["kind"] == "capsule") capsules.push_back(box.dir / artifact["path"].get<std::string>());
  REQUIRE(capsules.size() == 3);
  const auto runs_before = box.json("runs");
  auto replay_throw = [&] { return box.harness("replay " + run_id + " --trial " + throw_trial + " --device cpu"); };
  std::vector<uintmax_t> sizes;
  for (const auto& capsule : capsules) {
    sizes.push_back(fs::file_size(capsule));
    fs::resize_file(capsule, sizes.back() - 1000);
  }
  Result result = replay_throw();
  CHECK(result.exit_code == 2);
  CHECK(result.err.find("truncated") != std::string::npos);
  CHECK(result.err.find("1000 missing") != std::string::npos);

  for (size_t i = 0; i < capsules.size(); ++i) fs::resize_file(capsules[i], sizes[i]);  // zeros: a tensor's hash fails
  result = replay_throw();
  CHECK(result.exit_code == 2);
  CHECK(result.err.find("corrupted") != std::string::npos);

  for (const auto& capsule : capsules) fs::remove(capsule);
  result = replay_throw();
  CHECK(result.exit_code == 2);
  CHECK(result.err.find("cannot open") != std::string::npos);
  CHECK(box.json("runs").size() == runs_before.size());
}

TEST_CASE("a step saved from Python imports, replays and matches the reference", "[cli][replay]") {
  const char* home = std::getenv("HOME");
  const std::string python = std::getenv("HARNESS_TEST_PYTHON") ? std::getenv("HARNESS_TEST_PYTHON")
                             : home ? std::string(home) + "/.cache/harness/venv/bin/python"
                                    : "";
  if (python.empty() || !fs::exists(python) ||
      std::system((python + " -c 'import torch' >/dev/null 2>&1").c_str()) != 0) {
    HARNESS_SKIP("no python with torch at " << python << " (set HARNESS_TEST_PYTHON)");
  }
  Sandbox box;
  // A causal step (bottom-right aligned, as the harness's masks are), computed by PyTorch's own
  // SDPA in fp32, saved with its outputs and gradients.
  const fs::path script = box.dir / "make_step.py";
  std::ofstream(script) << "import sys, torch\n"
                           "sys.path.insert(0, '" << HARNESS_TEST_DATA_DIR << "/../replay')\n"
                           "from save_step import save_step\n"
                           "torch.manual_seed(0)\n"
                           "q = torch.randn(1, 4, 32, 64, requires_grad=True)\n"
                           "k = torch.randn(1, 2, 96, 64, requires_grad=True)\n"
                           "v = torch.randn(1, 2, 96, 64, requires_grad=True)\n"
                           "mask = torch.ones(32, 96, dtype=torch.bool).tril(diagonal=96 - 32)\n"
                           "out = torch.nn.functional.scaled_dot_product_attention(\n"
                           "    q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=mask)\n"
                           "grad_out = torch.randn_like(out)\n"
                           "out.backward(grad_out)\n"
                           "save_step(sys.argv[1], q, k, v, grad_out, mask={'type': 'causal'}, block_size=16,\n"
                           "          outputs={'out': out, 'dq': q.grad, 'dk': k.grad, 'dv': v.grad},\n"
                           "          name='python_causal', heads=4)\n";
  const fs::path step = box.dir / "step.pt";
  REQUIRE(std::system((python + " " + script.string() + " " + step.string()).c_str()) == 0);

  const auto report = box.json("replay --import " + step.string() + " --device cpu");
  INFO(report.dump(2));
  CHECK(report["verdict"] == "MATCH");
  CHECK(report["replay"]["status"] == "ok");
  CHECK_FALSE(report.contains("replay_of"));
  REQUIRE(report["outputs"].size() == 4);
  for (const auto& c : report["outputs"]) {
    if (c["bitwise_equal"] == true) continue;
    CHECK(c["max_abs_err"].get<double>() < 1e-4);  // fp32 against PyTorch's SDPA
  }

  std::ofstream(box.dir / "bad.pt") << "not a torch file";
  const Result bad = box.harness("replay --import " + (box.dir / "bad.pt").string() + " --device cpu");
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("torch.save") != std::string::npos);
}

// `harness db check | vacuum | prune` on a run with kept capsules: an orphaned file is found by check,
// kept by vacuum --dry-run and removed by vacuum; prune --dry-run names the capsules of old runs and
// removes nothing, prune removes them (rows and files; runs and metrics stay); a bad age is exit 2.
TEST_CASE("db vacuum removes orphaned files and prune removes the capsules of old runs", "[cli][db]") {
  Sandbox box;
  const auto run = box.json("run " + kReplaySmall + " --device cpu --keep-capsules");
  // prune's default kinds: the step capsules and the kept outputs of the passing trials.
  std::vector<fs::path> capsules;
  for (const auto& artifact : run["artifacts"])
    if (artifact["kind"] == "capsule" || artifact["kind"] == "outputs")
      capsules.push_back(box.dir / artifact["path"].get<std::string>());
  REQUIRE(capsules.size() == 5);  // 3 trials' step capsules, the 2 passing trials' outputs
  const fs::path orphan = capsules.front().parent_path() / "left-behind.capsule";
  { std::ofstream(orphan) << std::string(5000, 'x'); }

  const auto check = box.json("db check");
  REQUIRE(check["orphaned_files"].size() == 1);
  CHECK(check["orphaned_files"][0]["bytes"] == 5000);
  CHECK(box.json("db vacuum --dry-run")["orphaned_files"] == 1);
  CHECK(fs::exists(orphan));
  const auto vacuum = box.json("db vacuum");
  CHECK(vacuum["removed_files"] == 1);
  CHECK(vacuum["removed_bytes"] == 5000);
  CHECK_FALSE(fs::exists(orphan));
  for (const auto& capsule : capsules) CHECK(fs::exists(capsule));  // recorded artifacts stay

  // The run started a moment ago: not older than a day; --older-than 0s includes it (the cutoff
  // has whole seconds).
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  CHECK(box.json("db prune --older-than 1d")["artifacts"] == 0);
  const auto dry = box.json("db prune --older-than 0s --dry-run");
  CHECK(dry["artifacts"] == 5);
  CHECK(dry["runs"] == 1);
  for (const auto& capsule : capsules) CHECK(fs::exists(capsule));
  const auto prune = box.json("db prune --older-than 0s");
  CHECK(prune["artifacts"] == 5);
  CHECK(prune["removed_files"] == 5);
  for (const auto& capsule : capsules) CHECK_FALSE(fs::exists(capsule));
  const auto shown = box.json("show " + std::to_string(run["run"]["id"].get<int64_t>()));
  CHECK(shown["trials"].size() == run["trials"].size());
  for (const auto& artifact : shown["artifacts"]) {
    CHECK(artifact["kind"] != "capsule");
    CHECK(artifact["kind"] != "outputs");
  }
  CHECK(box.json("db check")["missing_files"].empty());

  const Result bad = box.harness("db prune --older-than soon");
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("soon") != std::string::npos);
}
