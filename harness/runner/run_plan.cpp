#include "harness/runner/run_plan.h"

#include <spdlog/spdlog.h>

#include <fmt/format.h>

#include <filesystem>

#include "experiments/memory_model.h"
#include "experiments/run_verdict.h"
#include "experiments/sweep.h"
#include "harness/runner/summary.h"

namespace harness {
namespace {

namespace fs = std::filesystem;

// The CUDA kernel a fused trial ran for `op` (attention_fwd, attention_bwd), from its dispatch
// records, or "" when it ran none (dense, CPU, failed before that phase).
std::string cuda_kernel_of(const nlohmann::json& dispatch, const std::string& op) {
  if (!dispatch.is_array()) return "";
  for (const auto& record : dispatch) {
    if (record.is_object() && record.value("op", "") == op && record.value("impl", "") == "fused_cuda")
      return record.value("kernel", "");
  }
  return "";
}

// The memory model's prediction for each attention variant at each point, stored as metrics beside
// the measured peaks so that `show`, diff and writeups put them side by side. On CUDA it models
// the kernels the trial's autotuner picked (the forward's tiling sets the schedule scratch, the
// backward's kind whether a dQ accumulator is allocated).
std::vector<db::Metric> model_metrics(const spec::Spec& point_spec, const nlohmann::json& point,
                                      const std::string& variant, const std::string& device,
                                      const nlohmann::json& dispatch) {
  memory_model::ModelOptions model_options;
  model_options.cuda_fwd_kernel = cuda_kernel_of(dispatch, "attention_fwd");
  model_options.cuda_bwd_kernel = cuda_kernel_of(dispatch, "attention_bwd");
  memory_model::Prediction prediction;
  const std::string device_kind = device.rfind("cuda", 0) == 0 ? "cuda" : "cpu";
  try {
    prediction = memory_model::predict(point_spec, variant, device_kind, model_options);
  } catch (const std::invalid_argument&) {  // a kernel this build does not know: model the default
    prediction = memory_model::predict(point_spec, variant, device_kind);
  }
  return {{variant, point, "model_fwd_peak_bytes", static_cast<double>(prediction.fwd_peak_bytes), "bytes", -1},
          {variant, point, "model_bwd_peak_bytes", static_cast<double>(prediction.bwd_peak_bytes), "bytes", -1}};
}

}  // namespace

void plan_points(PlannedRun& run) {
  run.points.clear();
  run.point_specs.clear();
  for (auto& [point, point_spec] : spec::points_with_specs(run.spec)) {
    run.points.push_back(std::move(point));
    run.point_specs.push_back(std::move(point_spec));
  }
  run.outcomes.assign(run.points.size(), {});
}

RecordedTrial execute_trial(const PlannedRun& run, const Job& job, const kinds::TrialRequest& base,
                            const std::string& result_path, const std::string& db_path, const GlobalOptions& options) {
  const spec::Variant& variant = run.spec.variants[job.variant];
  const nlohmann::json& point = run.points[job.point];
  kinds::TrialRequest request = base;
  request.spec_file = run.point_files[job.point];
  request.variant = variant.name;
  request.result_path = result_path;
  request.spec_dir = fs::absolute(fs::path(run.spec_path)).parent_path().string();
  request.timeout_s = run.spec.timeout_s;
  const std::string started_at = db::now_iso8601();
  const ChildOutcome outcome =
      run_child(trial_command(request, options), [](const std::string& line) { spdlog::debug("child: {}", line); });
  RecordedTrial recorded = record_trial(variant.name, point, outcome, request.result_path, db_path);
  recorded.trial.started_at = started_at;
  if (run.spec.kind == "attention_step") {
    const auto predicted =
        model_metrics(run.point_specs[job.point], point, variant.name, request.device, recorded.trial.dispatch);
    recorded.metrics.insert(recorded.metrics.end(), predicted.begin(), predicted.end());
  }
  return recorded;
}

void note_outcome(PlannedRun& run, size_t point, const RecordedTrial& recorded) {
  const db::Trial& trial = recorded.trial;
  spec::VariantOutcome variant_outcome;
  variant_outcome.status = trial.status;
  variant_outcome.error = trial.error;
  if (const auto failed = trial.details.find("check_failed"); failed != trial.details.end() && failed->is_string())
    variant_outcome.check_failed = failed->get<std::string>();
  for (const auto& [key, summary] : summarize(recorded.metrics)) variant_outcome.values[key.second] = summary.median;
  run.outcomes[point][trial.variant] = std::move(variant_outcome);
  run.metrics.insert(run.metrics.end(), recorded.metrics.begin(), recorded.metrics.end());
  run.any_failed = run.any_failed || trial_failed(trial.status);
  run.interrupted = run.interrupted || trial.status == "interrupted";
}

spec::Verdict decide(PlannedRun& run, db::Store& store) {
  if (run.interrupted) {
    spec::Verdict verdict;
    verdict.verdict = "INTERRUPTED";
    verdict.evidence = {{"reason", "the run was interrupted before every trial ran"}};
    return verdict;
  }
  spec::RunVerdict decided = spec::aggregate_verdict(run.spec, run.points, run.point_specs, run.outcomes);
  std::vector<db::Metric> metrics;
  for (const spec::DerivedMetric& metric : decided.metrics)
    metrics.push_back({metric.variant, nlohmann::json::object(), metric.name, metric.value, "", -1});
  if (!metrics.empty()) store.add_metrics(run.run_id, metrics);
  return decided.verdict;
}


}  // namespace harness
