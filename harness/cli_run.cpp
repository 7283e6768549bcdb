// `harness run EXPERIMENT`: validate the spec completely, check the device, then run every
// variant in its own child process and store trials, metrics and the verdict.

#include <ftw.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <regex>

#include <fmt/format.h>

#include "db/store.h"
#include "experiments/spec.h"
#include "harness/cli.h"
#include "harness/printer.h"
#include "harness/run_report.h"
#include "harness/summary.h"
#include "harness/trial_runner.h"

namespace harness {
namespace {

namespace fs = std::filesystem;

struct RunArgs {
  std::string experiment;
  std::string device = "auto";
  std::vector<std::string> overrides;
  std::string profile;
  bool no_profile = false;
  std::vector<std::string> fail_on;
  std::string memory_limit;
  double env_timeout_s = 180.0;
};

// POSIX instead of std::filesystem::remove_all: libtorch.so exports its own copy of that symbol,
// which the dynamic linker binds in place of libstdc++'s and which crashes here (seen with
// torch 2.11.0 on Debian 12, GCC 12).
void remove_tree(const std::string& path) {
  nftw(
      path.c_str(), [](const char* item, const struct stat*, int, struct FTW*) { return ::remove(item); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

// A scratch folder for the resolved spec and result files, removed when the run ends.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (fs::temp_directory_path() / "harness-run-XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw InfraError("cannot create a temporary directory");
    path_ = pattern;
  }
  ~ScratchDir() { remove_tree(path_.string()); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

void check_device_syntax(const std::string& device) {
  static const std::regex valid(R"(auto|cpu|cuda(:\d+)?)");
  if (!std::regex_match(device, valid))
    throw UsageError(fmt::format("--device '{}': expected cpu, cuda, cuda:N or auto", device));
}

std::string child_log_level(const GlobalOptions& options) { return options.log_level; }

// Asks a child for the device's fingerprint; the parent never touches CUDA itself. Returns
// {resolved device, env}.
std::pair<std::string, nlohmann::json> probe_device(const std::string& device, const GlobalOptions& options,
                                                    const ScratchDir& scratch, double timeout_s) {
  ChildCommand command;
  const std::string result_path = scratch.file("env.json");
  command.argv = {self_executable(), "__env", "--device", device, "--result", result_path,
                  "--log-level", child_log_level(options)};
  command.timeout_s = timeout_s;
  const ChildOutcome outcome = run_child(command);
  if (outcome.exit_code && *outcome.exit_code == kExitUsage) {
    std::string message = outcome.stderr_tail;
    const auto at = message.find("error: ");
    if (at != std::string::npos) message = message.substr(at + 7);
    while (!message.empty() && message.back() == '\n') message.pop_back();
    throw UsageError(message);
  }
  if (!outcome.exit_code || *outcome.exit_code != 0 || !fs::exists(result_path)) {
    throw InfraError(fmt::format("probing device {} failed ({}): {}", device,
                                 outcome.signal ? signal_name(*outcome.signal)
                                                : outcome.timed_out ? "timeout"
                                                                    : "exit " + std::to_string(outcome.exit_code.value_or(-1)),
                                 outcome.stderr_tail));
  }
  const auto json = nlohmann::json::parse(read_file(result_path));
  return {json.at("device").get<std::string>(), json.at("env")};
}

// Turns how the child ended (and its result file, if any) into a trial record and metrics.
std::pair<db::Trial, std::vector<db::Metric>> record_trial(const std::string& variant, const ChildOutcome& outcome,
                                                           const std::string& result_path) {
  db::Trial trial;
  trial.variant = variant;
  trial.exit_code = outcome.exit_code;
  trial.signal = outcome.signal;
  trial.stderr_tail = outcome.stderr_tail;
  trial.duration_s = outcome.duration_s;
  std::vector<db::Metric> metrics;
  if (outcome.interrupted) {
    trial.status = "interrupted";
    trial.error = "the harness was interrupted and stopped the trial";
  } else if (outcome.timed_out) {
    trial.status = "timeout";
    trial.error = fmt::format("no result after {:.0f} s; the child was killed", outcome.duration_s);
  } else if (outcome.signal) {
    trial.status = "crashed";
    trial.error = "killed by " + signal_name(*outcome.signal);
  } else if (!fs::exists(result_path)) {
    trial.status = "crashed";
    trial.error = fmt::format("exited with code {} without a result", outcome.exit_code.value_or(-1));
  } else {
    const auto result = nlohmann::json::parse(read_file(result_path));
    trial.status = result.at("status").get<std::string>();
    trial.error = result.value("error", "");
    if (result.contains("requested_bytes")) trial.requested_bytes = result.at("requested_bytes").get<int64_t>();
    trial.dispatch = result.value("dispatch", nlohmann::json::array());
    for (const auto& m : result.value("metrics", nlohmann::json::array())) {
      db::Metric metric;
      metric.variant = variant;
      metric.name = m.at("name").get<std::string>();
      metric.value = m.at("value").get<double>();
      metric.unit = m.value("unit", "");
      metric.repeat = m.value("repeat", -1);
      metrics.push_back(std::move(metric));
    }
  }
  return {trial, metrics};
}

bool trial_failed(const std::string& status) {
  return status == "crashed" || status == "timeout" || status == "error" || status == "interrupted";
}

int run_experiment(const RunArgs& args, const GlobalOptions& options) {
  check_device_syntax(args.device);
  int64_t memory_limit_bytes = 0;
  if (!args.memory_limit.empty()) {
    const auto bytes = spec::parse_byte_size(args.memory_limit);
    if (!bytes || *bytes < 1)
      throw UsageError(fmt::format("--memory-limit '{}': expected a size such as 96GiB, 512MiB or a byte count",
                                   args.memory_limit));
    memory_limit_bytes = static_cast<int64_t>(*bytes);
  }
  const auto dirs = experiment_search_dirs(options);
  const auto spec_path = spec::find_spec(args.experiment, dirs);
  if (!spec_path) {
    std::string searched;
    for (const auto& dir : dirs) searched += (searched.empty() ? "" : ", ") + dir;
    throw UsageError(fmt::format("unknown experiment '{}' (searched {}; `harness list` shows them)",
                                 args.experiment, searched));
  }

  // Validate everything a user can get wrong before any child starts or the db is touched.
  const bool allow_faults = std::getenv("HARNESS_ALLOW_FAULTS") && std::string(std::getenv("HARNESS_ALLOW_FAULTS")) == "1";
  const auto raw = nlohmann::json::parse(read_file(*spec_path), nullptr, false);
  spec::LoadOptions load;
  load.overrides = args.overrides;
  load.allow_faults = allow_faults;
  if (!args.profile.empty()) {
    if (raw.is_discarded() || !spec::has_profile(raw, args.profile))
      throw UsageError(fmt::format("--profile {}: {} defines no such profile", args.profile, *spec_path));
    load.profile = args.profile;
  }
  spec::load_spec_file(*spec_path, load);  // throws SpecError with every problem

  ScratchDir scratch;
  install_interrupt_handlers();
  const auto [device, env] = probe_device(args.device, options, scratch, args.env_timeout_s);
  if (args.profile.empty() && !args.no_profile && device == "cpu" && !raw.is_discarded() && spec::has_profile(raw, "cpu"))
    load.profile = "cpu";
  const spec::Spec spec = spec::load_spec_file(*spec_path, load);

  db::Store store(options.db_path);
  db::Run run;
  run.env_id = store.put_env(env);
  run.experiment_id = store.put_experiment(spec.name, spec.resolved);
  run.experiment = spec.name;
  run.device = device;
  run.profile = spec.profile;
  run.args = {{"experiment", args.experiment}, {"spec_path", *spec_path}, {"set", args.overrides},
              {"requested_device", args.device}};
  if (memory_limit_bytes > 0) run.args["memory_limit_bytes"] = memory_limit_bytes;
  const int64_t run_id = store.begin_run(run);

  const std::string spec_file = scratch.file("spec.json");
  write_file_atomic(spec_file, spec.resolved.dump(2));
  const bool show_progress = !options.json;
  const bool interactive = isatty(STDERR_FILENO) != 0;
  if (show_progress)
    std::cerr << fmt::format("run {}: {} on {}{} — {} variant{}\n", run_id, spec.name, device,
                             spec.profile.empty() ? "" : " (profile " + spec.profile + ")", spec.variants.size(),
                             spec.variants.size() == 1 ? "" : "s");

  std::map<std::string, spec::VariantOutcome> outcomes;
  bool any_failed = false, interrupted = false;
  const size_t total = spec.variants.size();
  for (size_t index = 0; index < total && !interrupted; ++index) {
    const auto& variant = spec.variants[index];
    // On a terminal the "running" line is overwritten by the result; in logs only results appear.
    if (show_progress && interactive)
      std::cerr << fmt::format("  [{}/{}] {:<10} running ...", index + 1, total, variant.name) << std::flush;
    const std::string result_path = scratch.file("result-" + variant.name + ".json");
    ChildCommand command;
    command.argv = {self_executable(), "__trial", "--spec", spec_file, "--variant", variant.name,
                    "--device", device, "--result", result_path, "--log-level", child_log_level(options)};
    if (allow_faults) command.argv.push_back("--allow-faults");
    if (memory_limit_bytes > 0) {
      command.argv.push_back("--memory-limit");
      command.argv.push_back(std::to_string(memory_limit_bytes));
    }
    command.timeout_s = spec.timeout_s;
    const std::string started_at = db::now_iso8601();
    const ChildOutcome outcome = run_child(command, [](const std::string& line) { spdlog::debug("child: {}", line); });
    auto [trial, metrics] = record_trial(variant.name, outcome, result_path);
    trial.run_id = run_id;
    trial.started_at = started_at;
    store.add_trial(trial, metrics);
    if (show_progress)
      std::cerr << fmt::format("{}  [{}/{}] {:<10} {:<12} {:.1f} s{}\n", interactive ? "\r" : "", index + 1, total, variant.name, trial.status,
                               trial.duration_s, trial.error.empty() ? "" : "  " + first_line(trial.error));
    any_failed = any_failed || trial_failed(trial.status);
    interrupted = trial.status == "interrupted";

    spec::VariantOutcome variant_outcome;
    variant_outcome.status = trial.status;
    variant_outcome.error = trial.error;
    for (const auto& [key, summary] : summarize(metrics)) variant_outcome.values[key.second] = summary.median;
    outcomes[variant.name] = std::move(variant_outcome);
  }

  const std::string status = interrupted ? "interrupted" : any_failed ? "failed" : "ok";
  spec::Verdict verdict;
  if (interrupted) {
    verdict.verdict = "INTERRUPTED";
    verdict.evidence = {{"reason", "the run was interrupted before every variant ran"}};
  } else {
    verdict = spec::evaluate_verdict(spec, outcomes);
  }
  store.finish_run(run_id, status, verdict.verdict, verdict.evidence);

  const auto detail = store.get_run(run_id);
  if (options.json) {
    print_json(std::cout, run_detail_json(*detail));
  } else {
    print_run_summary(std::cout, *detail);
  }
  if (interrupted) return kExitInfra;
  for (const auto& condition : args.fail_on) {
    if (condition == "failed" && status != "ok") return kExitFailOn;
    if (condition == "invalid" && (verdict.verdict == "INVALID" || verdict.verdict == "INCONCLUSIVE")) return kExitFailOn;
    if (condition.rfind("verdict=", 0) == 0 && verdict.verdict == condition.substr(8)) return kExitFailOn;
  }
  return kExitOk;
}

}  // namespace

Action add_run_command(CLI::App& app, GlobalOptions& options) {
  auto args = std::make_shared<RunArgs>();
  auto* command = app.add_subcommand("run", "Run an experiment: every variant isolated in its own process");
  command->add_option("experiment", args->experiment, "Experiment name (experiments/NAME.json) or spec path")->required();
  command->add_option("--device", args->device, "cpu, cuda:N, or auto (cuda:0 when a GPU is present, else cpu)");
  command->add_option("--set", args->overrides, "Override a spec field: path=value (e.g. dims.anchors=256)");
  command->add_option("--profile", args->profile, "Apply a profile of the spec (default: cpu on the CPU)");
  command->add_flag("--no-profile", args->no_profile, "Never apply a profile, even on the CPU");
  command->add_option("--memory-limit", args->memory_limit,
                      "Cap the device memory of each trial's step (e.g. 96GiB), to reproduce an OOM of a smaller GPU");
  command->add_option("--fail-on", args->fail_on,
                      "Exit 1 when: failed (a trial crashed/timed out/errored), invalid (verdict INVALID or "
                      "INCONCLUSIVE), verdict=NAME");
  add_global_options(*command, options);
  return [args, &options] { return run_experiment(*args, options); };
}

}  // namespace harness
