// The schema as an ordered list of steps. Step N takes a db at version N-1 to version N
// (PRAGMA user_version). Steps are only ever appended: a released step never changes, because
// dbs already carry its result.

#include "db/migrations.h"

#include <array>
#include <string>

#include "db/statement.h"
#include "db/store.h"

namespace harness::db {
namespace {

struct Migration {
  int version;              // user_version after this step
  const char* description;  // for error messages
  const char* sql;          // DDL only: no values, so nothing to bind
};

// JSON columns are TEXT holding canonical_json(); timestamps are ISO 8601 UTC text, which
// sorts chronologically.
constexpr std::array<Migration, 6> kMigrations = {{
    {1, "initial layout", R"sql(
CREATE TABLE envs (
  id         TEXT PRIMARY KEY,  -- sha256 of the canonical env JSON
  json       TEXT NOT NULL,
  created_at TEXT NOT NULL
);
CREATE TABLE experiments (
  id         INTEGER PRIMARY KEY,
  name       TEXT NOT NULL,
  spec       TEXT NOT NULL,
  spec_hash  TEXT NOT NULL,     -- sha256 of the canonical spec JSON
  created_at TEXT NOT NULL,
  UNIQUE (name, spec_hash)
);
CREATE TABLE runs (
  id            INTEGER PRIMARY KEY,
  experiment_id INTEGER NOT NULL REFERENCES experiments(id),
  env_id        TEXT REFERENCES envs(id),  -- NULL when no env was recorded
  device        TEXT NOT NULL,
  profile       TEXT NOT NULL,
  status        TEXT NOT NULL,
  verdict       TEXT NOT NULL,
  evidence      TEXT NOT NULL,
  args          TEXT NOT NULL,
  error         TEXT NOT NULL,
  started_at    TEXT NOT NULL,
  finished_at   TEXT NOT NULL
);
CREATE TABLE metrics (
  id      INTEGER PRIMARY KEY,
  run_id  INTEGER NOT NULL REFERENCES runs(id),
  variant TEXT NOT NULL,
  point   TEXT NOT NULL,
  name    TEXT NOT NULL,
  value   REAL NOT NULL,
  unit    TEXT NOT NULL,
  repeat  INTEGER NOT NULL   -- -1 for a summary value
);
CREATE TABLE artifacts (
  id     INTEGER PRIMARY KEY,
  run_id INTEGER NOT NULL REFERENCES runs(id),
  kind   TEXT NOT NULL,
  sha256 TEXT NOT NULL,
  path   TEXT NOT NULL,      -- relative to the db's folder
  bytes  INTEGER NOT NULL
);
)sql"},
    {2, "trials, replays and indexes", R"sql(
CREATE TABLE trials (
  id              INTEGER PRIMARY KEY,
  run_id          INTEGER NOT NULL REFERENCES runs(id),
  variant         TEXT NOT NULL,
  point           TEXT NOT NULL,
  status          TEXT NOT NULL,
  exit_code       INTEGER,
  signal          INTEGER,
  error           TEXT NOT NULL,
  stderr_tail     TEXT NOT NULL,
  requested_bytes INTEGER,
  dispatch        TEXT NOT NULL,
  duration_s      REAL NOT NULL,
  started_at      TEXT NOT NULL
);
ALTER TABLE metrics ADD COLUMN trial_id INTEGER REFERENCES trials(id);
ALTER TABLE artifacts ADD COLUMN trial_id INTEGER REFERENCES trials(id);
ALTER TABLE runs ADD COLUMN replay_of INTEGER REFERENCES runs(id);
CREATE INDEX runs_by_experiment ON runs(experiment_id);
CREATE INDEX trials_by_run ON trials(run_id);
CREATE INDEX metrics_by_run ON metrics(run_id);
CREATE INDEX metrics_by_trial ON metrics(trial_id);
CREATE INDEX artifacts_by_run ON artifacts(run_id);
)sql"},
    {3, "trial details (kind-specific evidence)", R"sql(
ALTER TABLE trials ADD COLUMN details TEXT NOT NULL DEFAULT '{}';
)sql"},
    // A Slurm run's tasks each write a shard: a harness db of its own whose shard_info says which
    // run of which main db its runs belong to (empty in a main db). shard_merges, in the main db,
    // makes merging idempotent: one row per (run, task attempt) already merged.
    {4, "Slurm shards and their merges", R"sql(
CREATE TABLE shard_info (
  shard_run_id INTEGER PRIMARY KEY REFERENCES runs(id),  -- the run row inside the shard
  main_run_id  INTEGER NOT NULL,  -- the run it belongs to, in the main db
  run_token    TEXT NOT NULL,     -- random, also in the main run's args.slurm.token
  task         INTEGER NOT NULL,  -- Slurm array task id
  attempt      INTEGER NOT NULL,  -- 0 for the first run of the task, n after n requeues
  slurm        TEXT NOT NULL,     -- JSON: job ids, node, as the task saw them
  created_at   TEXT NOT NULL,
  finished_at  TEXT NOT NULL      -- '' until every trial of the task attempt has run
);
CREATE TABLE shard_merges (
  id        INTEGER PRIMARY KEY,
  run_id    INTEGER NOT NULL REFERENCES runs(id),
  shard_key TEXT NOT NULL,        -- "task-T.attempt-A"
  path      TEXT NOT NULL,
  trials    INTEGER NOT NULL,
  merged_at TEXT NOT NULL,
  UNIQUE (run_id, shard_key)
);
)sql"},
    {5, "bisects (harness bisect) and their probes", R"sql(
CREATE TABLE bisects (
  id          INTEGER PRIMARY KEY,
  experiment  TEXT NOT NULL,
  mode        TEXT NOT NULL,      -- verdict, status or metric
  target      TEXT NOT NULL,      -- "" (verdict), the variant (status), variant.metric (metric)
  package     TEXT NOT NULL,      -- the package bisected; "" for --envs and --builds
  good        TEXT NOT NULL,
  bad         TEXT NOT NULL,
  status      TEXT NOT NULL,      -- running, found, range, failed, interrupted
  first_bad   TEXT NOT NULL,
  last_good   TEXT NOT NULL,
  args        TEXT NOT NULL,      -- the command line
  result      TEXT NOT NULL,      -- candidates, references, env diff, reproduce commands
  error       TEXT NOT NULL,
  started_at  TEXT NOT NULL,
  finished_at TEXT NOT NULL
);
CREATE TABLE bisect_probes (
  id         INTEGER PRIMARY KEY,
  bisect_id  INTEGER NOT NULL REFERENCES bisects(id),
  seq        INTEGER NOT NULL,    -- order of probing
  position   INTEGER NOT NULL,    -- index in the ordered candidates
  label      TEXT NOT NULL,       -- version, interpreter or build
  outcome    TEXT NOT NULL,       -- good, bad or skip
  reason     TEXT NOT NULL,
  run_ids    TEXT NOT NULL,       -- JSON array: the stored runs of this probe
  details    TEXT NOT NULL,       -- JSON: env, install time, verdict, status, metric values
  started_at TEXT NOT NULL
);
CREATE INDEX bisect_probes_by_bisect ON bisect_probes(bisect_id);
)sql"},
    {6, "run owner (host, pid, process start) to find abandoned runs", R"sql(
ALTER TABLE runs ADD COLUMN owner_host TEXT NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN owner_pid INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN owner_start TEXT NOT NULL DEFAULT '';
CREATE INDEX runs_by_status ON runs(status);
)sql"},
}};

// migrate() indexes the table by version: step i must produce version i + 1.
constexpr bool versions_are_consecutive() {
  for (size_t i = 0; i < kMigrations.size(); ++i) {
    if (kMigrations[i].version != static_cast<int>(i) + 1) return false;
  }
  return true;
}
static_assert(versions_are_consecutive(), "kMigrations must list versions 1, 2, ... in order");

}  // namespace

int current_schema_version() { return kMigrations.back().version; }

namespace detail {

int read_schema_version(sqlite3* db, const std::string& path) {
  Statement version(db, path, "PRAGMA user_version", "read schema version");
  if (!version.step()) throw DbError(path + ": read schema version: PRAGMA user_version returned no row");
  return static_cast<int>(version.column_int(0));
}

void check_not_newer(int version, const std::string& path) {
  if (version > current_schema_version()) {
    throw DbError(path + ": schema version " + std::to_string(version) +
                  " is newer than this binary's version " + std::to_string(current_schema_version()) +
                  "; use a newer harness");
  }
}

namespace {

// A db at version 0 that already holds tables was written by another program; migrating it
// would mix our tables into it.
void check_empty_if_unversioned(sqlite3* db, const std::string& path) {
  Statement tables(db, path, "SELECT count(*) FROM sqlite_master", "inspect schema");
  tables.step();
  if (tables.column_int(0) != 0) {
    throw DbError(path + ": not a harness db (schema version 0, but it already holds " +
                  std::to_string(tables.column_int(0)) + " schema objects)");
  }
}

}  // namespace

void migrate(sqlite3* db, const std::string& path, int target_version) {
  if (target_version < 1 || target_version > current_schema_version()) {
    throw DbError(path + ": migrate: no schema version " + std::to_string(target_version) +
                  " (this binary knows 1.." + std::to_string(current_schema_version()) + ")");
  }
  // Fast path without the write lock: a read-only command must not queue behind writers.
  const int version_seen = read_schema_version(db, path);
  check_not_newer(version_seen, path);
  if (version_seen >= target_version) return;
  for (;;) {
    Transaction transaction(db, path, Transaction::Mode::kWrite, "migrate schema");
    const int version = read_schema_version(db, path);
    check_not_newer(version, path);
    if (version >= target_version) return;  // the rollback of an unchanged transaction is a no-op
    if (version == 0) check_empty_if_unversioned(db, path);
    const Migration& step = kMigrations[static_cast<size_t>(version)];
    const std::string operation = "migrate to version " + std::to_string(step.version) + " (" +
                                  step.description + ")";
    exec_sql(db, path, step.sql, operation);
    // PRAGMA takes no bound parameters; the number comes from the table above, not from input.
    exec_sql(db, path, ("PRAGMA user_version = " + std::to_string(step.version)).c_str(), operation);
    transaction.commit();
  }
}

}  // namespace detail
}  // namespace harness::db
