#include "analysis/run_sections.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>

#include "analysis/memory_snapshot.h"
#include "analysis/series.h"
#include "core/json_input.h"
#include "db/artifact_paths.h"
#include "experiments/sweep.h"

namespace harness::analysis {
namespace {

// Metrics shown first, in this order; any others follow alphabetically.
const std::vector<std::string> kMetricOrder = {"fwd_peak_bytes", "bwd_peak_bytes", "fwd_ms", "bwd_ms", "match",
                                               "max_abs_err"};
// Shown by `show` only: per-tensor errors (max_abs_err summarizes them) and the fits' values (the
// verdict shows them).
bool detail_only(const std::string& name) {
  const bool per_tensor_error = name != "max_abs_err" && name.ends_with("_err");
  return per_tensor_error || name.rfind("r2_", 0) == 0 || name.rfind("slope_", 0) == 0;
}

// Model predictions are shown inside the measured metric's cell, not as rows of their own.
bool is_model(const std::string& name) { return name.rfind("model_", 0) == 0; }

std::string text_of(const nlohmann::json& value) { return value.is_string() ? value.get<std::string>() : value.dump(); }

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

// Medians with spread per (variant, metric) of metrics measured at one point.
using Summaries = std::map<std::pair<std::string, std::string>, Series>;

Summaries summaries_of(const std::vector<db::Metric>& metrics) {
  Summaries out;
  for (auto& s : collect_series(metrics)) out.emplace(std::make_pair(s.variant, s.metric), std::move(s));
  return out;
}

std::string summary_cell(const Series& s) {
  std::string cell = format_value(s.spread.median, s.unit);
  if (s.spread.count > 1 && s.spread.max > s.spread.min && s.unit == "ms")
    cell += fmt::format(" [{}–{}]", format_value(s.spread.min, s.unit), format_value(s.spread.max, s.unit));
  return cell;
}

// The measured value, and beside it the model's prediction with its relative error.
std::string metric_cell(const Summaries& summaries, const std::string& variant, const std::string& name) {
  const auto measured = summaries.find({variant, name});
  const auto model = summaries.find({variant, "model_" + name});
  std::string cell = measured == summaries.end() ? "-" : summary_cell(measured->second);
  if (model != summaries.end()) {
    cell += " (model " + format_value(model->second.spread.median, model->second.unit);
    if (measured != summaries.end() && measured->second.spread.median > 0)
      cell += fmt::format(", {:+.1f}%", 100.0 * (model->second.spread.median - measured->second.spread.median) /
                                            measured->second.spread.median);
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

}  // namespace

std::string first_line(const std::string& text) {
  const auto newline = text.find('\n');
  return newline == std::string::npos ? text : text.substr(0, newline);
}

std::vector<std::string> run_header_lines(const db::RunDetail& detail) {
  const auto& run = detail.run;
  const auto& spec = detail.spec;
  std::vector<std::string> lines;
  lines.push_back(fmt::format("run {} · {}", run.id, run.experiment));
  if (spec.contains("hypothesis")) lines.push_back("hypothesis: " + text_of(spec["hypothesis"]));
  lines.push_back(fmt::format("device {} · profile {} · status {} · started {} · finished {}", run.device,
                              run.profile.empty() ? "none" : run.profile, run.status, run.started_at,
                              run.finished_at.empty() ? "-" : run.finished_at));
  if (spec.contains("dims")) lines.push_back("dims: " + spec["dims"].dump());
  if (spec.contains("mask")) lines.push_back("mask: " + spec["mask"].dump());
  if (run.args.contains("slurm") && run.args["slurm"].is_object()) {
    const auto& slurm = run.args["slurm"];
    lines.push_back(fmt::format("slurm: job {} · {} array task{} · up to {} retr{} per task · run folder {}",
                                slurm.value("job_id", "-"), slurm.value("tasks", 0), slurm.value("tasks", 0) == 1 ? "" : "s",
                                slurm.value("retries", 0), slurm.value("retries", 0) == 1 ? "y" : "ies",
                                slurm.value("run_dir", "-")));
  }
  if (!run.args.empty()) lines.push_back("args: " + run.args.dump());
  if (!run.error.empty()) lines.push_back("error: " + run.error);
  return lines;
}

Table run_metrics_table(const db::RunDetail& detail, bool all) {
  const auto points = trial_points(detail);
  Table table;
  if (points.size() <= 1) {
    const auto metrics = points.empty() ? detail.metrics : metrics_at(detail.metrics, points.front());
    const auto summaries = summaries_of(metrics);
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
    return table;
  }
  // A sweep: one row per point and variant.
  std::vector<db::Metric> trial_metrics;
  for (const auto& m : detail.metrics)
    if (!m.point.empty()) trial_metrics.push_back(m);
  const auto names = ordered_metric_names(trial_metrics, all);
  table.headers = {"point", "variant", "status"};
  table.right_align = {false, false, false};
  for (const auto& name : names) {
    table.headers.push_back(name);
    table.right_align.push_back(true);
  }
  for (const auto& trial : detail.trials) {
    const auto summaries = summaries_of(metrics_at(detail.metrics, trial.point));
    std::vector<std::string> row = {spec::point_label(trial.point), trial.variant, trial.status};
    for (const auto& name : names) row.push_back(metric_cell(summaries, trial.variant, name));
    table.rows.push_back(std::move(row));
  }
  return table;
}

Table run_trials_table(const db::RunDetail& detail) {
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
        if (!slurm.is_object() || !slurm.contains(key)) return std::string("-");
        return text_of(slurm[key]);
      };
      table.rows.back().insert(table.rows.back().end() - 1, {text("task"), text("attempt"), text("node"), text("state")});
    }
    if (sweep) table.rows.back().insert(table.rows.back().begin(), spec::point_label(trial.point));
  }
  return table;
}

