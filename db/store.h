#pragma once
// The harness's SQLite store: envs, experiments, runs, trials, metrics, artifacts.
// Torch-free. WAL mode and a busy timeout so several harness processes can write one db.
// The schema carries a version (PRAGMA user_version) and is migrated forward on open.

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

struct sqlite3;

namespace harness::db {

//! A failure of the store itself (cannot open, corrupt, disk full, schema newer than this binary).
class DbError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  DbError(const std::string& message, int sqlite_code) : std::runtime_error(message), sqlite_code_(sqlite_code) {}
  //! SQLite's extended result code, 0 when the failure is not SQLite's.
  int sqlite_code() const { return sqlite_code_; }

 private:
  int sqlite_code_ = 0;
};

//! A read command was pointed at a db that does not exist (a mistyped --db): nothing is created.
class DbMissingError : public DbError {
 public:
  using DbError::DbError;
};

//! How a Store opens its file.
enum class Access {
  write,  //!< created when missing, migrated; refused when damaged (quick_check) so nothing is appended to it
  read,   //!< must exist; opened read-only (without migrating) when the file or its folder cannot be written
};

//! The schema version this binary writes.
int current_schema_version();

//! One measured value.
struct Metric {
  std::string variant;                          //!< "fused", "dense", or "" for run-level values
  nlohmann::json point = nlohmann::json::object();  //!< sweep point ({} without a sweep)
  std::string name;                             //!< "bwd_peak_bytes", "fwd_ms", ...
  double value = 0.0;
  std::string unit;                             //!< "bytes", "ms", "", ...
  int repeat = -1;                              //!< repeat index, or -1 for a summary value
};

//! One isolated trial (one child process) and how it ended.
struct Trial {
  int64_t id = 0;
  int64_t run_id = 0;
  std::string variant;
  nlohmann::json point = nlohmann::json::object();
  std::string status;        //!< ok, oom, unsupported, error, crashed, timeout, interrupted
  std::optional<int> exit_code;
  std::optional<int> signal;
  std::string error;         //!< error message (exception text, OOM message, reason)
  std::string stderr_tail;   //!< last lines the child wrote to stderr
  std::optional<int64_t> requested_bytes;  //!< OOM: bytes the failing allocation asked for
  nlohmann::json dispatch = nlohmann::json::array();  //!< dispatch records
  nlohmann::json details = nlohmann::json::object();  //!< kind-specific evidence (failure counts, script output)
  double duration_s = 0.0;
  std::string started_at;    //!< ISO 8601 UTC
};

//! A stored artifact (capsule, log): content-addressed file beside the db.
struct Artifact {
  int64_t id = 0;
  int64_t run_id = 0;
  std::optional<int64_t> trial_id;
  std::string kind;    //!< "capsule", "log", ...
  std::string sha256;
  std::string path;    //!< relative to the db's folder
  int64_t bytes = 0;
};

//! A run of one experiment.
struct Run {
  int64_t id = 0;
  std::string experiment;   //!< experiment name
  int64_t experiment_id = 0;
  std::string spec_hash;
  std::string env_id;
  std::string device;       //!< "cpu", "cuda:2"
  std::string profile;      //!< "" or "cpu"
  std::string status;       //!< running, ok, failed, interrupted, abandoned
  std::string verdict;      //!< FUSED, DENSE, INVALID, ... ("" while running)
  nlohmann::json evidence = nlohmann::json::object();  //!< why the verdict (rule, values)
  nlohmann::json args = nlohmann::json::object();      //!< command line, --set overrides
  std::string error;
  std::string started_at;
  std::string finished_at;
  std::optional<int64_t> replay_of;  //!< run this one replays
  std::string owner_host;   //!< the harness process running it: host, pid and process start
  int64_t owner_pid = 0;    //!< (filled by begin_run; an owner that is gone leaves the run "abandoned")
  std::string owner_start;
};

//! Everything about one run, for `show`, diff and writeup.
struct RunDetail {
  Run run;
  nlohmann::json env = nlohmann::json::object();
  nlohmann::json spec = nlohmann::json::object();
  std::vector<Trial> trials;
  std::vector<Metric> metrics;
  std::vector<Artifact> artifacts;
};

//! Filter for list_runs.
struct RunFilter {
  std::optional<std::string> experiment;
  bool failed_only = false;  //!< status not ok
  int limit = 50;
};

//! An experiment as stored (one row per distinct spec).
struct ExperimentRow {
  int64_t id = 0;
  std::string name;
  std::string spec_hash;
  std::string created_at;
};

