#include "harness/run_report.h"

#include <algorithm>
#include <ostream>
#include <set>

#include <fmt/format.h>

#include "core/printer.h"
#include "experiments/sweep.h"
#include "harness/summary.h"

namespace harness {
namespace {

// Metrics shown first, in this order; any others follow alphabetically.
const std::vector<std::string> kMetricOrder = {"fwd_peak_bytes", "bwd_peak_bytes", "fwd_ms", "bwd_ms", "match",
                                               "max_abs_err"};
std::vector<nlohmann::json> trial_points(const db::RunDetail& detail);

// Shown by `show` only: per-tensor errors (max_abs_err summarizes them) and the fits' values (the
// verdict shows them).
bool detail_only(const std::string& name) {
  const bool per_tensor_error = name != "max_abs_err" && name.size() > 4 && name.substr(name.size() - 4) == "_err";
  return per_tensor_error || name.rfind("r2_", 0) == 0 || name.rfind("slope_", 0) == 0;
}

// The correctness check of each trial that ran it: per tensor the errors against the float64
// reference, the flash-style reference's, and the bounds (experiments/tolerance.h).
void print_check(std::ostream& out, const db::RunDetail& detail) {
  Table table;
  table.headers = {"variant", "tensor", "max err", "lowp max", "bound", "mean err", "lowp mean", "mean bound", "ok"};
  table.right_align = {false, false, true, true, true, true, true, true, false};
  const bool sweep = trial_points(detail).size() > 1;
  if (sweep) {
    table.headers.insert(table.headers.begin(), "point");
    table.right_align.insert(table.right_align.begin(), false);
  }
  for (const auto& trial : detail.trials) {
    const auto tolerance = trial.details.find("tolerance");
    if (tolerance == trial.details.end() || !tolerance->is_object()) continue;
    for (const auto& [tensor, judged] : tolerance->items()) {
      if (!judged.is_object()) continue;
      const auto number = [&](const char* key) { return fmt::format("{:.3g}", judged.value(key, 0.0)); };
      const std::string failed = judged.value("failed", "");
      std::vector<std::string> row = {trial.variant, tensor, number("max_abs_err"), number("lowp_err"), number("bound"),
                                      number("mean_abs_err"), number("lowp_mean_err"), number("mean_bound"),
                                      judged.value("match", false) ? (judged.value("decided_by", "") == "rtol" ? "yes (rtol)" : "yes")
                                                                   : "NO: " + failed};
      if (sweep) row.insert(row.begin(), spec::point_label(trial.point));
      table.rows.push_back(std::move(row));
    }
  }
  if (table.rows.empty()) return;
  out << "\ncorrectness check (against float64; bound = factor · lowp max + atol, mean bound = mean_factor · lowp mean + "
         "atol;\nlowp = the step rounded as a flash kernel rounds it)\n";
  print_table(out, table);
}

// One line per trial whose check failed: which tensors, by how much.
void print_check_failures(std::ostream& out, const db::RunDetail& detail) {
  for (const auto& trial : detail.trials) {
    const auto failed = trial.details.find("check_failed");
    if (failed == trial.details.end() || !failed->is_string()) continue;
    out << "  " << trial.variant << (trial.point.empty() ? "" : " at " + spec::point_label(trial.point))
        << ": correctness check failed: " << failed->get<std::string>() << '\n';
  }
}

// Model predictions are shown inside the measured metric's cell, not as rows of their own.
bool is_model(const std::string& name) { return name.rfind("model_", 0) == 0; }

std::vector<std::string> ordered_metric_names(const std::vector<db::Metric>& metrics, bool all) {
  std::set<std::string> present;
  for (const auto& m : metrics) present.insert(m.name);
  std::vector<std::string> names;
  for (const auto& name : kMetricOrder)
    if (present.count(name)) names.push_back(name);
  for (const auto& name : present)
    if (std::find(names.begin(), names.end(), name) == names.end() && !is_model(name) && (all || !detail_only(name)))
      names.push_back(name);
  // A metric only the model has (the trial died before measuring it) still gets its column.
  for (const auto& name : present)
    if (is_model(name) && !present.count(name.substr(6)) && (all || !detail_only(name.substr(6))))
      names.push_back(name.substr(6));
  return names;
}

std::string summary_cell(const MetricSummary& s) {
  std::string cell = format_value(s.median, s.unit);
  if (s.count > 1 && s.max > s.min && s.unit == "ms")
    cell += fmt::format(" [{}–{}]", format_value(s.min, s.unit), format_value(s.max, s.unit));
  return cell;
}

using Summaries = std::map<std::pair<std::string, std::string>, MetricSummary>;

// The measured value, and beside it the model's prediction with its relative error.
std::string metric_cell(const Summaries& summaries, const std::string& variant, const std::string& name) {
  const auto measured = summaries.find({variant, name});
  const auto model = summaries.find({variant, "model_" + name});
  std::string cell = measured == summaries.end() ? "-" : summary_cell(measured->second);
  if (model != summaries.end()) {
    cell += " (model " + format_value(model->second.median, model->second.unit);
    if (measured != summaries.end() && measured->second.median > 0)
      cell += fmt::format(", {:+.1f}%", 100.0 * (model->second.median - measured->second.median) / measured->second.median);
    cell += ")";
  }
  return cell;
}

std::vector<db::Metric> metrics_at(const std::vector<db::Metric>& metrics, const nlohmann::json& point) {
  std::vector<db::Metric> out;
  for (const auto& m : metrics)
    if (m.point == point) out.push_back(m);
  return out;
}

std::vector<std::string> trial_variants(const db::RunDetail& detail) {
  std::vector<std::string> variants;
  for (const auto& trial : detail.trials)
    if (std::find(variants.begin(), variants.end(), trial.variant) == variants.end()) variants.push_back(trial.variant);
  return variants;
}

std::vector<nlohmann::json> trial_points(const db::RunDetail& detail) {
  std::vector<nlohmann::json> points;
  for (const auto& trial : detail.trials)
    if (std::find(points.begin(), points.end(), trial.point) == points.end()) points.push_back(trial.point);
  return points;
}

void print_metrics(std::ostream& out, const db::RunDetail& detail, bool all) {
  const auto points = trial_points(detail);
  if (points.size() <= 1) {
    const auto metrics = points.empty() ? detail.metrics : metrics_at(detail.metrics, points.front());
    const auto summaries = summarize(metrics);
    Table table;
    table.headers = {"metric"};
    table.right_align = {false};
    for (const auto& variant : trial_variants(detail)) {
      table.headers.push_back(variant);
      table.right_align.push_back(true);
    }
    for (const auto& name : ordered_metric_names(metrics, all)) {
      std::vector<std::string> row = {name};
      for (const auto& variant : trial_variants(detail)) row.push_back(metric_cell(summaries, variant, name));
      table.rows.push_back(std::move(row));
    }
    if (!table.rows.empty()) print_table(out, table);
    return;
  }
  // A sweep: one row per point and variant.
  std::vector<db::Metric> trial_metrics;
  for (const auto& m : detail.metrics)
    if (!m.point.empty()) trial_metrics.push_back(m);
  const auto names = ordered_metric_names(trial_metrics, all);
  Table table;
  table.headers = {"point", "variant", "status"};
  table.right_align = {false, false, false};
  for (const auto& name : names) {
    table.headers.push_back(name);
    table.right_align.push_back(true);
  }
  for (const auto& trial : detail.trials) {
    const auto summaries = summarize(metrics_at(detail.metrics, trial.point));
    std::vector<std::string> row = {spec::point_label(trial.point), trial.variant, trial.status};
    for (const auto& name : names) row.push_back(metric_cell(summaries, trial.variant, name));
    table.rows.push_back(std::move(row));
  }
  print_table(out, table);
}

void print_trials(std::ostream& out, const db::RunDetail& detail) {
  Table table;
  const bool sweep = trial_points(detail).size() > 1;
  table.headers = {"variant", "status", "time", "exit", "error"};
  table.right_align = {false, false, true, false, false};
  if (sweep) {
    table.headers.insert(table.headers.begin(), "point");
    table.right_align.insert(table.right_align.begin(), false);
  }
  // A Slurm run's trials say where they ran: array task, attempt, node and the task's Slurm state.
  bool on_slurm = false;
  for (const auto& trial : detail.trials) on_slurm = on_slurm || trial.details.contains("slurm");
  if (on_slurm) {
    const size_t at = table.headers.size() - 1;  // before "error"
    table.headers.insert(table.headers.begin() + static_cast<long>(at), {"task", "attempt", "node", "slurm"});
    table.right_align.insert(table.right_align.begin() + static_cast<long>(at), {true, true, false, false});
  }
  for (const auto& trial : detail.trials) {
    std::string exit = trial.signal ? fmt::format("signal {}", *trial.signal)
                                    : trial.exit_code ? std::to_string(*trial.exit_code) : "-";
    std::string error = first_line(trial.error);
    if (trial.requested_bytes) error += fmt::format(" (requested {})", format_bytes(static_cast<double>(*trial.requested_bytes)));
    table.rows.push_back({trial.variant, trial.status, fmt::format("{:.1f} s", trial.duration_s), exit, error});
    if (on_slurm) {
      const auto slurm = trial.details.value("slurm", nlohmann::json::object());
      const auto text = [&](const char* key) {
        if (!slurm.contains(key)) return std::string("-");
        return slurm[key].is_string() ? slurm[key].get<std::string>() : slurm[key].dump();
      };
      table.rows.back().insert(table.rows.back().end() - 1, {text("task"), text("attempt"), text("node"), text("state")});
    }
    if (sweep) table.rows.back().insert(table.rows.back().begin(), spec::point_label(trial.point));
  }
  print_table(out, table);
}

void print_verdict(std::ostream& out, const db::RunDetail& detail) {
  const auto& evidence = detail.run.evidence;
  out << "verdict: " << (detail.run.verdict.empty() ? "(none)" : detail.run.verdict);
  if (evidence.contains("if") && evidence["if"].is_string()) out << "   (rule: " << evidence["if"].get<std::string>() << ")";
  else if (evidence.contains("then") && !evidence.contains("if")) out << "   (rule: else)";
  out << '\n';
  if (evidence.contains("reason") && evidence["reason"].is_string())
    out << "  " << evidence["reason"].get<std::string>() << '\n';
  if (evidence.contains("fits") && evidence["fits"].is_object()) {
    for (const auto& [variant, entry] : evidence["fits"].items()) {
      std::string line = "  " + variant + ": " + entry.value("metric", "") + " grows as " +
                         (entry.value("growth", "").empty() ? std::string("(too few points)") : entry.value("growth", ""));
      for (const auto& fit : entry.value("fits", nlohmann::json::array()))
        line += fmt::format("; {} R² {:.4f}", fit.value("model", ""), fit.value("r2", 0.0));
      out << line << '\n';
    }
  }
  if (!evidence.contains("fits") && evidence.contains("points") && evidence["points"].is_array()) {
    for (const auto& point : evidence["points"])
      if (point.contains("verdict")) out << "  " << spec::point_label(point.value("point", nlohmann::json::object())) << ": " << point.value("verdict", "") << '\n';
  }
  // The values the deciding clause read, in the units of their metrics.
  if (!evidence.contains("values") || !evidence["values"].is_array()) return;
  for (const auto& value : evidence["values"]) {
    const std::string metric = value.value("metric", "");
    const std::string unit = metric.find("bytes") != std::string::npos ? "bytes"
                             : metric.size() > 3 && metric.substr(metric.size() - 3) == "_ms" ? "ms" : "";
    std::string line = "  " + value.value("variant", "") + "." + metric;
    if (value.contains("value") && value["value"].is_number())
      line += " = " + format_value(value["value"].get<double>(), unit);
    if (value.contains("threshold") && value["threshold"].is_number() && value.value("op", "") != "!=")
      line += "  " + value.value("op", "") + " " + format_value(value["threshold"].get<double>(), unit);
    if (value.contains("held")) line += value["held"].get<bool>() ? "  (holds)" : "  (does not hold)";
    out << line << '\n';
  }
}

}  // namespace

std::string first_line(const std::string& text) {
  const auto newline = text.find('\n');
  return newline == std::string::npos ? text : text.substr(0, newline);
}

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
  print_metrics(out, detail, false);
  print_verdict(out, detail);
  print_check_failures(out, detail);
  out << fmt::format("stored: `harness show {}` for env, dispatch trace, the correctness check and errors\n", detail.run.id);
}

