// Artifact files belong to their db: each db keeps them in its own folder beside it
// (`<db file>.artifacts/`), and `db vacuum`, `db prune` and `db check` touch only files of that
// folder. End to end through the binary: two dbs in one folder, a db whose rows were crafted to
// name files elsewhere (`artifacts/../../victim.txt`, an absolute path, a symbolic link leaving
// the folder), and a db whose rows still name the folder every db of a folder used to share.

#include <sqlite3.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/catch.h"
#include "tests/cli_support.h"
#include "tests/test_paths.h"

namespace {

namespace fs = std::filesystem;

using harness::test::Result;

const std::string kReplaySmall = std::string(HARNESS_TEST_DATA_DIR) + "/cli/replay_small.json";

// Runs `sql` on the db at `path` with SQLite itself (what a user editing a db could do).
void exec_sql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) == SQLITE_OK);
  char* message = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &message);
  const std::string error = message ? message : "";
  sqlite3_free(message);
  sqlite3_close(db);
  INFO(sql);
  REQUIRE(error.empty());
  REQUIRE(rc == SQLITE_OK);
}

struct Folder : harness::test::Sandbox {
  Folder() : harness::test::Sandbox("harness-cli-artifacts") {}
  std::string db_at(const std::string& name) const { return (dir / name).string(); }
  // A command on the db `name` of this folder.
  Result on(const std::string& name, const std::string& args) const {
    return harness(args + " --db " + db_at(name), "HARNESS_ALLOW_FAULTS=1");
  }
  nlohmann::json json(const std::string& name, const std::string& args) const {
    const Result result = on(name, args + " --json");
    INFO(name << ": " << args << "\n" << result.err);
    REQUIRE(result.exit_code == 0);
    return nlohmann::json::parse(result.out);
  }
  // The files of a run's artifact rows (paths relative to the folder of the db `name`).
  std::vector<fs::path> files_of(const nlohmann::json& run, const std::string& name) const {
    std::vector<fs::path> files;
    for (const auto& artifact : run["artifacts"])
      files.push_back((dir / name).parent_path() / artifact["path"].get<std::string>());
    return files;
  }
};

bool all_exist(const std::vector<fs::path>& files) {
  for (const auto& file : files)
    if (!fs::exists(file)) {
      UNSCOPED_INFO("missing: " << file);
      return false;
    }
  return true;
}

void wait_past_a_second() { std::this_thread::sleep_for(std::chrono::milliseconds(1100)); }

}  // namespace

TEST_CASE("two dbs in one folder: vacuum and prune of one leave the other's artifacts", "[cli][db][artifacts]") {
  Folder folder;
  const auto run_a = folder.json("a.db", "run " + kReplaySmall + " --device cpu --keep-capsules --set mask.seed=5");
  const auto run_b = folder.json("b.db", "run " + kReplaySmall + " --device cpu --keep-capsules");
  const auto files_a = folder.files_of(run_a, "a.db"), files_b = folder.files_of(run_b, "b.db");
  REQUIRE(files_a.size() == 5);
  REQUIRE(files_b.size() == 5);
  REQUIRE(all_exist(files_a));
  // Each db's files lie in its own folder.
  for (const auto& file : files_a) CHECK(file.parent_path().filename() == "a.db.artifacts");
  for (const auto& file : files_b) CHECK(file.parent_path().filename() == "b.db.artifacts");

  // b's vacuum sees none of a's files as its orphans.
  const auto vacuum = folder.json("b.db", "db vacuum");
  CHECK(vacuum["removed_files"] == 0);
  CHECK(all_exist(files_a));
  CHECK(all_exist(files_b));

  // b's prune removes b's capsules only.
  wait_past_a_second();
  const auto prune = folder.json("b.db", "db prune --older-than 0s");
  CHECK(prune["removed_files"] == 5);
  for (const auto& file : files_b) CHECK_FALSE(fs::exists(file));
  CHECK(all_exist(files_a));
  const auto check_a = folder.json("a.db", "db check");
  CHECK(check_a["missing_files"].empty());
  CHECK(check_a["orphaned_files"].empty());
}

