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
#include "experiments/spec.h"
#include "experiments/verdict.h"
#include "experiments/sweep.h"
#include "harness/cli/cli.h"
#include "core/printer.h"
#include "core/python_env.h"
#include "harness/runner/run_plan.h"
#include "harness/cli/run_report.h"
#include "harness/runner/run_support.h"
#include "harness/runner/slurm_run.h"
#include "harness/runner/summary.h"

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
  std::string model;
  std::vector<std::string> fail_on;
  std::string memory_limit;
  bool memory_limit_given = false;  //!< --memory-limit was on the command line (even as '')
  //! What every trial of the run is asked besides its point (--python, --keep-capsules,
  //! --memory-snapshot, --trace bind to it; device, caps and the artifact folder are set once known).
  kinds::TrialRequest trial;
  double env_timeout_s = 180.0;
  // Slurm (docs/RUNNING.md, "On a Slurm cluster").
  bool slurm = false;
  bool slurm_dry_run = false;
  bool no_wait = false;
  slurm::JobRequest request;
  int retries = 2;
  int trials_per_task = 1;
  std::string slurm_dir;
  //! Whether any Slurm-only option was given (an error without --slurm).
  bool any_slurm_option() const {
    return no_wait || !request.partition.empty() || !request.account.empty() || !request.time.empty() ||
           request.gpus_per_task != 0 || request.cpus_per_task != 0 || !request.mem.empty() ||
           request.array_parallel != 0 || !request.extra_args.empty() || retries != 2 || trials_per_task != 1 ||
           !slurm_dir.empty();
  }
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

// The summaries of finished runs (or their JSON) and the exit code their --fail-on conditions give.
int report_runs(db::Store& store, const std::vector<int64_t>& run_ids, const std::vector<std::string>& fail_on,
                const GlobalOptions& options) {
  bool interrupted = false;
  int exit_code = kExitOk;
  nlohmann::json all = nlohmann::json::array();
  for (size_t r = 0; r < run_ids.size(); ++r) {
    const auto detail = store.get_run(run_ids[r]);
    if (options.json) {
      all.push_back(run_detail_json(*detail));
    } else {
      if (r > 0) std::cout << '\n';
      print_run_summary(std::cout, *detail);
    }
    interrupted = interrupted || detail->run.status == "interrupted";
    for (const auto& condition : fail_on) {
      if ((condition == "failed" && detail->run.status != "ok") ||
          (condition == "invalid" && (detail->run.verdict == "INVALID" || detail->run.verdict == "INCONCLUSIVE")) ||
          (condition.rfind("verdict=", 0) == 0 && detail->run.verdict == condition.substr(8)))
        exit_code = kExitFailOn;
    }
  }
  if (options.json) print_json(std::cout, all.size() == 1 ? all.front() : nlohmann::json{{"runs", all}});
  return interrupted ? kExitInfra : exit_code;
}

void check_slurm_args(const RunArgs& args) {
  if (!args.devices.empty())
    throw UsageError("--devices spreads trials over the GPUs of this machine; with --slurm each task gets its "
                     "GPUs from Slurm (--gpus-per-task) and --device cuda means the first of them");
  if (args.retries < 0) throw UsageError(fmt::format("--retries {}: expected 0 or more", args.retries));
  if (args.trials_per_task < 1)
    throw UsageError(fmt::format("--trials-per-task {}: expected 1 or more", args.trials_per_task));
  if (args.request.array_parallel < 0)
    throw UsageError(fmt::format("--array-parallel {}: expected 1 or more (0: no limit)", args.request.array_parallel));
  if (args.request.gpus_per_task < 0 || args.request.cpus_per_task < 0)
    throw UsageError("--gpus-per-task and --cpus-per-task: expected 0 or more");
  for (const std::string& extra : args.request.extra_args)
    if (extra.rfind("--", 0) != 0 || extra.find('\n') != std::string::npos)
      throw UsageError(fmt::format("--sbatch-arg '{}': expected one sbatch option such as --qos=high", extra));
  const std::vector<std::pair<std::string, std::string>> texts = {
      {"--partition", args.request.partition}, {"--account", args.request.account}, {"--mem", args.request.mem},
      {"--slurm-dir", args.slurm_dir}};
  for (const auto& [option, value] : texts)
    if (const auto problem = slurm::sbatch_value_problem(value))
      throw UsageError(fmt::format("{} '{}': {}; it goes into the Slurm batch script", option, slurm::printable(value),
                                   *problem));
  if (!args.request.time.empty() &&
      args.request.time.find_first_not_of("0123456789:-") != std::string::npos)
    throw UsageError(fmt::format("--time '{}': expected a Slurm time such as 30, 00:30:00 or 1-00:00:00", args.request.time));
}

