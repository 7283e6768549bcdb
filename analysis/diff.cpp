#include "analysis/diff.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <ostream>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "core/errors.h"
#include "core/printer.h"

namespace harness::analysis {
namespace {

const char* const kAbsent = "(absent)";

SideValues side_of(const Series& series) { return {series.spread, series.repeated, series.values}; }

std::string delta_cell(const MetricComparison& c) {
  if (!c.delta) return "-";
  if (*c.delta == 0.0) return "0";
  return (*c.delta > 0 ? "+" : "-") + format_value(std::fabs(*c.delta), c.unit);
}

std::string ratio_cell(const MetricComparison& c) {
  if (!c.ratio) return "-";
  return fmt::format("×{:.3g}", *c.ratio);
}

std::string call_cell(const MetricComparison& c) {
  if (!c.a) return "only in B";
  if (!c.b) return "only in A";
  if (!c.called) return "";
  if (c.regression) return "WORSE";
  if (c.improvement) return "better";
  return "changed";
}

std::string run_label(const db::Run& run) {
  return fmt::format("run {} ({}, {}{}, {}, env {})", run.id, run.experiment, run.device,
                     run.profile.empty() ? "" : " profile " + run.profile, run.started_at, run.env_id.substr(0, 12));
}

std::string status_of(const std::map<std::pair<nlohmann::json, std::string>, std::string>& statuses,
                      const std::pair<nlohmann::json, std::string>& key) {
  const auto found = statuses.find(key);
  return found == statuses.end() ? kAbsent : found->second;
}

void print_changes(std::ostream& out, const std::vector<JsonChange>& changes, bool with_component, const db::Run& a,
                   const db::Run& b) {
  print_table(out, changes_table(changes, with_component, fmt::format("run {}", a.id), fmt::format("run {}", b.id)));
}

void print_env_section(std::ostream& out, const std::vector<JsonChange>& changes, const db::Run& a, const db::Run& b) {
  if (a.env_id == b.env_id) {
    out << "env: same (" << a.env_id.substr(0, 12) << ")\n";
    return;
  }
  if (changes.empty()) {
    out << "env: ids differ, fingerprints equal\n";
    return;
  }
  std::string components;
  for (const auto& component : changed_components(changes)) components += (components.empty() ? "" : ", ") + component;
  out << fmt::format("env changes ({} key{}; changed: {})\n", changes.size(), changes.size() == 1 ? "" : "s", components);
  print_changes(out, changes, true, a, b);
}

nlohmann::json side_json(const std::optional<SideValues>& side) {
  if (!side) return nullptr;
  return {{"median", side->spread.median}, {"min", side->spread.min},        {"max", side->spread.max},
          {"count", side->spread.count},   {"repeated", side->repeated},     {"values", side->values}};
}

nlohmann::json changes_json(const std::vector<JsonChange>& changes) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& c : changes) {
    nlohmann::json change = {{"key", c.key}, {"a", c.before}, {"b", c.after}};
    if (!c.component.empty()) change["component"] = c.component;
    out.push_back(std::move(change));
  }
  return out;
}

struct CallCounts {
  int called = 0, worse = 0, better = 0;
};

CallCounts count_calls(const RunDiff& diff) {
  CallCounts counts;
  for (const auto& c : diff.metrics) {
    counts.called += c.called;
    counts.worse += c.regression;
    counts.better += c.improvement;
  }
  return counts;
}

const char* worse_name(Worse worse) {
  switch (worse) {
    case Worse::kUp: return "up";
    case Worse::kDown: return "down";
    case Worse::kUnknown: return "unknown";
  }
  return "unknown";
}

}  // namespace

std::string side_text(const std::optional<SideValues>& side, const std::string& unit) {
  if (!side) return "-";
  std::string cell = format_value(side->spread.median, unit);
  if (side->repeated && side->spread.count > 1 && side->spread.max > side->spread.min)
    cell += fmt::format(" [{}–{}]", format_value(side->spread.min, unit), format_value(side->spread.max, unit));
  return cell;
}


std::string change_text(const MetricComparison& c) {
  if (!c.delta) return "-";
  std::string text = delta_cell(c);
  if (c.ratio) text += " " + ratio_cell(c);
  if (!c.rule.empty()) text += ", " + c.rule;
  if (c.test) text += fmt::format(" p={:.3g}", c.test->p_value);
  return text;
}

