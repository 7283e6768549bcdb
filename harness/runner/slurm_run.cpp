#include "harness/runner/slurm_run.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "experiments/sweep.h"
#include "core/printer.h"
#include "core/python_env.h"
#include "harness/runner/summary.h"
#include "core/trial_runner.h"

namespace harness::slurm {
namespace {

namespace fs = std::filesystem;

std::string absolute(const std::string& path) {
  std::error_code error;
  return fs::absolute(fs::path(path), error).lexically_normal().string();
}

// A name for the submission that sorts by time and cannot collide: the run folder's name, and the
// token a shard must carry to be merged into these runs.
std::string new_token() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &utc);
  std::random_device device;
  return fmt::format("{}-{:08x}", stamp, device());
}

std::string shard_path(const std::string& run_dir, int task, int attempt) {
  return fmt::format("{}/shards/task-{}.attempt-{}.db", run_dir, task, attempt);
}

// The attempts of `task` that left a shard, ascending.
std::vector<int> shard_attempts(const std::string& run_dir, int task) {
  std::vector<int> attempts;
  const std::string prefix = fmt::format("task-{}.attempt-", task);
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(run_dir + "/shards", error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || entry.path().extension() != ".db") continue;
    try {
      attempts.push_back(std::stoi(name.substr(prefix.size())));
    } catch (const std::exception&) {
    }
  }
  std::sort(attempts.begin(), attempts.end());
  return attempts;
}

// The manifest's layout: 2 keeps what each trial is asked as a kinds::TrialRequest ("trial").
constexpr int kManifestVersion = 2;

nlohmann::json read_manifest(const std::string& path) {
  const auto manifest = nlohmann::json::parse(read_file(path), nullptr, false);
  if (manifest.is_discarded() || !manifest.is_object() || !manifest.contains("tasks"))
    throw InfraError(path + ": not a harness Slurm manifest");
  if (manifest.value("version", 0) != kManifestVersion)
    throw InfraError(fmt::format("{}: a manifest of version {}, written by another harness release (this one reads "
                                 "version {}); follow or collect the job with the harness that submitted it",
                                 path, manifest.value("version", 0), kManifestVersion));
  return manifest;
}

// The planned runs of a manifest, as the submitting `harness run` had them.
std::vector<PlannedRun> runs_of(const nlohmann::json& manifest) {
  std::vector<PlannedRun> runs;
  const bool allow_faults = manifest.at("trial").value("allow_faults", false);
  for (const auto& entry : manifest.at("runs")) {
    PlannedRun run;
    run.spec_path = entry.at("spec_path").get<std::string>();
    run.spec = spec::parse_spec(entry.at("spec"), run.spec_path, allow_faults);
    run.spec.profile = entry.value("profile", "");
    plan_points(run);
    if (nlohmann::json(run.points) != entry.at("points"))
      throw InfraError("the manifest's sweep points of " + run.spec.name + " differ from its spec's");
    run.point_files = entry.at("point_files").get<std::vector<std::string>>();
    run.run_id = entry.at("run_id").get<int64_t>();
    runs.push_back(std::move(run));
  }
  return runs;
}

// What each trial of the manifest is asked besides its point (kinds::TrialRequest's run-wide part).
kinds::TrialRequest trial_base_of(const nlohmann::json& manifest) {
  try {
    return kinds::trial_request_from_json(manifest.at("trial"));
  } catch (const std::exception& error) {
    throw InfraError(std::string("the manifest's trial request: ") + error.what());
  }
}

std::string format_duration(double seconds) {
  if (seconds < 60.0) return fmt::format("{:.0f}s", seconds);
  if (seconds < 3600.0) return fmt::format("{}m{:02}s", static_cast<int>(seconds) / 60, static_cast<int>(seconds) % 60);
  return fmt::format("{}h{:02}m", static_cast<int>(seconds) / 3600, (static_cast<int>(seconds) / 60) % 60);
}

//! What the follower knows of one task.
struct TaskView {
  TaskState slurm;
  bool known = false;       // Slurm reported it
  bool final = false;       // finished and will not be requeued
  bool succeeded = false;   // final, and its last attempt ran every trial
  std::string note;         // why it is final, for not_run trials
};