std::vector<std::string> run_verdict_lines(const db::RunDetail& detail) {
  const auto& evidence = detail.run.evidence;
  std::vector<std::string> lines;
  std::string first = "verdict: " + (detail.run.verdict.empty() ? std::string("(none)") : detail.run.verdict);
  if (evidence.contains("if") && evidence["if"].is_string()) first += "   (rule: " + evidence["if"].get<std::string>() + ")";
  else if (evidence.contains("then") && !evidence.contains("if")) first += "   (rule: else)";
  lines.push_back(first);
  if (evidence.contains("reason") && evidence["reason"].is_string()) lines.push_back("  " + evidence["reason"].get<std::string>());
  if (evidence.contains("fits") && evidence["fits"].is_object()) {
    for (const auto& [variant, entry] : evidence["fits"].items()) {
      if (!entry.is_object()) continue;
      std::string line = "  " + variant + ": " + entry.value("metric", "") + " grows as " +
                         (entry.value("growth", "").empty() ? std::string("(too few points)") : entry.value("growth", ""));
      for (const auto& fit : entry.value("fits", nlohmann::json::array()))
        if (fit.is_object()) line += fmt::format("; {} R² {:.4f}", fit.value("model", ""), fit.value("r2", 0.0));
      lines.push_back(line);
    }
  }
  if (!evidence.contains("fits") && evidence.contains("points") && evidence["points"].is_array()) {
    for (const auto& point : evidence["points"])
      if (point.is_object() && point.contains("verdict"))
        lines.push_back("  " + spec::point_label(point.value("point", nlohmann::json::object())) + ": " +
                        point.value("verdict", ""));
  }
  // The values the deciding clause read, in the units of their metrics.
  if (!evidence.contains("values") || !evidence["values"].is_array()) return lines;
  for (const auto& value : evidence["values"]) {
    if (!value.is_object()) continue;
    const std::string metric = value.value("metric", "");
    const std::string unit = unit_from_name(metric);
    std::string line = "  " + value.value("variant", "") + "." + metric;
    if (value.contains("value") && value["value"].is_number()) line += " = " + format_value(value["value"].get<double>(), unit);
    if (value.contains("threshold") && value["threshold"].is_number() && value.value("op", "") != "!=")
      line += "  " + value.value("op", "") + " " + format_value(value["threshold"].get<double>(), unit);
    if (value.contains("held") && value["held"].is_boolean()) line += value["held"].get<bool>() ? "  (holds)" : "  (does not hold)";
    lines.push_back(line);
  }
  return lines;
}

const char* const kCheckTableTitle =
    "correctness check (against float64; bound = factor · lowp max + atol, mean bound = mean_factor · lowp mean + "
    "atol; lowp = the step rounded as a flash kernel rounds it)";

Table run_check_table(const db::RunDetail& detail) {
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
    for (auto item = tolerance->begin(); item != tolerance->end(); ++item) {
      const std::string& tensor = item.key();
      const nlohmann::json& judged = item.value();  // a named reference: lambdas below capture it
      if (!judged.is_object()) continue;
      const auto number = [&](const char* key) {
        const auto value = judged.find(key);
        return value != judged.end() && value->is_number() ? fmt::format("{:.3g}", value->get<double>()) : "-";
      };
      const auto text = [&](const char* key) {
        const auto value = judged.find(key);
        return value != judged.end() && value->is_string() ? value->get<std::string>() : std::string();
      };
      const bool match = judged.contains("match") && judged["match"].is_boolean() && judged["match"].get<bool>();
      std::vector<std::string> row = {trial.variant, tensor, number("max_abs_err"), number("lowp_err"), number("bound"),
                                      number("mean_abs_err"), number("lowp_mean_err"), number("mean_bound"),
                                      match ? (text("decided_by") == "rtol" ? "yes (rtol)" : "yes") : "NO: " + text("failed")};
      if (sweep) row.insert(row.begin(), spec::point_label(trial.point));
      table.rows.push_back(std::move(row));
    }
  }
  return table;
}