bool RunDiff::regressed() const {
  for (const auto& m : metrics)
    if (m.regression) return true;
  for (const auto& t : trial_changes)
    if (t.regression) return true;
  return false;
}

bool EnvDiff::regressed() const {
  return std::any_of(experiments.begin(), experiments.end(), [](const RunDiff& d) { return d.regressed(); });
}

bool EnvDiff::verdict_flipped() const {
  return std::any_of(experiments.begin(), experiments.end(), [](const RunDiff& d) { return d.verdict_flipped; });
}

void judge(MetricComparison& c) {
  c.called = c.regression = c.improvement = false;
  c.test.reset();
  c.rule.clear();
  c.delta.reset();
  c.ratio.reset();
  if (!c.a || !c.b) return;
  const double median_a = c.a->spread.median, median_b = c.b->spread.median;
  c.delta = median_b - median_a;
  if (median_a != 0.0) c.ratio = median_b / median_a;
  const bool both_repeated = c.a->repeated && c.b->repeated && c.a->spread.count >= kMannWhitneyMinRepeats &&
                             c.b->spread.count >= kMannWhitneyMinRepeats;
  if (both_repeated) {
    c.rule = "mann-whitney";
    c.test = mann_whitney_u(c.a->values, c.b->values);
    c.called = c.test->p_value < kSignificance && median_a != median_b;
  } else {
    c.rule = "range";
    c.called = !ranges_overlap(c.a->spread, c.b->spread);
  }
  if (!c.called) return;
  const bool up = median_b > median_a;
  c.worse = worse_direction(c.metric, c.unit);
  if (c.worse == Worse::kUp) (up ? c.regression : c.improvement) = true;
  if (c.worse == Worse::kDown) (up ? c.improvement : c.regression) = true;
}

RunDiff diff_runs(const db::RunDetail& a, const db::RunDetail& b) {
  if (a.run.experiment != b.run.experiment)
    throw UsageError(fmt::format("run {} is experiment '{}' and run {} is '{}': diff compares runs of one experiment",
                                 a.run.id, a.run.experiment, b.run.id, b.run.experiment));
  RunDiff diff;
  diff.a = a.run;
  diff.b = b.run;
  diff.env_summary_a = env_summary(a.env);
  diff.env_summary_b = env_summary(b.env);
  diff.env_changes = diff_envs(a.env, b.env);
  if (a.run.device != b.run.device) diff.setup_changes.push_back({"", "device", a.run.device, b.run.device});
  if (a.run.profile != b.run.profile)
    diff.setup_changes.push_back({"", "profile", a.run.profile.empty() ? "none" : a.run.profile,
                                  b.run.profile.empty() ? "none" : b.run.profile});
  for (auto change : diff_json(a.spec, b.spec)) {
    change.key = "spec." + change.key;
    diff.setup_changes.push_back(std::move(change));
  }
  diff.verdict_flipped = a.run.verdict != b.run.verdict;

  // Trials: the last trial of each (point, variant) decides its status.
  std::map<std::pair<nlohmann::json, std::string>, std::string> status_a, status_b;
  for (const auto& t : a.trials) status_a[{t.point, t.variant}] = t.status;
  for (const auto& t : b.trials) status_b[{t.point, t.variant}] = t.status;
  std::set<std::pair<nlohmann::json, std::string>> trial_keys;
  for (const auto& [key, status] : status_a) trial_keys.insert(key);
  for (const auto& [key, status] : status_b) trial_keys.insert(key);
  for (const auto& key : trial_keys) {
    const std::string before = status_of(status_a, key), after = status_of(status_b, key);
    if (before == after) continue;
    diff.trial_changes.push_back({key.first, key.second, before, after, before == "ok" && after != kAbsent && after != "ok"});
  }

  // Metrics: the union of keys, in A's order, then B's extra keys in B's order.
  const auto series_a = collect_series(a.metrics), series_b = collect_series(b.metrics);
  auto add = [&](const Series* in_a, const Series* in_b) {
    const Series& any = in_a ? *in_a : *in_b;
    MetricComparison c;
    c.point = any.point;
    c.variant = any.variant;
    c.metric = any.metric;
    c.unit = any.unit.empty() && in_b ? in_b->unit : any.unit;
    c.worse = worse_direction(c.metric, c.unit);
    if (in_a) c.a = side_of(*in_a);
    if (in_b) c.b = side_of(*in_b);
    judge(c);
    diff.metrics.push_back(std::move(c));
  };
  for (const auto& s : series_a) add(&s, find_series(series_b, s.point, s.variant, s.metric));
  for (const auto& s : series_b)
    if (!find_series(series_a, s.point, s.variant, s.metric)) add(nullptr, &s);
  return diff;
}

