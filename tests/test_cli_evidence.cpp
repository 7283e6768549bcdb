// Evidence in PyTorch's formats through the built binary: `explain-oom --solve` finds the context that reproduces the
// founding "Tried to allocate 15.09 GiB" and prints the --set that replays it; `run --trace` keeps
// a Chrome trace on the CPU that `show` names with the tool that opens it; `--memory-snapshot` on
// the CPU says snapshots are CUDA's; kept capsules are safetensors files `show` says how to load.

#include <filesystem>
#include <fstream>
#include <string>

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
  Sandbox() : harness::test::DbSandbox("harness-cli-evidence") {}
};

const std::string kReplaySmall = std::string(HARNESS_TEST_DATA_DIR) + "/cli/replay_small.json";

}  // namespace

TEST_CASE("explain-oom --solve: the context that asks for 15.09 GiB, and the --set that replays it", "[cli][explain]") {
  Sandbox box;
  const std::string message = "\"CUDA out of memory. Tried to allocate 15.09 GiB. GPU 0 has a total capacity of 139.81 GiB\"";
  const Result text = box.harness("explain-oom " + message + " --spec anchor_scaling --set dims.anchors=512 "
                                  "--set dims.layers=5 --solve dims.context");
  INFO(text.out << text.err);
  REQUIRE(text.exit_code == 0);
  CHECK(text.out.find("printed as 15.09 GiB") != std::string::npos);
  CHECK(text.out.find("7255..7264") != std::string::npos);  // KV 15447..15456 MiB of scores
  CHECK(text.out.find("--set dims.context=7260") != std::string::npos);

  const auto json = box.json("explain-oom " + message + " --spec anchor_scaling --set dims.anchors=512 --solve free");
  REQUIRE(json["solves"].size() == 4);
  CHECK(json["solves"][1]["dim"] == "dims.anchors");
  CHECK(json["solves"][1]["skipped"] == "pinned by --set");
  bool scores = false;
  for (const auto& s : json["solves"][0]["solutions"]) {
    if (s["tensor"] != "scores" || s["point"].value("dims.layers", 0) != 5) continue;
    scores = true;
    CHECK(s["best"] == 7260);
    CHECK(s["request_bytes"].get<int64_t>() >= json["request_low"].get<int64_t>());
    CHECK(s["request_bytes"].get<int64_t>() <= json["request_high"].get<int64_t>());
  }
  CHECK(scores);

  const Result bad = box.harness("explain-oom " + message + " --spec anchor_scaling --solve dims.head_dim");
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("--solve dims.head_dim") != std::string::npos);
}

TEST_CASE("run --trace keeps a Chrome trace per trial on the CPU, show names it and its tool", "[cli][trace]") {
  Sandbox box;
  const auto run = box.json("run " + kReplaySmall + " --device cpu --trace --memory-snapshot --set warmup=1");
  int traces = 0;
  for (const auto& artifact : run["artifacts"]) {
    if (artifact["kind"] != "trace") continue;
    ++traces;
    const fs::path path = box.dir / artifact["path"].get<std::string>();
    REQUIRE(fs::exists(path));
    CHECK(path.filename().string() == artifact["sha256"].get<std::string>() + ".trace.json");
    const auto trace = nlohmann::json::parse(slurp(path));
    REQUIRE(trace.contains("traceEvents"));
    bool fwd = false, bwd = false;
    for (const auto& event : trace["traceEvents"]) {
      const std::string name = event.value("name", "");
      // Labelled with the warm-up's dispatch records: implementation, kernel, config.
      fwd = fwd || (name.rfind("harness fwd layer 0 | ", 0) == 0 && name.find("attention_fwd") != std::string::npos);
      bwd = bwd || (name.rfind("harness bwd | ", 0) == 0 && name.find("attention_bwd") != std::string::npos);
    }
    CHECK(fwd);
    CHECK(bwd);
  }
  CHECK(traces == 2);  // fused and dense; the "throw" variant fails before its step
  // No CUDA here: the trial says why there is no snapshot instead of failing.
  for (const auto& trial : run["trials"]) {
    if (trial["status"] != "ok") continue;
    CHECK(trial["details"]["evidence_errors"]["memory_snapshot"] == "allocator snapshots are recorded on CUDA devices only");
  }
  const Result show = box.harness("show " + std::to_string(run["run"]["id"].get<int64_t>()));
  REQUIRE(show.exit_code == 0);
  CHECK(show.out.find("\nartifacts\n") != std::string::npos);
  CHECK(show.out.find("https://ui.perfetto.dev") != std::string::npos);
  CHECK(show.out.find("load_file(") != std::string::npos);  // the "throw" trial's kept capsule
}