// Whether the shard of `attempt` of `task` says every trial ran.
bool attempt_finished(const std::string& run_dir, int task, int attempt) {
  const std::string path = shard_path(run_dir, task, attempt);
  if (!fs::exists(path)) return false;
  try {
    for (const auto& shard_run : db::read_shard_runs(path))
      if (shard_run.finished_at.empty()) return false;
    return true;
  } catch (const db::DbError&) {
    return false;
  }
}

// Finishes every run of the manifest that is still running: not_run rows for trials without a
// result, outcomes from each trial's last result, the verdict, the status.
void finish_runs(db::Store& store, const nlohmann::json& manifest, const std::map<int, TaskView>& tasks) {
  std::vector<PlannedRun> runs = runs_of(manifest);
  const auto& trials = manifest.at("trials");
  std::map<size_t, int> task_of_trial;
  for (size_t task = 0; task < manifest.at("tasks").size(); ++task)
    for (const auto& index : manifest.at("tasks")[task]) task_of_trial[index.get<size_t>()] = static_cast<int>(task);
  const std::string job_id = manifest.value("job_id", "");

  for (size_t r = 0; r < runs.size(); ++r) {
    PlannedRun& run = runs[r];
    auto detail = store.get_run(run.run_id);
    if (!detail) throw InfraError(fmt::format("run {} is not in {}", run.run_id, store.path()));
    if (detail->run.status != "running") continue;
    // The last result of each trial (by manifest index): a requeued task skips trials an earlier
    // attempt finished, so at most one row per trial is not "interrupted".
    std::map<size_t, const db::Trial*> result_of;
    for (const db::Trial& trial : detail->trials) {
      const auto& slurm = trial.details.value("slurm", nlohmann::json::object());
      if (!slurm.contains("trial") || trial.status == "interrupted" || trial.status == "not_run") continue;
      result_of[slurm.at("trial").get<size_t>()] = &trial;
    }
    size_t missing = 0, planned = 0;
    std::set<std::string> reasons;
    for (size_t index = 0; index < trials.size(); ++index) {
      const auto& entry = trials[index];
      if (entry.at("run").get<size_t>() != r) continue;
      ++planned;
      const size_t point = entry.at("point").get<size_t>();
      const std::string variant = run.spec.variants[entry.at("variant").get<size_t>()].name;
      RecordedTrial recorded;
      const auto found = result_of.find(index);
      if (found != result_of.end()) {
        recorded.trial = *found->second;
        for (const db::Metric& metric : detail->metrics)
          if (metric.variant == variant && metric.point == run.points[point]) recorded.metrics.push_back(metric);
      } else {
        const int task = task_of_trial.at(index);
        const auto view = tasks.find(task);
        const std::string why = view == tasks.end() ? "its task was never seen by Slurm" : view->second.note;
        db::Trial& trial = recorded.trial;
        trial.run_id = run.run_id;
        trial.variant = variant;
        trial.point = run.points[point];
        trial.status = "not_run";
        trial.error = fmt::format("not run: Slurm task {} {}", task, why);
        trial.details = {{"slurm",
                          {{"trial", index},
                           {"point_index", point},
                           {"task", task},
                           {"job_id", job_id + "_" + std::to_string(task)},
                           {"state", view == tasks.end() ? "UNKNOWN" : view->second.slurm.state},
                           {"reason", view == tasks.end() ? "" : view->second.slurm.reason},
                           {"attempts", view == tasks.end() ? 0 : view->second.slurm.restarts + 1}}}};
        store.add_trial(trial, {});
        ++missing;
        reasons.insert(fmt::format("task {} {}", task, why));
      }
      note_outcome(run, point, recorded);
    }
    const spec::Verdict verdict = decide(run, store);
    std::string error;
    if (missing > 0) {
      std::string why;
      for (const auto& reason : reasons) why += (why.empty() ? "" : "; ") + reason;
      error = fmt::format("{} of {} trials not run ({})", missing, planned, why);
    }
    store.finish_run(run.run_id, run.any_failed ? "failed" : "ok", verdict.verdict, verdict.evidence, error);
  }
}

// Waits `seconds`, returning early (false) on Ctrl-C.
bool pause_for(double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (interrupt_requested()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return !interrupt_requested();
}

}  // namespace

