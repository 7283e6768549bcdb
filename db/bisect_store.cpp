// The bisect rows of the store (migration 4): one row per `harness bisect`, one per probe. The
// probes' runs are ordinary runs; a probe row only points at them.

#include <sqlite3.h>

#include "db/statement.h"
#include "db/store.h"

namespace harness::db {

using detail::Statement;
using detail::Transaction;

namespace {

constexpr const char* kBisectColumns =
    "id, experiment, mode, target, package, good, bad, status, first_bad, last_good, args, result, error, "
    "started_at, finished_at";

Bisect read_bisect(const Statement& row) {
  Bisect bisect;
  bisect.id = row.column_int(0);
  const std::string what = "read bisect " + std::to_string(bisect.id);
  bisect.experiment = row.column_text(1);
  bisect.mode = row.column_text(2);
  bisect.target = row.column_text(3);
  bisect.package = row.column_text(4);
  bisect.good = row.column_text(5);
  bisect.bad = row.column_text(6);
  bisect.status = row.column_text(7);
  bisect.first_bad = row.column_text(8);
  bisect.last_good = row.column_text(9);
  bisect.args = row.column_json(10, what + " args");
  bisect.result = row.column_json(11, what + " result");
  bisect.error = row.column_text(12);
  bisect.started_at = row.column_text(13);
  bisect.finished_at = row.column_text(14);
  return bisect;
}

}  // namespace

int64_t Store::begin_bisect(Bisect& bisect) {
  Transaction transaction(db_, path_, Transaction::Mode::kWrite, "begin bisect");
  bisect.status = "running";
  if (bisect.started_at.empty()) bisect.started_at = now_iso8601();
  Statement insert(db_, path_,
                   "INSERT INTO bisects (experiment, mode, target, package, good, bad, status, first_bad, last_good, "
                   "args, result, error, started_at, finished_at) "
                   "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, '', '', ?8, ?9, '', ?10, '')",
                   "insert bisect");
  insert.bind_text(1, bisect.experiment)
      .bind_text(2, bisect.mode)
      .bind_text(3, bisect.target)
      .bind_text(4, bisect.package)
      .bind_text(5, bisect.good)
      .bind_text(6, bisect.bad)
      .bind_text(7, bisect.status)
      .bind_text(8, canonical_json(bisect.args))
      .bind_text(9, canonical_json(bisect.result))
      .bind_text(10, bisect.started_at);
  insert.run();
  bisect.id = sqlite3_last_insert_rowid(db_);
  transaction.commit();
  return bisect.id;
}

int64_t Store::add_bisect_probe(BisectProbe& probe) {
  Transaction transaction(db_, path_, Transaction::Mode::kWrite, "add bisect probe");
  if (probe.started_at.empty()) probe.started_at = now_iso8601();
  Statement insert(db_, path_,
                   "INSERT INTO bisect_probes (bisect_id, seq, position, label, outcome, reason, run_ids, details, "
                   "started_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                   "insert bisect probe");
  insert.bind_int(1, probe.bisect_id)
      .bind_int(2, probe.seq)
      .bind_int(3, probe.position)
      .bind_text(4, probe.label)
      .bind_text(5, probe.outcome)
      .bind_text(6, probe.reason)
      .bind_text(7, canonical_json(nlohmann::json(probe.run_ids)))
      .bind_text(8, canonical_json(probe.details))
      .bind_text(9, probe.started_at);
  insert.run();
  probe.id = sqlite3_last_insert_rowid(db_);
  transaction.commit();
  return probe.id;
}

void Store::finish_bisect(int64_t bisect_id, const std::string& status, const std::string& last_good,
                          const std::string& first_bad, const nlohmann::json& result, const std::string& error) {
  const std::string operation = "finish bisect " + std::to_string(bisect_id);
  Transaction transaction(db_, path_, Transaction::Mode::kWrite, operation);
  Statement update(db_, path_,
                   "UPDATE bisects SET status = ?2, last_good = ?3, first_bad = ?4, result = ?5, error = ?6, "
                   "finished_at = ?7 WHERE id = ?1",
                   operation);
  update.bind_int(1, bisect_id)
      .bind_text(2, status)
      .bind_text(3, last_good)
      .bind_text(4, first_bad)
      .bind_text(5, canonical_json(result))
      .bind_text(6, error)
      .bind_text(7, now_iso8601());
  update.run();
  if (sqlite3_changes(db_) == 0) throw DbError(path_ + ": " + operation + ": no such bisect");
  transaction.commit();
}

std::optional<Bisect> Store::get_bisect(int64_t bisect_id) const {
  const std::string sql = std::string("SELECT ") + kBisectColumns + " FROM bisects WHERE id = ?1";
  Statement select(db_, path_, sql.c_str(), "get bisect " + std::to_string(bisect_id));
  select.bind_int(1, bisect_id);
  if (!select.step()) return std::nullopt;
  return read_bisect(select);
}

std::vector<BisectProbe> Store::list_bisect_probes(int64_t bisect_id) const {
  const std::string operation = "list probes of bisect " + std::to_string(bisect_id);
  Statement select(db_, path_,
                   "SELECT id, bisect_id, seq, position, label, outcome, reason, run_ids, details, started_at "
                   "FROM bisect_probes WHERE bisect_id = ?1 ORDER BY seq, id",
                   operation);
  select.bind_int(1, bisect_id);
  std::vector<BisectProbe> probes;
  while (select.step()) {
    BisectProbe probe;
    probe.id = select.column_int(0);
    probe.bisect_id = select.column_int(1);
    probe.seq = static_cast<int>(select.column_int(2));
    probe.position = static_cast<int>(select.column_int(3));
    probe.label = select.column_text(4);
    probe.outcome = select.column_text(5);
    probe.reason = select.column_text(6);
    probe.run_ids = select.column_json(7, operation).get<std::vector<int64_t>>();
    probe.details = select.column_json(8, operation);
    probe.started_at = select.column_text(9);
    probes.push_back(std::move(probe));
  }
  return probes;
}

std::vector<Bisect> Store::list_bisects() const {
  const std::string sql = std::string("SELECT ") + kBisectColumns + " FROM bisects ORDER BY id DESC";
  Statement select(db_, path_, sql.c_str(), "list bisects");
  std::vector<Bisect> bisects;
  while (select.step()) bisects.push_back(read_bisect(select));
  return bisects;
}

}  // namespace harness::db