// A capsule of the version 1 format (written by the writer before capsules became safetensors,
// tests/data/capsule_v1) still replays through the trial child, and what it writes now is safetensors.
TEST_CASE("a version 1 capsule still replays through the trial child", "[cli][replay][migration]") {
  Sandbox box;
  fs::path capsule;
  for (const auto& entry : fs::directory_iterator(fs::path(HARNESS_TEST_DATA_DIR) / "data" / "capsule_v1"))
    if (entry.path().extension() == ".capsule") capsule = entry.path();
  REQUIRE_FALSE(capsule.empty());
  // Its header, after the preamble line "harness-capsule 1 <header bytes> <payload offset>".
  const std::string file = slurp(capsule);
  REQUIRE(file.rfind("harness-capsule 1 ", 0) == 0);
  const size_t line_end = file.find('\n');
  const size_t header_bytes = std::stoul(file.substr(18, file.find(' ', 18) - 18));
  const auto header = nlohmann::json::parse(file.substr(line_end + 1, header_bytes));
  const fs::path spec = box.dir / "spec.json";
  std::ofstream(spec) << header["spec"].dump();

  const fs::path result_path = box.dir / "result.json";
  // The trial request as its parent writes it (experiments/kinds/trial.h); absent fields keep their defaults.
  const nlohmann::json request = {{"spec_file", spec.string()},
                                  {"variant", "fused"},
                                  {"device", "cpu"},
                                  {"allow_faults", true},
                                  {"result_path", result_path.string()},
                                  {"artifact_dir", (box.dir / "artifacts").string()},
                                  {"keep_capsules", true},
                                  {"replay_capsule", capsule.string()}};
  const fs::path request_path = box.dir / "request.json";
  std::ofstream(request_path) << request.dump();
  const Result trial = box.harness("__trial --request " + request_path.string());
  INFO(trial.err);
  REQUIRE(trial.exit_code == 0);
  const auto result = nlohmann::json::parse(slurp(result_path));
  CHECK(result["status"] == "ok");
  bool matched = false;
  for (const auto& metric : result["metrics"]) matched = matched || (metric["name"] == "match" && metric["value"] == 1.0);
  CHECK(matched);  // the fused step on the recorded inputs agrees with the fp32 reference
  bool outputs = false;
  for (const auto& artifact : result["artifacts"]) {
    if (artifact["kind"] != "outputs") continue;
    outputs = true;
    const std::string written = slurp(artifact["path"].get<std::string>());
    REQUIRE(written.size() > 8);
    CHECK(written[8] == '{');  // safetensors: an 8-byte length, then the JSON header
    CHECK(written.find("\"__metadata__\"") != std::string::npos);
  }
  CHECK(outputs);
}

// A request the child cannot read is refused before anything runs: exit 2 naming the file and
// the field, and no result file.
TEST_CASE("the trial child refuses a malformed request, naming the field", "[cli][trial]") {
  Sandbox box;
  const fs::path result_path = box.dir / "result.json";
  const fs::path request_path = box.dir / "request.json";
  const auto child_with = [&](const nlohmann::json& request) {
    std::ofstream(request_path) << request.dump();
    return box.harness("__trial --request " + request_path.string());
  };
  const nlohmann::json complete = {{"spec_file", (box.dir / "spec.json").string()},
                                   {"variant", "fused"},
                                   {"device", "cpu"},
                                   {"result_path", result_path.string()}};
  nlohmann::json wrong_type = complete;
  wrong_type["memory_limit_bytes"] = "16GiB";
  Result refused = child_with(wrong_type);
  CHECK(refused.exit_code == 2);
  CHECK(refused.err.find("memory_limit_bytes") != std::string::npos);
  CHECK(refused.err.find("an integer") != std::string::npos);
  nlohmann::json unknown = complete;
  unknown["timeout"] = 5;
  refused = child_with(unknown);
  CHECK(refused.exit_code == 2);
  CHECK(refused.err.find("\"timeout\" is not one a trial has") != std::string::npos);
  nlohmann::json no_variant = complete;
  no_variant.erase("variant");
  refused = child_with(no_variant);
  CHECK(refused.exit_code == 2);
  CHECK(refused.err.find("has no variant") != std::string::npos);
  CHECK(refused.err.find(request_path.string()) != std::string::npos);
  CHECK_FALSE(fs::exists(result_path));
}
