#pragma once
// The trial child's entry into the experiment kinds: runs one trial of a (per-point, resolved)
// spec with the runner of its kind.

#include "experiments/kinds/trial.h"
#include "experiments/spec.h"

namespace harness::kinds {

//! Runs the trial with the runner of `spec.kind`. Throws std::invalid_argument for an unknown kind.
TrialResult run_trial(const spec::Spec& spec, const TrialRequest& context);

}  // namespace harness::kinds
