// Shards: the db a Slurm array task writes (a harness db of its own, plus shard_info rows naming the
// main run), and their merge into the main db. The merge attaches the shard and copies with
// INSERT ... SELECT inside one write transaction, so a shard is merged completely or not at all, and
// shard_merges makes a second merge of the same task attempt a no-op.

#include <sqlite3.h>
#include <sys/stat.h>

#include <memory>
#include <set>

#include "db/artifact_paths.h"
#include "db/migrations.h"
#include "db/statement.h"
#include "db/store.h"

namespace harness::db {

using detail::Statement;
using detail::Transaction;

namespace {

struct ConnectionCloser {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};

std::string shard_key_of(const ShardRun& shard_run) {
  return "task-" + std::to_string(shard_run.task) + ".attempt-" + std::to_string(shard_run.attempt);
}

// Column names of `table` in schema `schema` ("main" or "shard"), except `skipped`.
std::vector<std::string> columns_of(sqlite3* db, const std::string& path, const std::string& schema,
                                    const std::string& table, const std::set<std::string>& skipped) {
  // PRAGMA takes no bound parameters; schema and table come from this file's constants.
  const std::string sql = "PRAGMA " + schema + ".table_info(" + table + ")";
  Statement info(db, path, sql.c_str(), "read columns of " + table);
  std::vector<std::string> columns;
  while (info.step()) {
    const std::string name = info.column_text(1);
    if (!skipped.count(name)) columns.push_back(name);
  }
  return columns;
}

std::string joined(const std::vector<std::string>& names, const std::string& prefix = "") {
  std::string text;
  for (const auto& name : names) text += (text.empty() ? "" : ", ") + prefix + name;
  return text;
}

// Detaches the shard however the merge ends.
class Attachment {
 public:
  Attachment(sqlite3* db, const std::string& path, const std::string& shard_path) : db_(db), path_(path) {
    Statement attach(db, path, "ATTACH DATABASE ?1 AS shard", "attach shard " + shard_path);
    attach.bind_text(1, shard_path);
    attach.run();
  }
  ~Attachment() { sqlite3_exec(db_, "DETACH DATABASE shard", nullptr, nullptr, nullptr); }
  Attachment(const Attachment&) = delete;
  Attachment& operator=(const Attachment&) = delete;

