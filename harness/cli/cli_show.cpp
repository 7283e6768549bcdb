// `harness show RUN`: one stored run with its spec, env, trials, metrics, verdict and dispatch,
// and its artifacts with the tool that opens each (safetensors, memory_viz, Perfetto).
// --format json is --json; csv is the run's metrics (the columns of `harness metrics`); md is the
// whole view as Markdown.

#include <iostream>

#include <fmt/format.h>

#include "analysis/run_sections.h"
#include "db/store.h"
#include "harness/cli/cli.h"
#include "core/printer.h"
#include "harness/cli/run_report.h"

namespace harness {

Action add_show_command(CLI::App& app, GlobalOptions& options) {
  auto run_id = std::make_shared<int64_t>(0);
  auto* command = app.add_subcommand("show", "Show one run: spec, env, metrics, verdict, dispatch trace, errors");
  command->add_option("run", *run_id, "Run id (see `harness runs`)")->required();
  add_global_options(*command, options);
  add_format_option(*command, options);
  return [run_id, &options] {
    const Format format = output_format(options);
    db::Store store(options.db_path, db::Access::read);
    store.settle_abandoned_runs();
    const auto detail = store.get_run(*run_id);
    if (!detail) throw UsageError(fmt::format("no run {} in {}", *run_id, options.db_path));
    switch (format) {
      case Format::kJson:
        print_json(std::cout, run_detail_json(*detail));
        break;
      case Format::kCsv: {
        Table table;
        table.headers = analysis::metric_columns();
        analysis::append_metric_rows(table, *detail);
        print_csv(std::cout, table);
        break;
      }
      case Format::kMarkdown:
        print_run_markdown(std::cout, *detail, options.db_path);
        break;
      case Format::kText:
        print_run_detail(std::cout, *detail);
        print_run_artifacts(std::cout, *detail, options.db_path);
        break;
    }
    return kExitOk;
  };
}

}  // namespace harness
