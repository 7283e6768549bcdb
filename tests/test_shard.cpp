// Shards of Slurm tasks and their merge into the main db: counts, idempotency, envs kept, and every
// refusal (another run, another db, truncated file, unfinished attempt, not a shard) leaving the
// main db exactly as it was.

#include <sqlite3.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "db/store.h"
#include "tests/catch.h"

namespace {

namespace fs = std::filesystem;
using harness::db::DbError;
using harness::db::Journal;
using harness::db::MergeOptions;
using harness::db::Run;
using harness::db::ShardRun;
using harness::db::Store;
using harness::db::Trial;
using nlohmann::json;

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "harness_shard_test_XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

int64_t count(const std::string& db_path, const std::string& table) {
  sqlite3* db = nullptr;
  sqlite3_open(db_path.c_str(), &db);
  sqlite3_stmt* stmt = nullptr;
  const std::string sql = "SELECT count(*) FROM " + table;
  int64_t value = -1;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK && sqlite3_step(stmt) == SQLITE_ROW)
    value = sqlite3_column_int64(stmt, 0);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return value;
}

const json kSpec = {{"name", "anchor_scaling"}, {"kind", "attention_step"}, {"dims", {{"anchors", 16}}}};

// The main db's Slurm run, as `harness run --slurm` creates it before submitting.
int64_t main_run(Store& store, const std::string& token) {
  Run run;
  run.experiment_id = store.put_experiment("anchor_scaling", kSpec);
  run.device = "cpu";
  run.args = {{"slurm", {{"token", token}, {"job_id", "17"}}}};
  return store.begin_run(run);
}

// A task's shard with `trials` trials (one metric each; the first with an artifact), as
// `harness __slurm-task` writes it.
void write_shard(const std::string& path, int64_t main_run_id, const std::string& token, int task, int attempt,
                 int trials, bool finished, const json& env,
                 const std::string& artifact_path = "harness.db.artifacts/ab.safetensors") {
  Store shard(path, Journal::kRollback);
  Run run;
  run.experiment_id = shard.put_experiment("anchor_scaling", kSpec);
  run.env_id = shard.put_env(env);
  run.device = "cpu";
  shard.begin_run(run);
  ShardRun info;
  info.shard_run_id = run.id;
  info.main_run_id = main_run_id;
  info.run_token = token;
  info.task = task;
  info.attempt = attempt;
  info.slurm = {{"job_id", "17_" + std::to_string(task)}, {"node", "node" + std::to_string(task)}};
  shard.add_shard_run(info);
  for (int i = 0; i < trials; ++i) {
    Trial trial;
    trial.run_id = run.id;
    trial.variant = i % 2 ? "dense" : "fused";
    trial.point = {{"dims.anchors", 16 * (i + 1)}};
    trial.status = "ok";
    trial.details = {{"slurm", {{"task", task}, {"attempt", attempt}}}};
    shard.add_trial(trial, {{trial.variant, trial.point, "bwd_peak_bytes", 1000.0 * (i + 1), "bytes", -1}});
    if (i == 0) {
      harness::db::Artifact artifact;
      artifact.run_id = run.id;
      artifact.trial_id = trial.id;
      artifact.kind = "capsule";
      artifact.sha256 = "ab";
      artifact.path = artifact_path;
      shard.add_artifact(artifact);
    }
  }
  if (finished) shard.finish_shard_run(run.id);
}

