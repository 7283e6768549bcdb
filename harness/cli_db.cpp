// `harness db merge SHARD... [--into DB]`: merges Slurm task shards into a db by hand (what
// `harness slurm collect` does as tasks end). Idempotent; refuses, with nothing written, a file
// that is not a valid shard of this schema version or belongs to a run the db does not have.
// `harness db check | vacuum | prune`: the db's health and size. check: SQLite's integrity
// check, runs whose harness died (marked abandoned), artifact files no row names (orphans) and
// rows whose file is gone; vacuum: removes orphans and compacts the file; prune: removes the
// capsules of old runs (about 1 GB each at real dims), keeping the runs, trials and metrics.

#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <regex>
#include <set>

#include <fmt/format.h>

#include "db/store.h"
#include "harness/cli.h"
#include "core/printer.h"
#include "harness/run_support.h"

namespace harness {
namespace {

namespace fs = std::filesystem;

struct DbArgs {
  std::vector<std::string> shards;  // merge
  std::string into;
  bool partial = false;
  std::string older_than;  // prune
  std::vector<std::string> kinds = {"capsule", "outputs"};
  bool dry_run = false;
};

std::string db_folder(const std::string& db_path) {
  std::error_code error;
  return fs::absolute(fs::path(db_path), error).parent_path().string();
}

// An artifact row's file on disk (rows store paths relative to the db's folder).
std::string artifact_file(const db::Artifact& artifact, const std::string& db_path) {
  const fs::path path(artifact.path);
  return path.is_absolute() ? path.string() : (fs::path(db_folder(db_path)) / path).lexically_normal().string();
}

struct Orphan {
  std::string path;
  int64_t bytes = 0;
};

// Files under the artifact folder that no row names: left by a harness killed between writing a
// capsule and storing its row, or by rows removed outside the harness.
std::vector<Orphan> orphaned_files(const std::vector<db::Artifact>& artifacts, const std::string& db_path) {
  std::set<std::string> named;
  for (const auto& artifact : artifacts) named.insert(artifact_file(artifact, db_path));
  std::vector<Orphan> orphans;
  const std::string folder = artifact_dir_for(db_path);
  std::error_code error;
  if (!fs::is_directory(folder, error)) return orphans;
  for (auto it = fs::recursive_directory_iterator(folder, error); !error && it != fs::recursive_directory_iterator();
       it.increment(error)) {
    if (!it->is_regular_file(error)) continue;
    const std::string path = it->path().lexically_normal().string();
    if (named.count(path)) continue;
    orphans.push_back({path, static_cast<int64_t>(it->file_size(error))});
  }
  return orphans;
}

// Runs still going on this host: while one runs, a capsule it just wrote has no row yet, so
// nothing may be deleted as an orphan.
size_t live_runs(db::Store& store) {
  db::RunFilter filter;
  filter.limit = 0;
  size_t count = 0;
  for (const auto& run : store.list_runs(filter)) count += run.status == "running";
  return count;
}

// "30d", "12h", "2w", "90m", "45s" -> seconds.
double parse_age(const std::string& text) {
  static const std::regex pattern(R"((\d+(?:\.\d+)?)\s*(s|m|h|d|w))");
  std::smatch match;
  if (!std::regex_match(text, match, pattern))
    throw UsageError(fmt::format("--older-than '{}': expected an age such as 30d, 12h, 2w", text));
  const double value = std::stod(match[1].str());
  const char unit = match[2].str()[0];
  const double scale = unit == 's' ? 1 : unit == 'm' ? 60 : unit == 'h' ? 3600 : unit == 'd' ? 86400 : 604800;
  if (value * scale > 1e10) throw UsageError(fmt::format("--older-than '{}': too long ago", text));
  return value * scale;
}

std::string iso8601_ago(double seconds) {
  const auto then = std::chrono::system_clock::now() - std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                                             std::chrono::duration<double>(seconds));
  const std::time_t time = std::chrono::system_clock::to_time_t(then);
  std::tm utc{};
  gmtime_r(&time, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S.000Z", &utc);
  return text;
}

// Deletes the files of `removed` that no remaining row names (content-addressed files are shared).
std::pair<size_t, int64_t> delete_unnamed(const std::vector<db::Artifact>& removed, db::Store& store,
                                          const std::string& db_path) {
  std::set<std::string> still_named;
  for (const auto& artifact : store.list_artifacts()) still_named.insert(artifact_file(artifact, db_path));
  std::set<std::string> done;
  size_t files = 0;
  int64_t bytes = 0;
  for (const auto& artifact : removed) {
    const std::string path = artifact_file(artifact, db_path);
    if (still_named.count(path) || !done.insert(path).second) continue;
    std::error_code error;
    const auto size = fs::file_size(path, error);
    if (!error && fs::remove(path, error)) {
      ++files;
      bytes += static_cast<int64_t>(size);
    }
  }
  return {files, bytes};
}

int db_check(const GlobalOptions& options) {
  db::Store store(options.db_path, db::Access::read);
  auto integrity = store.integrity_problems();
  // On a damaged db the other checks may fail to read: what they could not read is a finding too.
  std::vector<int64_t> abandoned;
  std::vector<db::Run> elsewhere;
  std::vector<db::Artifact> artifacts;
  try {
    abandoned = store.settle_abandoned_runs();
    elsewhere = store.runs_elsewhere();
    artifacts = store.list_artifacts();
  } catch (const db::DbError& error) {
    if (integrity.empty()) throw;
    integrity.push_back(std::string("the runs and artifacts could not be read: ") + error.what());
  }
  const auto orphans = integrity.empty() ? orphaned_files(artifacts, options.db_path) : std::vector<Orphan>{};
  nlohmann::json missing = nlohmann::json::array();
  for (const auto& artifact : artifacts) {
    std::error_code error;
    if (!fs::exists(artifact_file(artifact, options.db_path), error))
      missing.push_back({{"artifact", artifact.id}, {"run", artifact.run_id}, {"kind", artifact.kind}, {"path", artifact.path}});
  }
  nlohmann::json report = {{"db", options.db_path},
                           {"read_only", store.read_only()},
                           {"integrity", integrity.empty() ? nlohmann::json("ok") : nlohmann::json(integrity)},
                           {"abandoned_runs", abandoned},
                           {"running_elsewhere", nlohmann::json::array()},
                           {"orphaned_files", nlohmann::json::array()},
                           {"missing_files", missing}};
  for (const auto& run : elsewhere) report["running_elsewhere"].push_back({{"run", run.id}, {"host", run.owner_host}});
  int64_t orphan_bytes = 0;
  for (const auto& orphan : orphans) {
    report["orphaned_files"].push_back({{"path", orphan.path}, {"bytes", orphan.bytes}});
    orphan_bytes += orphan.bytes;
  }
  const int exit_code = integrity.empty() ? kExitOk : kExitInfra;
  if (options.json) {
    report["exit_code"] = exit_code;
    print_json(std::cout, report);
    return exit_code;
  }
  std::cout << options.db_path << (store.read_only() ? " (read-only)" : "") << '\n';
  if (integrity.empty()) {
    std::cout << "  integrity: ok\n";
  } else {
    std::cout << "  integrity: DAMAGED (" << integrity.size() << " problem" << (integrity.size() == 1 ? "" : "s")
              << "; `harness run` refuses to append to it)\n";
    for (const auto& problem : integrity) std::cout << "    " << problem << '\n';
  }
  std::cout << "  abandoned runs: " << abandoned.size();
  for (size_t i = 0; i < abandoned.size(); ++i) std::cout << (i ? ", " : " (") << abandoned[i];
  std::cout << (abandoned.empty() ? "" : store.read_only() ? ") (not marked: read-only)" : ") (marked abandoned)") << '\n';
  if (!elsewhere.empty()) std::cout << "  running on other hosts (not checked): " << elsewhere.size() << '\n';
  std::cout << "  orphaned artifact files: " << orphans.size()
            << (orphans.empty() ? "" : fmt::format(" ({}; `harness db vacuum` removes them)", format_bytes(static_cast<double>(orphan_bytes))))
            << '\n';
  std::cout << "  artifact rows whose file is missing: " << missing.size() << '\n';
  for (const auto& row : missing) std::cout << "    run " << row["run"] << ": " << row["path"].get<std::string>() << '\n';
  return exit_code;
}

int db_vacuum(const GlobalOptions& options, const DbArgs& args) {
  db::Store store(options.db_path, db::Access::read);
  if (store.read_only()) throw UsageError(options.db_path + ": read-only here; vacuum needs to write it");
  store.settle_abandoned_runs();
  std::error_code error;
  const auto before = fs::file_size(options.db_path, error);
  const size_t running = live_runs(store);
  const auto orphans = orphaned_files(store.list_artifacts(), options.db_path);
  size_t removed = 0;
  int64_t removed_bytes = 0;
  if (running == 0 && !args.dry_run) {
    for (const auto& orphan : orphans) {
      if (fs::remove(orphan.path, error)) {
        ++removed;
        removed_bytes += orphan.bytes;
      }
    }
  }
  if (!args.dry_run) store.vacuum();
  const auto after = fs::file_size(options.db_path, error);
  nlohmann::json report = {{"db", options.db_path},
                           {"dry_run", args.dry_run},
                           {"orphaned_files", orphans.size()},
                           {"removed_files", removed},
                           {"removed_bytes", removed_bytes},
                           {"db_bytes_before", before},
                           {"db_bytes_after", after},
                           {"skipped_because_running", running > 0 ? running : 0}};
  if (options.json) {
    print_json(std::cout, report);
  } else {
    std::cout << fmt::format("{}: {} orphaned file(s){}; db {} -> {}\n", options.db_path, orphans.size(),
                             running > 0 ? fmt::format(" kept ({} run(s) still running)", running)
                             : args.dry_run ? " (dry run)"
                                            : fmt::format(", removed ({})", format_bytes(static_cast<double>(removed_bytes))),
                             format_bytes(static_cast<double>(before)), format_bytes(static_cast<double>(after)));
  }
  return kExitOk;
}

int db_prune(const GlobalOptions& options, const DbArgs& args) {
  if (args.older_than.empty()) throw UsageError("db prune needs --older-than AGE (e.g. 30d)");
  const std::string cutoff = iso8601_ago(parse_age(args.older_than));
  db::Store store(options.db_path, db::Access::read);
  if (store.read_only()) throw UsageError(options.db_path + ": read-only here; prune needs to write it");
  store.settle_abandoned_runs();
  std::vector<db::Artifact> candidates;
  if (args.dry_run) {
    db::RunFilter filter;
    filter.limit = 0;
    std::map<int64_t, db::Run> runs;
    for (auto& run : store.list_runs(filter)) runs[run.id] = run;
    for (const auto& artifact : store.list_artifacts()) {
      const auto run = runs.find(artifact.run_id);
      if (std::find(args.kinds.begin(), args.kinds.end(), artifact.kind) != args.kinds.end() && run != runs.end() &&
          run->second.started_at < cutoff && run->second.status != "running")
        candidates.push_back(artifact);
    }
  } else {
    candidates = store.prune_artifacts(cutoff, args.kinds);
  }
  const auto [files, bytes] = args.dry_run ? std::pair<size_t, int64_t>{0, 0} : delete_unnamed(candidates, store, options.db_path);
  std::set<int64_t> runs;
  for (const auto& artifact : candidates) runs.insert(artifact.run_id);
  nlohmann::json report = {{"db", options.db_path},   {"older_than", args.older_than}, {"cutoff", cutoff},
                           {"dry_run", args.dry_run}, {"artifacts", candidates.size()}, {"runs", runs.size()},
                           {"removed_files", files},  {"removed_bytes", bytes}};
  if (options.json) {
    print_json(std::cout, report);
  } else {
    std::cout << fmt::format("{}: {} {} artifact row(s) of {} run(s) started before {}{}\n", options.db_path,
                             args.dry_run ? "would remove" : "removed", candidates.size(), runs.size(), cutoff,
                             args.dry_run ? "" : fmt::format("; {} file(s), {} freed", files, format_bytes(static_cast<double>(bytes))));
  }
  return kExitOk;
}

int merge_shards(const DbArgs& args, const GlobalOptions& options) {
  const std::string into = args.into.empty() ? options.db_path : args.into;
  if (!std::filesystem::exists(into))
    throw UsageError(fmt::format("--into {}: no such db (shards merge into the db their run was submitted from)", into));
  db::Store store(into);
  db::MergeOptions merge_options;
  merge_options.allow_unfinished = args.partial;
  // Every shard is checked before the first is merged, so one bad file merges nothing.
  merge_options.check_only = true;
  for (const std::string& shard : args.shards) store.merge_shard(shard, merge_options);
  merge_options.check_only = false;
  nlohmann::json results = nlohmann::json::array();
  Table table;
  table.headers = {"shard", "run", "attempt", "trials", "metrics", "artifacts", "result"};
  table.right_align = {false, true, false, true, true, true, false};
  for (const std::string& shard : args.shards) {
    for (const db::MergeResult& result : store.merge_shard(shard, merge_options)) {
      results.push_back({{"shard", shard},
                         {"run", result.run_id},
                         {"key", result.shard_key},
                         {"already_merged", result.already_merged},
                         {"trials", result.trials},
                         {"metrics", result.metrics},
                         {"artifacts", result.artifacts}});
      table.rows.push_back({shard, std::to_string(result.run_id), result.shard_key, std::to_string(result.trials),
                            std::to_string(result.metrics), std::to_string(result.artifacts),
                            result.already_merged ? "already merged (nothing added)" : "merged"});
    }
  }
  if (options.json) {
    print_json(std::cout, {{"into", into}, {"merged", results}});
  } else {
    print_table(std::cout, table);
  }
  return kExitOk;
}

int merge(const DbArgs& args, const GlobalOptions& options) {
  try {
    return merge_shards(args, options);
  } catch (const db::ShardRefused& refused) {
    throw UsageError(refused.what());  // a file the user named is not mergeable: exit 2
  }
}

}  // namespace

Action add_db_command(CLI::App& app, GlobalOptions& options) {
  auto args = std::make_shared<DbArgs>();
  auto* command = app.add_subcommand("db", "Check the db's health, compact it, prune old capsules, merge Slurm task shards");
  command->require_subcommand(1);
  auto* merge_command = command->add_subcommand("merge", "Merge task shards into a db (idempotent)");
  merge_command->add_option("shard", args->shards, "Shard files (<run folder>/shards/task-T.attempt-A.db)")->required();
  merge_command->add_option("--into", args->into, "The db to merge into (default: --db)");
  merge_command->add_flag("--partial", args->partial,
                          "Also merge an attempt that did not finish (its task was killed; the trials it ran)");
  auto* check = command->add_subcommand(
      "check", "Integrity, runs whose harness died (marked abandoned), orphaned or missing artifact files; exit 3 when damaged");
  auto* vacuum = command->add_subcommand("vacuum", "Remove orphaned artifact files and compact the db file");
  vacuum->add_flag("--dry-run", args->dry_run, "Only say what would be removed");
  auto* prune = command->add_subcommand("prune", "Remove the capsules of runs older than an age (runs and metrics stay)");
  prune->add_option("--older-than", args->older_than, "Age, e.g. 30d, 12h, 2w")->required();
  prune->add_option("--kind", args->kinds, "Artifact kinds to remove (default: capsule and outputs)")->delimiter(',');
  prune->add_flag("--dry-run", args->dry_run, "Only say what would be removed");
  for (CLI::App* sub : {command, merge_command, check, vacuum, prune}) add_global_options(*sub, options);
  for (CLI::App* sub : {merge_command, check, vacuum, prune}) sub->fallthrough();
  return [args, merge_command, check, vacuum, &options]() -> int {
    if (merge_command->parsed()) return merge(*args, options);
    if (check->parsed()) return db_check(options);
    if (vacuum->parsed()) return db_vacuum(options, *args);
    return db_prune(options, *args);
  };
}

}  // namespace harness