nlohmann::json slurm_section(db::Store& store, int64_t run_id) {
  const auto detail = store.get_run(run_id);
  if (!detail) throw UsageError(fmt::format("no run {} in {}", run_id, store.path()));
  const auto& args = detail->run.args;
  if (!args.contains("slurm") || !args.at("slurm").is_object())
    throw UsageError(fmt::format("run {} was not run on Slurm (harness run --slurm)", run_id));
  return args.at("slurm");
}

std::vector<int64_t> submit_runs(std::vector<PlannedRun>& runs, const std::vector<Job>& jobs,
                                 const SubmitOptions& submit, db::Store* store_pointer,
                                 const GlobalOptions& options, std::string* job_id_out) {
  const std::string token = new_token();
  const std::string db_path = absolute(options.db_path);
  const std::string run_dir =
      submit.run_dir.empty() ? (fs::path(db_path).parent_path() / "slurm" / token).string() : absolute(submit.run_dir);
  // One array task per chunk of trials_per_task trials, in the planner's order.
  std::vector<std::vector<size_t>> tasks;
  for (size_t index = 0; index < jobs.size(); ++index) {
    if (index % static_cast<size_t>(submit.trials_per_task) == 0) tasks.emplace_back();
    tasks.back().push_back(index);
  }
  std::vector<std::string> trial_lines;
  for (size_t task = 0; task < tasks.size(); ++task) {
    std::string line = fmt::format("task {}:", task);
    for (size_t index : tasks[task]) {
      const Job& job = jobs[index];
      const PlannedRun& run = runs[job.run];
      const std::string label = spec::point_label(run.points[job.point]);
      line += fmt::format(" {}{}{} {}{}", run.spec.name, label.empty() ? "" : " ", label,
                          run.spec.variants[job.variant].name, index == tasks[task].back() ? "" : ";");
    }
    trial_lines.push_back(line);
  }
  BatchScript script;
  script.request = submit.request;
  std::string names;
  for (const PlannedRun& run : runs) names += (names.empty() ? "" : "+") + run.spec.name;
  if (script.request.job_name.empty()) script.request.job_name = "harness-" + names;
  script.tasks = static_cast<int>(tasks.size());
  script.log_dir = run_dir + "/logs";
  script.harness = self_executable();
  script.manifest = run_dir + "/manifest.json";
  script.description = fmt::format(
      "harness run {} --slurm: {} trial{} in {} array task{} on device {}{}, db {}", names, jobs.size(),
      jobs.size() == 1 ? "" : "s", tasks.size(), tasks.size() == 1 ? "" : "s", submit.trial.device,
      submit.trial.device == "cuda" ? " (the first GPU Slurm gives the task)" : "", db_path);
  script.trial_lines = trial_lines;
  if (submit.dry_run) {
    std::cout << batch_script(script);
    return {};
  }

  db::Store& store = *store_pointer;
  for (const char* sub : {"", "/specs", "/shards", "/logs"}) {
    std::error_code error;
    fs::create_directories(run_dir + sub, error);
    if (error) throw InfraError(fmt::format("cannot create {}: {}", run_dir + sub, error.message()));
  }
  nlohmann::json manifest = {{"version", kManifestVersion},
                             {"token", token},
                             {"db", db_path},
                             {"run_dir", run_dir},
                             {"log_level", options.log_level},
                             {"retries", submit.retries},
                             {"runs", nlohmann::json::array()},
                             {"trials", nlohmann::json::array()},
                             {"tasks", tasks}};
  kinds::TrialRequest trial = submit.trial;
  trial.artifact_dir = absolute(trial.artifact_dir);
  manifest["trial"] = kinds::to_json(trial);
  std::vector<int64_t> run_ids;
  for (size_t r = 0; r < runs.size(); ++r) {
    PlannedRun& run = runs[r];
    db::Run row;
    row.experiment_id = store.put_experiment(run.spec.name, run.spec.resolved);
    row.device = trial.device;
    row.profile = run.spec.profile;
    row.args = submit.args_base;
    row.args["slurm"] = {{"token", token},
                         {"run_dir", run_dir},
                         {"manifest", script.manifest},
                         {"job_id", ""},
                         {"tasks", tasks.size()},
                         {"trials_per_task", submit.trials_per_task},
                         {"retries", submit.retries}};
    run.run_id = store.begin_run(row);
    run_ids.push_back(run.run_id);
    run.point_files.clear();
    for (size_t p = 0; p < run.points.size(); ++p) {
      run.point_files.push_back(fmt::format("{}/specs/run-{}-point-{}.json", run_dir, run.run_id, p));
      write_file_atomic(run.point_files.back(), run.point_specs[p].resolved.dump(2));
    }
    manifest["runs"].push_back({{"run_id", run.run_id},
                                {"spec_path", absolute(run.spec_path)},
                                {"spec", run.spec.resolved},
                                {"profile", run.spec.profile},
                                {"points", run.points},
                                {"point_files", run.point_files}});
  }
  for (const Job& job : jobs) manifest["trials"].push_back({{"run", job.run}, {"point", job.point}, {"variant", job.variant}});
  write_file_atomic(script.manifest, manifest.dump(2));
  const std::string script_path = run_dir + "/batch.sh";
  write_file_atomic(script_path, batch_script(script));

  std::string job_id;
  try {
    job_id = submit_script(script_path);
  } catch (const InfraError& error) {
    for (const int64_t run_id : run_ids)
      store.finish_run(run_id, "failed", "", nlohmann::json::object(), std::string("sbatch failed: ") + error.what());
    throw;
  }
  manifest["job_id"] = job_id;
  write_file_atomic(script.manifest, manifest.dump(2));
  for (const int64_t run_id : run_ids) {
    auto args = store.get_run(run_id)->run.args;
    args["slurm"]["job_id"] = job_id;
    store.set_run_args(run_id, args);
  }
  if (job_id_out) *job_id_out = job_id;
  return run_ids;
}

