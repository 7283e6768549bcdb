// `harness metrics`: every stored value, one row per metric (run, experiment, variant, point,
// name, value, unit, repeat), oldest run first: a table, or the export forms (--format json|csv|md,
// docs/RUNNING.md "Exports") that read straight into pandas or a spreadsheet.

#include <algorithm>
#include <iostream>

#include <fmt/format.h>

#include "analysis/run_sections.h"
#include "db/store.h"
#include "harness/cli/cli.h"
#include "core/printer.h"
#include "experiments/sweep.h"

namespace harness {
namespace {

struct MetricsArgs {
  std::string experiment;
  std::vector<int64_t> runs;
  std::vector<std::string> names;
  int limit = 0;
};

}  // namespace

Action add_metrics_command(CLI::App& app, GlobalOptions& options) {
  auto args = std::make_shared<MetricsArgs>();
  auto* command = app.add_subcommand("metrics", "Every stored metric value, one row each (for pandas, spreadsheets, PR comments)");
  command->add_option("--experiment", args->experiment, "Only runs of this experiment");
  command->add_option("--run", args->runs, "Only this run (repeat for several)")->check(CLI::PositiveNumber)->allow_extra_args(false);
  command->add_option("--name", args->names, "Only this metric (repeat for several)")->allow_extra_args(false);
  command->add_option("--limit", args->limit, "Only the newest N runs (0: all, the default)")->check(CLI::NonNegativeNumber);
  add_global_options(*command, options);
  add_format_option(*command, options);
  return [args, &options] {
    const Format format = output_format(options);
    db::Store store(options.db_path, db::Access::read);
    store.settle_abandoned_runs();
    std::vector<db::RunDetail> details;
    if (!args->runs.empty()) {
      for (const int64_t id : args->runs) {
        auto detail = store.get_run(id);
        if (!detail) throw UsageError(fmt::format("--run {}: no such run in {} (`harness runs` lists them)", id, options.db_path));
        if (!args->experiment.empty() && detail->run.experiment != args->experiment)
          throw UsageError(fmt::format("--run {} is a run of {}, not of --experiment {}", id, detail->run.experiment,
                                       args->experiment));
        details.push_back(std::move(*detail));
      }
    } else {
      db::RunFilter filter;
      if (!args->experiment.empty()) filter.experiment = args->experiment;
      filter.limit = args->limit;
      auto runs = store.list_runs(filter);
      std::reverse(runs.begin(), runs.end());  // oldest first, as the rows were stored
      for (const auto& run : runs)
        if (auto detail = store.get_run(run.id)) details.push_back(std::move(*detail));
    }
    if (!args->names.empty()) {
      for (auto& detail : details)
        detail.metrics.erase(std::remove_if(detail.metrics.begin(), detail.metrics.end(),
                                            [&](const db::Metric& m) {
                                              return std::find(args->names.begin(), args->names.end(), m.name) ==
                                                     args->names.end();
                                            }),
                             detail.metrics.end());
    }
    if (format == Format::kJson) {
      nlohmann::json rows = nlohmann::json::array();
      for (const auto& detail : details) analysis::append_metric_json(rows, detail);
      print_json(std::cout, rows);
      return kExitOk;
    }
    Table table;
    table.headers = analysis::metric_columns();
    if (format == Format::kCsv || format == Format::kMarkdown) {
      for (const auto& detail : details) analysis::append_metric_rows(table, detail);
      if (format == Format::kCsv) print_csv(std::cout, table);
      else print_markdown_table(std::cout, table);
      return kExitOk;
    }
    table.right_align = {true, false, false, false, false, true, false, true};
    for (const auto& detail : details)
      for (const auto& m : detail.metrics)
        table.rows.push_back({std::to_string(detail.run.id), detail.run.experiment, m.variant.empty() ? "(run)" : m.variant,
                              m.point.empty() ? "-" : spec::point_label(m.point), m.name, format_value(m.value, m.unit),
                              m.unit, std::to_string(m.repeat)});
    if (table.rows.empty()) std::cout << "no metrics recorded in " << options.db_path << " for that selection\n";
    else print_table(std::cout, table);
    return kExitOk;
  };
}

}  // namespace harness