void print_run_detail(std::ostream& out, const db::RunDetail& detail) {
  const auto& run = detail.run;
  const auto& spec = detail.spec;
  out << fmt::format("run {} · {}\n", run.id, run.experiment);
  if (spec.contains("hypothesis")) out << "hypothesis: " << spec["hypothesis"].get<std::string>() << '\n';
  out << fmt::format("device {} · profile {} · status {} · started {} · finished {}\n", run.device,
                     run.profile.empty() ? "none" : run.profile, run.status, run.started_at,
                     run.finished_at.empty() ? "-" : run.finished_at);
  if (spec.contains("dims")) out << "dims: " << spec["dims"].dump() << '\n';
  if (spec.contains("mask")) out << "mask: " << spec["mask"].dump() << '\n';
  if (run.args.contains("slurm")) {
    const auto& slurm = run.args["slurm"];
    out << fmt::format("slurm: job {} · {} array task{} · up to {} retr{} per task · run folder {}\n",
                       slurm.value("job_id", "-"), slurm.value("tasks", 0), slurm.value("tasks", 0) == 1 ? "" : "s",
                       slurm.value("retries", 0), slurm.value("retries", 0) == 1 ? "y" : "ies",
                       slurm.value("run_dir", "-"));
  }
  if (!run.args.empty()) out << "args: " << run.args.dump() << '\n';
  if (!run.error.empty()) out << "error: " << run.error << '\n';

  out << "\ntrials\n";
  print_trials(out, detail);
  out << "\nmetrics (median over repeats, [min–max] for times)\n";
  print_metrics(out, detail, true);
  print_check(out, detail);
  out << '\n';
  print_verdict(out, detail);
  print_check_failures(out, detail);

  out << "\ndispatch trace\n";
  Table dispatch;
  dispatch.headers = {"variant", "op", "impl", "device", "calls", "config", "reason"};
  for (const auto& trial : detail.trials)
    for (const auto& d : trial.dispatch)
      dispatch.rows.push_back({trial.variant, d.value("op", ""), d.value("impl", ""), d.value("device", ""),
                               std::to_string(d.value("calls", 1)), d.value("config", ""), d.value("reason", "")});
  if (dispatch.rows.empty()) out << "  (none recorded)\n";
  else print_table(out, dispatch);

  out << fmt::format("\nenv {}\n", run.env_id.substr(0, 16));
  Table env;
  env.headers = {"key", "value"};
  for (const auto& [key, value] : detail.env.items())
    env.rows.push_back({key, value.is_string() ? value.get<std::string>() : value.dump()});
  print_table(out, env);

  for (const auto& trial : detail.trials) {
    if (trial.status == "ok" || trial.stderr_tail.empty()) continue;
    out << fmt::format("\nstderr of {}{} ({}), last lines:\n", trial.variant,
                       trial.point.empty() ? "" : " at " + spec::point_label(trial.point), trial.status);
    out << trial.stderr_tail;
    if (trial.stderr_tail.back() != '\n') out << '\n';
  }
}

}  // namespace harness