TEST_CASE("rows that name files outside the db's artifact folder: flagged by db check, never deleted",
          "[cli][db][artifacts]") {
  Folder folder;
  fs::create_directories(folder.dir / "lab");
  const std::string db = "lab/test.db";
  const auto run = folder.json(db, "run " + kReplaySmall + " --device cpu --keep-capsules");
  const int64_t run_id = run["run"]["id"].get<int64_t>();
  const auto kept = folder.files_of(run, db);
  REQUIRE(kept.size() == 5);
  const fs::path own = kept.front().parent_path();

  // Files of someone else: beside the db's folder, in another folder, behind a symbolic link.
  const fs::path victim = folder.dir / "victim.txt", absolute_victim = folder.dir / "elsewhere" / "victim2.txt",
                 linked_victim = folder.dir / "outside" / "victim3.txt";
  fs::create_directories(absolute_victim.parent_path());
  fs::create_directories(linked_victim.parent_path());
  for (const auto& file : {victim, absolute_victim, linked_victim}) std::ofstream(file) << "not the harness's";
  fs::create_directory_symlink(folder.dir / "outside", own / "escape");
  const std::string own_name = own.filename().string();
  for (const std::string& path : {std::string("artifacts/../../victim.txt"), absolute_victim.string(),
                                  own_name + "/escape/victim3.txt", own_name + "/../../victim.txt"})
    exec_sql(folder.db_at(db), "INSERT INTO artifacts (run_id, kind, sha256, path, bytes) VALUES (" +
                                   std::to_string(run_id) + ", 'capsule', 'ab', '" + path + "', 17)");

  const Result check = folder.on(db, "db check --json");
  INFO(check.err);
  CHECK(check.exit_code == 3);
  const auto report = nlohmann::json::parse(check.out);
  REQUIRE(report["outside_rows"].size() == 4);
  for (const auto& row : report["outside_rows"]) CHECK_FALSE(row["problem"].get<std::string>().empty());
  const Result text = folder.on(db, "db check");
  CHECK(text.out.find("artifacts/../../victim.txt") != std::string::npos);

  CHECK(folder.json(db, "db vacuum")["removed_files"] == 0);
  wait_past_a_second();
  const auto prune = folder.json(db, "db prune --older-than 0s");
  CHECK(prune["artifacts"] == 9);
  CHECK(prune["removed_files"] == 5);  // the run's own capsules and outputs
  CHECK(fs::exists(victim));
  CHECK(fs::exists(absolute_victim));
  CHECK(fs::exists(linked_victim));
}

TEST_CASE("replay and show refuse an artifact row that leaves the artifact folder", "[cli][db][artifacts]") {
  Folder folder;
  const auto run = folder.json("test.db", "run " + kReplaySmall + " --device cpu");
  const std::string run_id = std::to_string(run["run"]["id"].get<int64_t>());
  std::ofstream(folder.dir / "victim.txt") << "secret";
  // The thrown trial's capsule row now names a file outside.
  exec_sql(folder.db_at("test.db"), "UPDATE artifacts SET path = '/etc/hostname' WHERE kind = 'capsule'");
  const Result replay = folder.on("test.db", "replay " + run_id + " --variant throw --device cpu");
  INFO(replay.err);
  CHECK(replay.exit_code == 2);
  CHECK(replay.err.find("/etc/hostname") != std::string::npos);
  CHECK(replay.err.find("outside") != std::string::npos);
  const Result show = folder.on("test.db", "show " + run_id);
  CHECK(show.exit_code == 0);
  CHECK(show.out.find("load_file('/etc/hostname')") == std::string::npos);
}

TEST_CASE("a db whose rows name the shared artifacts/ folder of older versions: read, never deleted from",
          "[cli][db][artifacts]") {
  Folder folder;
  const auto run = folder.json("test.db", "run " + kReplaySmall + " --device cpu --keep-capsules");
  const std::string run_id = std::to_string(run["run"]["id"].get<int64_t>());
  // The layout older versions wrote: every db of the folder kept its files in <folder>/artifacts.
  const fs::path own = folder.dir / "test.db.artifacts", shared = folder.dir / "artifacts";
  if (fs::exists(own)) {
    fs::rename(own, shared);
    exec_sql(folder.db_at("test.db"), "UPDATE artifacts SET path = 'artifacts/' || substr(path, length('test.db.artifacts/') + 1)");
  }
  std::vector<fs::path> files;
  const auto shown = folder.json("test.db", "show " + run_id);  // kept: the loop below reads into it
  for (const auto& artifact : shown["artifacts"]) {
    REQUIRE(artifact["path"].get<std::string>().rfind("artifacts/", 0) == 0);
    files.push_back(folder.dir / artifact["path"].get<std::string>());
  }
  REQUIRE(files.size() == 5);
  const auto check = folder.json("test.db", "db check");
  CHECK(check["missing_files"].empty());
  CHECK(check["outside_rows"].empty());
  CHECK(check["shared_folder_rows"] == 5);
  // Read as before: the kept passing trial replays from the shared folder.
  CHECK(folder.json("test.db", "replay " + run_id + " --variant fused --device cpu")["replay"]["status"] == "ok");

  // Another db of the folder may name the same files: prune drops the rows and keeps the files
  // (the replay's own rows may name the shared capsule too; its new files are its db's own).
  wait_past_a_second();
  const auto prune = folder.json("test.db", "db prune --older-than 0s");
  CHECK(prune["artifacts"] >= 5);
  CHECK(prune["kept_files"]["shared_folder"] == 5);
  CHECK(all_exist(files));
  CHECK(folder.json("test.db", "db vacuum")["removed_files"] == 0);
  CHECK(all_exist(files));
}
