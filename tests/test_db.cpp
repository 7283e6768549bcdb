// The SQLite store: hashing, round trips of every entity, filters, migrations, errors and
// concurrent writers. Every test works in its own mkdtemp directory.

#include <sqlite3.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "db/store.h"
#include "tests/catch.h"

namespace {

using harness::db::Artifact;
using harness::db::DbError;
using harness::db::Metric;
using harness::db::Run;
using harness::db::RunFilter;
using harness::db::Store;
using harness::db::Trial;
using nlohmann::json;

//! A fresh directory under the system temp folder, removed with everything in it at scope end.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "harness_db_test_XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

//! Raw SQLite access, independent of Store, to set up old layouts and count rows.
class RawDb {
 public:
  explicit RawDb(const std::string& path) {
    if (sqlite3_open(path.c_str(), &db_) != SQLITE_OK) throw std::runtime_error("cannot open " + path);
  }
  ~RawDb() { sqlite3_close(db_); }
  void exec(const std::string& sql) {
    char* message = nullptr;
    if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &message) != SQLITE_OK) {
      const std::string text = message ? message : "?";
      sqlite3_free(message);
      throw std::runtime_error("raw SQL failed: " + text + " in: " + sql);
    }
  }
  int64_t integer(const std::string& sql) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK || sqlite3_step(stmt) != SQLITE_ROW) {
      sqlite3_finalize(stmt);
      throw std::runtime_error(std::string("raw query failed: ") + sqlite3_errmsg(db_) + " in: " + sql);
    }
    const int64_t value = sqlite3_column_int64(stmt, 0);
    sqlite3_finalize(stmt);
    return value;
  }

 private:
  sqlite3* db_ = nullptr;
};

//! The message of the DbError `action` throws; fails the test when it throws nothing.
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

json sample_env() {
  return {{"torch", "2.11.0"}, {"cuda_runtime", "13.0"}, {"gpu", {{"name", "NVIDIA H200"}, {"memory_bytes", 150754820096}}}};
}

json sample_spec(int anchors = 128) {
  return {{"name", "bwd_fusion"},
          {"kind", "attention_step"},
          {"dims", {{"heads", 32}, {"kv_heads", 8}, {"head_dim", 128}, {"anchors", anchors}}}};
}

Run new_run(Store& store, int64_t experiment_id, const std::string& env_id) {
  Run run;
  run.experiment_id = experiment_id;
  run.env_id = env_id;
  run.device = "cuda:2";
  store.begin_run(run);
  return run;
}

}  // namespace

