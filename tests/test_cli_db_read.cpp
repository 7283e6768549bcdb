// Reading commands (runs, show, diff, writeup, list, db check) open the db read-only: they never
// create a file, write a schema into an empty one or leave a journal beside a device; and
// `db check` of a damaged db lists what SQLite's integrity_check finds (page and table), not one
// line.

#include <sqlite3.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/catch.h"
#include "tests/cli_support.h"
#include "tests/test_paths.h"

namespace {

namespace fs = std::filesystem;

using harness::test::has;
using harness::test::Result;

const std::string kFaults = std::string(HARNESS_TEST_DATA_DIR) + "/cli/faults.json";
const std::vector<std::string> kReadingCommands = {"runs", "runs --json", "show 1", "diff 1 2", "writeup 1", "db check"};

struct Box : harness::test::Sandbox {
  Box() : harness::test::Sandbox("harness-cli-db-read") {}
  // The names in the folder, without the captured output.
  std::set<std::string> files() const {
    std::set<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir))
      if (entry.path().filename() != "stdout" && entry.path().filename() != "stderr")
        names.insert(entry.path().filename().string());
    return names;
  }
  Result run_fused(const std::string& db_path) const {
    return harness("run " + kFaults + " --device cpu --set 'variants={\"fused\":{\"impl\":\"fused\"}}' --db " + db_path,
                   "HARNESS_ALLOW_FAULTS=1");
  }
};

std::string scalar(const std::string& db_path, const std::string& sql) {
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK);
  sqlite3_stmt* statement = nullptr;
  std::string value;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &statement, nullptr) == SQLITE_OK && sqlite3_step(statement) == SQLITE_ROW)
    value = reinterpret_cast<const char*>(sqlite3_column_text(statement, 0));
  sqlite3_finalize(statement);
  sqlite3_close(db);
  return value;
}

}  // namespace

TEST_CASE("reading commands on a 0-byte file write nothing into it and create nothing beside it",
          "[cli][db][read_only]") {
  Box box;
  const fs::path empty = box.dir / "empty.db";
  { std::ofstream touch(empty); }
  for (const std::string& command : kReadingCommands) {
    const Result result = box.harness(command + " --db " + empty.string());
    INFO(command << ": " << result.err);
    CHECK(result.exit_code == 2);
    CHECK(has(result.err + result.out, "empty"));
    CHECK(fs::file_size(empty) == 0);
    CHECK(box.files() == std::set<std::string>{"empty.db"});
  }
}

TEST_CASE("a reading command on --db /dev/null leaves no journal in /dev", "[cli][db][read_only]") {
  Box box;
  // Debris of the defect itself on this machine (a regular file in /dev) is removed first.
  for (const char* debris : {"/dev/null-journal", "/dev/null-wal", "/dev/null-shm"})
    if (fs::is_regular_file(debris)) fs::remove(debris);
  for (const std::string& command : kReadingCommands) {
    const Result result = box.harness(command + " --db /dev/null");
    INFO(command << ": " << result.err);
    CHECK(result.exit_code == 2);
    for (const char* debris : {"/dev/null-journal", "/dev/null-wal", "/dev/null-shm"}) CHECK_FALSE(fs::exists(debris));
  }
}

TEST_CASE("reading commands leave a db's bytes as they were", "[cli][db][read_only]") {
  Box box;
  const std::string db_path = (box.dir / "test.db").string();
  for (int i = 0; i < 2; ++i) REQUIRE(box.run_fused(db_path).exit_code == 0);
  const std::string bytes = harness::test::slurp(db_path);
  for (const std::string& command : kReadingCommands) {
    const Result result = box.harness(command + " --db " + db_path);
    INFO(command << ": " << result.err);
    CHECK(result.exit_code == 0);
    CHECK(harness::test::slurp(db_path) == bytes);
    // Beside a WAL db, SQLite's readers may leave its shared-memory index and an empty WAL.
    for (const std::string& name : box.files())
      CHECK((name == "test.db" || name == "test.db-wal" || name == "test.db-shm" || name == "test.db.artifacts"));
    if (fs::exists(db_path + "-wal")) CHECK(fs::file_size(db_path + "-wal") == 0);
  }
}

TEST_CASE("db check of a damaged db lists integrity_check's findings with page and table", "[cli][db][read_only]") {
  Box box;
  const std::string db_path = (box.dir / "test.db").string();
  for (int i = 0; i < 3; ++i) REQUIRE(box.run_fused(db_path).exit_code == 0);
  REQUIRE(box.harness("db vacuum --db " + db_path).exit_code == 0);  // every page in the main file
  // Random-looking bytes over the trials table's root page, its b-tree header included: SQLite's
  // integrity_check itself stops there ("database disk image is malformed").
  const int64_t root_page = std::stoll(scalar(db_path, "SELECT rootpage FROM sqlite_master WHERE name = 'trials'"));
  {
    std::fstream file(db_path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp((root_page - 1) * 4096);
    for (int i = 0; i < 3000; ++i) file.put(static_cast<char>((i * 2654435761u) >> 13));
  }
  const Result check = box.harness("db check --json --db " + db_path);
  INFO(check.err << check.out);
  CHECK(check.exit_code == 3);
  const auto report = nlohmann::json::parse(check.out);
  REQUIRE(report["integrity"].is_array());
  bool names_page = false, names_table = false;
  for (const auto& finding : report["integrity"]) {
    const std::string text = finding.dump();
    names_page = names_page || has(text, "page");
    names_table = names_table || has(text, "trials");
  }
  CHECK(names_page);
  CHECK(names_table);
  const Result text = box.harness("db check --db " + db_path);
  CHECK(has(text.out, "trials"));
}