nlohmann::json to_json(const RunDiff& diff) {
  auto run_json = [](const db::Run& run, const std::string& summary) {
    return nlohmann::json{{"id", run.id},         {"experiment", run.experiment}, {"env_id", run.env_id},
                          {"env", summary},       {"device", run.device},         {"profile", run.profile},
                          {"status", run.status}, {"verdict", run.verdict},       {"started_at", run.started_at}};
  };
  nlohmann::json out;
  out["a"] = run_json(diff.a, diff.env_summary_a);
  out["b"] = run_json(diff.b, diff.env_summary_b);
  out["env_changes"] = changes_json(diff.env_changes);
  out["changed_components"] = changed_components(diff.env_changes);
  out["setup_changes"] = changes_json(diff.setup_changes);
  out["verdict"] = {{"a", diff.a.verdict}, {"b", diff.b.verdict}, {"flipped", diff.verdict_flipped}};
  out["trial_changes"] = nlohmann::json::array();
  for (const auto& t : diff.trial_changes)
    out["trial_changes"].push_back({{"point", t.point}, {"variant", t.variant}, {"a", t.before}, {"b", t.after},
                                    {"regression", t.regression}});
  out["metrics"] = nlohmann::json::array();
  for (const auto& c : diff.metrics) {
    nlohmann::json row = {{"point", c.point},   {"variant", c.variant},         {"metric", c.metric},
                          {"unit", c.unit},     {"a", side_json(c.a)},          {"b", side_json(c.b)},
                          {"rule", c.rule},     {"called", c.called},           {"worse_when", worse_name(c.worse)},
                          {"regression", c.regression}, {"improvement", c.improvement}};
    row["delta"] = c.delta ? nlohmann::json(*c.delta) : nlohmann::json();
    row["ratio"] = c.ratio ? nlohmann::json(*c.ratio) : nlohmann::json();
    row["p_value"] = c.test ? nlohmann::json(c.test->p_value) : nlohmann::json();
    out["metrics"].push_back(std::move(row));
  }
  out["regression"] = diff.regressed();
  return out;
}

Table changes_table(const std::vector<JsonChange>& changes, bool with_component, const std::string& a, const std::string& b) {
  Table table;
  if (with_component) table.headers.push_back("component");
  table.headers.insert(table.headers.end(), {"key", a, b});
  for (const auto& change : changes) {
    std::vector<std::string> row;
    if (with_component) row.push_back(change.component.empty() ? "-" : change.component);
    row.insert(row.end(), {change.key, change.before, change.after});
    table.rows.push_back(std::move(row));
  }
  return table;
}

Table run_diff_trials_table(const RunDiff& diff) {
  Table trials;
  trials.headers = {"point", "variant", fmt::format("run {}", diff.a.id), fmt::format("run {}", diff.b.id), ""};
  for (const auto& t : diff.trial_changes)
    trials.rows.push_back({point_label(t.point).empty() ? "-" : point_label(t.point), t.variant, t.before, t.after,
                           t.regression ? "WORSE" : ""});
  return trials;
}

Table run_diff_metrics_table(const RunDiff& diff, bool changes_only) {
  const bool any_point = std::any_of(diff.metrics.begin(), diff.metrics.end(),
                                     [](const MetricComparison& c) { return !c.point.empty(); });
  Table table;
  if (any_point) table.headers.push_back("point");
  table.headers.insert(table.headers.end(), {"variant", "metric", fmt::format("run {}", diff.a.id),
                                             fmt::format("run {}", diff.b.id), "delta", "ratio", "p", "call"});
  table.right_align.assign(table.headers.size(), false);
  for (size_t c = table.headers.size() - 6; c < table.headers.size() - 1; ++c) table.right_align[c] = true;
  for (const auto& c : diff.metrics) {
    if (changes_only && c.a && c.b && !c.called) continue;
    std::vector<std::string> row;
    if (any_point) row.push_back(point_label(c.point).empty() ? "-" : point_label(c.point));
    row.insert(row.end(), {c.variant.empty() ? "(run)" : c.variant, c.metric, side_text(c.a, c.unit),
                           side_text(c.b, c.unit), delta_cell(c), ratio_cell(c),
                           c.test ? fmt::format("{:.3g}", c.test->p_value) : "", call_cell(c)});
    table.rows.push_back(std::move(row));
  }
  return table;
}