TEST_CASE("sha256_hex matches the FIPS 180-2 test vectors", "[db]") {
  using harness::db::sha256_hex;
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(sha256_hex(std::string(1'000'000, 'a')) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("sha256_hex pads correctly around block boundaries", "[db]") {
  // 55 bytes is the longest message whose padding fits one block, 56 the shortest that needs a
  // second; 64 and 120 exercise full data blocks before the tail. Digests from Python's hashlib.
  using harness::db::sha256_hex;
  CHECK(sha256_hex(std::string(55, 'a')) == "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  CHECK(sha256_hex(std::string(56, 'a')) == "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  CHECK(sha256_hex(std::string(63, 'a')) == "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34");
  CHECK(sha256_hex(std::string(64, 'a')) == "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
  CHECK(sha256_hex(std::string(120, 'a')) == "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c");
}

TEST_CASE("canonical_json sorts keys and has no spaces", "[db]") {
  const json value = json::parse(R"({"b": 1, "a": [1, {"d": 2, "c": "x y"}]})");
  CHECK(harness::db::canonical_json(value) == R"({"a":[1,{"c":"x y","d":2}],"b":1})");
  const json same = json::parse(R"({"a":[1,{"c":"x y","d":2}],"b":1})");
  CHECK(harness::db::canonical_json(same) == harness::db::canonical_json(value));
}

TEST_CASE("now_iso8601 writes UTC with milliseconds", "[db]") {
  const std::string now = harness::db::now_iso8601();
  REQUIRE(now.size() == 24);  // 2026-11-29T10:00:00.123Z
  CHECK(now[4] == '-');
  CHECK(now[10] == 'T');
  CHECK(now[19] == '.');
  CHECK(now.back() == 'Z');
  CHECK(now.substr(0, 2) == "20");
}

TEST_CASE("a new db is at the current schema version, in WAL mode", "[db]") {
  TempDir dir;
  const std::string path = dir.file("harness.db");
  Store store(path);
  CHECK(store.schema_version() == harness::db::current_schema_version());
  CHECK(harness::db::current_schema_version() >= 3);  // migrations only ever append (never a fixed number: branches add steps)
  CHECK(store.path() == path);
  RawDb raw(path);
  CHECK(raw.integer("SELECT count(*) FROM pragma_journal_mode WHERE journal_mode = 'wal'") == 1);
}

TEST_CASE("envs and experiments are deduplicated by content", "[db]") {
  TempDir dir;
  const std::string path = dir.file("harness.db");
  Store store(path);

  const std::string env_id = store.put_env(sample_env());
  CHECK(env_id == harness::db::sha256_hex(harness::db::canonical_json(sample_env())));
  CHECK(store.put_env(json::parse(sample_env().dump(2))) == env_id);
  REQUIRE(store.get_env(env_id).has_value());
  CHECK(*store.get_env(env_id) == sample_env());
  CHECK_FALSE(store.get_env("no-such-env").has_value());

  const int64_t fusion = store.put_experiment("bwd_fusion", sample_spec());
  CHECK(store.put_experiment("bwd_fusion", json::parse(sample_spec().dump(4))) == fusion);
  const int64_t fusion_512 = store.put_experiment("bwd_fusion", sample_spec(512));
  const int64_t renamed = store.put_experiment("bwd_fusion_copy", sample_spec());
  CHECK(fusion_512 != fusion);
  CHECK(renamed != fusion);
  CHECK(renamed != fusion_512);

  const auto experiments = store.list_experiments();
  REQUIRE(experiments.size() == 3);
  CHECK(experiments[0].name == "bwd_fusion");
  CHECK(experiments[0].id == fusion);
  CHECK(experiments[0].spec_hash == harness::db::sha256_hex(harness::db::canonical_json(sample_spec())));
  CHECK(experiments[1].id == fusion_512);
  CHECK(experiments[2].name == "bwd_fusion_copy");
  CHECK(experiments[2].created_at.size() == 24);

  RawDb raw(path);
  CHECK(raw.integer("SELECT count(*) FROM envs") == 1);
  CHECK(raw.integer("SELECT count(*) FROM experiments") == 3);
}

TEST_CASE("a run with trials, metrics and artifacts reads back field by field", "[db]") {
  TempDir dir;
  const std::string path = dir.file("harness.db");
  Store store(path);
  const std::string env_id = store.put_env(sample_env());
  const int64_t experiment_id = store.put_experiment("bwd_fusion", sample_spec());

  Run run;
  run.experiment_id = experiment_id;
  run.env_id = env_id;
  run.device = "cuda:2";
  run.profile = "cpu";
  run.args = {{"argv", {"harness", "run", "bwd_fusion"}}, {"set", {{"dims.anchors", 256}}}};
  const int64_t run_id = store.begin_run(run);
  CHECK(run_id == run.id);
  CHECK(run_id > 0);
  CHECK(run.status == "running");
  CHECK(run.experiment == "bwd_fusion");
  CHECK(run.spec_hash == harness::db::sha256_hex(harness::db::canonical_json(sample_spec())));
  CHECK(run.started_at.size() == 24);

  Trial fused;
  fused.run_id = run_id;
  fused.variant = "fused";
  fused.point = {{"anchors", 256}};
  fused.status = "ok";
  fused.exit_code = 0;
  fused.dispatch = json::array({{{"op", "attention_bwd"}, {"impl", "fused_cuda"}, {"why", "mask has block lists"}}});
  fused.duration_s = 1.25;
  const std::vector<Metric> fused_metrics = {
      {"fused", {{"anchors", 256}}, "bwd_peak_bytes", 157286400.0, "bytes", -1},
      {"fused", {{"anchors", 256}}, "bwd_ms", 3.5, "ms", 0},
      {"fused", {{"anchors", 256}}, "bwd_ms", 3.75, "ms", 1},
  };
  const int64_t fused_id = store.add_trial(fused, fused_metrics);
  CHECK(fused_id == fused.id);
  CHECK(fused.started_at.size() == 24);

  Trial dense;
  dense.run_id = run_id;
  dense.variant = "dense";
  dense.point = {{"anchors", 256}};
  dense.status = "oom";
  dense.exit_code = 1;
  dense.signal = 6;
  dense.error = "CUDA out of memory. Tried to allocate 15.09 GiB";
  dense.stderr_tail = "line one\nline two\n";
  dense.requested_bytes = int64_t{16203091968};
  dense.duration_s = 0.5;
  dense.started_at = "2026-11-29T10:00:00.123Z";
  store.add_trial(dense, {});
  CHECK(dense.id > fused.id);

  store.add_metrics(run_id, {{"", json::object(), "trials", 2.0, "", -1}});

  Artifact capsule;
  capsule.run_id = run_id;
  capsule.trial_id = dense.id;
  capsule.kind = "capsule";
  capsule.sha256 = harness::db::sha256_hex("capsule bytes");
  capsule.path = "artifacts/ab/abcdef.capsule";
  capsule.bytes = 4294967296;
  const int64_t capsule_id = store.add_artifact(capsule);
  CHECK(capsule_id == capsule.id);
  Artifact log;
  log.run_id = run_id;
  log.kind = "log";
  log.sha256 = harness::db::sha256_hex("log bytes");
  log.path = "artifacts/cd/cdef.log";
  log.bytes = 9;
  store.add_artifact(log);

  const json evidence = {{"rule", "fused.bwd_peak_bytes < 5GiB"}, {"fused.bwd_peak_bytes", 157286400}};
  store.finish_run(run_id, "ok", "FUSED", evidence, "dense variant ran out of memory");

  const auto detail = store.get_run(run_id);
  REQUIRE(detail.has_value());
  const Run& stored = detail->run;
  CHECK(stored.id == run_id);
  CHECK(stored.experiment == "bwd_fusion");
  CHECK(stored.experiment_id == experiment_id);
  CHECK(stored.spec_hash == run.spec_hash);
  CHECK(stored.env_id == env_id);
  CHECK(stored.device == "cuda:2");
  CHECK(stored.profile == "cpu");
  CHECK(stored.status == "ok");
  CHECK(stored.verdict == "FUSED");
  CHECK(stored.evidence == evidence);
  CHECK(stored.args == run.args);
  CHECK(stored.error == "dense variant ran out of memory");
  CHECK(stored.started_at == run.started_at);
  CHECK(stored.finished_at.size() == 24);
  CHECK(stored.finished_at >= stored.started_at);
  CHECK_FALSE(stored.replay_of.has_value());
  CHECK(detail->env == sample_env());
  CHECK(detail->spec == sample_spec());

  REQUIRE(detail->trials.size() == 2);
  const Trial& first = detail->trials[0];
  CHECK(first.id == fused.id);
  CHECK(first.run_id == run_id);
  CHECK(first.variant == "fused");
  CHECK(first.point == fused.point);
  CHECK(first.status == "ok");
  CHECK(first.exit_code == std::optional<int>(0));
  CHECK_FALSE(first.signal.has_value());
  CHECK(first.error.empty());
  CHECK_FALSE(first.requested_bytes.has_value());
  CHECK(first.dispatch == fused.dispatch);
  CHECK(first.duration_s == 1.25);
  CHECK(first.started_at == fused.started_at);
  const Trial& second = detail->trials[1];
  CHECK(second.id == dense.id);
  CHECK(second.status == "oom");
  CHECK(second.exit_code == std::optional<int>(1));
  CHECK(second.signal == std::optional<int>(6));
  CHECK(second.error == dense.error);
  CHECK(second.stderr_tail == "line one\nline two\n");
  CHECK(second.requested_bytes == std::optional<int64_t>(16203091968));
  CHECK(second.dispatch == json::array());
  CHECK(second.duration_s == 0.5);
  CHECK(second.started_at == "2026-11-29T10:00:00.123Z");

  REQUIRE(detail->metrics.size() == 4);
  for (size_t i = 0; i < fused_metrics.size(); ++i) {
    CHECK(detail->metrics[i].variant == fused_metrics[i].variant);
    CHECK(detail->metrics[i].point == fused_metrics[i].point);
    CHECK(detail->metrics[i].name == fused_metrics[i].name);
    CHECK(detail->metrics[i].value == fused_metrics[i].value);
    CHECK(detail->metrics[i].unit == fused_metrics[i].unit);
    CHECK(detail->metrics[i].repeat == fused_metrics[i].repeat);
  }
  CHECK(detail->metrics[3].variant.empty());
  CHECK(detail->metrics[3].name == "trials");
  CHECK(detail->metrics[3].point == json::object());

  REQUIRE(detail->artifacts.size() == 2);
  CHECK(detail->artifacts[0].id == capsule.id);
  CHECK(detail->artifacts[0].run_id == run_id);
  CHECK(detail->artifacts[0].trial_id == std::optional<int64_t>(dense.id));
  CHECK(detail->artifacts[0].kind == "capsule");
  CHECK(detail->artifacts[0].sha256 == capsule.sha256);
  CHECK(detail->artifacts[0].path == capsule.path);
  CHECK(detail->artifacts[0].bytes == 4294967296);
  CHECK_FALSE(detail->artifacts[1].trial_id.has_value());
  CHECK(detail->artifacts[1].kind == "log");

  RawDb raw(path);
  CHECK(raw.integer("SELECT count(*) FROM metrics WHERE trial_id = " + std::to_string(fused.id)) == 3);
  CHECK(raw.integer("SELECT count(*) FROM metrics WHERE trial_id IS NULL") == 1);

  SECTION("a replay points at the run it replays") {
    Run replay;
    replay.experiment_id = experiment_id;
    replay.device = "cuda:1";
    replay.replay_of = run_id;
    store.begin_run(replay);
    const auto replayed = store.get_run(replay.id);
    REQUIRE(replayed.has_value());
    CHECK(replayed->run.replay_of == std::optional<int64_t>(run_id));
    CHECK(replayed->run.env_id.empty());
    CHECK(replayed->env == json::object());
    CHECK(replayed->trials.empty());
  }

  SECTION("an unknown run is nullopt") { CHECK_FALSE(store.get_run(run_id + 1000).has_value()); }
}

TEST_CASE("writes that refer to missing rows fail naming the db and the operation", "[db]") {
  TempDir dir;
  const std::string path = dir.file("harness.db");
  Store store(path);
  const int64_t experiment_id = store.put_experiment("bwd_fusion", sample_spec());

  Run orphan;
  orphan.experiment_id = experiment_id + 1;
  std::string message = db_error_of([&] { store.begin_run(orphan); });
  CHECK(contains(message, path + ": begin run"));
  CHECK(contains(message, "no experiment with id " + std::to_string(experiment_id + 1)));

  Trial trial;
  trial.run_id = 42;
  trial.status = "ok";
  message = db_error_of([&] { store.add_trial(trial, {}); });
  CHECK(contains(message, path + ": insert trial of run 42"));
  CHECK(contains(message, "FOREIGN KEY"));

  message = db_error_of([&] { store.finish_run(42, "ok", "FUSED", json::object()); });
  CHECK(contains(message, path + ": finish run 42: no such run"));

  orphan.experiment_id = experiment_id;
  orphan.env_id = "not-a-stored-env";
  message = db_error_of([&] { store.begin_run(orphan); });
  CHECK(contains(message, path + ": insert run"));

  RawDb raw(path);
  CHECK(raw.integer("SELECT count(*) FROM runs") == 0);
  CHECK(raw.integer("SELECT count(*) FROM trials") == 0);
}

TEST_CASE("a stored JSON column that does not parse names the db, the row and the column", "[db]") {
  TempDir dir;
  const std::string path = dir.file("harness.db");
  Store store(path);
  Run run;
  run.experiment_id = store.put_experiment("bwd_fusion", sample_spec());
  run.env_id = store.put_env(sample_env());
  const int64_t run_id = store.begin_run(run);
  CHECK(store.get_run(run_id).has_value());

  RawDb(path).exec("UPDATE runs SET evidence = '{\"peak\": ' WHERE id = " + std::to_string(run_id));
  const std::string message = db_error_of([&] { store.get_run(run_id); });
  CHECK(contains(message, path + ": read run " + std::to_string(run_id) + " evidence: stored JSON does not parse"));
  CHECK(contains(db_error_of([&] { store.list_runs({}); }), "read run " + std::to_string(run_id) + " evidence"));
}

TEST_CASE("list_runs is newest first and filters by experiment, failure and limit", "[db]") {
  TempDir dir;
  Store store(dir.file("harness.db"));
  const std::string env_id = store.put_env(sample_env());
  const int64_t fusion = store.put_experiment("bwd_fusion", sample_spec());
  const int64_t fusion_512 = store.put_experiment("bwd_fusion", sample_spec(512));
  const int64_t race = store.put_experiment("autotune_race", {{"name", "autotune_race"}});

  struct Planned {
    int64_t experiment_id;
    std::string status;  // "" leaves the run running
  };
  const std::vector<Planned> planned = {{fusion, "ok"},       {race, "failed"}, {fusion_512, "failed"},
                                        {race, "ok"},         {fusion, "interrupted"}, {fusion, ""}};
  std::vector<int64_t> ids;
  for (const Planned& plan : planned) {
    Run run = new_run(store, plan.experiment_id, env_id);
    if (!plan.status.empty()) store.finish_run(run.id, plan.status, "", json::object());
    ids.push_back(run.id);
  }

  auto ids_of = [](const std::vector<Run>& runs) {
    std::vector<int64_t> result;
    for (const Run& run : runs) result.push_back(run.id);
    return result;
  };

  const auto all = store.list_runs();
  CHECK(ids_of(all) == std::vector<int64_t>{ids[5], ids[4], ids[3], ids[2], ids[1], ids[0]});
  CHECK(all[1].experiment == "bwd_fusion");
  CHECK(all[1].status == "interrupted");
  CHECK(all[2].experiment == "autotune_race");

  RunFilter fusion_only;
  fusion_only.experiment = "bwd_fusion";
  CHECK(ids_of(store.list_runs(fusion_only)) == std::vector<int64_t>{ids[5], ids[4], ids[2], ids[0]});

  RunFilter failed;
  failed.failed_only = true;
  CHECK(ids_of(store.list_runs(failed)) == std::vector<int64_t>{ids[5], ids[4], ids[2], ids[1]});

  RunFilter failed_fusion = fusion_only;
  failed_fusion.failed_only = true;
  failed_fusion.limit = 2;
  CHECK(ids_of(store.list_runs(failed_fusion)) == std::vector<int64_t>{ids[5], ids[4]});

  RunFilter newest;
  newest.limit = 1;
  CHECK(ids_of(store.list_runs(newest)) == std::vector<int64_t>{ids[5]});

  RunFilter unlimited;
  unlimited.limit = 0;
  CHECK(store.list_runs(unlimited).size() == 6);

  RunFilter unknown;
  unknown.experiment = "no_such_experiment";
  CHECK(store.list_runs(unknown).empty());
}

TEST_CASE("a version 1 db is migrated to the current version and keeps its rows", "[db]") {
  TempDir dir;
  const std::string path = dir.file("old.db");
  harness::db::create_schema_at_version(path, 1);
  {
    RawDb raw(path);
    REQUIRE(raw.integer("PRAGMA user_version") == 1);
    REQUIRE(raw.integer("SELECT count(*) FROM sqlite_master WHERE name = 'trials'") == 0);
    REQUIRE(raw.integer("SELECT count(*) FROM pragma_table_info('runs') WHERE name = 'replay_of'") == 0);
    raw.exec(R"sql(
      INSERT INTO envs (id, json, created_at) VALUES ('env1', '{"torch":"2.10.0"}', '2026-01-01T00:00:00.000Z');
      INSERT INTO experiments (id, name, spec, spec_hash, created_at)
        VALUES (7, 'bwd_fusion', '{"name":"bwd_fusion"}', 'hash1', '2026-01-01T00:00:00.000Z');
      INSERT INTO runs (id, experiment_id, env_id, device, profile, status, verdict, evidence, args, error,
                        started_at, finished_at)
        VALUES (3, 7, 'env1', 'cuda:0', '', 'failed', 'DENSE', '{"rule":"else"}', '{}', 'oom',
                '2026-01-01T00:00:01.000Z', '2026-01-01T00:00:09.000Z');
      INSERT INTO metrics (run_id, variant, point, name, value, unit, repeat)
        VALUES (3, 'dense', '{"anchors":512}', 'bwd_peak_bytes', 17850000000, 'bytes', -1);
      INSERT INTO artifacts (run_id, kind, sha256, path, bytes) VALUES (3, 'log', 'abc', 'logs/3.log', 12);
    )sql");
  }

  Store store(path);
  CHECK(store.schema_version() == harness::db::current_schema_version());

  const auto old = store.get_run(3);
  REQUIRE(old.has_value());
  CHECK(old->run.experiment == "bwd_fusion");
  CHECK(old->run.experiment_id == 7);
  CHECK(old->run.spec_hash == "hash1");
  CHECK(old->run.env_id == "env1");
  CHECK(old->run.status == "failed");
  CHECK(old->run.verdict == "DENSE");
  CHECK(old->run.evidence == json{{"rule", "else"}});
  CHECK(old->run.error == "oom");
  CHECK(old->run.finished_at == "2026-01-01T00:00:09.000Z");
  CHECK_FALSE(old->run.replay_of.has_value());
  CHECK(old->env == json{{"torch", "2.10.0"}});
  CHECK(old->spec == json{{"name", "bwd_fusion"}});
  CHECK(old->trials.empty());
  REQUIRE(old->metrics.size() == 1);
  CHECK(old->metrics[0].value == 17850000000.0);
  CHECK(old->metrics[0].point == json{{"anchors", 512}});
  REQUIRE(old->artifacts.size() == 1);
  CHECK_FALSE(old->artifacts[0].trial_id.has_value());
  CHECK(old->artifacts[0].path == "logs/3.log");

  // The tables and columns version 2 added work on top of the old rows.
  Trial trial;
  trial.run_id = 3;
  trial.variant = "dense";
  trial.status = "oom";
  store.add_trial(trial, {{"dense", json::object(), "bwd_ms", 12.0, "ms", -1}});
  Run replay;
  replay.experiment_id = 7;
  replay.env_id = "env1";
  replay.device = "cuda:1";
  replay.replay_of = 3;
  store.begin_run(replay);
  CHECK(replay.id > 3);

  const auto migrated = store.get_run(3);
  REQUIRE(migrated.has_value());
  REQUIRE(migrated->trials.size() == 1);
  CHECK(migrated->trials[0].status == "oom");
  CHECK(migrated->metrics.size() == 2);
  CHECK(store.get_run(replay.id)->run.replay_of == std::optional<int64_t>(3));
  CHECK(store.list_runs().size() == 2);

  // Opening an up-to-date db again changes nothing.
  Store again(path);
  CHECK(again.schema_version() == harness::db::current_schema_version());
  CHECK(again.list_runs().size() == 2);
}

TEST_CASE("create_schema_at_version rejects versions this binary does not know", "[db]") {
  TempDir dir;
  const std::string path = dir.file("harness.db");
  CHECK(contains(db_error_of([&] { harness::db::create_schema_at_version(path, 0); }), "no schema version 0"));
  const int unknown = harness::db::current_schema_version() + 1;
  CHECK(contains(db_error_of([&] { harness::db::create_schema_at_version(path, unknown); }),
                 "no schema version " + std::to_string(unknown)));
}

TEST_CASE("a db newer than this binary is refused, naming both versions", "[db]") {
  TempDir dir;
  const std::string path = dir.file("future.db");
  const int future = harness::db::current_schema_version() + 1;
  {
    Store store(path);
    RawDb raw(path);
    raw.exec("PRAGMA user_version = " + std::to_string(future));
  }
  const std::string message = db_error_of([&] { Store store(path); });
  CHECK(contains(message, path));
  CHECK(contains(message, "schema version " + std::to_string(future)));
  CHECK(contains(message, "version " + std::to_string(harness::db::current_schema_version())));
  RawDb raw(path);
  CHECK(raw.integer("PRAGMA user_version") == future);
}

TEST_CASE("a file that is not a harness db is refused, naming its path", "[db]") {
  TempDir dir;
  SECTION("not SQLite at all") {
    const std::string path = dir.file("notes.txt");
    {
      std::ofstream text(path);
      for (int line = 0; line < 64; ++line) text << "this is a text file, not a database\n";
    }
    const std::string message = db_error_of([&] { Store store(path); });
    CHECK(contains(message, path + ": "));
    CHECK(contains(message, "not a database"));
  }
  SECTION("another program's SQLite db") {
    const std::string path = dir.file("other.db");
    {
      RawDb raw(path);
      raw.exec("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)");
    }
    const std::string message = db_error_of([&] { Store store(path); });
    CHECK(contains(message, path + ": not a harness db"));
    RawDb raw(path);
    CHECK(raw.integer("SELECT count(*) FROM sqlite_master WHERE name = 'runs'") == 0);
  }
}

TEST_CASE("a write blocked past the busy timeout names the db, the operation and the lock", "[db]") {
  TempDir dir;
  const std::string path = dir.file("harness.db");
  Store store(path);
  const int64_t experiment_id = store.put_experiment("bwd_fusion", sample_spec());
  store.set_busy_timeout(50);
  RawDb other_writer(path);
  other_writer.exec("BEGIN IMMEDIATE");
  Run run;
  run.experiment_id = experiment_id;
  const std::string message = db_error_of([&] { store.begin_run(run); });
  CHECK(message == path + ": begin run: database is locked");
  // Readers are not blocked by a writer in WAL mode.
  CHECK(store.list_runs().empty());
  other_writer.exec("ROLLBACK");
  CHECK(store.begin_run(run) > 0);
}

TEST_CASE("two stores on one file see each other's interleaved writes", "[db]") {
  TempDir dir;
  const std::string path = dir.file("harness.db");
  Store first(path);
  Store second(path);
  const int64_t experiment_first = first.put_experiment("bwd_fusion", sample_spec());
  CHECK(second.put_experiment("bwd_fusion", sample_spec()) == experiment_first);
  const std::string env_id = second.put_env(sample_env());
  CHECK(first.put_env(sample_env()) == env_id);

  Run run_a = new_run(first, experiment_first, env_id);
  Run run_b = new_run(second, experiment_first, env_id);
  for (int index = 0; index < 3; ++index) {
    Trial trial_a;
    trial_a.run_id = run_a.id;
    trial_a.status = "ok";
    first.add_trial(trial_a, {{"fused", json::object(), "fwd_ms", 1.0 + index, "ms", index}});
    Trial trial_b;
    trial_b.run_id = run_b.id;
    trial_b.status = "ok";
    second.add_trial(trial_b, {{"dense", json::object(), "fwd_ms", 10.0 + index, "ms", index}});
  }
  first.finish_run(run_b.id, "ok", "DENSE", json::object());
  second.finish_run(run_a.id, "failed", "INVALID", json::object());

  const auto seen_by_second = second.get_run(run_a.id);
  REQUIRE(seen_by_second.has_value());
  CHECK(seen_by_second->run.status == "failed");
  CHECK(seen_by_second->trials.size() == 3);
  REQUIRE(seen_by_second->metrics.size() == 3);
  CHECK(seen_by_second->metrics[2].value == 3.0);
  const auto seen_by_first = first.get_run(run_b.id);
  REQUIRE(seen_by_first.has_value());
  CHECK(seen_by_first->run.verdict == "DENSE");
  CHECK(seen_by_first->trials.size() == 3);
  CHECK(first.list_runs().size() == 2);
}

TEST_CASE("two threads with their own stores write 100 runs each concurrently", "[db]") {
  TempDir dir;
  const std::string path = dir.file("harness.db");
  constexpr int kRunsPerWriter = 100;
  constexpr int kWriters = 2;

  // The writers also create the db together: both switch the new file to WAL and migrate it.
  // Catch's assertions are not thread-safe: writers record failures, the main thread checks them.
  std::vector<std::string> failures(kWriters);
  std::vector<std::thread> writers;
  for (int writer = 0; writer < kWriters; ++writer) {
    writers.emplace_back([&, writer] {
      try {
        Store store(path);
        const int64_t experiment_id = store.put_experiment("bwd_fusion", sample_spec());
        const std::string env_id = store.put_env(sample_env());
        for (int index = 0; index < kRunsPerWriter; ++index) {
          Run run;
          run.experiment_id = experiment_id;
          run.env_id = env_id;
          run.device = "cuda:" + std::to_string(writer);
          store.begin_run(run);
          Trial trial;
          trial.run_id = run.id;
          trial.variant = "fused";
          trial.status = "ok";
          store.add_trial(trial, {{"fused", json::object(), "writer", double(writer), "", -1},
                                  {"fused", json::object(), "index", double(index), "", -1}});
          store.finish_run(run.id, "ok", "FUSED", {{"writer", writer}, {"index", index}});
        }
      } catch (const std::exception& error) {
        failures[writer] = error.what();
      }
    });
  }
  for (std::thread& writer : writers) writer.join();
  for (const std::string& failure : failures) CHECK(failure.empty());

  Store store(path);
  RunFilter every_run;
  every_run.limit = 0;
  const auto runs = store.list_runs(every_run);
  REQUIRE(runs.size() == kWriters * kRunsPerWriter);
  std::set<std::pair<int, int>> seen;
  for (const Run& run : runs) {
    CHECK(run.status == "ok");
    const auto detail = store.get_run(run.id);
    REQUIRE(detail.has_value());
    REQUIRE(detail->trials.size() == 1);
    REQUIRE(detail->metrics.size() == 2);
    const int writer = run.evidence.at("writer").get<int>();
    CHECK(detail->metrics[0].value == writer);
    CHECK(run.device == "cuda:" + std::to_string(writer));
    seen.insert({writer, run.evidence.at("index").get<int>()});
  }
  CHECK(seen.size() == kWriters * kRunsPerWriter);
  CHECK(store.list_experiments().size() == 1);
  RawDb raw(path);
  CHECK(raw.integer("SELECT count(*) FROM envs") == 1);
}