 private:
  sqlite3* db_;
  std::string path_;
};

// Whether the db has a shard_info table (a db of schema version 4 or later always does; the check
// keeps the message clear for a file whose version matched by accident).
bool has_shard_info(sqlite3* db, const std::string& path) {
  Statement table(db, path, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'shard_info'",
                  "inspect shard");
  return table.step();
}

// The schema objects of `schema` ("main" or "shard"): type, name and the SQL that made them.
std::vector<std::string> schema_objects(sqlite3* db, const std::string& path, const std::string& schema) {
  const std::string sql = "SELECT type || ' ' || name || ': ' || coalesce(sql, '') FROM " + schema +
                          ".sqlite_master WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY type, name";
  Statement select(db, path, sql.c_str(), "read the schema of " + schema);
  std::vector<std::string> objects;
  while (select.step()) objects.push_back(select.column_text(0));
  return objects;
}

// Ids merged into the main db are shifted past its largest; ids of either side beyond this would
// overflow the sum (SQLite would turn it into a float and refuse the row half way).
constexpr int64_t kMaxMergedId = int64_t{1} << 53;

// A shard is input from another host (or anyone who can write the run folder): before anything is
// merged, every row of `shard_run` that the main db would keep must be what a harness task writes.
// ShardRefused naming the first problem otherwise.
void check_shard_rows(sqlite3* db, const std::string& main_path, const std::string& shard_path,
                      const ShardRun& shard_run) {
  const std::string operation = "check " + shard_path;
  const auto refuse = [&](const std::string& what) {
    throw ShardRefused(shard_path + ": " + what + "; nothing was merged");
  };
  const auto count = [&](const std::string& sql) {
    Statement select(db, main_path, sql.c_str(), operation);
    select.bind_int(1, shard_run.shard_run_id);
    select.step();
    return select.column_int(0);
  };
  if (count("SELECT count(*) FROM shard.trials WHERE run_id = ?1 AND (id < 1 OR id > " + std::to_string(kMaxMergedId) +
            ")") > 0)
    refuse("a trial id below 1 or above 2^53");
  for (const std::string table : {"metrics", "artifacts"}) {
    if (count("SELECT count(*) FROM shard." + table + " x WHERE x.run_id = ?1 AND x.trial_id IS NOT NULL AND NOT EXISTS "
              "(SELECT 1 FROM shard.trials t WHERE t.id = x.trial_id AND t.run_id = ?1)") > 0)
      refuse("rows of " + table + " name a trial the shard's run does not have");
  }
  if (count("SELECT count(*) FROM shard.trials WHERE run_id = ?1 AND NOT (json_valid(point) AND json_valid(dispatch) "
            "AND json_valid(details))") > 0 ||
      count("SELECT count(*) FROM shard.metrics WHERE run_id = ?1 AND NOT json_valid(point)") > 0 ||
      count("SELECT count(*) FROM shard.envs WHERE ?1 IS NOT NULL AND NOT json_valid(json)") > 0)
    refuse("a JSON column (trials.point, dispatch or details, metrics.point, envs.json) that is not JSON");
  if (count("SELECT count(*) FROM shard.runs r WHERE r.id = ?1 AND r.env_id IS NOT NULL AND NOT EXISTS "
            "(SELECT 1 FROM shard.envs e WHERE e.id = r.env_id)") > 0)
    refuse("the shard's run names an env the shard does not have");
  // Artifact rows name files the main db will read and may one day delete: they must lie in the
  // main db's artifact folder, where the task wrote its capsules.
  const ArtifactFolder folder(main_path);
  Statement artifacts(db, main_path, "SELECT path FROM shard.artifacts WHERE run_id = ?1 ORDER BY id", operation);
  artifacts.bind_int(1, shard_run.shard_run_id);
  while (artifacts.step()) {
    const std::string path = artifacts.column_text(0);
    const ResolvedArtifact resolved = folder.resolve(path);
    if (resolved.place == ResolvedArtifact::Place::outside)
      refuse("an artifact row names '" + path + "', " + resolved.problem);
  }
}

}  // namespace

std::vector<ShardRun> read_shard_runs(const std::string& shard_path) {
  struct stat info{};
  if (stat(shard_path.c_str(), &info) != 0 || !S_ISREG(info.st_mode))
    throw ShardRefused(shard_path + ": no such shard file");
  sqlite3* raw = nullptr;
  // Read-write (never create): a task killed mid-write leaves a hot journal, which only a writer
  // can roll back; opening read-only would fail on exactly the shards that need care.
  const int rc = sqlite3_open_v2(shard_path.c_str(), &raw, SQLITE_OPEN_READWRITE, nullptr);
  std::unique_ptr<sqlite3, ConnectionCloser> db(raw);
  if (rc != SQLITE_OK) {
    const std::string message = raw ? sqlite3_errmsg(raw) : "cannot open";
    throw ShardRefused(shard_path + ": open shard: " + message);
  }
  sqlite3_busy_timeout(raw, 10'000);
  // A truncated or damaged file fails here (not a database, malformed image, missing pages).
  try {
    Statement check(raw, shard_path, "PRAGMA quick_check", "check shard");
    std::string problems;
    while (check.step()) {
      const std::string line = check.column_text(0);
      if (line != "ok") problems += (problems.empty() ? "" : "; ") + line;
    }
    if (!problems.empty()) throw DbError(shard_path + ": damaged shard (quick_check: " + problems + ")");
  } catch (const DbError& error) {
    throw ShardRefused(std::string(error.what()) + " (truncated or damaged shard; nothing was merged)");
  }
  int version = 0;
  try {
    version = detail::read_schema_version(raw, shard_path);
  } catch (const DbError& error) {
    throw ShardRefused(error.what());
  }
  if (version != current_schema_version()) {
    throw ShardRefused(shard_path + ": shard schema version " + std::to_string(version) + ", this harness writes " +
                  std::to_string(current_schema_version()) + ": merge it with the harness that wrote it");
  }
  if (!has_shard_info(raw, shard_path))
    throw ShardRefused(shard_path + ": not a shard (a harness db without shard_info rows)");
  Statement select(raw, shard_path,
                   "SELECT shard_run_id, main_run_id, run_token, task, attempt, slurm, finished_at FROM shard_info "
                   "ORDER BY shard_run_id",
                   "read shard_info");
  std::vector<ShardRun> runs;
  while (select.step()) {
    ShardRun run;
    run.shard_run_id = select.column_int(0);
    run.main_run_id = select.column_int(1);
    run.run_token = select.column_text(2);
    run.task = static_cast<int>(select.column_int(3));
    run.attempt = static_cast<int>(select.column_int(4));
    run.slurm = nlohmann::json::parse(select.column_text(5), nullptr, false);
    if (run.slurm.is_discarded()) throw ShardRefused(shard_path + ": shard_info.slurm is not JSON");
    run.finished_at = select.column_text(6);
    runs.push_back(std::move(run));
  }
  if (runs.empty()) throw ShardRefused(shard_path + ": not a shard (a harness db without shard_info rows)");
  return runs;
}

void Store::add_shard_run(const ShardRun& shard_run) {
  Transaction transaction(db_, path_, Transaction::Mode::kWrite, "add shard run");
  Statement insert(db_, path_,
                   "INSERT INTO shard_info (shard_run_id, main_run_id, run_token, task, attempt, slurm, created_at, "
                   "finished_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, '')",
                   "add shard run");
  insert.bind_int(1, shard_run.shard_run_id)
      .bind_int(2, shard_run.main_run_id)
      .bind_text(3, shard_run.run_token)
      .bind_int(4, shard_run.task)
      .bind_int(5, shard_run.attempt)
      .bind_text(6, canonical_json(shard_run.slurm))
      .bind_text(7, now_iso8601());
  insert.run();
  transaction.commit();
}

void Store::finish_shard_run(int64_t shard_run_id) {
  Transaction transaction(db_, path_, Transaction::Mode::kWrite, "finish shard run");
  Statement update(db_, path_, "UPDATE shard_info SET finished_at = ?2 WHERE shard_run_id = ?1", "finish shard run");
  update.bind_int(1, shard_run_id).bind_text(2, now_iso8601());
  update.run();
  transaction.commit();
}

std::vector<MergeResult> Store::merge_shard(const std::string& shard_path, const MergeOptions& options) {
  // Every check that can refuse the shard runs before anything is written.
  const std::vector<ShardRun> shard_runs = read_shard_runs(shard_path);
  for (const ShardRun& shard_run : shard_runs) {
    if (options.run_id && *options.run_id != shard_run.main_run_id) {
      throw ShardRefused(shard_path + ": a shard of run " + std::to_string(shard_run.main_run_id) + ", not of run " +
                    std::to_string(*options.run_id) + "; nothing was merged");
    }
    if (shard_run.finished_at.empty() && !options.allow_unfinished) {
      throw ShardRefused(shard_path + ": " + shard_key_of(shard_run) +
                    " did not finish (its task is still running, or was killed): merge it once its Slurm task "
                    "ended (harness slurm collect does), or pass --partial");
    }
  }
  Attachment attachment(db_, path_, shard_path);
  // Same version, same schema: a table made into a view, a changed column or an added trigger is
  // not what a harness task writes, and would run inside the merge.
  if (schema_objects(db_, path_, "shard") != schema_objects(db_, path_, "main"))
    throw ShardRefused(shard_path + ": its schema is not this harness's (a table, index, view or trigger differs); "
                       "nothing was merged");
  for (const ShardRun& shard_run : shard_runs) check_shard_rows(db_, path_, shard_path, shard_run);
  Statement largest(db_, path_, "SELECT coalesce(max(id), 0) FROM main.trials", "merge " + shard_path);
  largest.step();
  if (largest.column_int(0) > kMaxMergedId)
    throw ShardRefused(path_ + ": trial ids past 2^53: shards can no longer be merged into it; nothing was merged");
  std::vector<MergeResult> results;
  for (const ShardRun& shard_run : shard_runs) {
    MergeResult result;
    result.run_id = shard_run.main_run_id;
    result.shard_key = shard_key_of(shard_run);
    const std::string operation = "merge " + shard_path + " (" + result.shard_key + ")";
    Transaction transaction(db_, path_, Transaction::Mode::kWrite, operation);
    Statement owner(db_, path_, "SELECT json_extract(args, '$.slurm.token') FROM main.runs WHERE id = ?1", operation);
    owner.bind_int(1, shard_run.main_run_id);
    if (!owner.step()) {
      throw ShardRefused(path_ + ": " + operation + ": the shard belongs to run " + std::to_string(shard_run.main_run_id) +
                    ", which this db does not have (a shard of another db?); nothing was merged");
    }
    if (owner.column_text(0) != shard_run.run_token) {
      throw ShardRefused(path_ + ": " + operation + ": the shard belongs to another run " +
                    std::to_string(shard_run.main_run_id) + " (token " + shard_run.run_token + ", this db's run has " +
                    (owner.is_null(0) ? std::string("none: not a Slurm run") : owner.column_text(0)) +
                    "); nothing was merged");
    }
    Statement seen(db_, path_, "SELECT 1 FROM main.shard_merges WHERE run_id = ?1 AND shard_key = ?2", operation);
    seen.bind_int(1, shard_run.main_run_id).bind_text(2, result.shard_key);
    if (seen.step()) result.already_merged = true;
    if (result.already_merged || options.check_only) {
      results.push_back(result);
      continue;  // the transaction rolls back unchanged
    }

    const std::string env_columns = joined(columns_of(db_, path_, "main", "envs", {}));
    const std::string envs_sql =
        "INSERT OR IGNORE INTO main.envs (" + env_columns + ") SELECT " + env_columns + " FROM shard.envs";
    Statement(db_, path_, envs_sql.c_str(), operation).run();

    Statement max_trial(db_, path_, "SELECT coalesce(max(id), 0) FROM main.trials", operation);
    max_trial.step();
    const int64_t offset = max_trial.column_int(0);

    // Columns are read from the schema (equal on both sides: the versions matched), so a column
    // a later migration adds is copied without this code changing.
    const auto trial_columns = columns_of(db_, path_, "main", "trials", {"id", "run_id"});
    std::string trial_values;
    for (const std::string& column : trial_columns) {
      trial_values += trial_values.empty() ? "" : ", ";
      trial_values += column == "details" && !options.slurm_state.empty()
                          ? "json_set(details, '$.slurm.state', ?3)"
                          : column;
    }
    const std::string trials_sql = "INSERT INTO main.trials (id, run_id, " + joined(trial_columns) +
                                   ") SELECT id + ?4, ?1, " + trial_values +
                                   " FROM shard.trials WHERE run_id = ?2 ORDER BY id";
    Statement trials(db_, path_, trials_sql.c_str(), operation);
    trials.bind_int(1, shard_run.main_run_id).bind_int(2, shard_run.shard_run_id).bind_int(4, offset);
    if (!options.slurm_state.empty()) trials.bind_text(3, options.slurm_state);
    trials.run();
    result.trials = sqlite3_changes(db_);

    for (const std::string table : {"metrics", "artifacts"}) {
      const auto columns = columns_of(db_, path_, "main", table, {"id", "run_id", "trial_id"});
      const std::string sql = "INSERT INTO main." + table + " (run_id, trial_id, " + joined(columns) +
                              ") SELECT ?1, trial_id + ?3, " + joined(columns) + " FROM shard." + table +
                              " WHERE run_id = ?2 ORDER BY id";
      Statement copy(db_, path_, sql.c_str(), operation);
      copy.bind_int(1, shard_run.main_run_id).bind_int(2, shard_run.shard_run_id).bind_int(3, offset);
      copy.run();
      (table == std::string("metrics") ? result.metrics : result.artifacts) = sqlite3_changes(db_);
    }

    Statement env(db_, path_,
                  "UPDATE main.runs SET env_id = (SELECT env_id FROM shard.runs WHERE id = ?2) "
                  "WHERE id = ?1 AND env_id IS NULL",
                  operation);
    env.bind_int(1, shard_run.main_run_id).bind_int(2, shard_run.shard_run_id);
    env.run();

    Statement record(db_, path_,
                     "INSERT INTO main.shard_merges (run_id, shard_key, path, trials, merged_at) "
                     "VALUES (?1, ?2, ?3, ?4, ?5)",
                     operation);
    record.bind_int(1, shard_run.main_run_id)
        .bind_text(2, result.shard_key)
        .bind_text(3, shard_path)
        .bind_int(4, result.trials)
        .bind_text(5, now_iso8601());
    record.run();
    transaction.commit();
    results.push_back(result);
  }
  return results;
}

std::vector<ShardMerge> Store::list_shard_merges(int64_t run_id) const {
  Statement select(db_, path_,
                   "SELECT run_id, shard_key, path, trials, merged_at FROM shard_merges WHERE run_id = ?1 ORDER BY id",
                   "list shard merges of run " + std::to_string(run_id));
  select.bind_int(1, run_id);
  std::vector<ShardMerge> merges;
  while (select.step()) {
    merges.push_back({select.column_int(0), select.column_text(1), select.column_text(2), select.column_int(3),
                      select.column_text(4)});
  }
  return merges;
}

}  // namespace harness::db
