#include "analysis/bisect.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "analysis/series.h"
#include "analysis/svg_plot.h"
#include "core/errors.h"
#include "core/printer.h"

namespace harness::analysis {
namespace {

std::string side_text(const SideValues& side, const std::string& unit) {
  std::string text = format_value(side.spread.median, unit);
  if (side.spread.count > 1 && side.spread.max > side.spread.min)
    text += fmt::format(" [{}–{}]", format_value(side.spread.min, unit), format_value(side.spread.max, unit));
  if (side.spread.count > 1) text += fmt::format(" ×{}", side.spread.count);
  return text;
}

MetricComparison compare(const BisectTarget& target, const SideValues& a, const SideValues& b, const std::string& unit) {
  MetricComparison comparison;
  comparison.variant = target.variant;
  comparison.metric = target.metric;
  comparison.unit = unit;
  comparison.a = a;
  comparison.b = b;
  judge(comparison);
  return comparison;
}

std::string how_judged(const MetricComparison& c) {
  if (c.rule == "mann-whitney" && c.test) return fmt::format("Mann-Whitney p = {:.3g}", c.test->p_value);
  return c.called ? "ranges apart" : "ranges overlap";
}

// The size of a change relative to the good end (its median, or the bad end's when that is 0).
double relative(double delta, const SideValues& good, const SideValues& bad) {
  const double scale = good.spread.median != 0.0 ? std::fabs(good.spread.median) : std::fabs(bad.spread.median);
  return scale == 0.0 ? 0.0 : std::fabs(delta) / scale;
}

std::string percent(double fraction) { return fmt::format("{:.3g} %", fraction * 100.0); }

std::string json_text(const nlohmann::json& object, const char* key) {
  if (!object.is_object() || !object.contains(key) || object[key].is_null()) return "";
  return object[key].is_string() ? object[key].get<std::string>() : object[key].dump();
}

// The probe of each candidate position (the last one when a position was probed twice).
std::map<int, const db::BisectProbe*> probes_by_position(const std::vector<db::BisectProbe>& probes) {
  std::map<int, const db::BisectProbe*> by_position;
  for (const auto& probe : probes) by_position[probe.position] = &probe;
  return by_position;
}

std::string runs_text(const std::vector<int64_t>& run_ids) {
  std::string text;
  for (const auto id : run_ids) text += (text.empty() ? "" : ", ") + std::to_string(id);
  return text.empty() ? "-" : text;
}

std::string metric_cell(const nlohmann::json& details) {
  const auto metric = details.value("metric", nlohmann::json());
  if (!metric.is_object()) return "-";
  SideValues side;
  side.spread.median = metric.value("median", 0.0);
  side.spread.min = metric.value("min", 0.0);
  side.spread.max = metric.value("max", 0.0);
  side.spread.count = metric.value("count", 0);
  return side_text(side, metric.value("unit", ""));
}

std::string answer_text(const db::Bisect& bisect) {
  const auto unresolved = bisect.result.value("unresolved", std::vector<std::string>());
  if (bisect.status == "found")
    return fmt::format("first bad: {} (last good: {})", bisect.first_bad, bisect.last_good);
  if (bisect.status == "range") {
    std::string candidates;
    for (const auto& label : unresolved) candidates += label + ", ";
    return fmt::format("the change is at one of {}{} (last good: {}; {} could not be probed)", candidates,
                       bisect.first_bad, bisect.last_good, unresolved.size() == 1 ? "it" : "they");
  }
  if (bisect.status == "running") return "still running (or stopped before it finished)";
  return bisect.status + (bisect.error.empty() ? "" : ": " + bisect.error);
}

std::string what_text(const db::Bisect& bisect) {
  const std::string over = bisect.package.empty() ? bisect.result.value("over", std::string("candidates"))
                                                  : "package " + bisect.package;
  return fmt::format("bisect {}: {} over {}, {} (good) -> {} (bad), by {}", bisect.id, bisect.experiment, over,
                     bisect.good, bisect.bad,
                     bisect.result.value("target", bisect.mode + (bisect.target.empty() ? "" : " " + bisect.target)));
}

}  // namespace

const char* outcome_name(ProbeOutcome outcome) {
  switch (outcome) {
    case ProbeOutcome::kGood: return "good";
    case ProbeOutcome::kBad: return "bad";
    case ProbeOutcome::kSkip: return "skip";
  }
  return "skip";
}

const char* mode_name(BisectMode mode) {
  switch (mode) {
    case BisectMode::kVerdict: return "verdict";
    case BisectMode::kStatus: return "status";
    case BisectMode::kMetric: return "metric";
  }
  return "verdict";
}

BisectSearch::BisectSearch(size_t count) : first_bad_(count - 1) {
  if (count < 2) throw std::invalid_argument("a bisect needs at least two candidates (good and bad)");
}

std::optional<size_t> BisectSearch::next() const {
  std::optional<size_t> best;
  double best_distance = 0.0;
  const double middle = (static_cast<double>(last_good_) + static_cast<double>(first_bad_)) / 2.0;
  for (size_t position = last_good_ + 1; position < first_bad_; ++position) {
    if (skipped_.count(position)) continue;
    const double distance = std::fabs(static_cast<double>(position) - middle);
    if (!best || distance < best_distance) {
      best = position;
      best_distance = distance;
    }
  }
  return best;
}

void BisectSearch::record(size_t position, ProbeOutcome outcome) {
  if (position <= last_good_ || position >= first_bad_)
    throw std::invalid_argument(fmt::format("probe {} lies outside the bracket ({}, {})", position, last_good_, first_bad_));
  switch (outcome) {
    case ProbeOutcome::kGood: last_good_ = position; break;
    case ProbeOutcome::kBad: first_bad_ = position; break;
    case ProbeOutcome::kSkip: skipped_.insert(position); break;
  }
}

std::vector<size_t> BisectSearch::unresolved() const {
  std::vector<size_t> positions;
  for (const size_t position : skipped_)
    if (position > last_good_ && position < first_bad_) positions.push_back(position);
  return positions;
}

int BisectSearch::max_probes(size_t count) {
  int probes = 0;
  for (size_t span = 1; span < count - 1; span *= 2) ++probes;
  return probes;
}

std::string BisectTarget::describe() const {
  switch (mode) {
    case BisectMode::kVerdict: return "verdict";
    case BisectMode::kStatus: return "status of " + variant;
    case BisectMode::kMetric:
      return fmt::format("{}{} (threshold {})", variant.empty() ? "" : variant + ".", metric, percent(threshold));
  }
  return "";
}

ProbeReading read_probe(const BisectTarget& target, const std::vector<db::RunDetail>& runs) {
  ProbeReading reading;
  if (runs.empty()) {
    reading.why_not = "no run";
    return reading;
  }
  const db::RunDetail& last = runs.back();
  if (last.run.status == "interrupted" || last.run.status == "running") {
    reading.why_not = "run " + std::to_string(last.run.id) + " did not finish (" + last.run.status + ")";
    return reading;
  }
  reading.verdict = last.run.verdict;
  std::vector<std::string> statuses;
  for (const auto& trial : last.trials)
    if (trial.variant == target.variant) statuses.push_back(trial.status);
  for (const auto& status : statuses) reading.status += (reading.status.empty() ? "" : ",") + status;
  switch (target.mode) {
    case BisectMode::kVerdict:
      reading.usable = !reading.verdict.empty();
      if (!reading.usable) reading.why_not = "run " + std::to_string(last.run.id) + " has no verdict";
      break;
    case BisectMode::kStatus:
      reading.usable = !statuses.empty();
      if (!reading.usable)
        reading.why_not = "run " + std::to_string(last.run.id) + " has no trial of variant " + target.variant;
      break;
    case BisectMode::kMetric: {
      SideValues pooled;
      std::string error;
      for (const auto& run : runs) {
        for (const auto& series : collect_series(run.metrics)) {
          if (series.variant != target.variant || series.metric != target.metric) continue;
          if (!series.point.empty() && !series.point.is_null() && series.point != nlohmann::json::object()) {
            error = "the metric is measured at several sweep points; bisect one point (--set)";
          }
          pooled.values.insert(pooled.values.end(), series.values.begin(), series.values.end());
          pooled.repeated = pooled.repeated || series.repeated;
          reading.unit = series.unit;
        }
      }
      if (!error.empty()) {
        reading.why_not = error;
      } else if (pooled.values.empty()) {
        std::string trial_error;
        for (const auto& trial : last.trials)
          if (trial.variant == target.variant && !trial.error.empty()) trial_error = trial.error;
        reading.why_not = fmt::format("run {} measured no {}.{}{}", last.run.id, target.variant, target.metric,
                                      trial_error.empty() ? "" : " (" + trial_error.substr(0, 200) + ")");
      } else {
        pooled.spread = spread_of(pooled.values);
        pooled.repeated = pooled.repeated || pooled.values.size() > 1;
        reading.metric = pooled;
        reading.usable = true;
      }
      break;
    }
  }
  return reading;
}

BisectTarget resolve_target(const BisectTarget& target, const db::RunDetail& good_run) {
  BisectTarget resolved = target;
  std::vector<std::string> variants;
  for (const auto& trial : good_run.trials)
    if (std::find(variants.begin(), variants.end(), trial.variant) == variants.end()) variants.push_back(trial.variant);
  auto listing = [](const std::vector<std::string>& names) {
    std::string text;
    for (const auto& name : names) text += (text.empty() ? "" : ", ") + name;
    return text.empty() ? std::string("none") : text;
  };
  if (!target.variant.empty() && std::find(variants.begin(), variants.end(), target.variant) == variants.end()) {
    throw UsageError(fmt::format("{}: {} has no variant '{}' (variants: {})",
                                 target.mode == BisectMode::kStatus ? "--status" : "--metric", good_run.run.experiment,
                                 target.variant, listing(variants)));
  }
  if (target.mode != BisectMode::kMetric) return resolved;
  std::vector<std::string> measuring, names;
  for (const auto& series : collect_series(good_run.metrics)) {
    if (std::find(names.begin(), names.end(), series.metric) == names.end()) names.push_back(series.metric);
    if (series.metric == target.metric &&
        std::find(measuring.begin(), measuring.end(), series.variant) == measuring.end())
      measuring.push_back(series.variant);
  }
  if (measuring.empty()) {
    throw UsageError(fmt::format("--metric {}: the good end's run {} measured no such metric (measured: {})",
                                 target.metric, good_run.run.id, listing(names)));
  }
  if (target.variant.empty()) {
    if (measuring.size() > 1) {
      throw UsageError(fmt::format("--metric {}: measured by several variants ({}); name one as VARIANT.{}", target.metric,
                                   listing(measuring), target.metric));
    }
    resolved.variant = measuring.front();
  } else if (std::find(measuring.begin(), measuring.end(), target.variant) == measuring.end()) {
    throw UsageError(fmt::format("--metric {}.{}: the good end's run {} has no such value (variants that measured {}: {})",
                                 target.variant, target.metric, good_run.run.id, target.metric, listing(measuring)));
  }
  return resolved;
}

void check_ends(const BisectTarget& target, const ProbeReading& good, const ProbeReading& bad,
                const std::string& good_label, const std::string& bad_label) {
  if (!good.usable) throw UsageError(fmt::format("--good {}: cannot be read: {}", good_label, good.why_not));
  if (!bad.usable) throw UsageError(fmt::format("--bad {}: cannot be read: {}", bad_label, bad.why_not));
  switch (target.mode) {
    case BisectMode::kVerdict:
      if (good.verdict == bad.verdict) {
        throw UsageError(fmt::format("good {} and bad {} have the same verdict {}: nothing changed to bisect (bisect a "
                                     "trial status with --status VARIANT, or a metric with --metric)",
                                     good_label, bad_label, good.verdict));
      }
      return;
    case BisectMode::kStatus:
      if (good.status == bad.status) {
        throw UsageError(fmt::format("good {} and bad {} have the same status of {} ({}): nothing changed to bisect",
                                     good_label, bad_label, target.variant, good.status));
      }
      return;
    case BisectMode::kMetric: {
      const auto c = compare(target, *good.metric, *bad.metric, good.unit);
      const double change = relative(c.delta.value_or(0.0), *good.metric, *bad.metric);
      if (!c.called) {
        throw UsageError(fmt::format("{}: good {} ({}) and bad {} ({}) do not differ outside the noise ({}): no "
                                     "change to bisect",
                                     target.describe(), good_label, side_text(*good.metric, good.unit), bad_label,
                                     side_text(*bad.metric, bad.unit), how_judged(c)));
      }
      if (change < target.threshold) {
        throw UsageError(fmt::format("{}: good {} ({}) and bad {} ({}) differ by {}, less than the threshold",
                                     target.describe(), good_label, side_text(*good.metric, good.unit), bad_label,
                                     side_text(*bad.metric, bad.unit), percent(change)));
      }
      return;
    }
  }
}

ProbeJudgement judge_probe(const BisectTarget& target, const ProbeReading& good, const ProbeReading& bad,
                           const ProbeReading& probe) {
  ProbeJudgement judgement;
  if (!probe.usable) {
    judgement.reason = probe.why_not;
    return judgement;
  }
  auto decide = [&](const std::string& value, const std::string& good_value, const std::string& bad_value,
                    const std::string& what) {
    if (value == good_value) {
      judgement.outcome = ProbeOutcome::kGood;
      judgement.reason = what + " " + value + " (as good)";
    } else if (value == bad_value) {
      judgement.outcome = ProbeOutcome::kBad;
      judgement.reason = what + " " + value + " (as bad)";
    } else {
      judgement.reason = fmt::format("{} {} is neither good's ({}) nor bad's ({})", what, value, good_value, bad_value);
    }
  };
  switch (target.mode) {
    case BisectMode::kVerdict: decide(probe.verdict, good.verdict, bad.verdict, "verdict"); break;
    case BisectMode::kStatus: decide(probe.status, good.status, bad.status, target.variant); break;
    case BisectMode::kMetric: {
      // Moved away from an end: the diff calls the change (outside the noise), it goes the way
      // good -> bad goes, and it reaches the threshold.
      const double step = bad.metric->spread.median - good.metric->spread.median;
      const auto from_good = compare(target, *good.metric, *probe.metric, probe.unit);
      const auto to_bad = compare(target, *probe.metric, *bad.metric, probe.unit);
      auto moved = [&](const MetricComparison& c) {
        const double delta = c.delta.value_or(0.0);
        return c.called && delta * step > 0.0 &&
               relative(delta, *good.metric, *bad.metric) >= target.threshold;
      };
      const bool left_good = moved(from_good), short_of_bad = moved(to_bad);
      const std::string value = side_text(*probe.metric, probe.unit);
      if (left_good && !short_of_bad) {
        judgement.outcome = ProbeOutcome::kBad;
        judgement.reason = fmt::format("{}: moved from good ({}), as bad", value, how_judged(from_good));
      } else if (short_of_bad && !left_good) {
        judgement.outcome = ProbeOutcome::kGood;
        judgement.reason = fmt::format("{}: apart from bad ({}), as good", value, how_judged(to_bad));
      } else if (left_good && short_of_bad) {
        judgement.reason = fmt::format("{}: between good and bad, apart from both", value);
        judgement.inside_noise = true;
      } else {
        judgement.reason = fmt::format("{}: inside the noise of both ends (good: {}; bad: {})", value,
                                       how_judged(from_good), how_judged(to_bad));
        judgement.inside_noise = true;
      }
      break;
    }
  }
  return judgement;
}

std::vector<JsonChange> package_changes(const nlohmann::json& before, const nlohmann::json& after) {
  std::map<std::string, std::pair<std::string, std::string>> versions;
  auto add = [&](const nlohmann::json& packages, bool is_after) {
    if (!packages.is_object()) return;
    for (const auto& [name, version] : packages.items()) {
      auto& slot = versions[name];
      (is_after ? slot.second : slot.first) = version.is_string() ? version.get<std::string>() : version.dump();
    }
  };
  add(before, false);
  add(after, true);
  std::vector<JsonChange> changes;
  for (const auto& [name, pair] : versions) {
    if (pair.first == pair.second) continue;
    changes.push_back({"package", name, pair.first.empty() ? "(absent)" : pair.first,
                       pair.second.empty() ? "(absent)" : pair.second});
  }
  return changes;
}

Document bisect_document(const db::Bisect& bisect, const std::vector<db::BisectProbe>& probes,
                         const std::string& db_path) {
  Document doc;
  const auto& result = bisect.result;
  const std::string over = bisect.package.empty() ? result.value("over", std::string("candidates")) : bisect.package;
  doc.title = fmt::format("Bisect {}: {} over {} ({} -> {})", bisect.id, bisect.experiment, over, bisect.good, bisect.bad);
  if (const std::string hypothesis = result.value("hypothesis", std::string()); !hypothesis.empty())
    doc.paragraph("**Hypothesis of the experiment.** " + hypothesis);
  doc.paragraph(fmt::format("**Question.** Which {} changed the {} of `{}`: good at `{}`, bad at `{}`? {} candidates "
                            "in order{}; binary search with skip, each probe a stored run in its own env.",
                            bisect.package.empty() ? "candidate" : "version of `" + bisect.package + "`",
                            result.value("target", bisect.mode), bisect.experiment, bisect.good, bisect.bad,
                            result.value("candidates", nlohmann::json::array()).size(),
                            result.contains("source") ? " (from " + result.value("source", std::string()) + ")" : ""));
  doc.heading(2, "Answer");
  doc.paragraph("**" + answer_text(bisect) + "**");
  const int between = result.value("probes_between", 0), bound = result.value("max_probes", 0);
  if (bisect.status == "found" || bisect.status == "range") {
    doc.paragraph(fmt::format("{} probe{} between the ends ({} skipped), at most {} = ceil(log2({})) without skips; "
                              "plus the two ends.",
                              between, between == 1 ? "" : "s", result.value("skipped", 0), bound,
                              result.value("candidates", nlohmann::json::array()).size() - 1));
  }

  doc.heading(2, "Candidates");
  TableBlock table;
  table.headers = {"candidate", "probe", "outcome", "verdict", "status", "metric", "runs", "env", "reason"};
  table.right_align = {false, true, false, false, false, true, false, false, false};
  const auto by_position = probes_by_position(probes);
  const auto candidates = result.value("candidates", std::vector<std::string>());
  for (size_t position = 0; position < candidates.size(); ++position) {
    const auto found = by_position.find(static_cast<int>(position));
    std::string label = "`" + candidates[position] + "`";
    if (candidates[position] == bisect.first_bad) label += " **first bad**";
    if (candidates[position] == bisect.last_good) label += " last good";
    if (found == by_position.end()) {
      table.rows.push_back({label, "", "not probed", "", "", "", "", "", ""});
      continue;
    }
    const auto& probe = *found->second;
    const auto& details = probe.details;
    const auto env = details.value("env", nlohmann::json::object());
    std::string env_cell = json_text(env, "key");
    if (!env_cell.empty()) {
      env_cell = "`" + env_cell.substr(0, 8) + "`";
      if (env.value("reused", false)) env_cell += " reused";
      else if (env.contains("install_s")) env_cell += fmt::format(" {:.0f} s", env.value("install_s", 0.0));
    }
    table.rows.push_back({label, std::to_string(probe.seq), probe.outcome, json_text(details, "verdict"),
                          json_text(details, "status"), metric_cell(details), runs_text(probe.run_ids), env_cell,
                          probe.reason});
  }
  doc.table(table);

  // The plot: the target metric (or, bisecting a verdict or status, the metric the result names)
  // across the candidates, one colour per outcome.
  const std::string plot_metric = result.value("plot_metric", std::string());
  if (!plot_metric.empty()) {
    Plot plot;
    plot.title = fmt::format("{} across {}", plot_metric, over);
    plot.x_label = bisect.package.empty() ? "candidate" : bisect.package;
    plot.y_label = plot_metric;
    plot.categories = candidates;
    plot.x_scale = Scale::kLinear;
    std::map<std::string, PlotSeries> by_outcome;
    int color = 0;
    for (const char* outcome : {"good", "bad", "skip"}) {
      PlotSeries series;
      series.label = outcome;
      series.color = color++;
      series.line = false;
      series.marker = std::string(outcome) == "skip" ? Marker::kCross : Marker::kCircle;
      by_outcome[outcome] = series;
    }
    for (const auto& probe : probes) {
      const auto values = probe.details.value("plot", nlohmann::json());
      if (!values.is_object()) continue;
      plot.y_unit = values.value("unit", "");
      PlotPoint point;
      point.x = probe.position;
      point.y = values.value("median", 0.0);
      point.low = values.value("min", point.y);
      point.high = values.value("max", point.y);
      by_outcome[probe.outcome].points.push_back(point);
    }
    for (const char* outcome : {"good", "bad", "skip"})
      if (!by_outcome[outcome].points.empty()) plot.series.push_back(by_outcome[outcome]);
    if (!plot.series.empty()) {
      doc.figure({"metric", fmt::format("{} per probed candidate (median, whiskers min–max over repeats; a candidate "
                                        "without a value did not measure it)",
                                        plot_metric),
                  render_svg(plot)});
    }
  }

  const auto changes = result.value("package_changes", nlohmann::json::array());
  if (!changes.empty()) {
    doc.heading(2, fmt::format("What else changed between `{}` and `{}`", bisect.last_good, bisect.first_bad));
    doc.paragraph("The installed packages of the two envs (transitive dependencies included):");
    TableBlock packages;
    packages.headers = {"package", bisect.last_good, bisect.first_bad};
    for (const auto& change : changes)
      packages.rows.push_back({change.value("key", ""), change.value("a", ""), change.value("b", "")});
    doc.table(packages);
  }
  const auto reproduce = result.value("reproduce", std::vector<std::string>());
  if (!reproduce.empty()) {
    doc.heading(2, "Reproduce");
    std::string text;
    for (const auto& line : reproduce) text += line + "\n";
    text += fmt::format("harness bisect show {} --db {}\n", bisect.id, db_path);
    doc.code(text, "sh");
  }
  return doc;
}

std::string bisect_text(const db::Bisect& bisect, const std::vector<db::BisectProbe>& probes) {
  std::ostringstream out;
  out << what_text(bisect) << '\n';
  Table table;
  table.headers = {"#", "candidate", "outcome", "reading", "runs", "reason"};
  for (const auto& probe : probes) {
    std::string reading = json_text(probe.details, "reading");
    table.rows.push_back({std::to_string(probe.seq), probe.label, probe.outcome, reading, runs_text(probe.run_ids),
                          probe.reason});
  }
  if (!table.rows.empty()) {
    out << '\n';
    print_table(out, table);
  }
  out << '\n' << answer_text(bisect) << '\n';
  if (bisect.status == "found" || bisect.status == "range") {
    out << fmt::format("{} probes between the ends ({} skipped; at most {} without skips)\n",
                       bisect.result.value("probes_between", 0), bisect.result.value("skipped", 0),
                       bisect.result.value("max_probes", 0));
  }
  const auto changes = bisect.result.value("package_changes", nlohmann::json::array());
  if (!changes.empty()) {
    out << fmt::format("\npackages that changed between {} and {}\n", bisect.last_good, bisect.first_bad);
    Table packages;
    packages.headers = {"package", bisect.last_good, bisect.first_bad};
    for (const auto& change : changes)
      packages.rows.push_back({change.value("key", ""), change.value("a", ""), change.value("b", "")});
    print_table(out, packages);
  }
  const auto reproduce = bisect.result.value("reproduce", std::vector<std::string>());
  if (!reproduce.empty()) {
    out << "\nreproduce\n";
    for (const auto& line : reproduce) out << "  " << line << '\n';
  }
  return out.str();
}

nlohmann::json bisect_json(const db::Bisect& bisect, const std::vector<db::BisectProbe>& probes) {
  nlohmann::json out = {{"id", bisect.id},
                        {"experiment", bisect.experiment},
                        {"mode", bisect.mode},
                        {"target", bisect.target},
                        {"package", bisect.package},
                        {"good", bisect.good},
                        {"bad", bisect.bad},
                        {"status", bisect.status},
                        {"first_bad", bisect.first_bad},
                        {"last_good", bisect.last_good},
                        {"args", bisect.args},
                        {"result", bisect.result},
                        {"error", bisect.error},
                        {"started_at", bisect.started_at},
                        {"finished_at", bisect.finished_at}};
  out["probes"] = nlohmann::json::array();
  for (const auto& probe : probes) {
    out["probes"].push_back({{"seq", probe.seq},
                             {"position", probe.position},
                             {"label", probe.label},
                             {"outcome", probe.outcome},
                             {"reason", probe.reason},
                             {"run_ids", probe.run_ids},
                             {"details", probe.details},
                             {"started_at", probe.started_at}});
  }
  return out;
}

}  // namespace harness::analysis
