// `harness db merge SHARD... [--into DB]`: merges Slurm task shards into a db by hand (what
// `harness slurm collect` does as tasks end). Idempotent; refuses, with nothing written, a file
// that is not a valid shard of this schema version or belongs to a run the db does not have.
// `harness db check | vacuum | prune`: the db's health and size. check: SQLite's integrity
// check, runs whose harness died (marked abandoned), files of the db's artifact folder no row
// names (orphans), rows whose file is gone and rows that name files outside the folder; vacuum:
// removes orphans and compacts the file; prune: removes the capsules of old runs (about 1 GB each
// at real dims), keeping the runs, trials and metrics. Only files of the db's own artifact folder
// are ever deleted, and none while a run of the db is going (db/artifact_paths.h).

#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <regex>
#include <set>

#include <fmt/format.h>

#include "core/json_input.h"
#include "db/artifact_paths.h"
#include "db/store.h"
#include "harness/cli/cli.h"
#include "core/printer.h"
#include "harness/runner/run_support.h"

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

using Place = db::ResolvedArtifact::Place;

struct Orphan {
  std::string path;
  int64_t bytes = 0;
};

// Files in the db's own artifact folder that no row names: left by a harness killed between
// writing a capsule and storing its row, or by rows removed outside the harness. Only regular
// files count (a symbolic link there is not the harness's), and nothing outside the folder is
// looked at: other dbs' files, even in the folder older versions shared, are never orphans here.
std::vector<Orphan> orphaned_files(const std::vector<db::Artifact>& artifacts, const db::ArtifactFolder& folder) {
  std::set<std::string> named;
  for (const auto& artifact : artifacts) {
    const auto resolved = folder.resolve(artifact.path);
    if (resolved.place == Place::own) named.insert(resolved.file);
  }
  std::vector<Orphan> orphans;
  std::error_code error;
  if (!fs::is_directory(fs::symlink_status(folder.own(), error))) return orphans;
  for (auto it = fs::recursive_directory_iterator(folder.own(), error); !error && it != fs::recursive_directory_iterator();
       it.increment(error)) {
    std::error_code status_error;
    if (!fs::is_regular_file(it->symlink_status(status_error))) continue;
    const std::string path = it->path().lexically_normal().string();
    if (named.count(path)) continue;
    orphans.push_back({path, static_cast<int64_t>(it->file_size(status_error))});
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

// What prune did with the files of the rows it removed.
struct Deleted {
  size_t files = 0;
  int64_t bytes = 0;
  size_t kept_shared = 0;   // in the folder older versions shared: another db may name them
  size_t kept_outside = 0;  // rows naming files outside the artifact folders: never touched
  size_t kept_running = 0;  // a run of this db is going and may name them next
};

// Deletes the files of `removed` that lie in the db's own folder and that no remaining row names
// (content-addressed files are shared between runs); while a run of the db is going, none: its
// next row may name any of them.
Deleted delete_unnamed(const std::vector<db::Artifact>& removed, db::Store& store, const db::ArtifactFolder& folder,
                       size_t running) {
  std::set<std::string> still_named;
  for (const auto& artifact : store.list_artifacts()) still_named.insert(folder.resolve(artifact.path).file);
  std::set<std::string> done;
  Deleted deleted;
  for (const auto& artifact : removed) {
    const auto resolved = folder.resolve(artifact.path);
    if (resolved.place == Place::outside) {
      ++deleted.kept_outside;
      continue;
    }
    if (still_named.count(resolved.file) || !done.insert(resolved.file).second) continue;
    if (resolved.place == Place::shared) {
      ++deleted.kept_shared;
    } else if (running > 0) {
      ++deleted.kept_running;
    } else {
      std::error_code error;
      const auto size = fs::file_size(resolved.file, error);
      if (!error && fs::remove(resolved.file, error)) {
        ++deleted.files;
        deleted.bytes += static_cast<int64_t>(size);
      }
    }
  }
  return deleted;
}

int db_check(const GlobalOptions& options) {
  db::Store store(options.db_path, db::Access::read);
  const db::ArtifactFolder folder(options.db_path);
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
  const auto orphans = integrity.empty() ? orphaned_files(artifacts, folder) : std::vector<Orphan>{};
  nlohmann::json missing = nlohmann::json::array(), outside = nlohmann::json::array();
  size_t shared_rows = 0;
  for (const auto& artifact : artifacts) {
    const auto resolved = folder.resolve(artifact.path);
    const nlohmann::json row = {{"artifact", artifact.id}, {"run", artifact.run_id}, {"kind", artifact.kind}, {"path", artifact.path}};
    if (resolved.place == Place::outside) {
      outside.push_back(row);
      outside.back()["problem"] = resolved.problem;
      continue;
    }
    shared_rows += resolved.place == Place::shared;
    std::error_code error;
    if (!fs::exists(resolved.file, error)) missing.push_back(row);
  }
  nlohmann::json report = {{"db", options.db_path},
                           {"integrity", integrity.empty() ? nlohmann::json("ok") : nlohmann::json(integrity)},
                           {"abandoned_runs", abandoned},
                           {"running_elsewhere", nlohmann::json::array()},
                           {"artifact_folder", folder.own()},
                           {"orphaned_files", nlohmann::json::array()},
                           {"missing_files", missing},
                           {"outside_rows", outside},
                           {"shared_folder_rows", shared_rows}};
  for (const auto& run : elsewhere) report["running_elsewhere"].push_back({{"run", run.id}, {"host", run.owner_host}});
  int64_t orphan_bytes = 0;
  for (const auto& orphan : orphans) {
    report["orphaned_files"].push_back({{"path", orphan.path}, {"bytes", orphan.bytes}});
    orphan_bytes += orphan.bytes;
  }
  // A damaged db, or rows that name files outside the artifact folders (a db edited by hand or
  // from someone else: not to be trusted with deletions), end in exit 3.
  const int exit_code = integrity.empty() && outside.empty() ? kExitOk : kExitInfra;
  if (options.json) {
    report["exit_code"] = exit_code;
    print_json(std::cout, report);
    return exit_code;
  }
  std::cout << options.db_path << '\n';
  if (integrity.empty()) {
    std::cout << "  integrity: ok\n";
  } else {
    std::cout << "  integrity: DAMAGED (" << integrity.size() << " problem" << (integrity.size() == 1 ? "" : "s")
              << "; `harness run` refuses to append to it)\n";
    for (const auto& problem : integrity) std::cout << "    " << problem << '\n';
  }
  std::cout << "  abandoned runs: " << abandoned.size();
  for (size_t i = 0; i < abandoned.size(); ++i) std::cout << (i ? ", " : " (") << abandoned[i];
  std::cout << (abandoned.empty() ? "" : ") (not marked here: `harness run` and `db vacuum` mark them)") << '\n';
  if (!elsewhere.empty()) std::cout << "  running on other hosts (not checked): " << elsewhere.size() << '\n';
  std::cout << "  artifact folder: " << folder.own() << '\n';
  std::cout << "  orphaned artifact files: " << orphans.size()
            << (orphans.empty() ? "" : fmt::format(" ({}; `harness db vacuum` removes them)", format_bytes(static_cast<double>(orphan_bytes))))
            << '\n';
  std::cout << "  artifact rows whose file is missing: " << missing.size() << '\n';
  for (const auto& row : missing) std::cout << "    run " << row["run"] << ": " << row["path"].get<std::string>() << '\n';
  if (shared_rows > 0)
    std::cout << "  artifact rows in " << folder.shared() << " (shared by the folder's dbs before; read, never deleted): "
              << shared_rows << '\n';
  std::cout << "  artifact rows naming files outside the artifact folder (never read or deleted): " << outside.size() << '\n';
  for (const auto& row : outside)
    std::cout << "    run " << row["run"] << ": " << clip_text(row["path"].get<std::string>(), 200) << ": "
              << row["problem"].get<std::string>() << '\n';
  return exit_code;
}

int db_vacuum(const GlobalOptions& options, const DbArgs& args) {
  db::Store store(options.db_path, db::Access::update);
  store.settle_abandoned_runs();
  std::error_code error;
  const auto before = fs::file_size(options.db_path, error);
  const size_t running = live_runs(store);
  const auto orphans = orphaned_files(store.list_artifacts(), db::ArtifactFolder(options.db_path));
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
  db::Store store(options.db_path, db::Access::update);
  store.settle_abandoned_runs();
  const size_t running = live_runs(store);
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
  const db::ArtifactFolder folder(options.db_path);
  const Deleted deleted = args.dry_run ? Deleted{} : delete_unnamed(candidates, store, folder, running);
  std::set<int64_t> runs;
  for (const auto& artifact : candidates) runs.insert(artifact.run_id);
  nlohmann::json report = {{"db", options.db_path},
                           {"older_than", args.older_than},
                           {"cutoff", cutoff},
                           {"dry_run", args.dry_run},
                           {"artifacts", candidates.size()},
                           {"runs", runs.size()},
                           {"removed_files", deleted.files},
                           {"removed_bytes", deleted.bytes},
                           {"kept_files",
                            {{"shared_folder", deleted.kept_shared},
                             {"outside", deleted.kept_outside},
                             {"running", deleted.kept_running}}}};
  if (options.json) {
    print_json(std::cout, report);
    return kExitOk;
  }
  std::cout << fmt::format("{}: {} {} artifact row(s) of {} run(s) started before {}{}\n", options.db_path,
                           args.dry_run ? "would remove" : "removed", candidates.size(), runs.size(), cutoff,
                           args.dry_run ? "" : fmt::format("; {} file(s), {} freed", deleted.files,
                                                           format_bytes(static_cast<double>(deleted.bytes))));
  if (deleted.kept_running > 0)
    std::cout << fmt::format("  kept {} file(s): {} run(s) of this db are going and may name them; `harness db vacuum` "
                             "removes them once none is\n",
                             deleted.kept_running, running);
  if (deleted.kept_shared > 0)
    std::cout << fmt::format("  kept {} file(s) in {}: older versions shared that folder between the dbs beside it\n",
                             deleted.kept_shared, folder.shared());
  if (deleted.kept_outside > 0)
    std::cout << fmt::format("  kept {} file(s) named outside the artifact folder (`harness db check` lists the rows)\n",
                             deleted.kept_outside);
  return kExitOk;
}

// Reading commands never write, so they read only dbs of this binary's schema: an older db is
// upgraded here (what `run` also does when it appends to one).
int db_migrate(const GlobalOptions& options) {
  const db::Store store(options.db_path, db::Access::update);
  if (options.json) {
    print_json(std::cout, {{"db", options.db_path}, {"schema_version", store.schema_version()}});
  } else {
    std::cout << fmt::format("{}: schema version {} (this binary's)\n", options.db_path, store.schema_version());
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
  auto* migrate = command->add_subcommand("migrate", "Upgrade the db's schema to this binary's (reading commands never do)");
  for (CLI::App* sub : {command, merge_command, check, vacuum, prune, migrate}) add_global_options(*sub, options);
  for (CLI::App* sub : {merge_command, check, vacuum, prune, migrate}) sub->fallthrough();
  return [args, merge_command, check, vacuum, migrate, &options]() -> int {
    if (merge_command->parsed()) return merge(*args, options);
    if (check->parsed()) return db_check(options);
    if (vacuum->parsed()) return db_vacuum(options, *args);
    if (migrate->parsed()) return db_migrate(options);
    return db_prune(options, *args);
  };
}

}  // namespace harness
