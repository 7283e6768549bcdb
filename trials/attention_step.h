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
#include "experiments/kinds/trial.h"

namespace harness::kinds {

//! Runs the variant on `device` ("cpu", "cuda:N"). Expected outcomes (OOM, unsupported
//! configuration) come back as a status; other failures as status "error". Injected faults
//! (tests only) crash, abort, throw or hang as asked.
//! `context.memory_limit_bytes` > 0 caps the device's memory for the step (not for the reference check
//! that follows it), so that a large GPU behaves like the smaller one a failure happened on.
TrialResult run_attention_step(const spec::Spec& spec, const TrialRequest& context);

}  // namespace harness::kinds
