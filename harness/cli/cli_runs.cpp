// `harness runs`: the recorded runs, newest first; --format csv|md|json exports them with the
// columns docs/RUNNING.md ("Exports") lists.

#include <iostream>

#include "db/store.h"
#include "harness/cli/cli.h"
#include "core/printer.h"

namespace harness {
namespace {

struct RunsArgs {
  std::string experiment;
  bool failed = false;
  int limit = 50;
};

// The export's columns, in order (docs/RUNNING.md): the JSON keys, the CSV and Markdown headers.
const std::vector<std::string> kRunColumns = {"id",          "experiment", "device",    "profile",
                                              "status",      "verdict",    "env_id",    "started_at",
                                              "finished_at", "replay_of",  "slurm_job_id", "error"};

std::string slurm_job_id(const db::Run& run) {
  if (!run.args.contains("slurm") || !run.args["slurm"].is_object()) return "";
  const auto& id = run.args["slurm"].value("job_id", nlohmann::json(""));
  return id.is_string() ? id.get<std::string>() : id.dump();
}

}  // namespace

Action add_runs_command(CLI::App& app, GlobalOptions& options) {
  auto args = std::make_shared<RunsArgs>();
  auto* command = app.add_subcommand("runs", "List recorded runs, newest first");
  command->add_option("--experiment", args->experiment, "Only runs of this experiment");
  command->add_flag("--failed", args->failed, "Only runs whose status is not ok");
  command->add_option("--limit", args->limit, "At most this many runs (0: all; default 50)")->check(CLI::NonNegativeNumber);
  add_global_options(*command, options);
  add_format_option(*command, options);
  return [args, &options] {
    const Format format = output_format(options);
    db::Store store(options.db_path, db::Access::read);
    store.settle_abandoned_runs();  // a run whose harness was killed shows as abandoned, not running
    db::RunFilter filter;
    if (!args->experiment.empty()) filter.experiment = args->experiment;
    filter.failed_only = args->failed;
    filter.limit = args->limit;
    const auto runs = store.list_runs(filter);
    if (format == Format::kJson) {
      nlohmann::json json = nlohmann::json::array();
      for (const auto& r : runs) {
        json.push_back({{"id", r.id}, {"experiment", r.experiment}, {"device", r.device}, {"profile", r.profile},
                        {"status", r.status}, {"verdict", r.verdict}, {"env_id", r.env_id},
                        {"started_at", r.started_at}, {"finished_at", r.finished_at},
                        {"replay_of", r.replay_of ? nlohmann::json(*r.replay_of) : nlohmann::json()}, {"error", r.error}});
        if (r.args.contains("slurm")) json.back()["slurm_job_id"] = slurm_job_id(r);
      }
      print_json(std::cout, json);
      return kExitOk;
    }
    if (format == Format::kCsv || format == Format::kMarkdown) {
      Table table;
      table.headers = kRunColumns;
      for (const auto& r : runs)
        table.rows.push_back({std::to_string(r.id), r.experiment, r.device, r.profile, r.status, r.verdict, r.env_id,
                              r.started_at, r.finished_at, r.replay_of ? std::to_string(*r.replay_of) : "",
                              slurm_job_id(r), r.error});
      if (format == Format::kCsv) print_csv(std::cout, table);
      else print_markdown_table(std::cout, table);
      return kExitOk;
    }
    Table table;
    table.headers = {"run", "experiment", "device", "profile", "status", "verdict", "started", "env"};
    table.right_align = {true};
    for (const auto& r : runs)
      table.rows.push_back({std::to_string(r.id), r.experiment,
                            r.args.contains("slurm") ? r.device + " · slurm job " + r.args["slurm"].value("job_id", "-")
                                                     : r.device, r.profile.empty() ? "-" : r.profile, r.status,
                            r.verdict.empty() ? "-" : r.verdict, r.started_at, r.env_id.substr(0, 12)});
    if (runs.empty()) std::cout << "no runs recorded in " << options.db_path << '\n';
    else print_table(std::cout, table);
    return kExitOk;
  };
}

}  // namespace harness