// What every trial of this invocation is asked, locally and on Slurm alike: the run's flags, the
// devices (the first is the device of a one-device run; a worker sets its own), the memory cap and
// the db's artifact folder.
kinds::TrialRequest trial_base(const RunArgs& args, const std::vector<std::string>& devices, int64_t memory_limit_bytes,
                               bool allow_faults, const GlobalOptions& options) {
  kinds::TrialRequest base = args.trial;
  base.device = devices.front();
  base.devices = devices;
  base.memory_limit_bytes = memory_limit_bytes;
  base.allow_faults = allow_faults;
  base.artifact_dir = artifact_dir_for(options.db_path);
  return base;
}

// `harness run --slurm`: the plan becomes one job array (one task per --trials-per-task trials);
// without --no-wait the job is followed and its shards merged as its tasks end.
int run_on_slurm(const RunArgs& args, std::vector<PlannedRun>& runs, const std::string& device,
                 int64_t memory_limit_bytes, bool allow_faults, const GlobalOptions& options) {
  // The run folder, its logs and the db are named in the batch script (#SBATCH --output, comments).
  if (const auto problem = slurm::sbatch_value_problem(options.db_path))
    throw UsageError(fmt::format("--db '{}': {}; a Slurm run names the db in its batch script",
                                 slurm::printable(options.db_path), *problem));
  std::vector<Job> jobs;
  for (size_t r = 0; r < runs.size(); ++r)
    for (size_t p = 0; p < runs[r].points.size(); ++p)
      for (size_t v = 0; v < runs[r].spec.variants.size(); ++v) jobs.push_back({r, p, v});
  slurm::SubmitOptions submit;
  submit.request = args.request;
  submit.retries = args.retries;
  submit.trials_per_task = args.trials_per_task;
  submit.dry_run = args.slurm_dry_run;
  submit.run_dir = args.slurm_dir;
  submit.trial = trial_base(args, {device}, memory_limit_bytes, allow_faults, options);
  submit.args_base = {{"set", args.overrides}, {"requested_device", args.device}};
  if (memory_limit_bytes > 0) submit.args_base["memory_limit_bytes"] = memory_limit_bytes;
  if (args.slurm_dry_run) {
    slurm::submit_runs(runs, jobs, submit, nullptr, options, nullptr);
    return kExitOk;
  }
  if (const auto reason = slurm::unavailable_reason()) throw InfraError("--slurm: " + *reason);
  db::Store store(options.db_path);
  std::string job_id;
  const auto run_ids = slurm::submit_runs(runs, jobs, submit, &store, options, &job_id);
  const int64_t first = run_ids.front();
  std::string run_list;
  for (const int64_t id : run_ids) run_list += (run_list.empty() ? "" : ", ") + std::to_string(id);
  const size_t tasks = (jobs.size() + static_cast<size_t>(args.trials_per_task) - 1) /
                       static_cast<size_t>(args.trials_per_task);
  std::cerr << fmt::format("submitted Slurm job {}: {} trial{} in {} array task{} (run{} {}); run folder {}\n", job_id,
                           jobs.size(), jobs.size() == 1 ? "" : "s", tasks, tasks == 1 ? "" : "s",
                           run_ids.size() == 1 ? "" : "s", run_list,
                           slurm::slurm_section(store, first).at("run_dir").get<std::string>());
  if (args.no_wait) {
    if (options.json) {
      print_json(std::cout, {{"job_id", job_id}, {"runs", run_ids}});
    } else {
      std::cout << fmt::format("job {}\nfollow it: harness slurm status {}    merge it: harness slurm collect {}\n",
                               job_id, first, first);
    }
    return kExitOk;
  }
  slurm::FollowOptions follow_options;
  follow_options.progress = !options.json;
  const auto followed = slurm::follow(store, first, follow_options);
  if (followed.interrupted) {
    std::cerr << fmt::format("interrupted: Slurm job {} keeps running (nothing was cancelled).\n"
                             "  harness slurm collect {}   follows it and merges its results\n"
                             "  harness slurm cancel {}    cancels it\n",
                             job_id, first, first);
    return kExitInfra;
  }
  return report_runs(store, run_ids, args.fail_on, options);
}