//! Connection to one db file. Not shared between threads; open one per thread/process.
class Store {
 public:
  //! Opens the db at `path` as `access` says (write: creating it if needed; read: DbMissingError
  //! when it does not exist) and migrates it. Throws DbError.
  explicit Store(const std::string& path, Access access = Access::write);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  int schema_version() const;
  //! How long a write waits for another writer's lock before failing (default 10 s).
  void set_busy_timeout(int milliseconds);
  const std::string& path() const { return path_; }
  //! Opened read-only (Access::read on a file or folder that cannot be written).
  bool read_only() const { return read_only_; }

  //! Stores an env fingerprint; id = sha256 of its canonical JSON. Returns the id.
  std::string put_env(const nlohmann::json& env);
  //! Stores an experiment spec (deduplicated by name + sha256 of canonical JSON). Returns its id.
  int64_t put_experiment(const std::string& name, const nlohmann::json& spec);
  //! Starts a run (status "running"). Fills run.id and returns it.
  int64_t begin_run(Run& run);
  //! Records a finished trial with its metrics, in one transaction. Fills trial.id.
  int64_t add_trial(Trial& trial, const std::vector<Metric>& metrics);
  //! Run-level metrics (variant may be "").
  void add_metrics(int64_t run_id, const std::vector<Metric>& metrics);
  //! Fills artifact.id and returns it.
  int64_t add_artifact(Artifact& artifact);
  //! Ends a run with its status, verdict and evidence.
  void finish_run(int64_t run_id, const std::string& status, const std::string& verdict,
                  const nlohmann::json& evidence, const std::string& error = "");

  std::vector<Run> list_runs(const RunFilter& filter = {}) const;
  std::optional<RunDetail> get_run(int64_t run_id) const;
  std::optional<nlohmann::json> get_env(const std::string& env_id) const;
  std::vector<ExperimentRow> list_experiments() const;
  //! Ids of every stored env, oldest first (for resolving an id prefix).
  std::vector<std::string> list_env_ids() const;
  //! The newest finished run of `experiment` (under `env_id` when given) that is not a replay.
  std::optional<Run> latest_run(const std::string& experiment, const std::optional<std::string>& env_id) const;
  //! Runs that replay `run_id` (replay_of = run_id), oldest first.
  std::vector<Run> list_replays(int64_t run_id) const;

  //! Runs still "running" whose owner process is gone (same host; pid absent or started at
  //! another time): marked "abandoned" with the reason, or, read-only, shown so by list_runs and
  //! get_run without writing. Runs owned by another host are left alone. Returns their ids.
  std::vector<int64_t> settle_abandoned_runs();
  //! Runs "running" on another host (their owner cannot be checked from here).
  std::vector<Run> runs_elsewhere() const;
  //! SQLite's integrity_check (quick_check when `quick`): empty when the db is sound, else the
  //! problems it lists (at most 100).
  std::vector<std::string> integrity_problems(bool quick = false) const;
  //! Every artifact row, oldest first.
  std::vector<Artifact> list_artifacts() const;
  //! Deletes the artifact rows of `kinds` that belong to runs started before `started_before`
  //! (ISO 8601) and are not still running; returns the rows removed (their files are the
  //! caller's to delete, once no remaining row names them).
  std::vector<Artifact> prune_artifacts(const std::string& started_before, const std::vector<std::string>& kinds);
  //! Rewrites the file without free pages (SQLite VACUUM) and truncates the WAL.
  void vacuum();
  //! Test hook (HARNESS_FAULT_DB_MAX_PAGES, honoured with HARNESS_ALLOW_FAULTS=1 by the CLI): the
  //! db may not grow past `pages` pages, so writes fail as on a full disk (SQLITE_FULL).
  void limit_pages(int64_t pages);

 private:
  void apply_abandoned(Run& run) const;

  std::string path_;
  sqlite3* db_ = nullptr;
  bool read_only_ = false;
  std::vector<int64_t> abandoned_;  //!< settled while read-only: reported as abandoned
};

//! Test hook: creates (or migrates) the db at `path` to schema `version` (1..current) and no
//! further, so tests can write rows in an old layout and check that Store migrates them.
void create_schema_at_version(const std::string& path, int version);

//! sha256 of bytes, lowercase hex.
std::string sha256_hex(const std::string& bytes);
//! Canonical JSON text (sorted keys, no spaces) used for hashing.
std::string canonical_json(const nlohmann::json& value);
//! Current time as ISO 8601 UTC with milliseconds ("2026-11-29T10:00:00.123Z").
std::string now_iso8601();

}  // namespace harness::db
