// `harness writeup RUN|EXPERIMENT [-o report.md] [--html]`: the debugging writeup of a run (or of
// an experiment's latest run, with its history), as Markdown with SVG plots beside it, or HTML.

#include <filesystem>
#include <iostream>
#include <memory>

#include <fmt/format.h>

#include "analysis/bisect.h"
#include "analysis/writeup.h"
#include "db/store.h"
#include "harness/cli/cli.h"
#include "core/printer.h"

namespace harness {
namespace {

struct WriteupArgs {
  std::string target;
  std::string output;
  bool html = false;
  int64_t bisect = 0;
};

// The writeup of a stored bisect (`--bisect ID`): its document, with the experiment's name.
analysis::Writeup bisect_writeup(const db::Store& store, int64_t id, const std::string& db_path) {
  const auto bisect = store.get_bisect(id);
  if (!bisect) throw UsageError(fmt::format("--bisect {}: no such bisect in {}", id, db_path));
  analysis::Writeup writeup;
  writeup.document = analysis::bisect_document(*bisect, store.list_bisect_probes(id), db_path);
  writeup.experiment = bisect->experiment;
  return writeup;
}

int run_writeup(const WriteupArgs& args, const GlobalOptions& options) {
  namespace fs = std::filesystem;
  if (!fs::exists(options.db_path)) throw UsageError("no db at " + options.db_path + " (nothing to write up)");
  if (!args.output.empty()) {
    const fs::path parent = fs::path(args.output).parent_path();
    if (!parent.empty() && !fs::is_directory(parent))
      throw UsageError(fmt::format("-o {}: folder {} does not exist", args.output, parent.string()));
  }
  if (args.bisect == 0 && args.target.empty()) throw UsageError("name a run, an experiment, or --bisect ID");
  if (args.bisect != 0 && !args.target.empty()) throw UsageError("give a run or experiment, or --bisect ID, not both");
  db::Store store(options.db_path, db::Access::read);
  store.settle_abandoned_runs();
  const auto writeup = args.bisect != 0 ? bisect_writeup(store, args.bisect, options.db_path)
                                        : analysis::build_writeup(store, analysis::resolve_writeup_target(store, args.target),
                                                                  options.db_path);

  if (args.output.empty()) {
    // No files: the page itself on stdout (plots are only in files, or inline in HTML).
    if (options.json) {
      print_json(std::cout, {{"run", writeup.run_id},
                             {"experiment", writeup.experiment},
                             {"markdown", analysis::render_markdown(writeup.document, "")}});
    } else if (args.html) {
      std::cout << analysis::render_html(writeup.document);
    } else {
      std::cout << analysis::render_markdown(writeup.document, "");
    }
    return kExitOk;
  }
  const auto files = analysis::write_writeup(writeup, args.output, args.html);
  if (options.json) {
    print_json(std::cout, {{"run", writeup.run_id},
                           {"experiment", writeup.experiment},
                           {"markdown", files.markdown},
                           {"html", files.html.empty() ? nlohmann::json() : nlohmann::json(files.html)},
                           {"figures", files.figures}});
    return kExitOk;
  }
  std::cout << fmt::format("writeup of {} ({}):\n  {}\n",
                           args.bisect != 0 ? "bisect " + std::to_string(args.bisect) : "run " + std::to_string(writeup.run_id),
                           writeup.experiment, files.markdown);
  if (!files.html.empty()) std::cout << "  " << files.html << '\n';
  for (const auto& figure : files.figures) std::cout << "  " << figure << '\n';
  return kExitOk;
}

}  // namespace

Action add_writeup_command(CLI::App& app, GlobalOptions& options) {
  auto args = std::make_shared<WriteupArgs>();
  auto* command = app.add_subcommand(
      "writeup", "Debugging writeup of a run, or of an experiment's latest run with its history: Markdown (plots as "
                 "SVG beside it) or HTML");
  command->add_option("target", args->target, "Run id, or experiment name (its latest finished run)");
  command->add_option("--bisect", args->bisect, "Write up a stored bisect instead (harness bisect show ID)");
  command->add_option("-o,--output", args->output,
                      "Write the report here (report.md; report.html implies --html) with plots as report-*.svg; "
                      "without it the report goes to stdout, without plot files");
  command->add_flag("--html", args->html, "Also write HTML with the plots embedded (to stdout without -o)");
  add_global_options(*command, options);
  return [args, &options] { return run_writeup(*args, options); };
}

}  // namespace harness
