// `harness show RUN`: one stored run with its spec, env, trials, metrics, verdict and dispatch.

#include <iostream>

#include <fmt/format.h>

#include "db/store.h"
#include "harness/cli.h"
#include "core/printer.h"
#include "harness/run_report.h"

namespace harness {

Action add_show_command(CLI::App& app, GlobalOptions& options) {
  auto run_id = std::make_shared<int64_t>(0);
  auto* command = app.add_subcommand("show", "Show one run: spec, env, metrics, verdict, dispatch trace, errors");
  command->add_option("run", *run_id, "Run id (see `harness runs`)")->required();
  add_global_options(*command, options);
  return [run_id, &options] {
    db::Store store(options.db_path, db::Access::read);
    store.settle_abandoned_runs();
    const auto detail = store.get_run(*run_id);
    if (!detail) throw UsageError(fmt::format("no run {} in {}", *run_id, options.db_path));
    if (options.json) print_json(std::cout, run_detail_json(*detail));
    else print_run_detail(std::cout, *detail);
    return kExitOk;
  };
}

}  // namespace harness
