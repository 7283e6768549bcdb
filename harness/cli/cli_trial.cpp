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
  std::string request_path;
};

// The request file the parent wrote (kinds::TrialRequest as JSON); UsageError naming the file and
// the field when it is not one.
kinds::TrialRequest read_request(const std::string& path) {
  const auto json = nlohmann::json::parse(read_file(path), nullptr, false);
  if (json.is_discarded()) throw UsageError(path + ": the trial request is not valid JSON");
  kinds::TrialRequest request;
  try {
    request = kinds::trial_request_from_json(json);
  } catch (const std::invalid_argument& error) {
    throw UsageError(path + ": " + error.what());
  }
  const std::pair<const char*, const std::string*> required[] = {
      {"spec_file", &request.spec_file}, {"variant", &request.variant}, {"device", &request.device},
      {"result_path", &request.result_path}};
  for (const auto& [name, value] : required) {
    if (value->empty()) throw UsageError(path + ": the trial request has no " + name);
  }
  if (request.devices.empty()) request.devices = {request.device};
  return request;
}

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
  command->add_option("--request", args->request_path, "The trial request (JSON) its parent wrote")->required();
  add_global_options(*command, options);
  return [args] {
    install_crash_report("harness __trial");  // a `crashed` trial keeps its native backtrace
    const kinds::TrialRequest request = read_request(args->request_path);
    // The child's own deadline, for when its parent cannot enforce one (stopped, or killed and
    // this child somehow survived): a little after the parent's, so that normally the parent decides.
    start_deadline(request.timeout_s + kChildDeadlineGraceS, request.result_path);
    const auto resolved = nlohmann::json::parse(read_file(request.spec_file));
    const spec::Spec spec = spec::parse_spec(resolved, request.spec_file, request.allow_faults);
    const kinds::TrialResult result = kinds::run_trial(spec, request);
    write_file_atomic(request.result_path, kinds::to_json(result).dump());
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
