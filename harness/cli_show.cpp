// `harness show RUN`: one stored run with its spec, env, trials, metrics, verdict and dispatch,
// and its artifacts with the tool that opens each (safetensors, memory_viz, Perfetto).

#include <filesystem>
#include <iostream>

#include <fmt/format.h>

#include "analysis/memory_snapshot.h"
#include "core/json_input.h"
#include "db/artifact_paths.h"
#include "db/store.h"
#include "harness/cli.h"
#include "core/printer.h"
#include "harness/run_report.h"

namespace harness {
namespace {

// The artifacts of a run: what each is, whose, where, and how to open it.
void print_artifacts(std::ostream& out, const db::RunDetail& detail, const std::string& db_path) {
  if (detail.artifacts.empty()) return;
  const db::ArtifactFolder folder(db_path);
  out << "\nartifacts\n";
  for (const auto& artifact : detail.artifacts) {
    std::string owner;
    for (const auto& t : detail.trials)
      if (artifact.trial_id && t.id == *artifact.trial_id)
        owner = fmt::format(" of {}{} (trial {}, {})", t.variant, t.point.empty() ? "" : " at " + t.point.dump(), t.id, t.status);
    const db::ResolvedArtifact resolved = folder.resolve(artifact.path);
    if (resolved.place == db::ResolvedArtifact::Place::outside) {
      // A row edited by hand or from someone else's db: named, never opened.
      out << fmt::format("  {}{}: {} (outside the db's artifact folder, not opened: {})\n", artifact.kind, owner,
                         clip_text(artifact.path, 200), resolved.problem);
      continue;
    }
    const std::string& path = resolved.file;
    out << fmt::format("  {}{}: {} ({})\n", artifact.kind, owner, path, format_bytes(static_cast<double>(artifact.bytes)));
    if (artifact.kind == "capsule" || artifact.kind == "outputs") {
      out << fmt::format("    safetensors: python -c \"from safetensors.torch import load_file; print(load_file('{}').keys())\"\n", path);
    } else if (artifact.kind == "memory_snapshot") {
      try {
        const auto summary = analysis::read_snapshot(path);
        out << fmt::format("    {} allocator events, peak {} allocated, largest block {}", summary.trace_events,
                           format_bytes(static_cast<double>(summary.peak_allocated)),
                           format_bytes(static_cast<double>(summary.largest_block)));
        if (summary.oom)
          out << fmt::format(", OOM asking {} with {} allocated", format_bytes(static_cast<double>(summary.oom->requested_bytes)),
                             format_bytes(static_cast<double>(summary.oom->allocated)));
        out << '\n';
      } catch (const std::exception& error) {
        out << "    (cannot summarize: " << error.what() << ")\n";
      }
      out << fmt::format("    memory_viz: python -m torch.cuda._memory_viz trace_plot {} -o snapshot.html "
                         "(or drop the file on https://pytorch.org/memory_viz)\n", path);
    } else if (artifact.kind == "trace") {
      out << "    Perfetto: open it at https://ui.perfetto.dev (or chrome://tracing); the harness ranges name each phase\n";
    }
  }
}

}  // namespace

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
    else {
      print_run_detail(std::cout, *detail);
      print_artifacts(std::cout, *detail, options.db_path);
    }
    return kExitOk;
  };
}

}  // namespace harness