void print_run_diff(std::ostream& out, const RunDiff& diff, bool with_env, bool changes_only) {
  out << "A: " << run_label(diff.a) << '\n' << "   " << diff.env_summary_a << '\n';
  out << "B: " << run_label(diff.b) << '\n' << "   " << diff.env_summary_b << '\n';
  if (with_env) {
    out << '\n';
    print_env_section(out, diff.env_changes, diff.a, diff.b);
  }
  if (!diff.setup_changes.empty()) {
    out << fmt::format("\nsetup changes ({})\n", diff.setup_changes.size());
    print_changes(out, diff.setup_changes, false, diff.a, diff.b);
  }
  out << '\n';
  auto verdict = [](const std::string& v) { return v.empty() ? std::string("(none)") : v; };
  if (diff.verdict_flipped) {
    out << fmt::format("verdict: {} -> {}   <<< VERDICT FLIP\n", verdict(diff.a.verdict), verdict(diff.b.verdict));
  } else {
    out << fmt::format("verdict: {} (unchanged)\n", verdict(diff.a.verdict));
  }
  if (diff.a.status != diff.b.status) out << fmt::format("run status: {} -> {}\n", diff.a.status, diff.b.status);

  if (!diff.trial_changes.empty()) {
    out << "\ntrial status changes\n";
    print_table(out, run_diff_trials_table(diff));
  }

  const auto [called, worse, better] = count_calls(diff);
  const Table table = run_diff_metrics_table(diff, changes_only);
  out << fmt::format("\nmetrics: median [min–max] over repeats; a change is called outside the repeats' ranges, or by "
                     "a Mann-Whitney test (p < {}) with {}+ repeats on both sides\n",
                     kSignificance, kMannWhitneyMinRepeats);
  if (table.rows.empty()) {
    out << (diff.metrics.empty() ? "  (no metrics in either run)\n" : "  (no change outside the noise)\n");
  } else {
    print_table(out, table);
  }
  const auto worse_trials = std::count_if(diff.trial_changes.begin(), diff.trial_changes.end(),
                                          [](const TrialChange& t) { return t.regression; });
  std::string trials;
  if (!diff.trial_changes.empty()) {
    trials = fmt::format("; {} trial status change{} ({} worse)", diff.trial_changes.size(),
                         diff.trial_changes.size() == 1 ? "" : "s", worse_trials);
  }
  out << fmt::format("\n{} metric change{} called: {} worse, {} better, {} without a direction{}{}\n", called,
                     called == 1 ? "" : "s", worse, better, called - worse - better, trials,
                     diff.verdict_flipped ? "; VERDICT FLIPPED" : "");
}

std::string resolve_env_id(const db::Store& store, const std::string& prefix) {
  if (prefix.empty()) throw UsageError("--env: empty env id");
  const auto ids = store.list_env_ids();
  std::vector<std::string> matches;
  for (const auto& id : ids) {
    if (id == prefix) return id;
    if (id.rfind(prefix, 0) == 0) matches.push_back(id);
  }
  if (matches.size() == 1) return matches.front();
  if (matches.empty()) {
    std::string known;
    for (const auto& id : ids) known += (known.empty() ? "" : ", ") + id.substr(0, 12);
    throw UsageError(fmt::format("no env '{}' in {} (envs: {})", prefix, store.path(), known.empty() ? "none" : known));
  }
  std::string candidates;
  for (const auto& id : matches) candidates += (candidates.empty() ? "" : ", ") + id.substr(0, 16);
  throw UsageError(fmt::format("env '{}' is ambiguous in {}: {} match ({})", prefix, store.path(), matches.size(),
                               candidates));
}

