#include "trials/run_trial.h"

#include <stdexcept>

#include "trials/attention_step.h"
#include "trials/autotune_race.h"
#include "trials/cache_corruption.h"
#include "trials/python_kind.h"

namespace harness::kinds {

TrialResult run_trial(const spec::Spec& spec, const TrialContext& context) {
  if (spec.kind == "attention_step") return run_attention_step(spec, context);
  if (spec.kind == "autotune_race") return run_autotune_race(spec, context);
  if (spec.kind == "cache_corruption") return run_cache_corruption(spec, context);
  if (spec.kind == "python") return run_python(spec, context);
  throw std::invalid_argument("no runner for experiment kind \"" + spec.kind + "\"");
}

}  // namespace harness::kinds
