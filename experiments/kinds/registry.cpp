#include "experiments/kinds/registry.h"

#include <stdexcept>

namespace harness::kinds {

const std::vector<KindInfo>& all_kinds() {
  static const std::vector<KindInfo> kinds = [] {
    std::vector<KindInfo> listed;
    // Each line of kinds.def: its KindInfo, which must carry the name the line gives it.
#define HARNESS_KIND(kind_name, info, runner)                                                          \
  listed.push_back(info());                                                                            \
  if (listed.back().name != #kind_name) throw std::logic_error("kinds.def: " #info "() names its kind " + listed.back().name);
#include "experiments/kinds/kinds.def"
#undef HARNESS_KIND
    return listed;
  }();
  return kinds;
}

const KindInfo* find_kind(const std::string& name) {
  for (const KindInfo& kind : all_kinds()) {
    if (kind.name == name) return &kind;
  }
  return nullptr;
}

KindInfo attention_step_kind() {
  KindInfo kind;
  kind.name = "attention_step";
  kind.summary = "one forward and backward of the drafter attention, variants compared";
  kind.attention = true;
  kind.impls = {"fused", "dense"};
  kind.measures = {"fwd_peak_bytes", "bwd_peak_bytes", "fwd_ms",         "bwd_ms",         "max_abs_err",
                   "out_max_abs_err", "dq_max_abs_err", "dk_max_abs_err", "dv_max_abs_err", "dispatch"};
  kind.default_measures = {"fwd_peak_bytes", "bwd_peak_bytes", "fwd_ms", "bwd_ms", "max_abs_err", "dispatch"};
  kind.verdict_metrics = {"fwd_peak_bytes", "bwd_peak_bytes", "fwd_ms", "bwd_ms", "match", "max_abs_err"};
  // The correctness check's per-tensor errors (experiments/tolerance.h).
  for (const char* tensor : {"out", "dq", "dk", "dv"})
    for (const char* error : {"_max_abs_err", "_mean_abs_err", "_lowp_err", "_lowp_mean_err"})
      kind.verdict_metrics.push_back(std::string(tensor) + error);
  kind.check_params = [](const nlohmann::json& params, ParamIssues& issues) {
    if (!params.empty()) issues.emplace_back("params", "attention_step takes no params; its fields are dims and mask");
  };
  return kind;
}

}  // namespace harness::kinds