FollowResult follow(db::Store& store, int64_t run_id, const FollowOptions& follow_options) {
  const nlohmann::json section = slurm_section(store, run_id);
  const nlohmann::json manifest = read_manifest(section.at("manifest").get<std::string>());
  const std::string run_dir = manifest.at("run_dir").get<std::string>();
  const std::string job_id = manifest.value("job_id", section.value("job_id", ""));
  if (job_id.empty()) throw UsageError(fmt::format("run {} has no Slurm job (it was never submitted)", run_id));
  const int retries = manifest.value("retries", 0);
  const bool cancelled = section.value("cancelled", false);
  const size_t task_count = manifest.at("tasks").size();
  FollowResult result;
  for (const auto& entry : manifest.at("runs")) result.run_ids.push_back(entry.at("run_id").get<int64_t>());

  std::set<std::string> merged;           // shard paths merged by this follower
  std::map<int, int> requeued_at;         // task -> restart count when we requeued it
  const bool interactive = isatty(STDERR_FILENO) != 0;
  std::string last_line;
  const auto start = std::chrono::steady_clock::now();
  size_t done_at_start = SIZE_MAX;
  for (;;) {
    std::string query_error;
    const auto states = query(job_id, &query_error);
    std::map<int, TaskView> tasks;
    size_t pending = 0, running = 0, done = 0, failed = 0, requeued = 0;
    for (size_t t = 0; t < task_count; ++t) {
      const int task = static_cast<int>(t);
      TaskView view;
      if (states) {
        for (const TaskState& state : *states)
          if (state.task == task) view.slurm = state, view.known = true;
      }
      if (!view.known) {
        // Slurm forgot the job (past MinJobAge, or the controller's state was lost): what the
        // shards hold is all there will be.
        view.slurm.task = task;
        view.slurm.state = "UNKNOWN";
        view.slurm.reason = states ? "not listed by squeue" : query_error;
        view.slurm.restarts = shard_attempts(run_dir, task).empty() ? 0 : shard_attempts(run_dir, task).back();
      }
      if (view.known && !is_finished(view.slurm.state)) {
        (view.slurm.state == "PENDING" ? pending : running) += 1;
        if (view.slurm.restarts > 0) ++requeued;
        tasks[task] = view;
        continue;
      }
      // The task ended: merge what each of its attempts wrote (idempotent; a killed attempt's
      // shard holds the trials it finished and the one it was stopped in).
      for (const int attempt : shard_attempts(run_dir, task)) {
        const std::string path = shard_path(run_dir, task, attempt);
        if (merged.count(path)) continue;
        db::MergeOptions merge_options;
        merge_options.allow_unfinished = true;
        merge_options.slurm_state = attempt == view.slurm.restarts ? view.slurm.state : "REQUEUED";
        try {
          store.merge_shard(path, merge_options);
          merged.insert(path);
        } catch (const db::DbError& error) {
          // A damaged shard (node died mid-write) loses that attempt's trials, not the run.
          spdlog::warn("shard {} not merged: {}", path, error.what());
          merged.insert(path);
        }
      }
      const bool complete = attempt_finished(run_dir, task, view.slurm.restarts);
      if (view.slurm.state == "COMPLETED" && complete) {
        view.final = view.succeeded = true;
        ++done;
      } else if (follow_options.requeue && !cancelled && view.known && view.slurm.restarts < retries) {
        const auto previous = requeued_at.find(task);
        if (previous == requeued_at.end() || previous->second != view.slurm.restarts) {
          requeue(job_id, task);
          requeued_at[task] = view.slurm.restarts;
          const std::string message = fmt::format("slurm: task {} ended {} (reason {}); requeued, attempt {} of {}",
                                                  task, view.slurm.state, view.slurm.reason,
                                                  view.slurm.restarts + 2, retries + 1);
          // Always said (on stderr, also under --json): a requeue is an event of the run, not progress.
          std::cerr << (interactive && follow_options.progress ? "\r\033[K" : "") << message << '\n';
        }
        ++pending;
        ++requeued;
      } else {
        view.final = true;
        view.note = fmt::format("ended {}{} after {} attempt{}{}", view.slurm.state,
                                view.slurm.reason.empty() || view.slurm.reason == "None"
                                    ? ""
                                    : " (reason " + view.slurm.reason + ")",
                                view.slurm.restarts + 1, view.slurm.restarts == 0 ? "" : "s",
                                cancelled ? ", cancelled with harness slurm cancel" : "");
        ++failed;
      }
      tasks[task] = view;
    }

    const size_t final_count = done + failed;
    if (done_at_start == SIZE_MAX) done_at_start = final_count;
    if (follow_options.progress) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::string eta = "ETA -";
      if (final_count > done_at_start && final_count < task_count)
        eta = "ETA " + format_duration(elapsed / static_cast<double>(final_count - done_at_start) *
                                       static_cast<double>(task_count - final_count));
      const std::string line =
          fmt::format("slurm job {}: {} task{}: {} pending · {} running · {} done · {} failed{}", job_id, task_count,
                      task_count == 1 ? "" : "s", pending, running, done, failed,
                      requeued ? fmt::format(" · {} requeued", requeued) : "");
      if (interactive) {
        std::cerr << "\r\033[K" << line << " · " << format_duration(elapsed) << " elapsed · " << eta << std::flush;
      } else if (line != last_line) {
        std::cerr << line << '\n';
      }
      last_line = line;
    }
    if (final_count == task_count) {
      if (follow_options.progress && interactive) std::cerr << '\n';
      finish_runs(store, manifest, tasks);
      result.finished = true;
      return result;
    }
    if (!follow_options.wait) {
      if (follow_options.progress && interactive) std::cerr << '\n';
      return result;
    }
    if (!pause_for(follow_options.poll_s)) {
      if (follow_options.progress && interactive) std::cerr << '\n';
      result.interrupted = true;
      return result;
    }
  }
}

