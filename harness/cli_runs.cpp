// `harness runs`: the recorded runs, newest first.

#include <iostream>

#include "db/store.h"
#include "harness/cli.h"
#include "core/printer.h"

namespace harness {
namespace {

struct RunsArgs {
  std::string experiment;
  bool failed = false;
  int limit = 50;
};

}  // namespace

Action add_runs_command(CLI::App& app, GlobalOptions& options) {
  auto args = std::make_shared<RunsArgs>();
  auto* command = app.add_subcommand("runs", "List recorded runs, newest first");
  command->add_option("--experiment", args->experiment, "Only runs of this experiment");
  command->add_flag("--failed", args->failed, "Only runs whose status is not ok");
  command->add_option("--limit", args->limit, "At most this many runs")->check(CLI::PositiveNumber);
  add_global_options(*command, options);
  return [args, &options] {
    db::Store store(options.db_path, db::Access::read);
    store.settle_abandoned_runs();  // a run whose harness was killed shows as abandoned, not running
    db::RunFilter filter;
    if (!args->experiment.empty()) filter.experiment = args->experiment;
    filter.failed_only = args->failed;
    filter.limit = args->limit;
    const auto runs = store.list_runs(filter);
    if (options.json) {
      nlohmann::json json = nlohmann::json::array();
      for (const auto& r : runs) {
        json.push_back({{"id", r.id}, {"experiment", r.experiment}, {"device", r.device}, {"profile", r.profile},
                        {"status", r.status}, {"verdict", r.verdict}, {"env_id", r.env_id},
                        {"started_at", r.started_at}, {"finished_at", r.finished_at}});
        if (r.args.contains("slurm")) json.back()["slurm_job_id"] = r.args["slurm"].value("job_id", "");
      }
      print_json(std::cout, json);
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