int run_experiments(const RunArgs& args, const GlobalOptions& options) {
  // Everything a user can get wrong is checked before any child starts or the db is touched.
  if (args.all && !args.experiments.empty())
    throw UsageError("give experiment names or --all, not both");
  if (!args.all && args.experiments.empty()) throw UsageError("name an experiment (`harness list` shows them) or pass --all");
  const bool on_slurm = args.slurm || args.slurm_dry_run;
  if (!on_slurm && args.any_slurm_option())
    throw UsageError("--partition, --account, --time, --gpus-per-task, --cpus-per-task, --mem, --array-parallel, "
                     "--retries, --trials-per-task, --sbatch-arg, --slurm-dir and --no-wait go with --slurm");
  if (on_slurm) check_slurm_args(args);
  std::vector<std::string> devices;
  if (on_slurm) {
    // Each task probes the device it was given on its node; here only the profile is decided.
    check_device_syntax(args.device);
    devices = {args.device != "auto" ? args.device : args.request.gpus_per_task > 0 ? "cuda" : "cpu"};
  } else if (!args.devices.empty()) {
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
  // Each spec is read once (bounded: core/json_input.h) and resolved once as it will run: its
  // profile (--profile, else the spec's cpu profile on the CPU), then --model and --set, then every
  // point checked (Spec::points, which the plan uses). With --device auto the device is known only
  // after the probe: a spec valid with or without its cpu profile goes on, and is resolved again
  // below once the probe has said which.
  const auto load_options = [&](bool on_cpu) {
    spec::LoadOptions load;
    load.overrides = args.overrides;
    load.model = args.model;
    load.allow_faults = allow_faults;
    load.profile = args.profile;
    if (args.profile.empty() && !args.no_profile && on_cpu) load.implicit_profile = "cpu";
    return load;
  };
  const bool device_known = devices.front() != "auto";
  std::vector<spec::SpecIssue> issues;
  size_t issues_more = 0;
  std::vector<std::string> texts;
  std::vector<std::optional<spec::Spec>> loaded;  // as they will run, when the device was named
  for (const std::string& path : spec_paths) {
    loaded.emplace_back();
    try {
      texts.push_back(spec::read_spec_text(path));
      try {
        spec::Spec spec = spec::load_spec_text(texts.back(), path, load_options(devices.front() == "cpu"));
        if (device_known) loaded.back() = std::move(spec);
      } catch (const spec::SpecError& error) {
        if (device_known) throw;
        try {
          spec::load_spec_text(texts.back(), path, load_options(true));  // valid on the CPU: the probe decides
        } catch (const spec::SpecError&) {
          throw error;
        }
      }
    } catch (const spec::SpecError& error) {
      issues.insert(issues.end(), error.issues().begin(), error.issues().end());
      issues_more += error.more();
    }
  }
  if (!issues.empty()) throw spec::SpecError(std::move(issues), issues_more);

  ScratchDir scratch;
  install_interrupt_handlers();
  std::vector<std::string> no_devices;
  std::vector<nlohmann::json> envs;
  for (std::string& device : on_slurm ? no_devices : devices) {
    auto [resolved, env] = probe_device(device, options, scratch, args.env_timeout_s);
    device = resolved;
    envs.push_back(std::move(env));
  }
  const bool on_cpu = devices.front() == "cpu";

  std::vector<PlannedRun> runs;
  std::optional<nlohmann::json> python_env;
  for (size_t i = 0; i < spec_paths.size(); ++i) {
    PlannedRun run;
    run.spec_path = spec_paths[i];
    run.spec = loaded[i] ? std::move(*loaded[i]) : spec::load_spec_text(texts[i], spec_paths[i], load_options(on_cpu));
    plan_points(run);
    if (run.spec.kind == "python" && !python_env && !on_slurm) {
      // An interpreter that cannot run fails each trial with the reason; the env says so too.
      try {
        python_env = python_fingerprint(args.trial.python, args.env_timeout_s);
      } catch (const std::exception& error) {
        python_env = nlohmann::json{{"interpreter", args.trial.python}, {"error", error.what()}};
      }
    }
    runs.push_back(std::move(run));
  }

  if (on_slurm) return run_on_slurm(args, runs, devices.front(), memory_limit_bytes, allow_faults, options);

  db::Store store(options.db_path);
  store.settle_abandoned_runs();  // reading commands show a dead harness's runs abandoned; a writer marks them
  if (const char* pages = std::getenv("HARNESS_FAULT_DB_MAX_PAGES"); pages && allow_faults) {
    // Test-only: the fault suite's disk-full case where no small file system can be mounted.
    store.limit_pages(std::atoll(pages));
  }
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
    if (run.spec.kind == "python") row.args["python"] = args.trial.python;
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

  const kinds::TrialRequest base = trial_base(args, devices, memory_limit_bytes, allow_faults, options);
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
      kinds::TrialRequest request = base;
      request.device = device;
      RecordedTrial recorded = execute_trial(run, job, request, scratch.file(fmt::format("result-{}.json", index)),
                                             options.db_path, options);

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
      note_outcome(run, job.point, recorded);
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

  std::vector<int64_t> run_ids;
  for (const PlannedRun& run : runs) run_ids.push_back(run.run_id);
  return report_runs(store, run_ids, args.fail_on, options);
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
  command->add_option("--model", args->model,
                      "Run at a model's attention shape: heads, kv_heads, head_dim (harness list --models), "
                      "after the profile and before --set");
  command
      ->add_option("--memory-limit", args->memory_limit,
                   "Cap the device memory of each trial's step (e.g. 96GiB), to reproduce an OOM of a smaller GPU")
      ->each([args](const std::string&) { args->memory_limit_given = true; });
  command->add_option("--python", args->trial.python, "Interpreter for python experiments (default python3)");
  command->add_flag("--keep-capsules", args->trial.keep_capsules, "Keep the capsules of trials that succeed too");
  command->add_flag("--memory-snapshot", args->trial.memory_snapshot,
                    "Keep the CUDA allocator snapshot of each trial's measured step (PyTorch's memory_viz opens it; "
                    "a trial that ends oom on CUDA keeps one always)");
  command->add_flag("--trace", args->trial.trace,
                    "Run each trial's measured step under the Kineto profiler and keep its Chrome trace (Perfetto opens it)");
  command->add_option("--fail-on", args->fail_on,
                      "Exit 1 when: failed (a trial crashed/timed out/errored), invalid (verdict INVALID or "
                      "INCONCLUSIVE), verdict=NAME");
  command->add_flag("--slurm", args->slurm,
                    "Run the trials as one Slurm job array, each task writing a db shard that is merged here");
  command->add_flag("--slurm-dry-run", args->slurm_dry_run, "Print the Slurm batch script; submit and write nothing");
  command->add_flag("--no-wait", args->no_wait,
                    "With --slurm: print the job id and return (harness slurm status|collect RUN follow it)");
  command->add_option("--partition", args->request.partition, "With --slurm: partition");
  command->add_option("--account", args->request.account, "With --slurm: account");
  command->add_option("--time", args->request.time, "With --slurm: time limit per task (e.g. 00:30:00)");
  command->add_option("--gpus-per-task", args->request.gpus_per_task,
                      "With --slurm: GPUs per task (--device cuda then means the first GPU Slurm gave)");
  command->add_option("--cpus-per-task", args->request.cpus_per_task, "With --slurm: CPU cores per task");
  command->add_option("--mem", args->request.mem, "With --slurm: host memory per task (e.g. 32G)");
  command->add_option("--array-parallel", args->request.array_parallel,
                      "With --slurm: at most N tasks at once (sbatch --array=...%N)");
  command->add_option("--retries", args->retries, "With --slurm: requeues of a failed task (default 2)");
  command->add_option("--trials-per-task", args->trials_per_task, "With --slurm: trials per array task (default 1)");
  command->add_option("--sbatch-arg", args->request.extra_args, "With --slurm: one more sbatch option, verbatim");
  command->add_option("--slurm-dir", args->slurm_dir,
                      "With --slurm: the run folder (manifest, shards, logs) on shared storage "
                      "(default <db folder>/slurm/<submission>)");
  add_global_options(*command, options);
  return [args, &options] { return run_experiments(*args, options); };
}

}  // namespace harness