EnvDiff diff_envs_latest(const db::Store& store, const std::string& env_a, const std::string& env_b,
                         const std::optional<std::string>& experiment) {
  EnvDiff diff;
  diff.env_a = env_a;
  diff.env_b = env_b;
  const auto fingerprint_a = store.get_env(env_a).value_or(nlohmann::json::object());
  const auto fingerprint_b = store.get_env(env_b).value_or(nlohmann::json::object());
  diff.env_summary_a = env_summary(fingerprint_a);
  diff.env_summary_b = env_summary(fingerprint_b);
  diff.env_changes = diff_envs(fingerprint_a, fingerprint_b);

  std::vector<std::string> names;
  if (experiment) {
    names.push_back(*experiment);
  } else {
    for (const auto& row : store.list_experiments())
      if (std::find(names.begin(), names.end(), row.name) == names.end()) names.push_back(row.name);
  }
  for (const auto& name : names) {
    const auto run_a = store.latest_run(name, env_a), run_b = store.latest_run(name, env_b);
    if (run_a && run_b) {
      diff.experiments.push_back(diff_runs(*store.get_run(run_a->id), *store.get_run(run_b->id)));
    } else if (run_a) {
      diff.only_a.push_back(name);
    } else if (run_b) {
      diff.only_b.push_back(name);
    }
  }
  if (diff.experiments.empty()) {
    const std::string who = experiment ? "experiment '" + *experiment + "' has no" : "no experiment has";
    throw UsageError(fmt::format("{} finished run under both env {} and env {} in {}", who, env_a.substr(0, 12),
                                 env_b.substr(0, 12), store.path()));
  }
  return diff;
}

nlohmann::json to_json(const EnvDiff& diff) {
  nlohmann::json out;
  out["env_a"] = {{"id", diff.env_a}, {"summary", diff.env_summary_a}};
  out["env_b"] = {{"id", diff.env_b}, {"summary", diff.env_summary_b}};
  out["env_changes"] = changes_json(diff.env_changes);
  out["changed_components"] = changed_components(diff.env_changes);
  out["experiments"] = nlohmann::json::array();
  for (const auto& run_diff : diff.experiments) out["experiments"].push_back(to_json(run_diff));
  out["only_a"] = diff.only_a;
  out["only_b"] = diff.only_b;
  out["regression"] = diff.regressed();
  out["verdict_flipped"] = diff.verdict_flipped();
  return out;
}

void print_env_diff(std::ostream& out, const EnvDiff& diff, bool changes_only) {
  out << "env A: " << diff.env_a.substr(0, 12) << "  " << diff.env_summary_a << '\n';
  out << "env B: " << diff.env_b.substr(0, 12) << "  " << diff.env_summary_b << "\n\n";
  if (diff.env_changes.empty()) {
    out << "env: fingerprints equal\n";
  } else {
    std::string components;
    for (const auto& c : changed_components(diff.env_changes)) components += (components.empty() ? "" : ", ") + c;
    out << fmt::format("env changes ({} key{}; changed: {})\n", diff.env_changes.size(),
                       diff.env_changes.size() == 1 ? "" : "s", components);
    print_table(out, changes_table(diff.env_changes, true, "env A", "env B"));
  }
  for (const auto& run_diff : diff.experiments) {
    out << fmt::format("\n=== {} ===\n", run_diff.a.experiment);
    print_run_diff(out, run_diff, false, changes_only);
  }
  auto list = [](const std::vector<std::string>& names) {
    std::string text;
    for (const auto& n : names) text += (text.empty() ? "" : ", ") + n;
    return text;
  };
  if (!diff.only_a.empty()) out << "\nonly under env A (not compared): " << list(diff.only_a) << '\n';
  if (!diff.only_b.empty()) out << "\nonly under env B (not compared): " << list(diff.only_b) << '\n';
}

namespace {

void markdown_changes(std::ostream& out, const std::vector<JsonChange>& changes, const std::string& a, const std::string& b) {
  print_markdown_table(out, changes_table(changes, true, a, b));
}

std::string join_names(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& n : names) text += (text.empty() ? "" : ", ") + n;
  return text;
}

// The body of one run diff below its outcome line: setup, verdict, trials and the called metrics.
void markdown_run_body(std::ostream& out, const RunDiff& diff) {
  const std::string a = fmt::format("run {}", diff.a.id), b = fmt::format("run {}", diff.b.id);
  if (!diff.setup_changes.empty()) {
    out << "\n**Setup changes** (" << diff.setup_changes.size() << ")\n\n";
    markdown_changes(out, diff.setup_changes, a, b);
  }
  auto verdict = [](const std::string& v) { return v.empty() ? std::string("(none)") : v; };
  out << '\n'
      << (diff.verdict_flipped ? fmt::format("Verdict: **{} → {}** (flipped)", markdown_cell(verdict(diff.a.verdict)),
                                             markdown_cell(verdict(diff.b.verdict)))
                               : fmt::format("Verdict: {} (unchanged)", markdown_cell(verdict(diff.a.verdict))))
      << '\n';
  if (!diff.trial_changes.empty()) {
    out << "\n**Trial status changes**\n\n";
    print_markdown_table(out, run_diff_trials_table(diff));
  }
  const auto [called, worse, better] = count_calls(diff);
  const Table table = run_diff_metrics_table(diff, true);
  out << fmt::format("\n{} of {} metric{} changed outside the noise: {} worse, {} better, {} without a direction.\n",
                     called, diff.metrics.size(), diff.metrics.size() == 1 ? "" : "s", worse, better, called - worse - better);
  if (!table.rows.empty()) {
    out << '\n';
    print_markdown_table(out, table);
  }
}

}  // namespace

