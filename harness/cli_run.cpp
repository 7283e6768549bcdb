// `harness run EXPERIMENT... | --all`: validate every spec completely, check the devices, plan
// (experiments × sweep points × variants), then run each trial in its own child process, one
// trial per device at a time, and store trials, metrics and verdicts.

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "db/store.h"
#include "experiments/memory_model.h"
#include "experiments/scaling.h"
#include "experiments/spec.h"
#include "experiments/verdict.h"
#include "experiments/sweep.h"
#include "harness/cli.h"
#include "core/printer.h"
#include "core/python_env.h"
#include "harness/run_report.h"
#include "harness/run_support.h"
#include "harness/summary.h"

namespace harness {
namespace {

namespace fs = std::filesystem;

struct RunArgs {
  std::vector<std::string> experiments;
  bool all = false;
  std::string device = "auto";
  std::string devices;
  std::vector<std::string> overrides;
  std::string profile;
  bool no_profile = false;
  std::vector<std::string> fail_on;
  std::string memory_limit;
  bool memory_limit_given = false;  //!< --memory-limit was on the command line (even as '')
  std::string python = "python3";
  bool keep_capsules = false;
  double env_timeout_s = 180.0;
};

//! One experiment of the invocation: its spec, points and run row, and what its trials gave.
struct PlannedRun {
  std::string spec_path;
  spec::Spec spec;
  std::vector<nlohmann::json> points;
  std::vector<spec::Spec> point_specs;
  std::vector<std::string> point_files;
  int64_t run_id = 0;
  size_t pending = 0;  //!< trials not finished yet
  std::vector<db::Metric> metrics;
  std::vector<std::map<std::string, spec::VariantOutcome>> outcomes;  //!< per point
  bool any_failed = false;
  bool interrupted = false;
  bool finished = false;
};

//! One trial to run.
struct Job {
  size_t run = 0;
  size_t point = 0;
  size_t variant = 0;
};

std::vector<std::string> all_experiment_specs(const std::vector<std::string>& dirs) {
  std::vector<std::string> paths, stems;
  for (const std::string& dir : dirs) {
    std::error_code error;
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(dir, error))
      if (entry.path().extension() == ".json") files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    for (const auto& file : files) {
      if (std::find(stems.begin(), stems.end(), file.stem().string()) != stems.end()) continue;
      stems.push_back(file.stem().string());
      paths.push_back(file.string());
    }
  }
  return paths;
}

std::string join_devices(const std::vector<std::string>& devices) {
  std::string joined;
  for (const auto& device : devices) joined += (joined.empty() ? "" : ",") + device;
  return joined;
}

std::string format_duration(double seconds) {
  if (seconds < 60.0) return fmt::format("{:.0f}s", seconds);
  if (seconds < 3600.0) return fmt::format("{}m{:02}s", static_cast<int>(seconds) / 60, static_cast<int>(seconds) % 60);
  return fmt::format("{}h{:02}m", static_cast<int>(seconds) / 3600, (static_cast<int>(seconds) / 60) % 60);
}

void check_fail_on(const std::vector<std::string>& fail_on) {
  for (const std::string& condition : fail_on) {
    if (condition == "failed" || condition == "invalid" || (condition.rfind("verdict=", 0) == 0 && condition.size() > 8))
      continue;
    throw UsageError(fmt::format("--fail-on '{}': expected failed, invalid or verdict=NAME", condition));
  }
}

// The CUDA forward kernel a fused trial ran, from its dispatch records, or "" when it ran none
// (dense, CPU, failed before the forward).
std::string cuda_fwd_kernel_of(const nlohmann::json& dispatch) {
  if (!dispatch.is_array()) return "";
  for (const auto& record : dispatch) {
    if (record.is_object() && record.value("op", "") == "attention_fwd" && record.value("impl", "") == "fused_cuda")
      return record.value("kernel", "");
  }
  return "";
}

// The memory model's prediction for each attention variant at each point, stored as metrics beside
// the measured peaks so that `show`, diff and writeups put them side by side. On CUDA it models
// the forward kernel the trial's autotuner picked (its tiling sets the schedule scratch).
std::vector<db::Metric> model_metrics(const spec::Spec& point_spec, const nlohmann::json& point,
                                      const std::string& variant, const std::string& device,
                                      const nlohmann::json& dispatch) {
  memory_model::ModelOptions model_options;
  model_options.cuda_fwd_kernel = cuda_fwd_kernel_of(dispatch);
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

// Verdict of a finished run: per point by the spec's rule; with a scaling section, once over the
// fits; several points agree or the verdict is MIXED.
spec::Verdict decide(PlannedRun& run, db::Store& store) {
  spec::Verdict verdict;
  if (run.interrupted) {
    verdict.verdict = "INTERRUPTED";
    verdict.evidence = {{"reason", "the run was interrupted before every trial ran"}};
    return verdict;
  }
  const spec::Spec& spec = run.spec;
  if (spec.scaling) {
    std::vector<spec::ScalingSample> samples;
    nlohmann::json per_point = nlohmann::json::array();
    for (size_t p = 0; p < run.points.size(); ++p) {
      for (const auto& [variant, outcome] : run.outcomes[p]) {
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

// The progress display: on a terminal, a status line (trial i of n, current point, elapsed, ETA)
// under the finished trials' lines; elsewhere only the finished lines; nothing under --json.
class Progress {
 public:
  Progress(bool enabled, size_t total, size_t workers)
      : enabled_(enabled), interactive_(isatty(STDERR_FILENO) != 0), total_(total), workers_(workers),
        start_(std::chrono::steady_clock::now()) {}

  void started(const std::string& what) {
    if (!enabled_ || !interactive_) return;
    ++started_;
    current_ = what;
    draw();
  }

  void finished(const std::string& line, double seconds) {
    ++done_;
    busy_seconds_ += seconds;
    if (!enabled_) return;
    if (interactive_) std::cerr << "\r\033[K";
    std::cerr << line << '\n';
    if (interactive_ && done_ < total_) draw();
  }

  void message(const std::string& line) {
    if (!enabled_) return;
    if (interactive_) std::cerr << "\r\033[K";
    std::cerr << line << '\n';
  }

 private:
  void draw() {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::string eta = "ETA -";
    if (done_ > 0) {
      const double per_trial = busy_seconds_ / static_cast<double>(done_);
      const double remaining = per_trial * static_cast<double>(total_ - done_) / static_cast<double>(workers_);
      eta = "ETA " + format_duration(remaining);
    }
    std::cerr << fmt::format("\r\033[K[{}/{}] {} · {} elapsed · {}", std::min(started_, total_), total_, current_,
                             format_duration(elapsed), eta)
              << std::flush;
  }

  bool enabled_, interactive_;
  size_t total_, workers_;
  size_t started_ = 0, done_ = 0;
  double busy_seconds_ = 0.0;
  std::string current_;
  std::chrono::steady_clock::time_point start_;
};

int run_experiments(const RunArgs& args, const GlobalOptions& options) {
  // Everything a user can get wrong is checked before any child starts or the db is touched.
  if (args.all && !args.experiments.empty())
    throw UsageError("give experiment names or --all, not both");
  if (!args.all && args.experiments.empty()) throw UsageError("name an experiment (`harness list` shows them) or pass --all");
  std::vector<std::string> devices;
  if (!args.devices.empty()) {
    if (args.device != "auto") throw UsageError("give --device or --devices, not both");
    devices = parse_device_list(args.devices);
  } else {
    check_device_syntax(args.device);
    devices = {args.device};
  }
  const int64_t memory_limit_bytes = parse_memory_limit(args.memory_limit, args.memory_limit_given).value_or(0);
  check_fail_on(args.fail_on);
  const auto dirs = experiment_search_dirs(options);
  std::vector<std::string> spec_paths;
  if (args.all) {
    spec_paths = all_experiment_specs(dirs);
    if (spec_paths.empty()) throw UsageError("--all: no experiment specs found");
  }
  for (const std::string& name : args.experiments) {
    const auto path = spec::find_spec(name, dirs);
    if (!path) {
      std::string searched;
      for (const auto& dir : dirs) searched += (searched.empty() ? "" : ", ") + dir;
      throw UsageError(fmt::format("unknown experiment '{}' (searched {}; `harness list` shows them)", name, searched));
    }
    spec_paths.push_back(*path);
  }
  const bool allow_faults = faults_allowed();
  std::vector<spec::SpecIssue> issues;
  std::vector<nlohmann::json> raws;
  for (const std::string& path : spec_paths) {
    raws.push_back(nlohmann::json::parse(read_file(path), nullptr, false));
    spec::LoadOptions load;
    load.overrides = args.overrides;
    load.allow_faults = allow_faults;
    if (!args.profile.empty()) {
      if (raws.back().is_discarded() || !spec::has_profile(raws.back(), args.profile))
        throw UsageError(fmt::format("--profile {}: {} defines no such profile", args.profile, path));
      load.profile = args.profile;
    }
    try {
      spec::load_spec_file(path, load);
    } catch (const spec::SpecError& error) {
      issues.insert(issues.end(), error.issues().begin(), error.issues().end());
    }
  }
  if (!issues.empty()) throw spec::SpecError(std::move(issues));

  ScratchDir scratch;
  install_interrupt_handlers();
  std::vector<nlohmann::json> envs;
  for (std::string& device : devices) {
    auto [resolved, env] = probe_device(device, options, scratch, args.env_timeout_s);
    device = resolved;
    envs.push_back(std::move(env));
  }
  const bool on_cpu = devices.front() == "cpu";

  std::vector<PlannedRun> runs;
  std::optional<nlohmann::json> python_env;
  for (size_t i = 0; i < spec_paths.size(); ++i) {
    spec::LoadOptions load;
    load.overrides = args.overrides;
    load.allow_faults = allow_faults;
    load.profile = args.profile;
    if (args.profile.empty() && !args.no_profile && on_cpu && !raws[i].is_discarded() && spec::has_profile(raws[i], "cpu"))
      load.profile = "cpu";
    PlannedRun run;
    run.spec_path = spec_paths[i];
    run.spec = spec::load_spec_file(spec_paths[i], load);
    run.points = spec::sweep_points(run.spec);
    for (const auto& point : run.points) run.point_specs.push_back(spec::spec_at_point(run.spec, point));
    run.outcomes.resize(run.points.size());
    if (run.spec.kind == "python" && !python_env) {
      // An interpreter that cannot run fails each trial with the reason; the env says so too.
      try {
        python_env = python_fingerprint(args.python, args.env_timeout_s);
      } catch (const std::exception& error) {
        python_env = nlohmann::json{{"interpreter", args.python}, {"error", error.what()}};
      }
    }
    runs.push_back(std::move(run));
  }

  db::Store store(options.db_path);
  if (const char* pages = std::getenv("HARNESS_FAULT_DB_MAX_PAGES"); pages && allow_faults) {
    // Test-only: the fault suite's disk-full case where no small file system can be mounted.
    store.limit_pages(std::atoll(pages));
  }
  const std::string artifact_dir = artifact_dir_for(options.db_path);
  std::vector<Job> jobs;
  for (size_t r = 0; r < runs.size(); ++r) {
    PlannedRun& run = runs[r];
    nlohmann::json env = envs.front();
    if (run.spec.kind == "python" && python_env) env["python"] = *python_env;
    db::Run row;
    row.env_id = store.put_env(env);
    row.experiment_id = store.put_experiment(run.spec.name, run.spec.resolved);
    row.experiment = run.spec.name;
    row.device = join_devices(devices);
    row.profile = run.spec.profile;
    row.args = {{"experiment", run.spec.name}, {"spec_path", run.spec_path}, {"set", args.overrides},
                {"requested_device", args.devices.empty() ? args.device : args.devices}};
    if (memory_limit_bytes > 0) row.args["memory_limit_bytes"] = memory_limit_bytes;
    if (run.spec.kind == "python") row.args["python"] = args.python;
    run.run_id = store.begin_run(row);
    for (size_t p = 0; p < run.points.size(); ++p) {
      run.point_files.push_back(scratch.file(fmt::format("spec-{}-{}.json", run.run_id, p)));
      write_file_atomic(run.point_files.back(), run.point_specs[p].resolved.dump(2));
      for (size_t v = 0; v < run.spec.variants.size(); ++v) jobs.push_back({r, p, v});
    }
    run.pending = run.points.size() * run.spec.variants.size();
  }

  const bool show_progress = !options.json;
  Progress progress(show_progress, jobs.size(), devices.size());
  for (const PlannedRun& run : runs) {
    progress.message(fmt::format("run {}: {} on {}{} — {} point{} × {} variant{}", run.run_id, run.spec.name,
                                 join_devices(devices), run.spec.profile.empty() ? "" : " (profile " + run.spec.profile + ")",
                                 run.points.size(), run.points.size() == 1 ? "" : "s", run.spec.variants.size(),
                                 run.spec.variants.size() == 1 ? "" : "s"));
  }

  std::mutex mutex;  // guards the queue, the store, the runs, storage_error and the progress display
  std::deque<Job> queue(jobs.begin(), jobs.end());
  size_t sequence = 0;
  // The first failure of the store (disk full, a damaged file) or of the machinery around a trial:
  // no further trial starts, and every unfinished run is stored as failed with this reason.
  std::string storage_error;
  auto finish_run = [&](PlannedRun& run) {
    const std::string status = run.interrupted ? "interrupted" : run.any_failed ? "failed" : "ok";
    const spec::Verdict verdict = decide(run, store);
    store.finish_run(run.run_id, status, verdict.verdict, verdict.evidence);
    run.finished = true;
  };
  auto worker = [&](const std::string& device) {
    while (true) {
      Job job;
      size_t index = 0;
      {
        std::lock_guard lock(mutex);
        if (queue.empty() || interrupt_requested() || !storage_error.empty()) return;
        job = queue.front();
        queue.pop_front();
        index = ++sequence;
      }
      PlannedRun& run = runs[job.run];
      const spec::Variant& variant = run.spec.variants[job.variant];
      const nlohmann::json& point = run.points[job.point];
      const std::string label = spec::point_label(point);
      const std::string what = fmt::format("{}{}{} · {} on {}", run.spec.name, label.empty() ? "" : " ", label,
                                           variant.name, device);
      {
        std::lock_guard lock(mutex);
        progress.started(what);
      }
      TrialLaunch launch;
      launch.spec_file = run.point_files[job.point];
      launch.variant = variant.name;
      launch.device = device;
      launch.devices = devices;
      launch.result_path = scratch.file(fmt::format("result-{}.json", index));
      launch.memory_limit_bytes = memory_limit_bytes;
      launch.allow_faults = allow_faults;
      if (run.spec.kind == "python") launch.python = args.python;
      launch.spec_dir = fs::absolute(fs::path(run.spec_path)).parent_path().string();
      launch.artifact_dir = artifact_dir;
      launch.keep_capsules = args.keep_capsules;
      launch.timeout_s = run.spec.timeout_s;
      const std::string started_at = db::now_iso8601();
      const ChildOutcome outcome =
          run_child(trial_command(launch, options), [](const std::string& line) { spdlog::debug("child: {}", line); });
      RecordedTrial recorded = record_trial(variant.name, point, outcome, launch.result_path, options.db_path);
      recorded.trial.started_at = started_at;
      if (run.spec.kind == "attention_step") {
        const auto predicted =
            model_metrics(run.point_specs[job.point], point, variant.name, device, recorded.trial.dispatch);
        recorded.metrics.insert(recorded.metrics.end(), predicted.begin(), predicted.end());
      }

      std::lock_guard lock(mutex);
      if (!storage_error.empty()) return;  // another worker's store failed: this trial cannot be kept either
      try {
        store_trial(store, run.run_id, recorded);
      } catch (const std::exception& error) {
        // Caught here, at the store's boundary, not in std::terminate: the run is ended below.
        storage_error = fmt::format("storing trial {} of run {} ({} at {}) failed: {}", index, run.run_id, variant.name,
                                    label.empty() ? "the only point" : label, error.what());
        progress.message("error: " + storage_error);
        return;
      }
      const db::Trial& trial = recorded.trial;
      spec::VariantOutcome variant_outcome;
      variant_outcome.status = trial.status;
      variant_outcome.error = trial.error;
      for (const auto& [key, summary] : summarize(recorded.metrics)) variant_outcome.values[key.second] = summary.median;
      run.outcomes[job.point][variant.name] = std::move(variant_outcome);
      run.metrics.insert(run.metrics.end(), recorded.metrics.begin(), recorded.metrics.end());
      run.any_failed = run.any_failed || trial_failed(trial.status);
      run.interrupted = run.interrupted || trial.status == "interrupted";
      progress.finished(fmt::format("  [{}/{}] {:<40} {:<12} {:.1f} s{}", index, jobs.size(), what, trial.status,
                                    trial.duration_s, trial.error.empty() ? "" : "  " + first_line(trial.error)),
                        trial.duration_s);
      if (--run.pending == 0) {
        try {
          finish_run(run);
        } catch (const std::exception& error) {
          storage_error = fmt::format("finishing run {} failed: {}", run.run_id, error.what());
          progress.message("error: " + storage_error);
          return;
        }
      }
    }
  };
  // Nothing a worker does may end the process: an exception escaping a thread is std::terminate,
  // which would leave its run "running" and its children behind.
  auto guarded_worker = [&](const std::string& device) {
    try {
      worker(device);
    } catch (const std::exception& error) {
      std::lock_guard lock(mutex);
      if (storage_error.empty()) storage_error = std::string("a trial worker failed: ") + error.what();
    }
  };
  std::vector<std::thread> workers;
  for (const std::string& device : devices) workers.emplace_back(guarded_worker, device);
  for (auto& thread : workers) thread.join();
  if (!storage_error.empty()) {
    // Mark each unfinished run failed with the reason. On a full disk this small update usually
    // still fits (SQLite reuses the WAL space of the failed transaction); if not, the run stays
    // "running" and the next `runs`/`db check` finds it abandoned, since this process is gone.
    std::string unrecorded;
    for (PlannedRun& run : runs) {
      if (run.finished) continue;
      try {
        store.finish_run(run.run_id, "failed", "", nlohmann::json{{"reason", storage_error}}, storage_error);
        run.finished = true;
      } catch (const std::exception& error) {
        unrecorded = error.what();
      }
    }
    throw InfraError(storage_error + (unrecorded.empty() ? "; the run is stored as failed"
                                                         : "; marking the run failed failed too (" + unrecorded +
                                                               "): it will show as abandoned"));
  }
  for (PlannedRun& run : runs) {
    if (run.finished) continue;
    run.interrupted = true;
    finish_run(run);
  }

  bool interrupted = false;
  int exit_code = kExitOk;
  nlohmann::json all = nlohmann::json::array();
  for (size_t r = 0; r < runs.size(); ++r) {
    const auto detail = store.get_run(runs[r].run_id);
    if (options.json) {
      all.push_back(run_detail_json(*detail));
    } else {
      if (r > 0) std::cout << '\n';
      print_run_summary(std::cout, *detail);
    }
    interrupted = interrupted || detail->run.status == "interrupted";
    for (const auto& condition : args.fail_on) {
      if ((condition == "failed" && detail->run.status != "ok") ||
          (condition == "invalid" && (detail->run.verdict == "INVALID" || detail->run.verdict == "INCONCLUSIVE")) ||
          (condition.rfind("verdict=", 0) == 0 && detail->run.verdict == condition.substr(8)))
        exit_code = kExitFailOn;
    }
  }
  if (options.json) print_json(std::cout, all.size() == 1 ? all.front() : nlohmann::json{{"runs", all}});
  return interrupted ? kExitInfra : exit_code;
}

}  // namespace

Action add_run_command(CLI::App& app, GlobalOptions& options) {
  auto args = std::make_shared<RunArgs>();
  auto* command = app.add_subcommand("run", "Run experiments: every trial isolated in its own process");
  command->add_option("experiment", args->experiments, "Experiment names (experiments/NAME.json) or spec paths");
  command->add_flag("--all", args->all, "Run every experiment of the experiment directories");
  command->add_option("--device", args->device, "cpu, cuda:N, or auto (cuda:0 when a GPU is present, else cpu)");
  command->add_option("--devices", args->devices,
                      "Spread the trials over these devices, one trial per device at a time (e.g. cuda:0,cuda:1)");
  command->add_option("--set", args->overrides,
                      "Override a spec field: path=value (dims.anchors=256); a list sweeps it (dims.anchors=[128,512])");
  command->add_option("--profile", args->profile, "Apply a profile of the spec (default: cpu on the CPU)");
  command->add_flag("--no-profile", args->no_profile, "Never apply a profile, even on the CPU");
  command
      ->add_option("--memory-limit", args->memory_limit,
                   "Cap the device memory of each trial's step (e.g. 96GiB), to reproduce an OOM of a smaller GPU")
      ->each([args](const std::string&) { args->memory_limit_given = true; });
  command->add_option("--python", args->python, "Interpreter for python experiments (default python3)");
  command->add_flag("--keep-capsules", args->keep_capsules, "Keep the capsules of trials that succeed too");
  command->add_option("--fail-on", args->fail_on,
                      "Exit 1 when: failed (a trial crashed/timed out/errored), invalid (verdict INVALID or "
                      "INCONCLUSIVE), verdict=NAME");
  add_global_options(*command, options);
  return [args, &options] { return run_experiments(*args, options); };
}

}  // namespace harness
