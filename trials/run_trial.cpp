#include "trials/run_trial.h"

#include <stdexcept>

#include "trials/attention_step.h"
#include "trials/autotune_race.h"
#include "trials/cache_corruption.h"
#include "trials/python_kind.h"

namespace harness::kinds {

TrialResult run_trial(const spec::Spec& spec, const TrialRequest& request) {
  // The runner of each line of experiments/kinds/kinds.def.
#define HARNESS_KIND(kind_name, info, runner) \
  if (spec.kind == #kind_name) return runner(spec, request);
#include "experiments/kinds/kinds.def"
#undef HARNESS_KIND
  throw std::invalid_argument("no runner for experiment kind \"" + spec.kind + "\"");
}

}  // namespace harness::kinds
