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

//! --db names no harness database to read: nothing there (a mistyped path), an empty file, or a
//! device, FIFO or socket. Nothing is created or written.
class DbMissingError : public DbError {
 public:
  using DbError::DbError;
};

//! How a Store opens its file.
enum class Access {
  write,   //!< created when missing, migrated; refused when damaged (quick_check) so nothing is appended to it
  update,  //!< as write, but the db must exist (maintenance: db vacuum, prune, migrate)
  read,    //!< must exist and be a harness db of this schema version; always opened read-only: no
           //!< schema is written, nothing is migrated or marked, no journal is created (a WAL db's
           //!< readers share SQLite's -wal and -shm files beside it, created when missing and the
           //!< folder is writable; where it is not, the file is read as it is)
};

//! A shard that merge_shard or read_shard_runs refuses (not a valid shard, another schema version,
//! another run or db, unfinished): bad input rather than a failing store.
class ShardRefused : public DbError {
 public:
  using DbError::DbError;
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

//! How a connection journals writes: WAL (the default: readers never block the writer) or a
//! rollback journal (a Slurm task's shard on shared storage: WAL's shared-memory index only works
//! for processes of one host, and a shard is written on one node and merged on another).
enum class Journal { kWal, kRollback };

//! A run inside a shard and the run of the main db it belongs to (db/README.md, "Shards").
struct ShardRun {
  int64_t shard_run_id = 0;  //!< the run row inside the shard
  int64_t main_run_id = 0;   //!< the run in the main db
  std::string run_token;     //!< must equal the main run's args.slurm.token
  int task = 0;              //!< Slurm array task id
  int attempt = 0;           //!< 0 for the first run of the task, n after n requeues
  nlohmann::json slurm = nlohmann::json::object();  //!< job ids and node, as the task saw them
  std::string finished_at;   //!< "" until every trial of the attempt ran
};

//! What merge_shard checks and writes.
struct MergeOptions {
  std::optional<int64_t> run_id;  //!< refuse a shard of any other run
  std::string slurm_state;        //!< written into each merged trial's details.slurm.state ("" leaves it)
  bool allow_unfinished = false;  //!< merge an attempt that did not finish (its task ended in Slurm)
  bool check_only = false;        //!< every check, nothing written (to check many shards before merging any)
};

//! One shard run merged (or found merged before).
struct MergeResult {
  int64_t run_id = 0;      //!< run of the main db
  std::string shard_key;   //!< "task-T.attempt-A"
  bool already_merged = false;
  int64_t trials = 0, metrics = 0, artifacts = 0;
};

//! A merge recorded in the main db.
struct ShardMerge {
  int64_t run_id = 0;
  std::string shard_key;
  std::string path;
  int64_t trials = 0;
  std::string merged_at;
};

//! The shard runs of a shard file, after checking it: a SQLite db that passes quick_check, at
//! this binary's schema version, with shard_info rows. DbError naming the file otherwise.
std::vector<ShardRun> read_shard_runs(const std::string& shard_path);

//! A `harness bisect`: which versions (or envs, or builds) it searched, for what, and what it found.
struct Bisect {
  int64_t id = 0;
  std::string experiment;
  std::string mode;        //!< verdict, status or metric
  std::string target;      //!< "" (verdict), variant (status), variant.metric (metric)
  std::string package;     //!< "" for --envs / --builds
  std::string good;
  std::string bad;
  std::string status;      //!< running, found, range (skipped candidates around the change), failed, interrupted
  std::string first_bad;
  std::string last_good;
  nlohmann::json args = nlohmann::json::object();
  nlohmann::json result = nlohmann::json::object();
  std::string error;
  std::string started_at;
  std::string finished_at;
};

//! One candidate a bisect tried.
struct BisectProbe {
  int64_t id = 0;
  int64_t bisect_id = 0;
  int seq = 0;               //!< order of probing (1, 2, ...)
  int position = 0;          //!< index among the ordered candidates
  std::string label;         //!< the version, interpreter or build
  std::string outcome;       //!< good, bad or skip
  std::string reason;
  std::vector<int64_t> run_ids;
  nlohmann::json details = nlohmann::json::object();
  std::string started_at;
};

//! Connection to one db file. Not shared between threads; open one per thread/process.
class Store {
 public:
  //! Opens the db at `path` as `access` says (write: creating it if needed, migrating it; update:
  //! the same for an existing db; read: read-only) journaling as `journal` says. DbMissingError
  //! when a db to read or update is not there, or is not a regular file, or is an empty one;
  //! DbError otherwise.
  explicit Store(const std::string& path, Access access = Access::write, Journal journal = Journal::kWal);
  //! A writer with that journal (a Slurm task's shard: Journal::kRollback).
  Store(const std::string& path, Journal journal) : Store(path, Access::write, journal) {}
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  int schema_version() const;
  //! How long a write waits for another writer's lock before failing (default 10 s).
  void set_busy_timeout(int milliseconds);
  const std::string& path() const { return path_; }
  //! Opened read-only (Access::read).
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

  //! Replaces a run's args (a Slurm run records its job id once sbatch answered).
  void set_run_args(int64_t run_id, const nlohmann::json& args);

  //! Marks this db as a shard: `shard_run` says which main run its run belongs to.
  void add_shard_run(const ShardRun& shard_run);
  //! Records that every trial of the shard run ran.
  void finish_shard_run(int64_t shard_run_id);
  //! Merges every run of the shard at `shard_path` into the main run it names, each in one
  //! transaction: trials (ids renumbered), metrics, artifacts, envs (so each node's toolchain is
  //! kept); the run gets the shard's env when it has none. Idempotent: a shard run already merged
  //! is skipped (already_merged). DbError, with nothing written, for a file that is not a valid
  //! shard, of another schema version, of a run this db does not have or of another db (token),
  //! of another run than options.run_id, or unfinished without allow_unfinished.
  std::vector<MergeResult> merge_shard(const std::string& shard_path, const MergeOptions& options = {});
  //! Merges recorded for a run, oldest first.
  std::vector<ShardMerge> list_shard_merges(int64_t run_id) const;

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

  //! Starts a bisect (status "running"). Fills bisect.id and returns it. (db/bisect_store.cpp)
  int64_t begin_bisect(Bisect& bisect);
  //! Records one probe of a bisect. Fills probe.id and returns it.
  int64_t add_bisect_probe(BisectProbe& probe);
  //! Ends a bisect with what it found.
  void finish_bisect(int64_t bisect_id, const std::string& status, const std::string& last_good,
                     const std::string& first_bad, const nlohmann::json& result, const std::string& error = "");
  std::optional<Bisect> get_bisect(int64_t bisect_id) const;
  //! The probes of a bisect, in the order they ran.
  std::vector<BisectProbe> list_bisect_probes(int64_t bisect_id) const;
  //! Every bisect, newest first.
  std::vector<Bisect> list_bisects() const;
  //! Runs still "running" whose owner process is gone (same host; pid absent or started at
  //! another time): marked "abandoned" with the reason, or, read-only, shown so by list_runs and
  //! get_run without writing. Runs owned by another host are left alone. Returns their ids.
  std::vector<int64_t> settle_abandoned_runs();
  //! Runs "running" on another host (their owner cannot be checked from here).
  std::vector<Run> runs_elsewhere() const;
  //! SQLite's integrity_check (quick_check when `quick`): empty when the db is sound, else its
  //! findings, one a line (at most 100), each page it names followed by its table or index
  //! ("On tree page 21 cell 3: ... [table trials]"); when the check itself stops (a damaged root
  //! page), each table is checked on its own and the ones that cannot be read are named.
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