std::string run_diff_markdown(const RunDiff& diff) {
  std::ostringstream out;
  out << fmt::format("### harness diff: {}, run {} → run {}\n\n", markdown_cell(diff.a.experiment), diff.a.id, diff.b.id);
  std::vector<std::string> outcome;
  outcome.push_back(diff.regressed() ? "**Regression**" : "No regression");
  if (diff.verdict_flipped) outcome.push_back("**verdict flipped**");
  out << join_names(outcome) << " (a change is called outside the repeats' min–max ranges, or by a Mann-Whitney test"
      << fmt::format(" with p < {} when both sides have {}+ repeats).\n\n", kSignificance, kMannWhitneyMinRepeats);
  Table runs;
  runs.headers = {"", "run", "device", "started", "env"};
  runs.rows.push_back({"A", std::to_string(diff.a.id), diff.a.device, diff.a.started_at,
                       diff.a.env_id.substr(0, 12) + " · " + diff.env_summary_a});
  runs.rows.push_back({"B", std::to_string(diff.b.id), diff.b.device, diff.b.started_at,
                       diff.b.env_id.substr(0, 12) + " · " + diff.env_summary_b});
  print_markdown_table(out, runs);
  if (diff.a.env_id != diff.b.env_id && !diff.env_changes.empty()) {
    out << fmt::format("\n<details><summary>Env changes ({}; changed: {})</summary>\n\n", diff.env_changes.size(),
                       markdown_cell(join_names(changed_components(diff.env_changes))));
    markdown_changes(out, diff.env_changes, fmt::format("run {}", diff.a.id), fmt::format("run {}", diff.b.id));
    out << "\n</details>\n";
  }
  markdown_run_body(out, diff);
  return out.str();
}

std::string env_diff_markdown(const EnvDiff& diff) {
  std::ostringstream out;
  out << fmt::format("### harness diff: env {} → env {}\n\n", diff.env_a.substr(0, 12), diff.env_b.substr(0, 12));
  std::vector<std::string> outcome;
  outcome.push_back(diff.regressed() ? "**Regression**" : "No regression");
  if (diff.verdict_flipped()) outcome.push_back("**verdict flipped**");
  out << join_names(outcome) << fmt::format(" across {} experiment{}.\n\n", diff.experiments.size(),
                                            diff.experiments.size() == 1 ? "" : "s");
  Table envs;
  envs.headers = {"", "env", "toolchain"};
  envs.rows.push_back({"A", diff.env_a.substr(0, 12), diff.env_summary_a});
  envs.rows.push_back({"B", diff.env_b.substr(0, 12), diff.env_summary_b});
  print_markdown_table(out, envs);
  if (!diff.env_changes.empty()) {
    out << fmt::format("\n<details><summary>Env changes ({}; changed: {})</summary>\n\n", diff.env_changes.size(),
                       markdown_cell(join_names(changed_components(diff.env_changes))));
    markdown_changes(out, diff.env_changes, "env A", "env B");
    out << "\n</details>\n";
  }
  for (const auto& run_diff : diff.experiments) {
    out << fmt::format("\n#### {}: run {} → run {}{}\n", markdown_cell(run_diff.a.experiment), run_diff.a.id,
                       run_diff.b.id, run_diff.regressed() ? " — **regression**" : "");
    markdown_run_body(out, run_diff);
  }
  if (!diff.only_a.empty()) out << "\nOnly under env A (not compared): " << markdown_cell(join_names(diff.only_a)) << '\n';
  if (!diff.only_b.empty()) out << "\nOnly under env B (not compared): " << markdown_cell(join_names(diff.only_b)) << '\n';
  return out.str();
}

}  // namespace harness::analysis
