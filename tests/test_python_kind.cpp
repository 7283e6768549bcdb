// Kind python: the script protocol case by case (tests/python/protocol_fixture.py, run by the
// system python3, no torch), the checks of its params, and the interpreter fingerprint.

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "trials/python_kind.h"
#include "experiments/kinds/python_kind_info.h"
#include "experiments/kinds/registry.h"
#include "core/errors.h"
#include "core/python_env.h"
#include "tests/catch.h"
#include "tests/test_paths.h"

namespace {

namespace fs = std::filesystem;
using harness::kinds::MetricValue;
using harness::kinds::ParamIssues;
using harness::kinds::TrialRequest;
using harness::kinds::TrialResult;

const std::string kTestDataDir = HARNESS_TEST_DATA_DIR;

// The system interpreter: the fixture needs only the standard library.
std::string system_python() { return access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3"; }

harness::spec::Spec fixture_spec(const std::string& mode, nlohmann::json extra = nlohmann::json::object()) {
  harness::spec::Spec spec;
  spec.name = "fixture";
  spec.kind = "python";
  spec.variants = {{"first", "script", ""}, {"second", "script", ""}};
  spec.timeout_s = 60;
  spec.params = {{"script", "python/protocol_fixture.py"}, {"args", {"--mode", mode}}};
  spec.params.update(extra);
  return spec;
}

TrialRequest fixture_context(const std::string& device = "cpu") {
  TrialRequest context;
  context.variant = "first";
  context.device = device;
  context.python = system_python();
  context.spec_dir = kTestDataDir;
  return context;
}

TrialResult run_mode(const std::string& mode, nlohmann::json extra = nlohmann::json::object()) {
  return harness::kinds::run_python(fixture_spec(mode, std::move(extra)), fixture_context());
}

std::vector<MetricValue> named(const TrialResult& result, const std::string& name) {
  std::vector<MetricValue> found;
  for (const auto& metric : result.metrics) {
    if (metric.name == name) found.push_back(metric);
  }
  return found;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::vector<std::string> issue_paths(const nlohmann::json& params) {
  ParamIssues issues;
  harness::kinds::python_kind().check_params(params, issues);
  std::vector<std::string> paths;
  for (const auto& [path, message] : issues) paths.push_back(path);
  return paths;
}

bool has(const std::vector<std::string>& list, const std::string& item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

}  // namespace

TEST_CASE("python kind: the printed object becomes metrics, units and details", "[python]") {
  const std::vector<std::string> tricky = {"a b", "$(touch /tmp/harness_no_shell)", "x;y", "*"};
  nlohmann::json variant_args = nlohmann::json::array();
  for (const auto& arg : tricky) variant_args.insert(variant_args.end(), {"--echo", arg});
  const auto result =
      run_mode("ok", {{"env", {{"FIXTURE", "from params"}}},
                      {"variants", {{"first", {{"args", variant_args}}}, {"second", {{"args", {"--echo", "no"}}}}}}});
  INFO(result.error << "\n" << result.details.dump(2));
  REQUIRE(result.status == "ok");
  const auto peak = named(result, "peak_bytes");
  REQUIRE(peak.size() == 1);
  CHECK(peak[0].value == 1024);
  CHECK(peak[0].unit == "bytes");
  CHECK(peak[0].repeat == -1);
  const auto step = named(result, "step_ms");
  REQUIRE(step.size() == 3);
  CHECK(step[1].value == 2.5);
  CHECK(step[1].repeat == 1);
  CHECK(step[2].unit == "ms");
  REQUIRE(named(result, "fused").size() == 1);
  CHECK(named(result, "fused")[0].value == 1.0);
  REQUIRE(named(result, "count").size() == 1);
  CHECK(named(result, "count")[0].unit == "calls");
  CHECK(named(result, "impl").empty());  // words stay in the details
  const auto& output = result.details.at("output");
  CHECK(output.at("impl") == "flex");
  // Argv only: each argument arrives as written, the first variant's and not the second's.
  CHECK(output.at("echo").get<std::vector<std::string>>() == tricky);
  CHECK_FALSE(fs::exists("/tmp/harness_no_shell"));
  CHECK(output.at("device") == "cpu");
  CHECK(output.at("visible") == "");
  CHECK(output.at("fixture_env") == "from params");
  CHECK(contains(result.details.at("stdout_tail").get<std::string>(), "log line before the result"));
  CHECK(contains(result.details.at("stderr_tail").get<std::string>(), "a warning on stderr"));
  CHECK(result.details.at("exit_code") == 0);
}

TEST_CASE("python kind: a cuda:N trial shows the script only that GPU, as cuda:0", "[python]") {
  const auto result = harness::kinds::run_python(fixture_spec("ok"), fixture_context("cuda:3"));
  REQUIRE(result.status == "ok");
  CHECK(result.details.at("output").at("device") == "cuda:0");
  CHECK(result.details.at("output").at("visible") == "3");
}

TEST_CASE("python kind: output that breaks the protocol is a failed trial with the reason", "[python]") {
  SECTION("no JSON") {
    const auto result = run_mode("no_json");
    CHECK(result.status == "error");
    CHECK(contains(result.error, "no JSON object"));
    CHECK(contains(result.error, "done, but no result"));
    CHECK(contains(result.details.at("stdout_tail").get<std::string>(), "done, but no result"));
  }
  SECTION("nothing at all") {
    const auto result = run_mode("silent");
    CHECK(result.status == "error");
    CHECK(contains(result.error, "printed nothing"));
  }
  SECTION("invalid JSON") {
    const auto result = run_mode("invalid_json");
    CHECK(result.status == "error");
    CHECK(contains(result.error, "not valid JSON"));
    CHECK(result.metrics.empty());
  }
  SECTION("JSON that is not an object") {
    const auto result = run_mode("not_object");
    CHECK(result.status == "error");
    CHECK(contains(result.error, "not an object"));
  }
  SECTION("a declared metric missing") {
    const auto result = run_mode("ok", {{"metrics", {{"peak_bytes", "bytes"}, {"bwd_ms", "ms"}}}});
    CHECK(result.status == "error");
    CHECK(contains(result.error, "bwd_ms"));
    CHECK_FALSE(contains(result.error, "peak_bytes"));
    CHECK(named(result, "peak_bytes").size() == 1);  // what was printed is kept
  }
}

TEST_CASE("python kind: how the script ended decides the status", "[python]") {
  SECTION("non-zero exit keeps the metrics printed before") {
    const auto result = run_mode("exit");
    CHECK(result.status == "error");
    CHECK(contains(result.error, "exited with code 1"));
    CHECK(contains(result.error, "ValueError: the probe failed after measuring"));
    CHECK(named(result, "peak_bytes").size() == 1);
  }
  SECTION("the error names the exception, not the hint printed after the traceback") {
    const auto result = run_mode("exit_with_hint");
    CHECK(result.status == "error");
    CHECK(contains(result.error, "exited with code 1: LoweringException: RuntimeError: Found no NVIDIA driver"));
    CHECK_FALSE(contains(result.error, "suppress_errors"));
  }
  SECTION("skip") {
    const auto result = run_mode("skip");
    CHECK(result.status == "unsupported");
    CHECK(contains(result.error, "needs a CUDA GPU"));
  }
  SECTION("oom reported by the script") {
    const auto result = run_mode("oom_json");
    CHECK(result.status == "oom");
    CHECK(result.requested_bytes == std::optional<int64_t>(16203091968));
  }
  SECTION("oom raised") {
    const auto result = run_mode("oom_raise");
    CHECK(result.status == "oom");
    CHECK(result.requested_bytes == std::optional<int64_t>(2 * 1024 * 1024));
  }
  SECTION("signal") {
    const auto result = run_mode("crash");
    CHECK(result.status == "crashed");
    CHECK(contains(result.error, "SIGSEGV"));
  }
  SECTION("hang: killed at params.timeout_s") {
    const auto result = run_mode("hang", {{"timeout_s", 1}});
    CHECK(result.status == "timeout");
    CHECK(contains(result.error, "1 s limit"));
    CHECK(result.details.at("duration_s").get<double>() < 5.0);
    CHECK(contains(result.details.at("stdout_tail").get<std::string>(), "log line before the result"));
  }
}

TEST_CASE("python kind: what cannot start is a failed trial naming what is missing", "[python]") {
  SECTION("missing script, relative to the spec's folder") {
    const auto result = run_mode("ok", {{"script", "python/no_such_script.py"}});
    CHECK(result.status == "error");
    CHECK(contains(result.error, "script not found"));
    CHECK(contains(result.error, kTestDataDir));
  }
  SECTION("missing interpreter") {
    auto context = fixture_context();
    context.python = "/nonexistent/bin/python3";
    const auto result = harness::kinds::run_python(fixture_spec("ok"), context);
    CHECK(result.status == "error");
    CHECK(contains(result.error, "interpreter not found"));
    CHECK(contains(result.error, "/nonexistent/bin/python3"));
    context.python = "no_such_python_interpreter";
    CHECK(contains(harness::kinds::run_python(fixture_spec("ok"), context).error, "$PATH"));
  }
  SECTION("params.variants naming no variant") {
    const auto result = run_mode("ok", {{"variants", {{"thrid", {{"args", {"--echo", "x"}}}}}}});
    CHECK(result.status == "error");
    CHECK(contains(result.error, "params.variants.thrid"));
  }
}

TEST_CASE("python kind: params are checked, every problem with its path", "[python]") {
  CHECK(issue_paths({{"script", "x.py"}}).empty());
  CHECK(issue_paths({{"script", "x.py"},
                     {"args", {"--a", "1"}},
                     {"env", {{"TORCH_LOGS", "+dynamo"}}},
                     {"timeout_s", 30},
                     {"metrics", {{"bwd_peak_bytes", "bytes"}, {"fwd_ms", "ms"}, {"failure_rate", ""}}},
                     {"variants", {{"eager", {{"args", {"--mode", "eager"}}, {"env", {{"X", "1"}}}}}}}})
            .empty());
  CHECK(has(issue_paths(nlohmann::json::object()), "params.script"));
  CHECK(has(issue_paths({{"script", ""}}), "params.script"));
  CHECK(has(issue_paths(nlohmann::json::array()), "params"));
  const auto paths = issue_paths({{"script", 3},
                                  {"args", {"--a", 1}},
                                  {"env", {{"CUDA_VISIBLE_DEVICES", "1"}, {"1BAD", "x"}, {"N", 2}}},
                                  {"timeout_s", -1},
                                  {"metrics", {{"peak_bytes", "MiB"}, {"wall", "ms"}, {"Bad", ""}, {"skipped", ""}}},
                                  {"variants", {{"eager", {{"args", "--mode eager"}, {"shell", true}}}, {"x", 1}}},
                                  {"argz", {}}});
  for (const std::string path :
       {"params.script", "params.args.1", "params.env.CUDA_VISIBLE_DEVICES", "params.env.1BAD", "params.env.N",
        "params.timeout_s", "params.metrics.peak_bytes", "params.metrics.wall", "params.metrics.Bad",
        "params.metrics.skipped", "params.variants.eager.args", "params.variants.eager.shell", "params.variants.x",
        "params.argz"}) {
    INFO(path);
    CHECK(has(paths, path));
  }
  CHECK(paths.size() == 14);
  CHECK_THROWS_AS(harness::kinds::parse_python_params({{"script", 3}}), std::invalid_argument);
  CHECK(harness::kinds::python_verdict_metrics({{"script", "x.py"}, {"metrics", {{"b_bytes", "bytes"}, {"rate", ""}}}}) ==
        std::vector<std::string>{"b_bytes", "rate"});
  const auto* kind = harness::kinds::find_kind("python");
  REQUIRE(kind != nullptr);
  CHECK(kind->impls == std::vector<std::string>{"script"});
}

TEST_CASE("python fingerprint: the interpreter describes itself, a missing one is a usage error", "[python]") {
  const auto fingerprint = harness::python_fingerprint(system_python(), 30);
  INFO(fingerprint.dump(2));
  CHECK(fingerprint.at("executable") == harness::find_program(system_python()).value());
  CHECK(fingerprint.at("version").get<std::string>().rfind("3.", 0) == 0);
  CHECK(fs::exists(fingerprint.at("real_path").get<std::string>()));
  for (const char* key : {"torch", "triton", "cuda", "prefix"}) CHECK(fingerprint.contains(key));
  CHECK_THROWS_AS(harness::python_fingerprint("/nonexistent/python3", 30), harness::UsageError);
  CHECK_THROWS_AS(harness::python_fingerprint("no_such_python_interpreter", 30), harness::UsageError);
  CHECK_THROWS_AS(harness::python_fingerprint("/bin/false", 30), harness::UsageError);
  CHECK_THROWS_AS(harness::python_fingerprint("/bin/true", 30), harness::UsageError);
  CHECK(harness::find_program("sh").has_value());
  CHECK_FALSE(harness::find_program(kTestDataDir).has_value());  // a directory is no program
}