std::vector<std::string> run_check_failure_lines(const db::RunDetail& detail) {
  std::vector<std::string> lines;
  for (const auto& trial : detail.trials) {
    const auto failed = trial.details.find("check_failed");
    if (failed == trial.details.end() || !failed->is_string()) continue;
    lines.push_back("  " + trial.variant + (trial.point.empty() ? "" : " at " + spec::point_label(trial.point)) +
                    ": correctness check failed: " + failed->get<std::string>());
  }
  return lines;
}

Table run_dispatch_table(const db::RunDetail& detail) {
  Table dispatch;
  dispatch.headers = {"variant", "op", "impl", "device", "calls", "config", "reason"};
  for (const auto& trial : detail.trials) {
    if (!trial.dispatch.is_array()) continue;
    for (const auto& d : trial.dispatch) {
      if (!d.is_object()) continue;
      dispatch.rows.push_back({trial.variant, d.value("op", ""), d.value("impl", ""), d.value("device", ""),
                               std::to_string(d.value("calls", 1)), d.value("config", ""), d.value("reason", "")});
    }
  }
  return dispatch;
}

Table run_env_table(const db::RunDetail& detail) {
  Table env;
  env.headers = {"key", "value"};
  for (const auto& [key, value] : detail.env.items()) env.rows.push_back({key, text_of(value)});
  return env;
}

std::vector<StderrTail> run_stderr_tails(const db::RunDetail& detail) {
  std::vector<StderrTail> tails;
  for (const auto& trial : detail.trials) {
    if (trial.status == "ok" || trial.stderr_tail.empty()) continue;
    tails.push_back({fmt::format("stderr of {}{} ({}), last lines:", trial.variant,
                                 trial.point.empty() ? "" : " at " + spec::point_label(trial.point), trial.status),
                     trial.stderr_tail});
  }
  return tails;
}

std::vector<ArtifactEntry> run_artifacts(const db::RunDetail& detail, const std::string& db_path) {
  const db::ArtifactFolder folder(db_path);
  std::vector<ArtifactEntry> entries;
  for (const auto& artifact : detail.artifacts) {
    ArtifactEntry entry;
    entry.artifact = artifact;
    for (const auto& t : detail.trials)
      if (artifact.trial_id && t.id == *artifact.trial_id)
        entry.owner = fmt::format(" of {}{} (trial {}, {})", t.variant, t.point.empty() ? "" : " at " + t.point.dump(), t.id,
                                  t.status);
    const db::ResolvedArtifact resolved = folder.resolve(artifact.path);
    if (resolved.place == db::ResolvedArtifact::Place::outside) {
      // A row edited by hand or from someone else's db: named, never opened.
      entry.path = clip_text(artifact.path, 200);
      entry.outside = true;
      entry.summary = "(outside the db's artifact folder, not opened: " + resolved.problem + ")";
      entries.push_back(std::move(entry));
      continue;
    }
    entry.path = resolved.file;
    if (artifact.kind == "capsule" || artifact.kind == "outputs") {
      entry.open.push_back(fmt::format(
          "safetensors: python -c \"from safetensors.torch import load_file; print(load_file('{}').keys())\"", entry.path));
    } else if (artifact.kind == "memory_snapshot") {
      try {
        const auto summary = read_snapshot(entry.path);
        entry.summary = fmt::format("{} allocator events, peak {} allocated, largest block {}", summary.trace_events,
                                    format_bytes(static_cast<double>(summary.peak_allocated)),
                                    format_bytes(static_cast<double>(summary.largest_block)));
        if (summary.oom)
          entry.summary += fmt::format(", OOM asking {} with {} allocated",
                                       format_bytes(static_cast<double>(summary.oom->requested_bytes)),
                                       format_bytes(static_cast<double>(summary.oom->allocated)));
      } catch (const std::exception& error) {
        entry.summary = std::string("(cannot summarize: ") + error.what() + ")";
      }
      entry.open.push_back(fmt::format("memory_viz: python -m torch.cuda._memory_viz trace_plot {} -o snapshot.html "
                                       "(or drop the file on https://pytorch.org/memory_viz)",
                                       entry.path));
    } else if (artifact.kind == "trace") {
      entry.open.push_back("Perfetto: open it at https://ui.perfetto.dev (or chrome://tracing); the harness ranges name each phase");
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

const std::vector<std::string>& metric_columns() {
  static const std::vector<std::string> columns = {"run", "experiment", "variant", "point", "name", "value", "unit", "repeat"};
  return columns;
}

void append_metric_rows(Table& table, const db::RunDetail& detail) {
  for (const auto& m : detail.metrics)
    table.rows.push_back({std::to_string(detail.run.id), detail.run.experiment, m.variant, m.point.dump(), m.name,
                          format_exact(m.value), m.unit, std::to_string(m.repeat)});
}

void append_metric_json(nlohmann::json& rows, const db::RunDetail& detail) {
  for (const auto& m : detail.metrics)
    rows.push_back({{"run", detail.run.id}, {"experiment", detail.run.experiment}, {"variant", m.variant},
                    {"point", m.point}, {"name", m.name}, {"value", m.value}, {"unit", m.unit}, {"repeat", m.repeat}});
}

}  // namespace harness::analysis