template <typename Action>
std::string db_error_of(Action&& action) {
  try {
    action();
  } catch (const DbError& error) {
    return error.what();
  }
  FAIL("expected a DbError");
  return {};
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("a shard merges its trials, metrics, artifacts and env once, a second merge adds nothing", "[db][shard]") {
  TempDir dir;
  const std::string main_path = dir.file("harness.db");
  Store store(main_path);
  const int64_t run_id = main_run(store, "tok-a");
  // The main db already holds a trial of another run, so the shard's ids must be renumbered.
  Run other;
  other.experiment_id = store.put_experiment("anchor_scaling", kSpec);
  other.device = "cpu";
  store.begin_run(other);
  Trial existing;
  existing.run_id = other.id;
  existing.variant = "fused";
  existing.status = "ok";
  store.add_trial(existing, {});

  const json node_env = {{"torch", "2.11.0"}, {"host", "node1"}};
  write_shard(dir.file("task-1.attempt-0.db"), run_id, "tok-a", 1, 0, 3, true, node_env);
  MergeOptions options;
  options.slurm_state = "COMPLETED";
  const auto first = store.merge_shard(dir.file("task-1.attempt-0.db"), options);
  REQUIRE(first.size() == 1);
  CHECK_FALSE(first[0].already_merged);
  CHECK(first[0].shard_key == "task-1.attempt-0");
  CHECK(first[0].trials == 3);
  CHECK(first[0].metrics == 3);
  CHECK(first[0].artifacts == 1);

  const auto detail = store.get_run(run_id);
  REQUIRE(detail);
  REQUIRE(detail->trials.size() == 3);
  CHECK(detail->metrics.size() == 3);
  REQUIRE(detail->artifacts.size() == 1);
  // The artifact still points at its trial after renumbering.
  CHECK(detail->artifacts[0].trial_id == detail->trials[0].id);
  CHECK(detail->trials[0].id != existing.id);
  CHECK(detail->trials[0].details["slurm"]["state"] == "COMPLETED");
  CHECK(detail->trials[0].details["slurm"]["task"] == 1);
  // The run had no env (submitted from a host that ran nothing): it takes the node's.
  CHECK(detail->env == node_env);

  const auto second = store.merge_shard(dir.file("task-1.attempt-0.db"), options);
  REQUIRE(second.size() == 1);
  CHECK(second[0].already_merged);
  CHECK(count(main_path, "trials") == 4);
  CHECK(count(main_path, "metrics") == 3);
  CHECK(count(main_path, "shard_merges") == 1);
  REQUIRE(store.list_shard_merges(run_id).size() == 1);
  CHECK(store.list_shard_merges(run_id)[0].trials == 3);
}

TEST_CASE("shards of two nodes with different toolchains keep both envs", "[db][shard]") {
  TempDir dir;
  Store store(dir.file("harness.db"));
  const int64_t run_id = main_run(store, "tok");
  const json env_a = {{"torch", "2.11.0"}, {"host", "a"}};
  const json env_b = {{"torch", "2.5.1"}, {"host", "b"}};
  write_shard(dir.file("s0.db"), run_id, "tok", 0, 0, 1, true, env_a);
  write_shard(dir.file("s1.db"), run_id, "tok", 1, 0, 1, true, env_b);
  store.merge_shard(dir.file("s0.db"));
  store.merge_shard(dir.file("s1.db"));
  const auto ids = store.list_env_ids();
  REQUIRE(ids.size() == 2);
  CHECK(*store.get_env(ids[0]) != *store.get_env(ids[1]));
  CHECK(store.get_run(run_id)->trials.size() == 2);
}

TEST_CASE("a shard of another run or another db is refused and the main db is untouched", "[db][shard]") {
  TempDir dir;
  const std::string main_path = dir.file("harness.db");
  Store store(main_path);
  const int64_t run_id = main_run(store, "tok-mine");
  write_shard(dir.file("foreign.db"), run_id, "tok-theirs", 0, 0, 2, true, {{"host", "x"}});
  const std::string foreign = db_error_of([&] { store.merge_shard(dir.file("foreign.db")); });
  CHECK(contains(foreign, "foreign.db"));
  CHECK(contains(foreign, "another run"));
  CHECK(contains(foreign, "nothing was merged"));

  write_shard(dir.file("missing-run.db"), run_id + 40, "tok-mine", 0, 0, 2, true, {{"host", "x"}});
  CHECK(contains(db_error_of([&] { store.merge_shard(dir.file("missing-run.db")); }), "this db does not have"));

  write_shard(dir.file("mine.db"), run_id, "tok-mine", 0, 0, 2, true, {{"host", "x"}});
  MergeOptions other_run;
  other_run.run_id = run_id + 1;
  CHECK(contains(db_error_of([&] { store.merge_shard(dir.file("mine.db"), other_run); }), "not of run"));
  CHECK(count(main_path, "trials") == 0);
  CHECK(count(main_path, "envs") == 0);
  CHECK(count(main_path, "shard_merges") == 0);
}

TEST_CASE("a truncated shard, a plain db and an unfinished attempt are refused with the reason", "[db][shard]") {
  TempDir dir;
  const std::string main_path = dir.file("harness.db");
  Store store(main_path);
  const int64_t run_id = main_run(store, "tok");
  const std::string shard = dir.file("task-0.attempt-0.db");
  write_shard(shard, run_id, "tok", 0, 0, 40, true, {{"host", "x"}});
  const auto size = fs::file_size(shard);
  fs::resize_file(shard, size / 2);
  const std::string truncated = db_error_of([&] { store.merge_shard(shard); });
  CHECK(contains(truncated, "task-0.attempt-0.db"));
  CHECK(contains(truncated, "nothing was merged"));

  const std::string garbage = dir.file("garbage.db");
  {
    std::FILE* file = std::fopen(garbage.c_str(), "w");
    std::fputs("this is not sqlite at all, just text long enough to have a header of sorts......", file);
    std::fclose(file);
  }
  CHECK(contains(db_error_of([&] { store.merge_shard(garbage); }), "garbage.db"));

  { Store plain(dir.file("plain.db")); }
  CHECK(contains(db_error_of([&] { store.merge_shard(dir.file("plain.db")); }), "not a shard"));

  CHECK(contains(db_error_of([&] { store.merge_shard(dir.file("absent.db")); }), "no such shard file"));

  write_shard(dir.file("unfinished.db"), run_id, "tok", 2, 0, 1, false, {{"host", "x"}});
  CHECK(contains(db_error_of([&] { store.merge_shard(dir.file("unfinished.db")); }), "did not finish"));
  CHECK(count(main_path, "trials") == 0);

  MergeOptions partial;
  partial.allow_unfinished = true;
  CHECK(store.merge_shard(dir.file("unfinished.db"), partial)[0].trials == 1);
}

TEST_CASE("a shard of an older schema version is refused, naming both versions", "[db][shard]") {
  TempDir dir;
  Store store(dir.file("harness.db"));
  harness::db::create_schema_at_version(dir.file("old.db"), 1);
  const std::string message = db_error_of([&] { store.merge_shard(dir.file("old.db")); });
  CHECK(contains(message, "shard schema version"));
  CHECK(contains(message, "this harness writes"));
}

namespace {

// Runs `sql` on the file at `path` (a hostile edit of a shard).
void edit(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) == SQLITE_OK);
  char* message = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &message);
  INFO(sql << ": " << (message ? message : ""));
  sqlite3_free(message);
  sqlite3_close(db);
  REQUIRE(rc == SQLITE_OK);
}

}  // namespace

