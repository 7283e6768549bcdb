// `harness db merge SHARD... [--into DB]`: merges Slurm task shards into a db by hand (what
// `harness slurm collect` does as tasks end). Idempotent; refuses, with nothing written, a file
// that is not a valid shard of this schema version or belongs to a run the db does not have.

#include <filesystem>
#include <iostream>

#include <fmt/format.h>

#include "db/store.h"
#include "harness/cli.h"
#include "core/printer.h"

namespace harness {
namespace {

struct DbArgs {
  std::vector<std::string> shards;
  std::string into;
  bool partial = false;
};

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
  auto* command = app.add_subcommand("db", "Database maintenance: merge Slurm task shards");
  command->require_subcommand(1);
  auto* merge_command = command->add_subcommand("merge", "Merge task shards into a db (idempotent)");
  merge_command->add_option("shard", args->shards, "Shard files (<run folder>/shards/task-T.attempt-A.db)")->required();
  merge_command->add_option("--into", args->into, "The db to merge into (default: --db)");
  merge_command->add_flag("--partial", args->partial,
                          "Also merge an attempt that did not finish (its task was killed; the trials it ran)");
  add_global_options(*merge_command, options);
  merge_command->fallthrough();
  add_global_options(*command, options);
  return [args, &options] { return merge(*args, options); };
}

}  // namespace harness
