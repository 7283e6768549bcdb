// `harness site -o DIR`: the whole db as a static site (analysis/site.h says what is on it).
// Parses the options, builds it, and prints what was written and how long it took.

#include <chrono>
#include <filesystem>
#include <iostream>

#include <fmt/format.h>

#include "analysis/site.h"
#include "db/store.h"
#include "harness/cli/cli.h"
#include "core/printer.h"

namespace harness {
namespace {

struct SiteArgs {
  std::string output;
  std::string artifacts = "link";
  size_t window = 60;
};

}  // namespace

Action add_site_command(CLI::App& app, GlobalOptions& options) {
  auto args = std::make_shared<SiteArgs>();
  auto* command = app.add_subcommand(
      "site", "Write the whole db as a static site (runs, experiments with plots, flips and regressions, envs, bisects)");
  command->add_option("-o,--output", args->output, "Folder to write (new, empty, or a site written before)")->required();
  command->add_option("--artifacts", args->artifacts,
                      "link: link traces, snapshots and capsules where they are (default); copy: copy them into the "
                      "site, for a static host")
      ->check(CLI::IsMember({"link", "copy"}));
  command->add_option("--window", args->window, "Runs per experiment page (default 60)")->check(CLI::Range(1, 100000));
  add_global_options(*command, options);
  return [args, &options] {
    if (!std::filesystem::exists(options.db_path)) throw UsageError("no db at " + options.db_path + " (nothing to show)");
    const auto start = std::chrono::steady_clock::now();
    db::Store store(options.db_path, db::Access::read);
    store.settle_abandoned_runs();
    analysis::SiteOptions site;
    site.db_path = options.db_path;
    site.copy_artifacts = args->artifacts == "copy";
    site.history_window = args->window;
    const auto stats = analysis::write_site(store, args->output, site);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string index = (std::filesystem::absolute(args->output) / "index.html").lexically_normal().string();
    if (options.json) {
      print_json(std::cout, {{"output", args->output}, {"index", index}, {"runs", stats.runs},
                             {"experiments", stats.experiments}, {"pages", stats.pages}, {"bytes", stats.bytes},
                             {"artifacts_copied", stats.artifacts_copied}, {"largest_page", stats.largest_page},
                             {"largest_page_bytes", stats.largest_page_bytes}, {"seconds", seconds}});
      return kExitOk;
    }
    std::cout << fmt::format("site of {} runs, {} experiments: {} pages, {} in {} ({:.1f} s)\n", stats.runs, stats.experiments,
                             stats.pages, format_bytes(static_cast<double>(stats.bytes)), args->output, seconds);
    if (stats.artifacts_copied) std::cout << fmt::format("{} artifact files copied\n", stats.artifacts_copied);
    std::cout << "open file://" << index << '\n';
    return kExitOk;
  };
}

}  // namespace harness