TEST_CASE("a hostile shard is refused with nothing written: paths leaving the artifact folder, a foreign schema, "
          "broken JSON, dangling or overflowing ids", "[db][shard][hostile]") {
  TempDir dir;
  const std::string main_path = dir.file("harness.db");
  Store store(main_path);
  const int64_t run_id = main_run(store, "tok");
  int shards = 0;
  const auto refused = [&](const std::string& sql, const std::string& artifact_path, const std::string& expected) {
    const std::string shard = dir.file("task-" + std::to_string(shards) + ".attempt-0.db");
    write_shard(shard, run_id, "tok", shards++, 0, 2, true, {{"host", "x"}}, artifact_path);
    if (!sql.empty()) edit(shard, sql);
    INFO(sql << " " << artifact_path);
    const std::string message = db_error_of([&] { store.merge_shard(shard); });
    CHECK(contains(message, expected));
    CHECK(contains(message, "nothing was merged"));
    CHECK_THROWS_AS(store.merge_shard(shard), harness::db::ShardRefused);
  };
  refused("", "../../victim.txt", "../../victim.txt");
  refused("", "/etc/passwd", "/etc/passwd");
  refused("", "harness.db.artifacts/../../victim.txt", "victim.txt");
  refused("", "other.db.artifacts/ab.safetensors", "other.db.artifacts");
  refused("ALTER TABLE trials RENAME TO kept; CREATE VIEW trials AS SELECT * FROM kept", "harness.db.artifacts/a", "schema");
  refused("UPDATE trials SET point = '{not json'", "harness.db.artifacts/a", "JSON");
  refused("UPDATE metrics SET trial_id = 999", "harness.db.artifacts/a", "trial");
  refused("PRAGMA foreign_keys = OFF; UPDATE metrics SET trial_id = 9000000000000000000 WHERE trial_id = 1; "
          "UPDATE artifacts SET trial_id = 9000000000000000000 WHERE trial_id = 1; "
          "UPDATE trials SET id = 9000000000000000000 WHERE id = 1",
          "harness.db.artifacts/a", "trial");
  CHECK(count(main_path, "trials") == 0);
  CHECK(count(main_path, "metrics") == 0);
  CHECK(count(main_path, "artifacts") == 0);
  CHECK(count(main_path, "shard_merges") == 0);

  // The layout older versions wrote (the folder every db shared) still merges.
  write_shard(dir.file("legacy.db"), run_id, "tok", 40, 0, 1, true, {{"host", "x"}}, "artifacts/ab.safetensors");
  CHECK(store.merge_shard(dir.file("legacy.db"))[0].artifacts == 1);
}
