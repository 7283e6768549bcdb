#include "harness/runner/run_plan.h"

#include <spdlog/spdlog.h>

#include <fmt/format.h>

#include <filesystem>

#include "experiments/memory_model.h"
#include "experiments/scaling.h"
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
  run.points = spec::sweep_points(run.spec);
  run.point_specs.clear();
  for (const auto& point : run.points) run.point_specs.push_back(spec::spec_at_point(run.spec, point));
  run.outcomes.assign(run.points.size(), {});
}

RecordedTrial execute_trial(const PlannedRun& run, const Job& job, const TrialSettings& settings,
                            const std::string& result_path, const GlobalOptions& options) {
  const spec::Variant& variant = run.spec.variants[job.variant];
  const nlohmann::json& point = run.points[job.point];
  TrialLaunch launch;
  launch.spec_file = run.point_files[job.point];
  launch.variant = variant.name;
  launch.device = settings.device;
  launch.devices = settings.devices;
  launch.result_path = result_path;
  launch.memory_limit_bytes = settings.memory_limit_bytes;
  launch.allow_faults = settings.allow_faults;
  if (run.spec.kind == "python") launch.python = settings.python;
  launch.spec_dir = fs::absolute(fs::path(run.spec_path)).parent_path().string();
  launch.artifact_dir = settings.artifact_dir;
  launch.keep_capsules = settings.keep_capsules;
  launch.memory_snapshot = settings.memory_snapshot;
  launch.trace = settings.trace;
  launch.timeout_s = run.spec.timeout_s;
  const std::string started_at = db::now_iso8601();
  const ChildOutcome outcome =
      run_child(trial_command(launch, options), [](const std::string& line) { spdlog::debug("child: {}", line); });
  RecordedTrial recorded = record_trial(variant.name, point, outcome, launch.result_path, settings.db_path);
  recorded.trial.started_at = started_at;
  if (run.spec.kind == "attention_step") {
    const auto predicted =
        model_metrics(run.point_specs[job.point], point, variant.name, settings.device, recorded.trial.dispatch);
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
  spec::Verdict verdict;
  if (run.interrupted) {
    verdict.verdict = "INTERRUPTED";
    verdict.evidence = {{"reason", "the run was interrupted before every trial ran"}};
    return verdict;
  }
  const spec::Spec& spec = run.spec;
  if (spec.scaling) {
    // A wrong result at any point stops the fit from deciding (experiments/verdict.h).
    for (size_t p = 0; p < run.points.size(); ++p) {
      if (auto guarded = spec::failed_check_verdict(run.point_specs[p], run.outcomes[p])) {
        guarded->evidence["point"] = run.points[p];
        return *guarded;
      }
    }
    std::vector<spec::ScalingSample> samples;
    nlohmann::json per_point = nlohmann::json::array();
    std::map<std::string, double> match_everywhere;  // per variant: 1 when every point's check passed
    for (size_t p = 0; p < run.points.size(); ++p) {
      for (const auto& [variant, outcome] : run.outcomes[p]) {
        if (const auto match = outcome.values.find("match"); match != outcome.values.end())
          match_everywhere[variant] = std::min(match_everywhere.count(variant) ? match_everywhere[variant] : 1.0, match->second);
        per_point.push_back({{"point", run.points[p]}, {"variant", variant}, {"status", outcome.status}});
        const auto value = outcome.values.find(spec.scaling->metric);
        if (outcome.status != "ok" || value == outcome.values.end()) continue;
        spec::ScalingSample sample;
        sample.variant = variant;
        sample.value = value->second;
        for (const std::string& model : spec.scaling->models)
          sample.regressors[model] = spec::model_regressor(model, run.point_specs[p]);
        samples.push_back(std::move(sample));
      }
    }
    const auto fits = spec::fit_scaling(*spec.scaling, samples);
    std::map<std::string, spec::VariantOutcome> outcomes;
    std::vector<db::Metric> metrics;
    nlohmann::json fit_evidence = nlohmann::json::object();
    for (const spec::Variant& variant : spec.variants) {
      spec::VariantOutcome outcome;
      outcome.status = "ok";
      const auto found = fits.find(variant.name);
      nlohmann::json entry = {{"metric", spec.scaling->metric}, {"fits", nlohmann::json::array()}};
      if (found != fits.end()) {
        if (!found->second.growth.empty()) outcome.words["growth"] = found->second.growth;
        entry["growth"] = found->second.growth;
        for (const spec::Fit& fit : found->second.fits) {
          entry["fits"].push_back({{"model", fit.model},
                                   {"slope", fit.slope},
                                   {"intercept", fit.intercept},
                                   {"r2", fit.r2},
                                   {"points", fit.points}});
          if (fit.points < 2) continue;
          outcome.values["r2_" + fit.model] = fit.r2;
          outcome.values["slope_" + fit.model] = fit.slope;
          metrics.push_back({variant.name, nlohmann::json::object(), "r2_" + fit.model, fit.r2, "", -1});
          metrics.push_back({variant.name, nlohmann::json::object(), "slope_" + fit.model, fit.slope, "", -1});
        }
      }
      if (const auto match = match_everywhere.find(variant.name); match != match_everywhere.end())
        outcome.values["match"] = match->second;
      fit_evidence[variant.name] = std::move(entry);
      outcomes[variant.name] = std::move(outcome);
    }
    if (!metrics.empty()) store.add_metrics(run.run_id, metrics);
    verdict = spec::evaluate_verdict(spec, outcomes);
    verdict.evidence["fits"] = std::move(fit_evidence);
    verdict.evidence["points"] = std::move(per_point);
    return verdict;
  }
  std::vector<spec::Verdict> verdicts;
  for (size_t p = 0; p < run.points.size(); ++p)
    verdicts.push_back(spec::evaluate_verdict(run.point_specs[p], run.outcomes[p]));
  if (verdicts.size() == 1) return verdicts.front();
  nlohmann::json points = nlohmann::json::array();
  bool same = true;
  for (size_t p = 0; p < verdicts.size(); ++p) {
    points.push_back({{"point", run.points[p]}, {"verdict", verdicts[p].verdict}, {"evidence", verdicts[p].evidence}});
    same = same && verdicts[p].verdict == verdicts.front().verdict;
  }
  verdict.verdict = same ? verdicts.front().verdict : "MIXED";
  verdict.evidence = {{"points", std::move(points)}};
  if (!same) verdict.evidence["reason"] = "the sweep's points reached different verdicts";
  return verdict;
}


}  // namespace harness
