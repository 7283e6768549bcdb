#include "harness/cli/run_report.h"

#include <ostream>

#include <fmt/format.h>

#include "core/printer.h"
#include "harness/runner/summary.h"

namespace harness {
namespace {

void print_lines(std::ostream& out, const std::vector<std::string>& lines) {
  for (const auto& line : lines) out << line << '\n';
}

void print_nonempty(std::ostream& out, const Table& table) {
  if (!table.rows.empty()) print_table(out, table);
}

void print_nonempty_markdown(std::ostream& out, const Table& table) {
  if (!table.rows.empty()) print_markdown_table(out, table);
}

}  // namespace

nlohmann::json run_detail_json(const db::RunDetail& detail) {
  const auto& run = detail.run;
  nlohmann::json json;
  json["run"] = {{"id", run.id},           {"experiment", run.experiment}, {"spec_hash", run.spec_hash},
                 {"env_id", run.env_id},   {"device", run.device},         {"profile", run.profile},
                 {"status", run.status},   {"verdict", run.verdict},       {"evidence", run.evidence},
                 {"args", run.args},       {"error", run.error},           {"started_at", run.started_at},
                 {"finished_at", run.finished_at}};
  if (run.replay_of) json["run"]["replay_of"] = *run.replay_of;
  json["env"] = detail.env;
  json["spec"] = detail.spec;
  json["trials"] = nlohmann::json::array();
  for (const auto& t : detail.trials) {
    nlohmann::json trial = {{"id", t.id},         {"variant", t.variant},         {"point", t.point},
                            {"status", t.status}, {"error", t.error},             {"stderr_tail", t.stderr_tail},
                            {"dispatch", t.dispatch}, {"duration_s", t.duration_s}, {"started_at", t.started_at},
                            {"details", t.details}};
    trial["exit_code"] = t.exit_code ? nlohmann::json(*t.exit_code) : nlohmann::json();
    trial["signal"] = t.signal ? nlohmann::json(*t.signal) : nlohmann::json();
    trial["requested_bytes"] = t.requested_bytes ? nlohmann::json(*t.requested_bytes) : nlohmann::json();
    json["trials"].push_back(std::move(trial));
  }
  json["summary"] = nlohmann::json::object();
  for (const auto& [key, s] : summarize(detail.metrics))
    json["summary"][key.first.empty() ? "run" : key.first][key.second] = {
        {"median", s.median}, {"min", s.min}, {"max", s.max}, {"count", s.count}, {"unit", s.unit}};
  json["metrics"] = nlohmann::json::array();
  for (const auto& m : detail.metrics)
    json["metrics"].push_back({{"variant", m.variant}, {"point", m.point}, {"name", m.name},
                               {"value", m.value},     {"unit", m.unit},   {"repeat", m.repeat}});
  json["artifacts"] = nlohmann::json::array();
  for (const auto& a : detail.artifacts) {
    json["artifacts"].push_back({{"id", a.id}, {"kind", a.kind}, {"sha256", a.sha256}, {"path", a.path}, {"bytes", a.bytes}});
    if (a.trial_id) json["artifacts"].back()["trial_id"] = *a.trial_id;
  }
  return json;
}

void print_run_summary(std::ostream& out, const db::RunDetail& detail) {
  out << fmt::format("run {} · {} · {}{} · status {}\n", detail.run.id, detail.run.experiment, detail.run.device,
                     detail.run.profile.empty() ? "" : " (profile " + detail.run.profile + ")", detail.run.status);
  if (detail.run.args.contains("slurm")) {
    const auto& slurm = detail.run.args["slurm"];
    out << fmt::format("slurm job {} · {} array task{}{}\n", slurm.value("job_id", "-"), slurm.value("tasks", 0),
                       slurm.value("tasks", 0) == 1 ? "" : "s", detail.run.error.empty() ? "" : " · " + detail.run.error);
  }
  print_nonempty(out, analysis::run_metrics_table(detail, false));
  print_lines(out, analysis::run_verdict_lines(detail));
  print_lines(out, analysis::run_check_failure_lines(detail));
  out << fmt::format("stored: `harness show {}` for env, dispatch trace, the correctness check and errors\n",
                     detail.run.id);
}

void print_run_detail(std::ostream& out, const db::RunDetail& detail) {
  print_lines(out, analysis::run_header_lines(detail));
  out << "\ntrials\n";
  print_table(out, analysis::run_trials_table(detail));
  out << "\nmetrics (median over repeats, [min–max] for times)\n";
  print_nonempty(out, analysis::run_metrics_table(detail, true));
  const Table check = analysis::run_check_table(detail);
  if (!check.rows.empty()) {
    out << '\n' << analysis::kCheckTableTitle << '\n';
    print_table(out, check);
  }
  out << '\n';
  print_lines(out, analysis::run_verdict_lines(detail));
  print_lines(out, analysis::run_check_failure_lines(detail));

  out << "\ndispatch trace\n";
  const Table dispatch = analysis::run_dispatch_table(detail);
  if (dispatch.rows.empty()) out << "  (none recorded)\n";
  else print_table(out, dispatch);

  out << fmt::format("\nenv {}\n", detail.run.env_id.substr(0, 16));
  print_table(out, analysis::run_env_table(detail));

  for (const auto& tail : analysis::run_stderr_tails(detail)) {
    out << '\n' << tail.title << '\n' << tail.text;
    if (tail.text.back() != '\n') out << '\n';
  }
}

void print_run_artifacts(std::ostream& out, const db::RunDetail& detail, const std::string& db_path) {
  const auto artifacts = analysis::run_artifacts(detail, db_path);
  if (artifacts.empty()) return;
  out << "\nartifacts\n";
  for (const auto& entry : artifacts) {
    out << fmt::format("  {}{}: {} ({})\n", entry.artifact.kind, entry.owner, entry.path,
                       format_bytes(static_cast<double>(entry.artifact.bytes)));
    if (!entry.summary.empty()) out << "    " << entry.summary << '\n';
    for (const auto& line : entry.open) out << "    " << line << '\n';
  }
}

void print_run_markdown(std::ostream& out, const db::RunDetail& detail, const std::string& db_path) {
  // Db text goes into code spans and fences, whose content Markdown does not interpret.
  const auto fenced = [&](const std::string& text) {
    std::string fence = "```";
    while (text.find(fence) != std::string::npos) fence += '`';
    out << fence << "text\n" << text << (text.empty() || text.back() != '\n' ? "\n" : "") << fence << '\n';
  };
  const auto lines = analysis::run_header_lines(detail);
  out << "## " << markdown_cell(lines.front()) << "\n\n";
  std::string header;
  for (size_t i = 1; i < lines.size(); ++i) header += lines[i] + '\n';
  fenced(header);
  out << "\n### Trials\n\n";
  print_markdown_table(out, analysis::run_trials_table(detail));
  out << "\n### Metrics\n\nMedian over repeats, [min–max] for times.\n\n";
  print_nonempty_markdown(out, analysis::run_metrics_table(detail, true));
  const Table check = analysis::run_check_table(detail);
  if (!check.rows.empty()) {
    out << "\n### Correctness check\n\n" << markdown_cell(analysis::kCheckTableTitle) << "\n\n";
    print_markdown_table(out, check);
  }
  out << "\n### Verdict\n\n";
  std::string verdict;
  for (const auto& line : analysis::run_verdict_lines(detail)) verdict += line + '\n';
  for (const auto& line : analysis::run_check_failure_lines(detail)) verdict += line + '\n';
  fenced(verdict);
  out << "\n### Dispatch trace\n\n";
  const Table dispatch = analysis::run_dispatch_table(detail);
  if (dispatch.rows.empty()) out << "(none recorded)\n";
  else print_markdown_table(out, dispatch);
  out << "\n### Env " << detail.run.env_id.substr(0, 16) << "\n\n";
  print_markdown_table(out, analysis::run_env_table(detail));
  for (const auto& tail : analysis::run_stderr_tails(detail)) {
    out << '\n' << markdown_cell(tail.title) << "\n\n";
    fenced(tail.text);
  }
  const auto artifacts = analysis::run_artifacts(detail, db_path);
  if (artifacts.empty()) return;
  out << "\n### Artifacts\n\n";
  Table table;
  table.headers = {"kind", "owner", "file", "bytes", "open with"};
  for (const auto& entry : artifacts) {
    std::string open = entry.summary;
    for (const auto& line : entry.open) open += (open.empty() ? "" : "; ") + line;
    table.rows.push_back({entry.artifact.kind, entry.owner.empty() ? "-" : entry.owner.substr(4), entry.path,
                          format_bytes(static_cast<double>(entry.artifact.bytes)), open});
  }
  print_markdown_table(out, table);
}

}  // namespace harness
