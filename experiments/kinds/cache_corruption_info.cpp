// What the spec validator knows of kind cache_corruption (the runner: cache_corruption.cpp).

#include "experiments/kinds/param_check.h"
#include "experiments/kinds/registry.h"

namespace harness::kinds {

KindInfo cache_corruption_kind() {
  KindInfo kind;
  kind.name = "cache_corruption";
  kind.summary = "damaged on-disk autotune cache: detected, re-tuned, never crashing or using a bad entry";
  // One variant per damage; the runner (cache_corruption.h) describes each.
  kind.impls = {"truncated",       "zeroed",       "garbage",     "empty",          "not_a_cache",
                "old_version",     "malformed_entry", "other_device", "other_build", "unknown_config",
                "two_writer_processes", "two_writer_threads", "killed_writer"};
  kind.verdict_metrics = {"trials",       "detected", "recovered", "crashes", "bad_entry_used",
                          "entries_lost", "kills",    "leftover_temp_files"};
  kind.measures = kind.verdict_metrics;
  kind.default_measures = kind.verdict_metrics;
  kind.check_params = [](const nlohmann::json& params, ParamIssues& issues) {
    using namespace param_check;
    if (!check_object(params, "cache_corruption", {"keys"}, issues)) return;
    check_integer(params, "keys", 2, 256, issues);
  };
  return kind;
}

}  // namespace harness::kinds
