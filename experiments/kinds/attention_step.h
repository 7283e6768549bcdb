#pragma once
// Experiment kind `attention_step`: one forward and backward of the drafter attention (a stack
// of `layers` calls), for one variant, inside the trial child. Measures forward and backward
// peak memory and time over repeats, and checks outputs and gradients against an fp32 reference.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiments/spec.h"
#include "kernels/dispatch.h"

namespace harness::kinds {

//! One measured value of a trial.
struct MetricValue {
  std::string name;
  double value = 0.0;
  std::string unit;
  int repeat = -1;  //!< -1 for values measured once
};

//! What a trial child reports to its parent (as JSON in the result file).
struct TrialResult {
  std::string status = "ok";  //!< ok, oom, unsupported, error
  std::string error;
  std::optional<int64_t> requested_bytes;
  std::vector<MetricValue> metrics;
  std::vector<kernels::DispatchRecord> dispatch;
};

nlohmann::json to_json(const TrialResult& result);
TrialResult trial_result_from_json(const nlohmann::json& json);

//! Runs the variant on `device` ("cpu", "cuda:N"). Expected outcomes (OOM, unsupported
//! configuration) come back as a status; other failures as status "error". Injected faults
//! (tests only) crash, abort, throw or hang as asked.
//! `memory_limit_bytes` > 0 caps the device's memory for the step (not for the reference check
//! that follows it), so that a large GPU behaves like the smaller one a failure happened on.
TrialResult run_attention_step(const spec::Spec& spec, const std::string& variant, const std::string& device,
                               int64_t memory_limit_bytes = 0);

}  // namespace harness::kinds
