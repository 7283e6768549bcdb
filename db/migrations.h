#pragma once
// Internal to db/: the schema's versions and how a db moves from one to the next.

#include <string>

struct sqlite3;

namespace harness::db::detail {

//! PRAGMA user_version of the open db (0 for a new file). Throws DbError (e.g. not a db).
int read_schema_version(sqlite3* db, const std::string& path);

//! Throws DbError naming both versions when `version` is newer than this binary's schema.
void check_not_newer(int version, const std::string& path);

//! Brings the db up to `target_version`, one transaction per step. Safe when several processes
//! open a new db at once: each step re-reads the version under the write lock.
//! Throws DbError when the db is newer than this binary or is some other program's db.
void migrate(sqlite3* db, const std::string& path, int target_version);

}  // namespace harness::db::detail
