// `harness diff A B` or `harness diff --env X --env Y [--experiment E]`: what changed between two
// runs of one experiment (or the latest runs under two envs): the toolchain components first,
// then the metrics side by side, a change called only outside the noise of the repeats.
// --format md writes it for a CI comment (the called changes only).

#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "analysis/diff.h"
#include "db/store.h"
#include "harness/cli/cli.h"
#include "core/printer.h"

namespace harness {
namespace {

struct DiffArgs {
  std::vector<std::string> runs;
  std::vector<std::string> envs;
  std::string experiment;
  std::vector<std::string> fail_on;
  bool changes_only = false;
};

int64_t parse_run_id(const std::string& text) {
  size_t used = 0;
  int64_t id = 0;
  try {
    id = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || id < 1)
    throw UsageError(fmt::format("'{}' is not a run id (a positive number; `harness runs` lists them)", text));
  return id;
}

// A db that does not exist is not created by a read-only command; one without runs has nothing to diff.
void check_db_has_runs(const db::Store& store) {
  db::RunFilter any;
  any.limit = 1;
  if (store.list_runs(any).empty()) throw UsageError("no runs in " + store.path() + " (nothing to diff)");
}

int exit_code_for(const std::vector<std::string>& fail_on, bool regressed, bool flipped) {
  for (const auto& condition : fail_on) {
    if (condition == "regression" && regressed) return kExitFailOn;
    if (condition == "verdict-flip" && flipped) return kExitFailOn;
  }
  return kExitOk;
}

int run_diff(const DiffArgs& args, GlobalOptions& options) {
  const Format format = output_format(options);
  if (format == Format::kCsv) throw UsageError("diff --format csv: a diff is not one table; use json or md");
  for (const auto& condition : args.fail_on)
    if (condition != "regression" && condition != "verdict-flip")
      throw UsageError(fmt::format("--fail-on {}: expected regression or verdict-flip", condition));
  const bool by_env = !args.envs.empty();
  if (by_env && !args.runs.empty()) throw UsageError("give two run ids or --env twice, not both");
  if (!by_env && args.runs.size() != 2)
    throw UsageError(fmt::format("diff needs two run ids (got {}) or --env A --env B", args.runs.size()));
  if (by_env && args.envs.size() != 2)
    throw UsageError(fmt::format("--env is needed exactly twice (got {})", args.envs.size()));
  if (!by_env && !args.experiment.empty()) throw UsageError("--experiment goes with --env; run ids name their experiment");
  if (!std::filesystem::exists(options.db_path)) throw UsageError("no db at " + options.db_path + " (nothing to diff)");

  db::Store store(options.db_path, db::Access::read);
  store.settle_abandoned_runs();
  check_db_has_runs(store);
  if (by_env) {
    const std::string env_a = analysis::resolve_env_id(store, args.envs[0]);
    const std::string env_b = analysis::resolve_env_id(store, args.envs[1]);
    const auto diff = analysis::diff_envs_latest(
        store, env_a, env_b, args.experiment.empty() ? std::nullopt : std::optional<std::string>(args.experiment));
    if (format == Format::kJson) print_json(std::cout, analysis::to_json(diff));
    else if (format == Format::kMarkdown) std::cout << analysis::env_diff_markdown(diff);
    else analysis::print_env_diff(std::cout, diff, args.changes_only);
    return exit_code_for(args.fail_on, diff.regressed(), diff.verdict_flipped());
  }
  const int64_t id_a = parse_run_id(args.runs[0]), id_b = parse_run_id(args.runs[1]);
  const auto a = store.get_run(id_a);
  if (!a) throw UsageError(fmt::format("no run {} in {} (`harness runs` lists them)", id_a, options.db_path));
  const auto b = store.get_run(id_b);
  if (!b) throw UsageError(fmt::format("no run {} in {} (`harness runs` lists them)", id_b, options.db_path));
  const auto diff = analysis::diff_runs(*a, *b);
  if (format == Format::kJson) print_json(std::cout, analysis::to_json(diff));
  else if (format == Format::kMarkdown) std::cout << analysis::run_diff_markdown(diff);
  else analysis::print_run_diff(std::cout, diff, true, args.changes_only);
  return exit_code_for(args.fail_on, diff.regressed(), diff.verdict_flipped);
}

}  // namespace

Action add_diff_command(CLI::App& app, GlobalOptions& options) {
  auto args = std::make_shared<DiffArgs>();
  auto* command = app.add_subcommand(
      "diff", "Compare two runs (RUN_A RUN_B) or the latest runs under two envs (--env A --env B): env changes, "
              "metrics with delta and ratio, changes called outside the noise, verdict flips");
  command->add_option("runs", args->runs, "Two run ids (see `harness runs`)");
  // One value per occurrence, so run ids after `--env X` or `--fail-on C` stay positional.
  command->add_option("--env", args->envs, "An env id or a unique prefix of one; give it twice")
      ->allow_extra_args(false);
  command->add_option("--experiment", args->experiment, "With --env: only this experiment");
  command->add_option("--fail-on", args->fail_on,
                      "Exit 1 when: regression (a called change for the worse, or a trial that was ok and is not), "
                      "verdict-flip")
      ->allow_extra_args(false);
  command->add_flag("--changes-only", args->changes_only, "List only metrics whose change is called");
  add_global_options(*command, options);
  add_format_option(*command, options);
  return [args, &options] { return run_diff(*args, options); };
}

}  // namespace harness
