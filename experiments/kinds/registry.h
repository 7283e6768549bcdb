#pragma once
// The experiment kinds the spec validator knows: per kind, which variant implementations, which
// measurements and verdict metrics exist, and how its "params" section is checked. Torch-free.
// The kinds are listed once, in kinds.def, with their runners (trials/, dispatched by
// trials/run_trial.h in the child).

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace harness::kinds {

//! Problems found in a kind's "params": (JSON path from the spec root, e.g. "params.threads", message).
using ParamIssues = std::vector<std::pair<std::string, std::string>>;

//! What the spec validator needs to know of one kind.
struct KindInfo {
  std::string name;
  std::string summary;                        //!< one line for `harness list`
  bool attention = false;                     //!< has dims, mask, block_mask and check (attention_step)
  std::vector<std::string> impls;             //!< the values a variant's "impl" may take
  std::vector<std::string> measures;          //!< measurement names a spec may list in "measure"
  std::vector<std::string> default_measures;  //!< when the spec lists none
  std::vector<std::string> verdict_metrics;   //!< what a verdict condition may read besides status
  //! Checks the "params" object (absent: an empty object) and appends problems.
  std::function<void(const nlohmann::json& params, ParamIssues& issues)> check_params;
};

//! Every kind, in the order `harness list` shows them.
const std::vector<KindInfo>& all_kinds();
//! The kind of that name, or nullptr.
const KindInfo* find_kind(const std::string& name);

//! The kinds' KindInfo functions named in kinds.def, each defined in its own file.
KindInfo attention_step_kind();
KindInfo autotune_race_kind();
KindInfo cache_corruption_kind();
KindInfo python_kind();

}  // namespace harness::kinds
