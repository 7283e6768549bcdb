// `harness triage CAPTURE` (or `--log FILE`): from a failed job to one writeup. Reads what failed
// (analysis/triage.h), matches it to the shipped hypotheses, runs the plan's harness commands (the
// experiments at the captured dims, explain-oom, the captured step replayed on the dense and the fused
// path) as child processes with --json into the same db, and writes one Markdown writeup.

#include <filesystem>
#include <iostream>
#include <optional>

#include <fmt/format.h>

#include "analysis/triage.h"
#include "analysis/writeup.h"
#include "core/files.h"
#include "core/printer.h"
#include "core/trial_runner.h"
#include "db/store.h"
#include "harness/cli/cli.h"
#include "harness/runner/run_support.h"

namespace harness {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct TriageArgs {
  std::string capture;
  std::string log;
  std::string device = "auto";
  std::string output;
  std::string memory_limit;
  std::vector<std::string> sets;
  bool dry_run = false;
  bool html = false;
  double step_timeout_s = 6 * 3600.0;
};

// The last JSON object a child printed on stdout (its --json answer).
json json_answer(const std::string& stdout_text) {
  const json parsed = json::parse(stdout_text, nullptr, false);
  if (!parsed.is_discarded()) return parsed;
  const size_t start = stdout_text.rfind("\n{");
  if (start != std::string::npos) {
    const json tail = json::parse(stdout_text.substr(start + 1), nullptr, false);
    if (!tail.is_discarded()) return tail;
  }
  return nullptr;
}

std::optional<int64_t> run_id_of(const analysis::TriageStep& step, const json& output) {
  if (!output.is_object()) return std::nullopt;
  if (step.kind == "run" && output.contains("run") && output["run"].is_object() && output["run"].contains("id"))
    return output["run"]["id"].get<int64_t>();
  if (step.kind == "replay" && output.contains("run") && output["run"].is_number_integer()) return output["run"].get<int64_t>();
  return std::nullopt;
}

analysis::StepResult run_step(const analysis::TriageStep& step, const TriageArgs& args, const GlobalOptions& options,
                              size_t index, size_t count) {
  ChildCommand command;
  command.argv = {self_executable()};
  command.argv.insert(command.argv.end(), step.args.begin(), step.args.end());
  for (const std::string& dir : options.experiments_dirs) {
    command.argv.push_back("--experiments-dir");
    command.argv.push_back(dir);
  }
  command.argv.insert(command.argv.end(), {"--db", options.db_path, "--json", "--log-level", "warn"});
  command.timeout_s = args.step_timeout_s;
  command.separate_stdout = true;
  command.die_with_parent = true;
  if (!options.json) std::cerr << fmt::format("triage [{}/{}] {}: {}\n", index, count, step.id, step.purpose);
  const ChildOutcome outcome = run_child(command);
  if (outcome.interrupted) throw InfraError("interrupted during triage step " + step.id);
  analysis::StepResult result;
  result.step = step;
  result.exit_code = outcome.exit_code.value_or(-1);
  result.output = json_answer(outcome.stdout_text);
  if (result.output.is_object() && result.output.contains("error"))
    result.error = result.output["error"].is_string() ? result.output["error"].get<std::string>() : result.output["error"].dump();
  else if (result.exit_code != 0 || outcome.signal || outcome.timed_out)
    result.error = outcome.timed_out ? "timed out"
                   : outcome.signal  ? "killed by " + signal_name(*outcome.signal)
                                     : outcome.stderr_tail;
  if (const auto id = run_id_of(step, result.output); id && fs::exists(options.db_path)) {
    const db::Store store(options.db_path, db::Access::read);
    result.run = store.get_run(*id);
  }
  if (!options.json) {
    std::string said = result.run ? fmt::format("run {}: {}", result.run->run.id,
                                                result.run->run.verdict.empty() ? result.run->run.status : result.run->run.verdict)
                       : result.error.empty() ? std::string("done")
                                              : fmt::format("could not run (exit {}): {}", result.exit_code,
                                                            result.error.substr(0, result.error.find('\n')));
    std::cerr << fmt::format("triage [{}/{}] {}: {}\n", index, count, step.id, said);
  }
  return result;
}

// The experiment whose dense path names the snapshot's blocks: bwd_fusion at the captured dims.
std::optional<spec::Spec> naming_spec(const analysis::TriagePlan& plan, const GlobalOptions& options) {
  const auto path = spec::find_spec("bwd_fusion", experiment_search_dirs(options));
  if (!path) return std::nullopt;
  try {
    spec::LoadOptions load;
    load.overrides = plan.sets;
    return spec::load_spec_file(*path, load);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

int run_triage(const TriageArgs& args, const GlobalOptions& options) {
  if (args.capture.empty() == args.log.empty()) throw UsageError("triage needs a CAPTURE file or --log FILE (one of them)");
  check_device_syntax(args.device);
  if (!args.memory_limit.empty()) parse_memory_limit(args.memory_limit, true);
  if (!args.output.empty()) {
    const fs::path parent = fs::path(args.output).parent_path();
    if (!parent.empty() && !fs::is_directory(parent))
      throw UsageError(fmt::format("-o {}: folder {} does not exist", args.output, parent.string()));
  }
  const std::string& source = args.capture.empty() ? args.log : args.capture;
  if (!fs::is_regular_file(source))
    throw UsageError(fmt::format("{} {}: no such file", args.capture.empty() ? "--log" : "triage", source));
  const analysis::Failure failure =
      args.capture.empty() ? analysis::read_failure_log(args.log, read_file(args.log)) : analysis::read_capture_file(args.capture);
  analysis::PlanOptions plan_options;
  plan_options.device = args.device;
  plan_options.memory_limit = args.memory_limit;
  plan_options.sets = args.sets;
  const analysis::TriagePlan plan = analysis::plan_triage(failure, plan_options);

  if (args.dry_run) {
    if (options.json)
      print_json(std::cout, analysis::plan_json(failure, plan));
    else
      std::cout << analysis::plan_text(failure, plan, self_executable(), options.db_path);
    return kExitOk;
  }

  install_interrupt_handlers();
  std::vector<analysis::StepResult> results;
  for (size_t i = 0; i < plan.steps.size(); ++i) results.push_back(run_step(plan.steps[i], args, options, i + 1, plan.steps.size()));
  const analysis::Conclusion conclusion = analysis::conclude(failure, plan, results);
  std::optional<db::Store> store;
  if (fs::exists(options.db_path)) store.emplace(options.db_path, db::Access::read);
  const std::optional<spec::Spec> named_by = failure.step ? naming_spec(plan, options) : std::nullopt;
  analysis::Writeup writeup;
  writeup.document = analysis::triage_document(failure, plan, results, conclusion, store ? &*store : nullptr, options.db_path,
                                               named_by);
  writeup.experiment = "triage";

  json steps = json::array();
  for (const auto& result : results) {
    json step = {{"id", result.step.id}, {"kind", result.step.kind}, {"exit_code", result.exit_code}};
    if (result.run) {
      step["run"] = result.run->run.id;
      step["verdict"] = result.run->run.verdict;
      step["status"] = result.run->run.status;
    }
    if (!result.error.empty()) step["error"] = result.error;
    steps.push_back(step);
  }
  json answer = {{"plan", analysis::plan_json(failure, plan)},
                 {"steps", steps},
                 {"conclusion", conclusion.text},
                 {"facts", conclusion.facts}};
  if (args.output.empty()) {
    const std::string markdown = analysis::render_markdown(writeup.document, "");
    if (options.json) {
      answer["markdown"] = markdown;
      print_json(std::cout, answer);
    } else {
      std::cout << markdown;
    }
    return kExitOk;
  }
  const auto files = analysis::write_writeup(writeup, args.output, args.html);
  if (options.json) {
    answer["writeup"] = files.markdown;
    answer["figures"] = files.figures;
    if (!files.html.empty()) answer["html"] = files.html;
    print_json(std::cout, answer);
  } else {
    std::cout << fmt::format("triage of {}: {}\n{}\nwriteup: {}\n", source, failure_kind_name(plan.kind), conclusion.text,
                             files.markdown);
  }
  return kExitOk;
}

}  // namespace

Action add_triage_command(CLI::App& app, GlobalOptions& options) {
  auto args = std::make_shared<TriageArgs>();
  auto* command = app.add_subcommand(
      "triage", "From a failed job to a written verdict: match a capture file (python -m harness.capture) or a log to the "
                "shipped hypotheses, run them at the captured dims, replay the step, write one writeup");
  command->add_option("capture", args->capture, "A capture file (capture-*.safetensors)");
  command->add_option("--log", args->log, "A job's log instead: its last Python exception is triaged (nothing is replayed)");
  command->add_option("--device", args->device, "cpu, cuda:N, or auto (the experiments and the replays)");
  command->add_option("-o,--output", args->output, "Write the writeup here (triage.md, figures beside it); default stdout");
  command->add_flag("--html", args->html, "Also write HTML with the figures embedded");
  command->add_flag("--dry-run", args->dry_run, "Print the plan (class, hypotheses, commands); run and write nothing");
  command->add_option("--set", args->sets, "Also set a spec field of the experiments: path=value (after the captured dims)")
      ->allow_extra_args(false);
  command->add_option("--memory-limit", args->memory_limit, "Cap the device memory of the replays (e.g. 80GiB)");
  command->add_option("--step-timeout", args->step_timeout_s, "Seconds one step may take (default 6 h)")
      ->check(CLI::PositiveNumber);
  add_global_options(*command, options);
  return [args, &options] { return run_triage(*args, options); };
}

}  // namespace harness
