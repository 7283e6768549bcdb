#include "db/statement.h"

#include <sqlite3.h>

#include <utility>

#include "db/store.h"

namespace harness::db::detail {

void throw_sqlite_error(sqlite3* db, const std::string& path, const std::string& operation) {
  throw DbError(path + ": " + operation + ": " + (db ? sqlite3_errmsg(db) : "out of memory"),
                db ? sqlite3_extended_errcode(db) : SQLITE_NOMEM);
}

void exec_sql(sqlite3* db, const std::string& path, const char* sql, const std::string& operation) {
  if (sqlite3_exec(db, sql, nullptr, nullptr, nullptr) != SQLITE_OK) throw_sqlite_error(db, path, operation);
}

Statement::Statement(sqlite3* db, const std::string& path, const char* sql, std::string operation)
    : db_(db), path_(path), operation_(std::move(operation)) {
  if (sqlite3_prepare_v2(db_, sql, -1, &stmt_, nullptr) != SQLITE_OK) {
    sqlite3_finalize(stmt_);
    throw_sqlite_error(db_, path_, operation_);
  }
}

Statement::~Statement() { sqlite3_finalize(stmt_); }

void Statement::check_bind(int rc) {
  if (rc != SQLITE_OK) throw_sqlite_error(db_, path_, operation_);
}

Statement& Statement::bind_int(int index, int64_t value) {
  check_bind(sqlite3_bind_int64(stmt_, index, value));
  return *this;
}

Statement& Statement::bind_real(int index, double value) {
  check_bind(sqlite3_bind_double(stmt_, index, value));
  return *this;
}

Statement& Statement::bind_text(int index, std::string_view value) {
  // SQLITE_TRANSIENT: SQLite copies the bytes, so temporaries may be bound.
  check_bind(sqlite3_bind_text64(stmt_, index, value.data(), value.size(), SQLITE_TRANSIENT, SQLITE_UTF8));
  return *this;
}

Statement& Statement::bind_null(int index) {
  check_bind(sqlite3_bind_null(stmt_, index));
  return *this;
}

Statement& Statement::bind_optional_int(int index, const std::optional<int64_t>& value) {
  return value ? bind_int(index, *value) : bind_null(index);
}

bool Statement::step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  throw_sqlite_error(db_, path_, operation_);
}

void Statement::run() {
  while (step()) {
  }
}

void Statement::reset() {
  // sqlite3_reset repeats the last step's error, which run() has already thrown.
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
}

bool Statement::is_null(int column) const { return sqlite3_column_type(stmt_, column) == SQLITE_NULL; }

int64_t Statement::column_int(int column) const { return sqlite3_column_int64(stmt_, column); }

double Statement::column_real(int column) const { return sqlite3_column_double(stmt_, column); }

std::string Statement::column_text(int column) const {
  const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, column));
  if (!text) return {};
  return std::string(text, static_cast<size_t>(sqlite3_column_bytes(stmt_, column)));
}

nlohmann::json Statement::column_json(int column, const std::string& what) const {
  try {
    return nlohmann::json::parse(column_text(column));
  } catch (const nlohmann::json::parse_error& error) {
    throw DbError(path_ + ": " + what + ": stored JSON does not parse: " + error.what());
  }
}

std::optional<int64_t> Statement::column_optional_int(int column) const {
  if (is_null(column)) return std::nullopt;
  return column_int(column);
}

Transaction::Transaction(sqlite3* db, const std::string& path, Mode mode, std::string operation)
    : db_(db), path_(path), operation_(std::move(operation)) {
  exec_sql(db_, path_, mode == Mode::kWrite ? "BEGIN IMMEDIATE" : "BEGIN DEFERRED", operation_);
}

Transaction::~Transaction() {
  // Rolling back after a failed statement can itself fail (SQLite may already have rolled back);
  // the exception that got us here is the one worth reporting.
  if (open_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
}

void Transaction::commit() {
  exec_sql(db_, path_, "COMMIT", operation_);
  open_ = false;
}

}  // namespace harness::db::detail
