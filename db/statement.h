#pragma once
// Internal to db/: RAII wrappers over the SQLite C API (prepared statements, transactions) whose
// failures become DbError naming the db path and the operation.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

struct sqlite3;
struct sqlite3_stmt;

namespace harness::db::detail {

//! Throws DbError "<path>: <operation>: <sqlite's message for db>".
[[noreturn]] void throw_sqlite_error(sqlite3* db, const std::string& path, const std::string& operation);

//! Runs constant SQL without parameters (schema DDL, BEGIN/COMMIT, pragmas). Never for values.
void exec_sql(sqlite3* db, const std::string& path, const char* sql, const std::string& operation);

//! One prepared statement; parameters are 1-based, columns 0-based (SQLite's convention).
class Statement {
 public:
  //! Prepares `sql`; failures name `operation`.
  Statement(sqlite3* db, const std::string& path, const char* sql, std::string operation);
  ~Statement();
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  Statement& bind_int(int index, int64_t value);
  Statement& bind_real(int index, double value);
  Statement& bind_text(int index, std::string_view value);
  Statement& bind_null(int index);
  //! Binds the value, or NULL when empty.
  Statement& bind_optional_int(int index, const std::optional<int64_t>& value);

  //! Advances: true when a row is ready, false when done. Throws DbError on failure.
  bool step();
  //! Steps a statement that returns no rows.
  void run();
  //! Makes the statement ready to run again with new bindings.
  void reset();

  bool is_null(int column) const;
  int64_t column_int(int column) const;
  double column_real(int column) const;
  //! Text of the column ("" for NULL).
  std::string column_text(int column) const;
  //! The value, or nullopt for NULL.
  std::optional<int64_t> column_optional_int(int column) const;
  //! The column's text parsed as JSON; DbError "<path>: <what>: stored JSON does not parse: ..."
  //! when it does not.
  nlohmann::json column_json(int column, const std::string& what) const;

 private:
  void check_bind(int rc);

  sqlite3* db_;
  std::string path_;
  std::string operation_;
  sqlite3_stmt* stmt_ = nullptr;
};

//! A transaction that rolls back unless committed. Writers open it IMMEDIATE: the write lock is
//! taken up front (waiting out the busy timeout), so a read-then-write never fails with
//! SQLITE_BUSY_SNAPSHOT when another process committed in between.
class Transaction {
 public:
  enum class Mode { kRead, kWrite };
  Transaction(sqlite3* db, const std::string& path, Mode mode, std::string operation);
  ~Transaction();
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;

  void commit();

 private:
  sqlite3* db_;
  std::string path_;
  std::string operation_;
  bool open_ = true;
};

}  // namespace harness::db::detail