nlohmann::json job_status(db::Store& store, int64_t run_id) {
  const nlohmann::json section = slurm_section(store, run_id);
  const nlohmann::json manifest = read_manifest(section.at("manifest").get<std::string>());
  const std::string run_dir = manifest.at("run_dir").get<std::string>();
  const std::string job_id = manifest.value("job_id", "");
  std::string error;
  const auto states = job_id.empty() ? std::nullopt : query(job_id, &error);
  std::set<std::string> merged;
  for (const auto& merge : store.list_shard_merges(run_id)) merged.insert(merge.shard_key);
  nlohmann::json tasks = nlohmann::json::array();
  for (size_t t = 0; t < manifest.at("tasks").size(); ++t) {
    const int task = static_cast<int>(t);
    nlohmann::json entry = {{"task", task}, {"trials", manifest.at("tasks")[t].size()}, {"state", "UNKNOWN"},
                            {"reason", states ? "not listed by squeue" : error}, {"node", ""}, {"restarts", 0}};
    if (states) {
      for (const TaskState& state : *states) {
        if (state.task != task) continue;
        entry["state"] = state.state;
        entry["reason"] = state.reason;
        entry["node"] = state.node;
        entry["restarts"] = state.restarts;
      }
    }
    nlohmann::json shards = nlohmann::json::array();
    for (const int attempt : shard_attempts(run_dir, task)) {
      const std::string key = fmt::format("task-{}.attempt-{}", task, attempt);
      shards.push_back({{"attempt", attempt}, {"merged", merged.count(key) > 0}});
    }
    entry["shards"] = shards;
    tasks.push_back(entry);
  }
  const auto detail = store.get_run(run_id);
  return {{"run", run_id},
          {"job_id", job_id},
          {"status", detail->run.status},
          {"run_dir", run_dir},
          {"tasks", tasks},
          {"error", detail->run.error}};
}

