// The one contract between whoever starts a trial and the trial child (experiments/kinds/trial.h):
// every field survives the trip through its request file, and a file that is not a request is
// refused naming the field.

#include <stdexcept>

#include <nlohmann/json.hpp>

#include "experiments/kinds/trial.h"
#include "tests/catch.h"

using harness::kinds::TrialRequest;

namespace {

// Every field away from its default, so that one the JSON forgets comes back different.
TrialRequest every_field_set() {
  TrialRequest request;
  request.spec_file = "/scratch/spec-7-0.json";
  request.variant = "fused";
  request.device = "cuda:1";
  request.devices = {"cuda:1", "cuda:2"};
  request.result_path = "/scratch/result-3.json";
  request.memory_limit_bytes = int64_t{40} << 30;
  request.allow_faults = true;
  request.python = "/opt/venv/bin/python";
  request.spec_dir = "/work/experiments";
  request.artifact_dir = "/work/harness.db.artifacts";
  request.keep_capsules = true;
  request.memory_snapshot = true;
  request.trace = true;
  request.replay_capsule = "/work/step.capsule";
  request.judge_outputs = "/work/step.outputs";
  request.timeout_s = 1234.5;
  return request;
}

}  // namespace

TEST_CASE("a trial request keeps every field through its JSON", "[trial][request]") {
  const TrialRequest sent = every_field_set();
  const nlohmann::json json = harness::kinds::to_json(sent);
  CHECK(json.size() == 16);  // one key per field of TrialRequest
  const TrialRequest read = harness::kinds::trial_request_from_json(nlohmann::json::parse(json.dump()));
  CHECK(read.spec_file == sent.spec_file);
  CHECK(read.variant == sent.variant);
  CHECK(read.device == sent.device);
  CHECK(read.devices == sent.devices);
  CHECK(read.result_path == sent.result_path);
  CHECK(read.memory_limit_bytes == sent.memory_limit_bytes);
  CHECK(read.allow_faults == sent.allow_faults);
  CHECK(read.python == sent.python);
  CHECK(read.spec_dir == sent.spec_dir);
  CHECK(read.artifact_dir == sent.artifact_dir);
  CHECK(read.keep_capsules == sent.keep_capsules);
  CHECK(read.memory_snapshot == sent.memory_snapshot);
  CHECK(read.trace == sent.trace);
  CHECK(read.replay_capsule == sent.replay_capsule);
  CHECK(read.judge_outputs == sent.judge_outputs);
  CHECK(read.timeout_s == sent.timeout_s);
}

TEST_CASE("a trial request's absent fields keep their defaults", "[trial][request]") {
  const TrialRequest read = harness::kinds::trial_request_from_json({{"variant", "dense"}});
  CHECK(read.variant == "dense");
  CHECK(read.python == "python3");
  CHECK(read.timeout_s == 600.0);
  CHECK(read.devices.empty());
  CHECK_FALSE(read.allow_faults);
}

TEST_CASE("a malformed trial request is refused naming the field", "[trial][request]") {
  using harness::kinds::trial_request_from_json;
  CHECK_THROWS_WITH(trial_request_from_json({{"memory_limit_bytes", "16GiB"}}),
                    Catch::Matchers::ContainsSubstring("\"memory_limit_bytes\": expected an integer"));
  CHECK_THROWS_WITH(trial_request_from_json({{"devices", {"cuda:0", 1}}}),
                    Catch::Matchers::ContainsSubstring("\"devices\": expected an array of strings"));
  CHECK_THROWS_WITH(trial_request_from_json({{"trace", 1}}),
                    Catch::Matchers::ContainsSubstring("\"trace\": expected true or false"));
  CHECK_THROWS_WITH(trial_request_from_json({{"variant", "fused"}, {"deadline_s", 5}}),
                    Catch::Matchers::ContainsSubstring("\"deadline_s\" is not one a trial has"));
  CHECK_THROWS_AS(trial_request_from_json(nlohmann::json::array()), std::invalid_argument);
}
