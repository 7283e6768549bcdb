// Hidden subcommands that run inside child processes: `__trial` runs one variant of one
// experiment on one device and writes its result file; `__env` writes the env fingerprint of a
// device. The parent never initializes CUDA itself, so a crash, hang or OOM stays in the child.

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "trials/run_trial.h"
#include "experiments/spec.h"
#include "core/crash_report.h"
#include "core/files.h"
#include "harness/cli/cli.h"
#include "harness/runner/env.h"
#include "harness/runner/run_support.h"

namespace harness {
namespace {

struct TrialArgs {
  std::string spec_path;
  kinds::TrialContext context;
  std::string devices;
  double deadline_s = 0.0;
};

// The child's own deadline: when the parent cannot end a hung trial (it is stopped, or gone and
// PR_SET_PDEATHSIG did not fire), the child ends itself, leaving a timeout result for whoever
// reads it, and its helpers die with it (they were started with PR_SET_PDEATHSIG).
void start_deadline(double seconds, const std::string& result_path) {
  if (!(seconds > 0.0)) return;
  // sleep_for converts to integer nanoseconds: past ~292 years that overflows into "now" (specs
  // allow 7 days; this keeps any other caller from ending every trial at once).
  seconds = std::min(seconds, 1e9);
  std::thread([seconds, result_path] {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    const nlohmann::json result = {
        {"status", "timeout"},
        {"error", "the trial ended itself at its own deadline (" + std::to_string(static_cast<long>(seconds)) +
                      " s): its parent did not stop it"}};
    try {
      write_file_atomic(result_path, result.dump());
    } catch (...) {
    }
    std::cerr << "harness __trial: deadline of " << seconds << " s passed; ending the trial\n";
    std::_Exit(kExitChildDeadline);
  }).detach();
}

struct EnvArgs {
  std::string device = "auto", result_path;
};

}  // namespace

Action add_trial_command(CLI::App& app, GlobalOptions& options) {
  auto args = std::make_shared<TrialArgs>();
  auto* command = app.add_subcommand("__trial", "(internal) run one trial in this process");
  command->group("");
  command->add_option("--spec", args->spec_path, "Resolved spec JSON")->required();
  auto& context = args->context;
  command->add_option("--variant", context.variant)->required();
  command->add_option("--device", context.device)->required();
  command->add_option("--devices", args->devices, "Every device of --devices, comma-separated");
  command->add_option("--result", context.result_path)->required();
  command->add_flag("--allow-faults", context.allow_faults);
  command->add_option("--memory-limit", context.memory_limit_bytes, "Device memory cap in bytes (0: none)");
  command->add_option("--python", context.python, "Interpreter of python specs");
  command->add_option("--spec-dir", context.spec_dir, "Folder of the spec file");
  command->add_option("--artifact-dir", context.artifact_dir, "Where capsules are written");
  command->add_flag("--keep-capsules", context.keep_capsules);
  command->add_flag("--memory-snapshot", context.memory_snapshot);
  command->add_flag("--trace", context.trace);
  command->add_option("--replay-capsule", context.replay_capsule, "Run the step recorded in this capsule");
  command->add_option("--judge-outputs", context.judge_outputs,
                      "Judge these recorded outputs of the step by the correctness check too");
  command->add_option("--deadline-s", args->deadline_s, "End the trial (status timeout) after this many seconds");
  add_global_options(*command, options);
  return [args] {
    install_crash_report("harness __trial");  // a `crashed` trial keeps its native backtrace
    start_deadline(args->deadline_s, args->context.result_path);
    const auto resolved = nlohmann::json::parse(read_file(args->spec_path));
    const spec::Spec spec = spec::parse_spec(resolved, args->spec_path, args->context.allow_faults);
    kinds::TrialContext context = args->context;
    for (size_t start = 0; start < args->devices.size();) {
      const size_t comma = args->devices.find(',', start);
      context.devices.push_back(args->devices.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    if (context.devices.empty()) context.devices = {context.device};
    const kinds::TrialResult result = kinds::run_trial(spec, context);
    write_file_atomic(context.result_path, kinds::to_json(result).dump());
    return kExitOk;
  };
}

Action add_env_child_command(CLI::App& app, GlobalOptions& options) {
  auto args = std::make_shared<EnvArgs>();
  auto* command = app.add_subcommand("__env", "(internal) write the env fingerprint of a device");
  command->group("");
  command->add_option("--device", args->device);
  command->add_option("--result", args->result_path)->required();
  add_global_options(*command, options);
  return [args] {
    std::string device = args->device;
    if (device == "auto") device = at::hasCUDA() && at::detail::getCUDAHooks().getNumGPUs() > 0 ? "cuda:0" : "cpu";
    nlohmann::json env = full_fingerprint(device);
    write_file_atomic(args->result_path, nlohmann::json{{"device", device}, {"env", env}}.dump());
    return kExitOk;
  };
}

}  // namespace harness