void cancel_job(db::Store& store, int64_t run_id) {
  const nlohmann::json section = slurm_section(store, run_id);
  const nlohmann::json manifest = read_manifest(section.at("manifest").get<std::string>());
  const std::string job_id = manifest.value("job_id", "");
  if (job_id.empty()) throw UsageError(fmt::format("run {} has no Slurm job (it was never submitted)", run_id));
  // Recorded first, so that a follower running elsewhere stops requeueing.
  for (const auto& entry : manifest.at("runs")) {
    const int64_t id = entry.at("run_id").get<int64_t>();
    auto args = store.get_run(id)->run.args;
    args["slurm"]["cancelled"] = true;
    store.set_run_args(id, args);
  }
  cancel(job_id);
}

int run_task(const std::string& manifest_path, const GlobalOptions& options) {
  const char* task_text = std::getenv("SLURM_ARRAY_TASK_ID");
  if (!task_text || !*task_text)
    throw UsageError("__slurm-task runs inside a Slurm array task (SLURM_ARRAY_TASK_ID is not set)");
  const int task = std::atoi(task_text);
  const char* restarts = std::getenv("SLURM_RESTART_COUNT");
  const int attempt = restarts && *restarts ? std::atoi(restarts) : 0;
  const auto env_text = [](const char* name) {
    const char* value = std::getenv(name);
    return std::string(value ? value : "");
  };
  const std::string array_job_id = env_text("SLURM_ARRAY_JOB_ID");
  const std::string node = env_text("SLURMD_NODENAME");
  const nlohmann::json manifest = read_manifest(manifest_path);
  if (task < 0 || static_cast<size_t>(task) >= manifest.at("tasks").size())
    throw UsageError(fmt::format("array task {} is not in {} ({} tasks)", task, manifest_path, manifest.at("tasks").size()));
  const std::string run_dir = manifest.at("run_dir").get<std::string>();
  std::vector<PlannedRun> runs = runs_of(manifest);
  kinds::TrialRequest base = trial_base_of(manifest);
  const std::string db_path = manifest.at("db").get<std::string>();  // artifact paths are stored relative to it
  std::cerr << fmt::format("harness slurm task {} attempt {} on {} (job {}_{}, CUDA_VISIBLE_DEVICES={})\n", task,
                           attempt, node, array_job_id, task,
                           std::getenv("CUDA_VISIBLE_DEVICES") ? std::getenv("CUDA_VISIBLE_DEVICES") : "unset");

  // Trials an earlier attempt of this task finished are not run again.
  std::set<size_t> done_before;
  for (const int earlier : shard_attempts(run_dir, task)) {
    if (earlier >= attempt) continue;
    try {
      db::Store previous(shard_path(run_dir, task, earlier), db::Journal::kRollback);
      for (const auto& shard_run : db::read_shard_runs(shard_path(run_dir, task, earlier))) {
        const auto detail = previous.get_run(shard_run.shard_run_id);
        for (const db::Trial& trial : detail ? detail->trials : std::vector<db::Trial>{})
          if (trial.status != "interrupted" && trial.details.contains("slurm"))
            done_before.insert(trial.details["slurm"].value("trial", size_t{0}));
      }
    } catch (const std::exception& error) {
      std::cerr << "earlier attempt " << earlier << " unreadable, its trials run again: " << error.what() << '\n';
    }
  }

  install_interrupt_handlers();
  ScratchDir scratch;
  // The device Slurm gave this task: "cuda" is the first GPU of CUDA_VISIBLE_DEVICES.
  auto [device, env] = probe_device(base.device, options, scratch, 180.0);
  base.device = device;
  base.devices = {device};
  std::optional<nlohmann::json> python_env;

  const std::string path = shard_path(run_dir, task, attempt);
  if (fs::exists(path)) fs::remove(path);  // a previous try of this very attempt (never merged: it did not end)
  db::Store shard(path, db::Journal::kRollback);
  std::map<size_t, int64_t> shard_run_of;  // planned run index -> run id in the shard
  const std::string job_task_id = array_job_id + "_" + std::to_string(task);
  std::string env_id;
  for (const auto& index_json : manifest.at("tasks")[static_cast<size_t>(task)]) {
    const size_t r = manifest.at("trials")[index_json.get<size_t>()].at("run").get<size_t>();
    if (shard_run_of.count(r)) continue;
    PlannedRun& run = runs[r];
    nlohmann::json run_env = env;
    if (run.spec.kind == "python") {
      if (!python_env) {
        try {
          python_env = python_fingerprint(base.python, 180.0);
        } catch (const std::exception& error) {
          python_env = nlohmann::json{{"interpreter", base.python}, {"error", error.what()}};
        }
      }
      run_env["python"] = *python_env;
    }
    db::Run row;
    row.experiment_id = shard.put_experiment(run.spec.name, run.spec.resolved);
    row.env_id = shard.put_env(run_env);
    env_id = row.env_id;
    row.device = device;
    row.profile = run.spec.profile;
    shard.begin_run(row);
    db::ShardRun info;
    info.shard_run_id = row.id;
    info.main_run_id = run.run_id;
    info.run_token = manifest.at("token").get<std::string>();
    info.task = task;
    info.attempt = attempt;
    info.slurm = {{"job_id", job_task_id}, {"node", node}};
    shard.add_shard_run(info);
    shard_run_of[r] = row.id;
  }

  size_t sequence = 0;
  for (const auto& index_json : manifest.at("tasks")[static_cast<size_t>(task)]) {
    const size_t index = index_json.get<size_t>();
    if (done_before.count(index)) continue;
    if (interrupt_requested()) break;
    const auto& entry = manifest.at("trials")[index];
    Job job{entry.at("run").get<size_t>(), entry.at("point").get<size_t>(), entry.at("variant").get<size_t>()};
    const PlannedRun& run = runs[job.run];
    RecordedTrial recorded =
        execute_trial(run, job, base, scratch.file(fmt::format("result-{}.json", ++sequence)), db_path, options);
    if (interrupt_requested()) {
      // Slurm signals every process of the task, the trial's child too: however the child ended,
      // the trial did not get its chance, and a requeued attempt must run it again.
      recorded.trial.status = "interrupted";
      recorded.trial.error = "Slurm stopped the task during this trial (scancel, time limit, preemption or node "
                             "shutdown); a requeued attempt runs it again";
      recorded.metrics.clear();
    }
    recorded.trial.details["slurm"] = {{"trial", index},       {"point_index", job.point}, {"task", task},
                                       {"attempt", attempt},   {"job_id", job_task_id},    {"node", node},
                                       {"env_id", env_id}};
    store_trial(shard, shard_run_of.at(job.run), recorded);
    std::cerr << fmt::format("trial {} ({} {} {}): {} in {:.1f} s\n", index, run.spec.name,
                             spec::point_label(run.points[job.point]), run.spec.variants[job.variant].name,
                             recorded.trial.status, recorded.trial.duration_s);
  }
  if (interrupt_requested()) {
    std::cerr << "interrupted (Slurm ended the task): the shard keeps the trials that ran\n";
    return kExitInfra;
  }
  for (const auto& [r, shard_run_id] : shard_run_of) shard.finish_shard_run(shard_run_id);
  return kExitOk;
}

}  // namespace harness::slurm
