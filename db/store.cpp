#include "db/store.h"

#include <sqlite3.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <ctime>
#include <map>
#include <memory>
#include <thread>

#include "core/process_identity.h"
#include "db/migrations.h"
#include "db/statement.h"

namespace harness::db {

using detail::Statement;
using detail::Transaction;

namespace {

// Several harness processes write one db; a writer holds the lock for one trial's rows
// (milliseconds), so 10 s only runs out when something is badly stuck.
constexpr int kBusyTimeoutMs = 10'000;

struct ConnectionCloser {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
using Connection = std::unique_ptr<sqlite3, ConnectionCloser>;

// WAL: readers never block the writer and vice versa, so `harness runs` works during a run.
// Switching a new file to WAL takes an exclusive lock, and SQLite skips the busy handler when
// waiting could deadlock (two new connections both holding a shared lock), so this waits itself:
// with 8 threads opening one new file, 3 in 200 trials failed at once without this loop.
void enable_wal(sqlite3* db, const std::string& path) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kBusyTimeoutMs);
  for (;;) {
    const int rc = sqlite3_exec(db, "PRAGMA journal_mode = WAL", nullptr, nullptr, nullptr);
    if (rc == SQLITE_OK) return;
    if ((rc & 0xff) != SQLITE_BUSY || std::chrono::steady_clock::now() > deadline) {
      detail::throw_sqlite_error(db, path, "switch to WAL");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Opens `path` with the settings every connection needs, and checks what the file is before
// anything writes to it. `create`: make the file when it is missing; `journal`: WAL, or a
// rollback journal for a Slurm shard on shared storage.
Connection open_connection(const std::string& path, bool create = true, Journal journal = Journal::kWal) {
  sqlite3* raw = nullptr;
  const int rc =
      sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0), nullptr);
  Connection db(raw);
  if (rc != SQLITE_OK) detail::throw_sqlite_error(raw, path, "open");
  sqlite3_extended_result_codes(raw, 1);
  sqlite3_busy_timeout(raw, kBusyTimeoutMs);
  // Reading the header is what reveals a file that is not a SQLite db ("file is not a
  // database"); a db newer than this binary is left untouched, not even switched to WAL.
  detail::check_not_newer(detail::read_schema_version(raw, path), path);
  detail::exec_sql(raw, path, "PRAGMA foreign_keys = ON", "open");
  if (journal == Journal::kWal) {
    enable_wal(raw, path);
  } else {
    detail::exec_sql(raw, path, "PRAGMA journal_mode = DELETE", "switch to a rollback journal");
  }
  return db;
}

// A file: URI for `path` (%, ? and # would otherwise end or escape the path).
std::string file_uri(const std::string& path, const std::string& query) {
  std::string uri = "file:";
  for (char c : path) {
    if (c == '%') uri += "%25";
    else if (c == '?') uri += "%3f";
    else if (c == '#') uri += "%23";
    else uri += c;
  }
  return uri + "?" + query;
}

// Opens a db read-only, writing nothing into it or beside it (reading commands). mode=ro: SQLite's
// read-only connection, which shares a WAL db's index (-shm) with its writers, creating the -wal
// and -shm files when they are missing and the folder allows it; where it does not (a read-only
// folder or file system), immutable=1 reads the file as it is, which is what such a folder holds:
// no writer can be changing it. Only a db of this binary's schema is read: an older one is not
// migrated here (a reader does not write), an empty or foreign one is refused.
Connection open_read_only(const std::string& path) {
  std::string last_error;
  for (const char* query : {"mode=ro", "immutable=1"}) {
    sqlite3* raw = nullptr;
    const int rc = sqlite3_open_v2(file_uri(path, query).c_str(), &raw, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nullptr);
    Connection db(raw);
    if (rc != SQLITE_OK) {
      last_error = raw ? sqlite3_errmsg(raw) : "out of memory";
      continue;
    }
    sqlite3_extended_result_codes(raw, 1);
    sqlite3_busy_timeout(raw, kBusyTimeoutMs);
    int version = 0;
    try {
      version = detail::read_schema_version(raw, path);
    } catch (const DbError& error) {
      last_error = error.what();
      continue;
    }
    detail::check_not_newer(version, path);
    if (version == 0) {
      Statement tables(raw, path, "SELECT count(*) FROM sqlite_master", "inspect schema");
      tables.step();
      if (tables.column_int(0) == 0)
        throw DbMissingError(path + ": an empty SQLite file, not a harness database (`harness run` makes one there)");
      throw DbError(path + ": a SQLite database of another program (tables but no harness schema version)");
    }
    if (version < current_schema_version())
      throw DbError(path + ": schema version " + std::to_string(version) + " is older than this binary's " +
                    std::to_string(current_schema_version()) +
                    "; reading commands do not write: `harness db migrate` upgrades it (where it can be written)");
    return db;
  }
  throw DbError(path + ": cannot open read-only: " + last_error);
}

// Whether `path` (an existing file) and its folder can be written: a writer needs both (the
// WAL and its index live beside the db). access() also reports a read-only file system for root.
bool writable(const std::string& path) {
  std::error_code error;
  const std::string folder = std::filesystem::absolute(path, error).parent_path().string();
  return ::access(path.c_str(), W_OK) == 0 && ::access(folder.c_str(), W_OK) == 0;
}

// The first `limit` rows of an integrity pragma; {"ok"} when sound.
std::vector<std::string> pragma_rows(sqlite3* db, const std::string& path, const char* sql) {
  detail::Statement check(db, path, sql, "check integrity");
  std::vector<std::string> rows;
  while (check.step()) rows.push_back(check.column_text(0));
  return rows;
}

std::optional<int64_t> widen(const std::optional<int>& value) {
  if (!value) return std::nullopt;
  return *value;
}

std::optional<int> narrow(const std::optional<int64_t>& value) {
  if (!value) return std::nullopt;
  return static_cast<int>(*value);
}

// Column list shared by list_runs and get_run; read_run below follows its order.
constexpr const char* kRunColumns =
    "r.id, e.name, r.experiment_id, e.spec_hash, r.env_id, r.device, r.profile, r.status, r.verdict, "
    "r.evidence, r.args, r.error, r.started_at, r.finished_at, r.replay_of, r.owner_host, r.owner_pid, r.owner_start";
constexpr int kRunColumnCount = 18;

Run read_run(const Statement& row) {
  Run run;
  run.id = row.column_int(0);
  const std::string what = "read run " + std::to_string(run.id);
  run.experiment = row.column_text(1);
  run.experiment_id = row.column_int(2);
  run.spec_hash = row.column_text(3);
  run.env_id = row.column_text(4);
  run.device = row.column_text(5);
  run.profile = row.column_text(6);
  run.status = row.column_text(7);
  run.verdict = row.column_text(8);
  run.evidence = row.column_json(9, what + " evidence");
  run.args = row.column_json(10, what + " args");
  run.error = row.column_text(11);
  run.started_at = row.column_text(12);
  run.finished_at = row.column_text(13);
  run.replay_of = row.column_optional_int(14);
  run.owner_host = row.column_text(15);
  run.owner_pid = row.column_int(16);
  run.owner_start = row.column_text(17);
  return run;
}

void insert_metrics(sqlite3* db, const std::string& path, int64_t run_id, std::optional<int64_t> trial_id,
                    const std::vector<Metric>& metrics) {
  Statement insert(db, path,
                   "INSERT INTO metrics (run_id, trial_id, variant, point, name, value, unit, repeat) "
                   "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                   "insert metric of run " + std::to_string(run_id));
  for (const Metric& metric : metrics) {
    insert.bind_int(1, run_id)
        .bind_optional_int(2, trial_id)
        .bind_text(3, metric.variant)
        .bind_text(4, canonical_json(metric.point))
        .bind_text(5, metric.name)
        .bind_real(6, metric.value)
        .bind_text(7, metric.unit)
        .bind_int(8, metric.repeat);
    insert.run();
    insert.reset();
  }
}

}  // namespace

std::string canonical_json(const nlohmann::json& value) {
  // nlohmann::json keeps objects in a std::map, so dump() writes keys sorted; indent -1 means no
  // whitespace. Invalid UTF-8 is replaced (U+FFFD) rather than thrown: a hash must always exist.
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string now_iso8601() {
  const auto since_epoch = std::chrono::system_clock::now().time_since_epoch();
  const auto milliseconds = std::chrono::duration_cast<std::chrono::milliseconds>(since_epoch).count();
  const std::time_t seconds = static_cast<std::time_t>(milliseconds / 1000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char date_time[32];
  std::strftime(date_time, sizeof date_time, "%Y-%m-%dT%H:%M:%S", &utc);
  char text[48];
  std::snprintf(text, sizeof text, "%s.%03dZ", date_time, static_cast<int>(milliseconds % 1000));
  return text;
}

void create_schema_at_version(const std::string& path, int version) {
  Connection db = open_connection(path);
  detail::migrate(db.get(), path, version);
}

Store::Store(const std::string& path, Access access, Journal journal) : path_(path) {
  struct stat info {};
  const bool exists = ::stat(path_.c_str(), &info) == 0;
  if (access != Access::write && !exists)
    throw DbMissingError(path_ + ": no database there (check --db; `harness run` creates one)");
  if (exists && S_ISDIR(info.st_mode))
    throw DbError(path_ + ": is a folder, not a database file (--db names the file, e.g. " + path_ + "/harness.db)");
  // SQLite would put its journal beside a device (/dev/null-journal) and read a FIFO forever.
  if (exists && !S_ISREG(info.st_mode))
    throw DbMissingError(path_ + ": not a regular file (a device, FIFO or socket); --db names a database file");
  if (access == Access::read) {
    if (info.st_size == 0)
      throw DbMissingError(path_ + ": an empty file, not a harness database (`harness run` makes one there)");
    db_ = open_read_only(path_).release();
    read_only_ = true;
    return;
  }
  if (exists && !writable(path_))
    throw DbError(path_ + ": read-only here (the file or its folder cannot be written); reading commands work, "
                          "but this one writes: copy the db somewhere writable or use another --db",
                  SQLITE_READONLY);
  Connection db = open_connection(path_, access == Access::write, journal);
  if (exists) {
    // A damaged db must not grow: what is appended to a malformed file may be lost with it.
    std::vector<std::string> rows;
    try {
      rows = pragma_rows(db.get(), path_, "PRAGMA quick_check(5)");
    } catch (const DbError& error) {
      rows = {error.what()};  // damage bad enough that the check itself fails
    }
    if (rows.size() != 1 || rows.front() != "ok")
      throw DbError(path_ + ": the database is damaged (quick_check: " + (rows.empty() ? "no answer" : rows.front()) +
                        "); nothing was written to it. `harness db check` lists the problems; restore a copy or "
                        "use another --db",
                    SQLITE_CORRUPT);
  }
  detail::migrate(db.get(), path_, current_schema_version());
  db_ = db.release();
}

Store::~Store() { sqlite3_close_v2(db_); }

int Store::schema_version() const { return detail::read_schema_version(db_, path_); }

void Store::set_busy_timeout(int milliseconds) { sqlite3_busy_timeout(db_, milliseconds); }

std::string Store::put_env(const nlohmann::json& env) {
  const std::string text = canonical_json(env);
  const std::string id = sha256_hex(text);
  Transaction transaction(db_, path_, Transaction::Mode::kWrite, "put env");
  Statement insert(db_, path_,
                   "INSERT INTO envs (id, json, created_at) VALUES (?1, ?2, ?3) ON CONFLICT (id) DO NOTHING",
                   "insert env " + id);
  insert.bind_text(1, id).bind_text(2, text).bind_text(3, now_iso8601());
  insert.run();
  transaction.commit();
  return id;
}

int64_t Store::put_experiment(const std::string& name, const nlohmann::json& spec) {
  const std::string text = canonical_json(spec);
  const std::string spec_hash = sha256_hex(text);
  Transaction transaction(db_, path_, Transaction::Mode::kWrite, "put experiment " + name);
  Statement insert(db_, path_,
                   "INSERT INTO experiments (name, spec, spec_hash, created_at) VALUES (?1, ?2, ?3, ?4) "
                   "ON CONFLICT (name, spec_hash) DO NOTHING",
                   "insert experiment " + name);
  insert.bind_text(1, name).bind_text(2, text).bind_text(3, spec_hash).bind_text(4, now_iso8601());
  insert.run();
  Statement find(db_, path_, "SELECT id FROM experiments WHERE name = ?1 AND spec_hash = ?2",
                 "find experiment " + name);
  find.bind_text(1, name).bind_text(2, spec_hash);
  if (!find.step()) throw DbError(path_ + ": put experiment " + name + ": row missing right after insert");
  const int64_t id = find.column_int(0);
  transaction.commit();
  return id;
}

int64_t Store::begin_run(Run& run) {
  Transaction transaction(db_, path_, Transaction::Mode::kWrite, "begin run");
  Statement experiment(db_, path_, "SELECT name, spec_hash FROM experiments WHERE id = ?1", "begin run");
  experiment.bind_int(1, run.experiment_id);
  if (!experiment.step()) {
    throw DbError(path_ + ": begin run: no experiment with id " + std::to_string(run.experiment_id) +
                  " (store it with put_experiment first)");
  }
  run.experiment = experiment.column_text(0);
  run.spec_hash = experiment.column_text(1);
  run.status = "running";
  if (run.started_at.empty()) run.started_at = now_iso8601();
  const ProcessIdentity owner = current_process();
  run.owner_host = owner.host;
  run.owner_pid = owner.pid;
  run.owner_start = owner.start;

  Statement insert(db_, path_,
                   "INSERT INTO runs (experiment_id, env_id, device, profile, status, verdict, evidence, args, "
                   "error, started_at, finished_at, replay_of, owner_host, owner_pid, owner_start) "
                   "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
                   "insert run");
  insert.bind_int(1, run.experiment_id);
  if (run.env_id.empty()) {
    insert.bind_null(2);
  } else {
    insert.bind_text(2, run.env_id);
  }
  insert.bind_text(3, run.device)
      .bind_text(4, run.profile)
      .bind_text(5, run.status)
      .bind_text(6, run.verdict)
      .bind_text(7, canonical_json(run.evidence))
      .bind_text(8, canonical_json(run.args))
      .bind_text(9, run.error)
      .bind_text(10, run.started_at)
      .bind_text(11, run.finished_at)
      .bind_optional_int(12, run.replay_of)
      .bind_text(13, run.owner_host)
      .bind_int(14, run.owner_pid)
      .bind_text(15, run.owner_start);
  insert.run();
  run.id = sqlite3_last_insert_rowid(db_);
  transaction.commit();
  return run.id;
}

int64_t Store::add_trial(Trial& trial, const std::vector<Metric>& metrics) {
  if (trial.started_at.empty()) trial.started_at = now_iso8601();
  const std::string of_run = " of run " + std::to_string(trial.run_id);
  Transaction transaction(db_, path_, Transaction::Mode::kWrite, "add trial" + of_run);
  Statement insert(db_, path_,
                   "INSERT INTO trials (run_id, variant, point, status, exit_code, signal, error, stderr_tail, "
                   "requested_bytes, dispatch, duration_s, started_at, details) "
                   "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
                   "insert trial" + of_run);
  insert.bind_int(1, trial.run_id)
      .bind_text(2, trial.variant)
      .bind_text(3, canonical_json(trial.point))
      .bind_text(4, trial.status)
      .bind_optional_int(5, widen(trial.exit_code))
      .bind_optional_int(6, widen(trial.signal))
      .bind_text(7, trial.error)
      .bind_text(8, trial.stderr_tail)
      .bind_optional_int(9, trial.requested_bytes)
      .bind_text(10, canonical_json(trial.dispatch))
      .bind_real(11, trial.duration_s)
      .bind_text(12, trial.started_at)
      .bind_text(13, canonical_json(trial.details));
  insert.run();
  const int64_t trial_id = sqlite3_last_insert_rowid(db_);
  insert_metrics(db_, path_, trial.run_id, trial_id, metrics);
  transaction.commit();
  trial.id = trial_id;
  return trial_id;
}

void Store::add_metrics(int64_t run_id, const std::vector<Metric>& metrics) {
  Transaction transaction(db_, path_, Transaction::Mode::kWrite, "add metrics of run " + std::to_string(run_id));
  insert_metrics(db_, path_, run_id, std::nullopt, metrics);
  transaction.commit();
}

int64_t Store::add_artifact(Artifact& artifact) {
  const std::string of_run = " of run " + std::to_string(artifact.run_id);
  Transaction transaction(db_, path_, Transaction::Mode::kWrite, "add artifact" + of_run);
  Statement insert(db_, path_,
                   "INSERT INTO artifacts (run_id, trial_id, kind, sha256, path, bytes) "
                   "VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                   "insert artifact" + of_run);
  insert.bind_int(1, artifact.run_id)
      .bind_optional_int(2, artifact.trial_id)
      .bind_text(3, artifact.kind)
      .bind_text(4, artifact.sha256)
      .bind_text(5, artifact.path)
      .bind_int(6, artifact.bytes);
  insert.run();
  const int64_t artifact_id = sqlite3_last_insert_rowid(db_);
  transaction.commit();
  artifact.id = artifact_id;
  return artifact_id;
}

void Store::finish_run(int64_t run_id, const std::string& status, const std::string& verdict,
                       const nlohmann::json& evidence, const std::string& error) {
  const std::string operation = "finish run " + std::to_string(run_id);
  Transaction transaction(db_, path_, Transaction::Mode::kWrite, operation);
  Statement update(db_, path_,
                   "UPDATE runs SET status = ?2, verdict = ?3, evidence = ?4, error = ?5, finished_at = ?6 "
                   "WHERE id = ?1",
                   operation);
  update.bind_int(1, run_id)
      .bind_text(2, status)
      .bind_text(3, verdict)
      .bind_text(4, canonical_json(evidence))
      .bind_text(5, error)
      .bind_text(6, now_iso8601());
  update.run();
  if (sqlite3_changes(db_) == 0) throw DbError(path_ + ": " + operation + ": no such run");
  transaction.commit();
}

void Store::set_run_args(int64_t run_id, const nlohmann::json& args) {
  const std::string operation = "set args of run " + std::to_string(run_id);
  Transaction transaction(db_, path_, Transaction::Mode::kWrite, operation);
  Statement update(db_, path_, "UPDATE runs SET args = ?2 WHERE id = ?1", operation);
  update.bind_int(1, run_id).bind_text(2, canonical_json(args));
  update.run();
  if (sqlite3_changes(db_) == 0) throw DbError(path_ + ": " + operation + ": no such run");
  transaction.commit();
}

std::vector<Run> Store::list_runs(const RunFilter& filter) const {
  // Newest first by id: ids grow with each begin_run, whichever process made it.
  const std::string sql = std::string("SELECT ") + kRunColumns +
                          " FROM runs r JOIN experiments e ON e.id = r.experiment_id"
                          " WHERE (?1 IS NULL OR e.name = ?1) AND (?2 = 0 OR r.status <> 'ok')"
                          " ORDER BY r.id DESC LIMIT ?3";
  Statement select(db_, path_, sql.c_str(), "list runs");
  if (filter.experiment) {
    select.bind_text(1, *filter.experiment);
  } else {
    select.bind_null(1);
  }
  // A negative LIMIT means no limit in SQLite; limit <= 0 asks for every run.
  select.bind_int(2, filter.failed_only ? 1 : 0).bind_int(3, filter.limit > 0 ? filter.limit : -1);
  std::vector<Run> runs;
  while (select.step()) {
    runs.push_back(read_run(select));
    apply_abandoned(runs.back());
  }
  return runs;
}

std::optional<RunDetail> Store::get_run(int64_t run_id) const {
  const std::string operation = "get run " + std::to_string(run_id);
  // One read transaction: a snapshot, so a trial committed meanwhile by another process cannot
  // show its metrics without its trial row.
  Transaction transaction(db_, path_, Transaction::Mode::kRead, operation);
  const std::string sql = std::string("SELECT ") + kRunColumns +
                          ", e.spec, v.json FROM runs r JOIN experiments e ON e.id = r.experiment_id"
                          " LEFT JOIN envs v ON v.id = r.env_id WHERE r.id = ?1";
  Statement select_run(db_, path_, sql.c_str(), operation);
  select_run.bind_int(1, run_id);
  if (!select_run.step()) return std::nullopt;
  RunDetail detail;
  detail.run = read_run(select_run);
  apply_abandoned(detail.run);
  detail.spec = select_run.column_json(kRunColumnCount, operation + " spec");
  if (!select_run.is_null(kRunColumnCount + 1)) {
    detail.env = select_run.column_json(kRunColumnCount + 1, operation + " env");
  }

  Statement trials(db_, path_,
                   "SELECT id, run_id, variant, point, status, exit_code, signal, error, stderr_tail, "
                   "requested_bytes, dispatch, duration_s, started_at, details FROM trials WHERE run_id = ?1 ORDER BY id",
                   operation + " trials");
  trials.bind_int(1, run_id);
  while (trials.step()) {
    Trial trial;
    trial.id = trials.column_int(0);
    const std::string what = operation + " trial " + std::to_string(trial.id);
    trial.run_id = trials.column_int(1);
    trial.variant = trials.column_text(2);
    trial.point = trials.column_json(3, what + " point");
    trial.status = trials.column_text(4);
    trial.exit_code = narrow(trials.column_optional_int(5));
    trial.signal = narrow(trials.column_optional_int(6));
    trial.error = trials.column_text(7);
    trial.stderr_tail = trials.column_text(8);
    trial.requested_bytes = trials.column_optional_int(9);
    trial.dispatch = trials.column_json(10, what + " dispatch");
    trial.duration_s = trials.column_real(11);
    trial.started_at = trials.column_text(12);
    trial.details = trials.column_json(13, what + " details");
    detail.trials.push_back(std::move(trial));
  }

  Statement metrics(db_, path_,
                    "SELECT variant, point, name, value, unit, repeat FROM metrics WHERE run_id = ?1 ORDER BY id",
                    operation + " metrics");
  metrics.bind_int(1, run_id);
  while (metrics.step()) {
    Metric metric;
    metric.variant = metrics.column_text(0);
    metric.point = metrics.column_json(1, operation + " metric point");
    metric.name = metrics.column_text(2);
    metric.value = metrics.column_real(3);
    metric.unit = metrics.column_text(4);
    metric.repeat = static_cast<int>(metrics.column_int(5));
    detail.metrics.push_back(std::move(metric));
  }

  Statement artifacts(db_, path_,
                      "SELECT id, run_id, trial_id, kind, sha256, path, bytes FROM artifacts WHERE run_id = ?1 "
                      "ORDER BY id",
                      operation + " artifacts");
  artifacts.bind_int(1, run_id);
  while (artifacts.step()) {
    Artifact artifact;
    artifact.id = artifacts.column_int(0);
    artifact.run_id = artifacts.column_int(1);
    artifact.trial_id = artifacts.column_optional_int(2);
    artifact.kind = artifacts.column_text(3);
    artifact.sha256 = artifacts.column_text(4);
    artifact.path = artifacts.column_text(5);
    artifact.bytes = artifacts.column_int(6);
    detail.artifacts.push_back(std::move(artifact));
  }
  transaction.commit();
  return detail;
}

std::optional<nlohmann::json> Store::get_env(const std::string& env_id) const {
  Statement select(db_, path_, "SELECT json FROM envs WHERE id = ?1", "get env " + env_id);
  select.bind_text(1, env_id);
  if (!select.step()) return std::nullopt;
  return select.column_json(0, "get env " + env_id);
}

std::vector<ExperimentRow> Store::list_experiments() const {
  Statement select(db_, path_, "SELECT id, name, spec_hash, created_at FROM experiments ORDER BY name, id",
                   "list experiments");
  std::vector<ExperimentRow> rows;
  while (select.step()) {
    ExperimentRow row;
    row.id = select.column_int(0);
    row.name = select.column_text(1);
    row.spec_hash = select.column_text(2);
    row.created_at = select.column_text(3);
    rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<std::string> Store::list_env_ids() const {
  Statement select(db_, path_, "SELECT id FROM envs ORDER BY created_at, id", "list envs");
  std::vector<std::string> ids;
  while (select.step()) ids.push_back(select.column_text(0));
  return ids;
}

std::optional<Run> Store::latest_run(const std::string& experiment, const std::optional<std::string>& env_id) const {
  // "Finished" excludes runs still running (or abandoned while running): their rows are partial.
  const std::string sql = std::string("SELECT ") + kRunColumns +
                          " FROM runs r JOIN experiments e ON e.id = r.experiment_id"
                          " WHERE e.name = ?1 AND (?2 IS NULL OR r.env_id = ?2) AND r.status NOT IN ('running', 'abandoned')"
                          " AND r.replay_of IS NULL ORDER BY r.id DESC LIMIT 1";
  Statement select(db_, path_, sql.c_str(), "latest run of " + experiment);
  select.bind_text(1, experiment);
  if (env_id) {
    select.bind_text(2, *env_id);
  } else {
    select.bind_null(2);
  }
  if (!select.step()) return std::nullopt;
  return read_run(select);
}

std::vector<Run> Store::list_replays(int64_t run_id) const {
  const std::string sql = std::string("SELECT ") + kRunColumns +
                          " FROM runs r JOIN experiments e ON e.id = r.experiment_id WHERE r.replay_of = ?1"
                          " ORDER BY r.id";
  Statement select(db_, path_, sql.c_str(), "list replays of run " + std::to_string(run_id));
  select.bind_int(1, run_id);
  std::vector<Run> runs;
  while (select.step()) runs.push_back(read_run(select));
  return runs;
}

namespace {

std::string abandoned_reason(const Run& run) {
  return "abandoned: the harness process that ran it (pid " + std::to_string(run.owner_pid) + " on " + run.owner_host +
         ") ended without finishing it (killed, or the machine went down); trials it stored are kept";
}

}  // namespace

void Store::apply_abandoned(Run& run) const {
  if (run.status == "running" && std::find(abandoned_.begin(), abandoned_.end(), run.id) != abandoned_.end()) {
    run.status = "abandoned";
    run.error = abandoned_reason(run);
  }
}

std::vector<int64_t> Store::settle_abandoned_runs() {
  std::vector<Run> gone;
  {
    const std::string sql = std::string("SELECT ") + kRunColumns +
                            " FROM runs r JOIN experiments e ON e.id = r.experiment_id WHERE r.status = 'running'";
    Statement select(db_, path_, sql.c_str(), "find abandoned runs");
    while (select.step()) {
      Run run = read_run(select);
      // Runs of an older schema have no owner; they cannot be judged and are left as they are.
      const auto alive = process_alive({run.owner_host, static_cast<long>(run.owner_pid), run.owner_start});
      if (alive && !*alive) gone.push_back(std::move(run));
    }
  }
  std::vector<int64_t> ids;
  for (const Run& run : gone) ids.push_back(run.id);
  if (read_only_) {
    abandoned_ = ids;
    return ids;
  }
  try {
    for (const Run& run : gone) {
      Transaction transaction(db_, path_, Transaction::Mode::kWrite, "mark run " + std::to_string(run.id) + " abandoned");
      // Only while still running: its owner cannot come back, but another check may have been first.
      Statement update(db_, path_,
                       "UPDATE runs SET status = 'abandoned', error = ?2, finished_at = ?3 WHERE id = ?1 AND "
                       "status = 'running'",
                       "mark run " + std::to_string(run.id) + " abandoned");
      update.bind_int(1, run.id).bind_text(2, abandoned_reason(run)).bind_text(3, now_iso8601());
      update.run();
      transaction.commit();
    }
  } catch (const DbError&) {
    // The db cannot take the write now (a full disk, a lock held too long): show the runs as
    // abandoned without writing, as for a read-only db; a later writer records it.
    abandoned_ = ids;
  }
  return ids;
}

std::vector<Run> Store::runs_elsewhere() const {
  const std::string sql = std::string("SELECT ") + kRunColumns +
                          " FROM runs r JOIN experiments e ON e.id = r.experiment_id WHERE r.status = 'running'";
  Statement select(db_, path_, sql.c_str(), "list running runs");
  std::vector<Run> runs;
  while (select.step()) {
    Run run = read_run(select);
    if (!process_alive({run.owner_host, static_cast<long>(run.owner_pid), run.owner_start}).has_value() &&
        !run.owner_host.empty())
      runs.push_back(std::move(run));
  }
  return runs;
}

namespace {

// A b-tree of the schema: a table or an index, and its root page.
struct Tree {
  std::string type, name;
  int64_t root_page = 0;
};

// The tables and indexes of the schema, as far as sqlite_master can still be read.
std::vector<Tree> schema_trees(sqlite3* db, const std::string& path) {
  std::vector<Tree> trees;
  try {
    Statement select(db, path, "SELECT type, name, rootpage FROM sqlite_master WHERE type IN ('table', 'index') AND rootpage > 0",
                     "read the schema");
    while (select.step()) trees.push_back({select.column_text(0), select.column_text(1), select.column_int(2)});
  } catch (const DbError&) {
  }
  return trees;
}

// Which table or index each page belongs to: every root page, and what the dbstat virtual table
// can still walk of each tree (a damaged tree may stop it half way; what it read counts).
std::map<int64_t, std::string> page_owners(sqlite3* db, const std::string& path, const std::vector<Tree>& trees) {
  std::map<int64_t, std::string> owners;
  for (const Tree& tree : trees) {
    const std::string owner = tree.type + " " + tree.name;
    owners[tree.root_page] = owner;
    try {
      Statement pages(db, path, "SELECT pageno FROM dbstat WHERE name = ?1", "map pages");
      pages.bind_text(1, tree.name);
      while (pages.step()) owners[pages.column_int(0)] = owner;
    } catch (const DbError&) {
    }
  }
  return owners;
}

std::string quoted_identifier(const std::string& name) {
  std::string quoted = "\"";
  for (char c : name) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

}  // namespace

std::vector<std::string> Store::integrity_problems(bool quick) const {
  constexpr size_t kMaxFindings = 100;
  const char* check = quick ? "quick_check" : "integrity_check";
  std::vector<std::string> findings;
  std::string stopped;
  try {
    // SQLite may put several findings in one row, a line each, under "*** in database main ***".
    for (const std::string& row : pragma_rows(db_, path_, quick ? "PRAGMA quick_check(100)" : "PRAGMA integrity_check(100)")) {
      size_t start = 0;
      while (start <= row.size()) {
        const size_t end = std::min(row.find('\n', start), row.size());
        const std::string line = row.substr(start, end - start);
        if (!line.empty() && line != "ok" && line.rfind("*** in database", 0) != 0) findings.push_back(line);
        start = end + 1;
      }
    }
  } catch (const DbError& error) {
    stopped = error.what();  // damage bad enough that the check itself stops (a damaged root page)
  }
  if (findings.empty() && stopped.empty()) return {};
  const std::vector<Tree> trees = schema_trees(db_, path_);
  if (!stopped.empty()) {
    // Check each table on its own (with its indexes): the damaged ones say where the damage is.
    findings.push_back(std::string(check) + " stopped: " + stopped);
    for (const Tree& tree : trees) {
      if (tree.type != "table") continue;
      const std::string where = "table " + tree.name + " (root page " + std::to_string(tree.root_page) + ")";
      try {
        const std::string sql = std::string("PRAGMA ") + check + "(" + quoted_identifier(tree.name) + ")";
        for (const std::string& row : pragma_rows(db_, path_, sql.c_str()))
          if (row != "ok") findings.push_back(where + ": " + row);
      } catch (const DbError& error) {
        findings.push_back(where + ": cannot be read: " + error.what());
      }
    }
  }
  // Name the table or index of every page a finding mentions ("On tree page 21 cell 3: ...").
  const std::map<int64_t, std::string> owners = page_owners(db_, path_, trees);
  for (std::string& finding : findings) {
    const size_t at = finding.find("page ");
    if (at == std::string::npos || finding.find(" (root page") != std::string::npos) continue;
    const int64_t page = std::atoll(finding.c_str() + at + 5);
    if (const auto owner = owners.find(page); owner != owners.end()) finding += " [" + owner->second + "]";
  }
  if (findings.size() > kMaxFindings) findings.resize(kMaxFindings);
  return findings;
}

std::vector<Artifact> Store::list_artifacts() const {
  Statement select(db_, path_, "SELECT id, run_id, trial_id, kind, sha256, path, bytes FROM artifacts ORDER BY id",
                   "list artifacts");
  std::vector<Artifact> artifacts;
  while (select.step()) {
    Artifact artifact;
    artifact.id = select.column_int(0);
    artifact.run_id = select.column_int(1);
    artifact.trial_id = select.column_optional_int(2);
    artifact.kind = select.column_text(3);
    artifact.sha256 = select.column_text(4);
    artifact.path = select.column_text(5);
    artifact.bytes = select.column_int(6);
    artifacts.push_back(std::move(artifact));
  }
  return artifacts;
}

std::vector<Artifact> Store::prune_artifacts(const std::string& started_before, const std::vector<std::string>& kinds) {
  Transaction transaction(db_, path_, Transaction::Mode::kWrite, "prune artifacts");
  std::vector<Artifact> removed;
  for (const Artifact& artifact : list_artifacts()) {
    if (std::find(kinds.begin(), kinds.end(), artifact.kind) == kinds.end()) continue;
    Statement run(db_, path_, "SELECT started_at, status FROM runs WHERE id = ?1", "prune artifacts");
    run.bind_int(1, artifact.run_id);
    if (!run.step() || run.column_text(0) >= started_before || run.column_text(1) == "running") continue;
    Statement remove(db_, path_, "DELETE FROM artifacts WHERE id = ?1", "prune artifact " + std::to_string(artifact.id));
    remove.bind_int(1, artifact.id);
    remove.run();
    removed.push_back(artifact);
  }
  transaction.commit();
  return removed;
}

void Store::vacuum() {
  detail::exec_sql(db_, path_, "VACUUM", "vacuum");
  detail::exec_sql(db_, path_, "PRAGMA wal_checkpoint(TRUNCATE)", "vacuum");
}

void Store::limit_pages(int64_t pages) {
  detail::exec_sql(db_, path_, ("PRAGMA max_page_count = " + std::to_string(pages)).c_str(), "limit pages");
}

}  // namespace harness::db
