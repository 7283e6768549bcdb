// Hidden subcommands that run inside child processes: `__trial` runs one variant of one
// experiment on one device and writes its result file; `__env` writes the env fingerprint of a
// device. The parent never initializes CUDA itself, so a crash, hang or OOM stays in the child.

#include <ATen/ATen.h>

#include <iostream>

#include "experiments/kinds/attention_step.h"
#include "experiments/spec.h"
#include "harness/cli.h"
#include "harness/env.h"

namespace harness {
namespace {

struct TrialArgs {
  std::string spec_path, variant, device, result_path;
  int64_t memory_limit_bytes = 0;
  bool allow_faults = false;
};

struct EnvArgs {
  std::string device = "auto", result_path;
};

}  // namespace

Action add_trial_command(CLI::App& app, GlobalOptions& options) {
  auto args = std::make_shared<TrialArgs>();
  auto* command = app.add_subcommand("__trial", "(internal) run one trial in this process");
  command->group("");
  command->add_option("--spec", args->spec_path, "Resolved spec JSON")->required();
  command->add_option("--variant", args->variant)->required();
  command->add_option("--device", args->device)->required();
  command->add_option("--result", args->result_path)->required();
  command->add_flag("--allow-faults", args->allow_faults);
  command->add_option("--memory-limit", args->memory_limit_bytes, "Device memory cap in bytes (0: none)");
  add_global_options(*command, options);
  return [args] {
    const auto resolved = nlohmann::json::parse(read_file(args->spec_path));
    const spec::Spec spec = spec::parse_spec(resolved, args->spec_path, args->allow_faults);
    const kinds::TrialResult result = kinds::run_attention_step(spec, args->variant, args->device, args->memory_limit_bytes);
    write_file_atomic(args->result_path, kinds::to_json(result).dump());
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
