// What the spec validator knows of kind autotune_race (the runner: autotune_race.cpp).

#include <set>

#include "experiments/kinds/param_check.h"
#include "experiments/kinds/registry.h"

namespace harness::kinds {

KindInfo autotune_race_kind() {
  KindInfo kind;
  kind.name = "autotune_race";
  kind.summary = "threads warming up one autotuner at once: failure rate of the shared-state model and the fixes";
  kind.impls = {"legacy_shared_state", "per_call_state", "sequential_warmup"};
  kind.verdict_metrics = {"threads",    "rounds",        "failures",      "failure_rate",  "failure_rate_ci_low",
                          "failure_rate_ci_high", "calls", "failed_calls", "exceptions", "wrong_configs",
                          "wrong_results", "elapsed_ms"};
  kind.measures = kind.verdict_metrics;
  kind.default_measures = kind.verdict_metrics;
  kind.check_params = [](const nlohmann::json& params, ParamIssues& issues) {
    using namespace param_check;
    if (!check_object(params, "autotune_race", {"threads", "trials", "jitter_us", "kernel_us", "bench_launches", "sizes"}, issues)) return;
    if (params.contains("threads")) {
      const nlohmann::json& threads = params["threads"];
      const bool per_device = threads.is_string() && threads.get<std::string>() == "per_device";
      const bool count = threads.is_number_integer() && threads.get<int64_t>() >= 2 && threads.get<int64_t>() <= 256;
      if (!per_device && !count) {
        issues.emplace_back("params.threads", "expected an integer from 2 to 256 or \"per_device\" (one thread per device "
                                              "of --devices), got " + describe(threads));
      }
    }
    check_integer(params, "trials", 1, 1000000, issues);
    check_integer(params, "jitter_us", 0, 1000000, issues);
    check_integer(params, "kernel_us", 0, 100000, issues);
    check_integer(params, "bench_launches", 1, 1000, issues);
    if (!params.contains("sizes")) return;
    const nlohmann::json& sizes = params["sizes"];
    if (!sizes.is_array() || sizes.empty() || sizes.size() > 64) {
      issues.emplace_back("params.sizes", "expected an array of 1 to 64 problem sizes, got " + describe(sizes));
      return;
    }
    // The project's autotuner keys sizes by power-of-two bucket (ceil(log2 n)); two sizes in one
    // bucket would share a config, which is bucketing, not a race.
    std::set<int> buckets;
    for (size_t index = 0; index < sizes.size(); ++index) {
      const nlohmann::json& size = sizes[index];
      const std::string path = "params.sizes[" + std::to_string(index) + "]";
      if (!size.is_number_integer() || size.get<int64_t>() < 1 || size.get<int64_t>() > (int64_t{1} << 40)) {
        issues.emplace_back(path, "expected a problem size from 1 to 2^40, got " + describe(size));
        continue;
      }
      int bucket = 0;
      while ((int64_t{1} << bucket) < size.get<int64_t>()) ++bucket;
      if (!buckets.insert(bucket).second) {
        issues.emplace_back(path, "size " + size.dump() + " shares the autotuner's size bucket 2^" + std::to_string(bucket) +
                                      " with an earlier size; give sizes in distinct power-of-two buckets");
      }
    }
  };
  return kind;
}

}  // namespace harness::kinds
