#include "analysis/writeup.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "analysis/env_diff.h"
#include "analysis/memory_snapshot.h"
#include "analysis/series.h"
#include "analysis/stats.h"
#include "analysis/svg_plot.h"
#include "core/errors.h"
#include "core/files.h"
#include "core/json_input.h"
#include "core/printer.h"
#include "db/artifact_paths.h"
#include "experiments/memory_model.h"
#include "experiments/spec.h"
#include "experiments/sweep.h"

namespace harness::analysis {
namespace {

using nlohmann::json;

// History rows shown; older runs are counted, not listed (each row reads its run's metrics).
constexpr size_t kHistoryRows = 30;
// Result tables show this many metrics as columns; every metric is in "All measurements".
constexpr size_t kResultColumns = 7;
// Lines of an error message or stderr tail quoted per failed trial.
constexpr size_t kQuotedLines = 16;

// ---- small helpers ---------------------------------------------------------------------------

std::string text_of(const json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_null()) return "-";
  return value.dump();
}

const json& field(const json& object, const std::string& key) {
  static const json null_value;
  if (!object.is_object()) return null_value;
  const auto found = object.find(key);
  return found == object.end() ? null_value : *found;
}

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string out;
  for (const auto& part : parts) out += (out.empty() ? "" : separator) + part;
  return out;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The first (or last) `count` lines, with a note of what was left out.
std::string quote_lines(const std::string& text, size_t count, bool tail) {
  const auto lines = lines_of(text);
  if (lines.size() <= count) return text;
  std::vector<std::string> kept;
  if (tail) {
    kept.push_back(fmt::format("[... {} earlier lines]", lines.size() - count));
    kept.insert(kept.end(), lines.end() - static_cast<long>(count), lines.end());
  } else {
    kept.assign(lines.begin(), lines.begin() + static_cast<long>(count));
    kept.push_back(fmt::format("[... {} more lines]", lines.size() - count));
  }
  return join(kept, "\n") + "\n";
}

std::string spread_cell(const Series& s) {
  std::string cell = format_value(s.spread.median, s.unit);
  if (s.repeated && s.spread.count > 1 && s.spread.max > s.spread.min)
    cell += fmt::format(" [{}–{}]", format_value(s.spread.min, s.unit), format_value(s.spread.max, s.unit));
  return cell;
}

std::string point_or_dash(const json& point) {
  const std::string label = point_label(point);
  return label.empty() ? "-" : label;
}

std::string short_id(const std::string& env_id) { return env_id.empty() ? "(none)" : env_id.substr(0, 12); }

std::string date_of(const std::string& iso) {
  // "2026-11-29T10:00:00.123Z" -> "2026-11-29 10:00"
  if (iso.size() < 16) return iso.empty() ? "-" : iso;
  return iso.substr(0, 10) + " " + iso.substr(11, 5);
}

bool is_model(const std::string& metric) { return metric.rfind("model_", 0) == 0; }
bool is_interval_bound(const std::string& metric) {
  return metric.find("ci95") != std::string::npos || metric.find("_ci_") != std::string::npos;
}
bool is_time(const Series& s) {
  return s.unit == "ms" || (s.metric.size() > 3 && s.metric.compare(s.metric.size() - 3, 3, "_ms") == 0);
}
bool is_bytes(const Series& s) { return s.unit == "bytes" || s.metric.find("bytes") != std::string::npos; }
bool is_rate(const std::string& metric) { return metric.find("failure_rate") != std::string::npos && !is_interval_bound(metric); }

// ---- what the run holds ------------------------------------------------------------------------

// The run's series, its points and variants, and the shape of its sweep.
struct RunView {
  const db::RunDetail& detail;
  std::vector<Series> series;
  std::vector<std::string> variants;
  std::vector<json> points;
  std::vector<std::string> swept_keys;  // point keys taking more than one value
  std::string x_key;                    // the swept key plots put on the x axis ("" without a numeric sweep)

  explicit RunView(const db::RunDetail& run) : detail(run) {
    series = collect_series(run.metrics);
    variants = variant_order(run);
    points = point_order(run);
    // In a sweep, the run-level metrics (scaling fits) sit at the empty point: they are not a sweep
    // point (the results table and the plots run over the sweep; the appendix lists them).
    if (points.size() > 1) {
      points.erase(std::remove_if(points.begin(), points.end(),
                                  [](const json& point) { return point.is_null() || (point.is_object() && point.empty()); }),
                   points.end());
    }
    std::map<std::string, std::set<json>> values;
    for (const auto& point : points)
      if (point.is_object())
        for (const auto& [key, value] : point.items()) values[key].insert(value);
    for (const auto& [key, distinct] : values)
      if (distinct.size() > 1) swept_keys.push_back(key);
    // Anchors first: the founding question is how memory grows with them. Otherwise the
    // numeric key with the most values.
    size_t best = 0;
    for (const auto& key : swept_keys) {
      const bool numeric = std::all_of(values[key].begin(), values[key].end(), [](const json& v) { return v.is_number(); });
      if (!numeric) continue;
      if (key == "dims.anchors") {
        x_key = key;
        break;
      }
      if (values[key].size() > best) {
        best = values[key].size();
        x_key = key;
      }
    }
  }

  const Series* find(const json& point, const std::string& variant, const std::string& metric) const {
    return find_series(series, point, variant, metric);
  }

  std::vector<const db::Trial*> trials_at(const json& point, const std::string& variant) const {
    std::vector<const db::Trial*> found;
    for (const auto& t : detail.trials)
      if (t.point == point && t.variant == variant) found.push_back(&t);
    return found;
  }

  // Metric names in table order, measured ones only.
  std::vector<std::string> measured_metrics() const {
    std::vector<std::string> names;
    for (const auto& s : series)
      if (!is_model(s.metric) && std::find(names.begin(), names.end(), s.metric) == names.end()) names.push_back(s.metric);
    std::stable_sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
      const int ra = metric_rank(a), rb = metric_rank(b);
      return ra != rb ? ra < rb : a < b;
    });
    return names;
  }

  // The columns of the results table: the usual metrics first, then others that are not
  // interval bounds or per-tensor error details, up to kResultColumns.
  std::vector<std::string> primary_metrics() const {
    std::vector<std::string> chosen;
    for (const auto& name : measured_metrics()) {
      if (chosen.size() >= kResultColumns) break;
      const bool detail_error = name.find("_err") != std::string::npos && name != "max_abs_err";
      if (is_interval_bound(name) || detail_error) continue;
      chosen.push_back(name);
    }
    return chosen;
  }

  // Point without the x key: what distinguishes the lines of one plot besides the variant.
  json rest_of(const json& point) const {
    json rest = json::object();
    if (point.is_object())
      for (const auto& [key, value] : point.items())
        if (key != x_key && std::find(swept_keys.begin(), swept_keys.end(), key) != swept_keys.end()) rest[key] = value;
    return rest;
  }
};

std::string status_summary(const std::vector<const db::Trial*>& trials) {
  if (trials.empty()) return "-";
  std::map<std::string, int> counts;
  for (const auto* t : trials) ++counts[t->status];
  std::vector<std::string> parts;
  for (const auto& [status, count] : counts) parts.push_back(count > 1 ? fmt::format("{} ×{}", status, count) : status);
  return join(parts, ", ");
}

// ---- plots -----------------------------------------------------------------------------------

// A rate's 95 % interval: stored bounds (<rate>_ci95_low/_high and similar), a stored half width
// (<rate>_ci95), or Wilson's interval from stored failure and trial counts.
std::optional<Interval> rate_interval(const RunView& view, const json& point, const std::string& variant,
                                      const std::string& rate) {
  auto value = [&](const std::string& metric) -> std::optional<double> {
    const Series* s = view.find(point, variant, metric);
    if (!s) return std::nullopt;
    return s->spread.median;
  };
  for (const auto& [low_suffix, high_suffix] : std::vector<std::pair<std::string, std::string>>{
           {"_ci95_low", "_ci95_high"}, {"_ci95_lo", "_ci95_hi"}, {"_ci95_lower", "_ci95_upper"}, {"_low", "_high"}}) {
    const auto low = value(rate + low_suffix), high = value(rate + high_suffix);
    if (low && high) return Interval{*low, *high};
  }
  for (const auto& [low_name, high_name] :
       std::vector<std::pair<std::string, std::string>>{{"ci95_low", "ci95_high"}, {"ci95_lo", "ci95_hi"}}) {
    const auto low = value(low_name), high = value(high_name);
    if (low && high) return Interval{*low, *high};
  }
  const auto centre = value(rate);
  if (const auto half = value(rate + "_ci95"); half && centre)
    return Interval{std::max(0.0, *centre - *half), std::min(1.0, *centre + *half)};
  const auto failures = value("failures"), trials = value("trials");
  if (failures && trials) return wilson_interval(*failures, *trials);
  return std::nullopt;
}

std::string axis_name(const std::string& key) { return key.rfind("dims.", 0) == 0 ? key.substr(5) : key; }

PlotPoint point_of(double x, const Series& s) {
  PlotPoint p{x, s.spread.median, std::nullopt, std::nullopt};
  if (s.repeated && s.spread.max > s.spread.min) {
    p.low = s.spread.min;
    p.high = s.spread.max;
  }
  return p;
}

// A plot against the swept value: one line per (variant, other swept values), the model's
// prediction dashed beside it, OOM trials as crosses at the bytes they asked for.
Plot sweep_plot(const RunView& view, const std::string& metric, const std::string& unit, bool with_model,
                bool with_oom) {
  Plot plot;
  plot.x_label = axis_name(view.x_key);
  plot.y_label = metric + (unit.empty() || unit == "bytes" ? "" : " (" + unit + ")");
  plot.y_unit = unit;
  std::set<double> xs;
  // Groups in order of first appearance: colours and the legend follow the variants' order.
  std::vector<std::pair<std::string, json>> groups;
  auto group_color = [&](const std::string& variant, const json& rest) {
    const auto key = std::make_pair(variant, rest);
    const auto found = std::find(groups.begin(), groups.end(), key);
    if (found != groups.end()) return static_cast<int>(found - groups.begin());
    groups.push_back(key);
    return static_cast<int>(groups.size() - 1);
  };
  std::map<std::pair<std::string, json>, PlotSeries> measured, model, oom;
  for (const auto& variant : view.variants) {
    for (const auto& point : view.points) {
      if (!point.is_object() || !point.contains(view.x_key) || !point[view.x_key].is_number()) continue;
      const double x = point[view.x_key].get<double>();
      const json rest = view.rest_of(point);
      const std::string suffix = rest.empty() ? "" : " · " + point_label(rest);
      const auto key = std::make_pair(variant, rest);
      const int color = group_color(variant, rest);
      if (const Series* s = view.find(point, variant, metric)) {
        auto& line = measured[key];
        line.label = variant + suffix;
        line.color = color;
        line.points.push_back(point_of(x, *s));
        xs.insert(x);
      }
      if (with_model)
        if (const Series* s = view.find(point, variant, "model_" + metric)) {
          auto& line = model[key];
          line.label = variant + suffix + " (model)";
          line.color = color;
          line.dashed = true;
          line.marker = Marker::kHollowCircle;
          line.points.push_back({x, s->spread.median, std::nullopt, std::nullopt});
          xs.insert(x);
        }
      if (with_oom)
        for (const auto* trial : view.trials_at(point, variant))
          if (trial->status == "oom" && trial->requested_bytes) {
            auto& crosses = oom[key];
            crosses.label = variant + suffix + " OOM (requested)";
            crosses.color = color;
            crosses.line = false;
            crosses.marker = Marker::kCross;
            crosses.points.push_back({x, static_cast<double>(*trial->requested_bytes), std::nullopt, std::nullopt});
            xs.insert(x);
          }
    }
  }
  for (auto* kind : {&measured, &model, &oom})
    for (const auto& key : groups)
      if (const auto found = kind->find(key); found != kind->end()) plot.series.push_back(std::move(found->second));
  plot.x_ticks.assign(xs.begin(), xs.end());
  return plot;
}

// A plot per variant (no numeric sweep): categories are the variants (with the point when the
// run has several), one series per metric.
// Whiskers of a category plot other than the repeats' spread (a rate's confidence interval).
using IntervalOf = std::function<std::optional<Interval>(const json& point, const std::string& variant,
                                                         const std::string& metric)>;

Plot category_plot(const RunView& view, const std::vector<std::string>& metrics, bool with_model, bool with_oom,
                   const IntervalOf& interval_of = nullptr) {
  Plot plot;
  std::vector<std::pair<json, std::string>> categories;
  for (const auto& point : view.points)
    for (const auto& variant : view.variants) {
      bool has_data = false;
      for (const auto& metric : metrics) has_data = has_data || view.find(point, variant, metric);
      for (const auto* t : view.trials_at(point, variant)) has_data = has_data || t->status != "ok";
      if (!has_data) continue;
      categories.emplace_back(point, variant);
      const std::string label = point_label(point);
      plot.categories.push_back(label.empty() ? variant : variant + " @ " + label);
    }
  int color = 0;
  for (const auto& metric : metrics) {
    PlotSeries measured, model;
    measured.label = metric;
    measured.color = color;
    measured.line = false;
    model.label = metric + " (model)";
    model.color = color;
    model.line = false;
    model.marker = Marker::kHollowCircle;
    for (size_t i = 0; i < categories.size(); ++i) {
      const auto& [point, variant] = categories[i];
      if (const Series* s = view.find(point, variant, metric)) {
        PlotPoint p = point_of(static_cast<double>(i), *s);
        if (interval_of) {
          const auto interval = interval_of(point, variant, metric);
          p.low = interval ? std::optional<double>(interval->low) : std::nullopt;
          p.high = interval ? std::optional<double>(interval->high) : std::nullopt;
        }
        measured.points.push_back(p);
      }
      if (with_model)
        if (const Series* s = view.find(point, variant, "model_" + metric))
          model.points.push_back({static_cast<double>(i), s->spread.median, std::nullopt, std::nullopt});
    }
    if (!measured.points.empty()) plot.series.push_back(std::move(measured));
    if (!model.points.empty()) plot.series.push_back(std::move(model));
    ++color;
  }
  if (with_oom) {
    PlotSeries crosses;
    crosses.label = "OOM (requested)";
    crosses.color = color;
    crosses.line = false;
    crosses.marker = Marker::kCross;
    for (size_t i = 0; i < categories.size(); ++i)
      for (const auto* trial : view.trials_at(categories[i].first, categories[i].second))
        if (trial->status == "oom" && trial->requested_bytes)
          crosses.points.push_back({static_cast<double>(i), static_cast<double>(*trial->requested_bytes), std::nullopt,
                                    std::nullopt});
    if (!crosses.points.empty()) plot.series.push_back(std::move(crosses));
  }
  return plot;
}

std::string unit_of(const RunView& view, const std::string& metric) {
  for (const auto& s : view.series)
    if (s.metric == metric) return s.unit.empty() ? unit_from_name(metric) : s.unit;
  return unit_from_name(metric);
}

std::vector<Figure> make_figures(const RunView& view) {
  std::vector<Figure> figures;
  const auto metrics = view.measured_metrics();
  std::vector<std::string> memory, times, rates;
  for (const auto& name : metrics) {
    const Series* any = nullptr;
    for (const auto& s : view.series)
      if (s.metric == name) any = &s;
    if (!any || is_interval_bound(name)) continue;
    if (is_bytes(*any)) memory.push_back(name);
    else if (is_time(*any)) times.push_back(name);
    else if (is_rate(name)) rates.push_back(name);
  }
  // Peaks are what the hypotheses are about; other byte counts only when there are no peaks.
  std::vector<std::string> peaks;
  for (const auto& name : memory)
    if (name.find("peak") != std::string::npos) peaks.push_back(name);
  if (!peaks.empty()) memory = peaks;
  const bool any_oom = std::any_of(view.detail.trials.begin(), view.detail.trials.end(),
                                   [](const db::Trial& t) { return t.status == "oom" && t.requested_bytes; });
  // OOM crosses go on one memory plot: the backward peak's when there is one.
  std::string oom_metric;
  if (any_oom && !memory.empty()) {
    oom_metric = memory.front();
    for (const auto& name : memory)
      if (name.find("bwd") != std::string::npos) oom_metric = name;
  }

  if (!view.x_key.empty()) {
    const std::string x = axis_name(view.x_key);
    for (const auto& name : memory) {
      Plot plot = sweep_plot(view, name, "bytes", true, name == oom_metric);
      plot.title = fmt::format("{} against {}", name, x);
      const bool with_model = std::any_of(plot.series.begin(), plot.series.end(),
                                          [](const PlotSeries& line) { return line.dashed; });
      figures.push_back({"memory-" + name,
                         fmt::format("{} against {}, per variant (median{}{})", name, x,
                                     with_model ? "; dashed: memory model" : "",
                                     name == oom_metric ? "; ×: bytes an allocation that ran out of memory asked for" : ""),
                         render_svg(plot)});
    }
    for (const auto& name : times) {
      Plot plot = sweep_plot(view, name, unit_of(view, name), false, false);
      plot.title = fmt::format("{} against {}", name, x);
      figures.push_back({"time-" + name, fmt::format("{} against {}, per variant (median, whiskers min–max over repeats)",
                                                     name, x),
                         render_svg(plot)});
    }
  } else {
    if (!memory.empty()) {
      Plot plot = category_plot(view, memory, true, !oom_metric.empty());
      plot.title = "Peak memory per variant";
      plot.y_label = "bytes";
      plot.y_unit = "bytes";
      const bool with_model = std::any_of(plot.series.begin(), plot.series.end(),
                                          [](const PlotSeries& line) { return line.marker == Marker::kHollowCircle; });
      figures.push_back({"memory", std::string("Memory per variant (filled: measured median") +
                                       (with_model ? "; hollow: memory model" : "") +
                                       (oom_metric.empty() ? "" : "; ×: bytes an allocation that ran out of memory asked for") +
                                       ")",
                         render_svg(plot)});
    }
    if (!times.empty()) {
      Plot plot = category_plot(view, times, false, false);
      plot.title = "Time per variant";
      plot.y_label = "time (" + unit_of(view, times.front()) + ")";
      plot.y_unit = unit_of(view, times.front());
      figures.push_back({"time", "Time per variant (median, whiskers min–max over repeats)", render_svg(plot)});
    }
  }
  if (!rates.empty()) {
    const IntervalOf interval_of = [&view](const json& point, const std::string& variant, const std::string& metric) {
      return rate_interval(view, point, variant, metric);
    };
    Plot plot = category_plot(view, rates, false, false, interval_of);
    plot.title = "Failure rate per variant";
    plot.y_label = "failure rate";
    plot.y_scale = Scale::kLinear;
    figures.push_back({"failure-rate", "Failure rate per variant, whiskers: 95 % confidence interval", render_svg(plot)});
  }
  // A metric measured only off the sweep has nothing to draw against it.
  figures.erase(std::remove_if(figures.begin(), figures.end(),
                               [](const Figure& f) { return f.svg.find(">no data</text>") != std::string::npos; }),
                figures.end());
  return figures;
}

// ---- sections ----------------------------------------------------------------------------------

std::string verdict_text(const db::Run& run) { return run.verdict.empty() ? "(none)" : run.verdict; }

void add_summary(Document& doc, const RunView& view) {
  const auto& run = view.detail.run;
  std::map<std::string, int> statuses;
  for (const auto& t : view.detail.trials) ++statuses[t.status];
  std::vector<std::string> status_parts;
  for (const auto& [status, count] : statuses) status_parts.push_back(fmt::format("{} {}", count, status));
  std::string shape = fmt::format("{} variant{}", view.variants.size(), view.variants.size() == 1 ? "" : "s");
  if (view.points.size() > 1) shape += fmt::format(" × {} sweep points", view.points.size());
  doc.paragraph(fmt::format("**Verdict: {}.** Run {} of `{}` on `{}`{} ({}), {}; {} trial{}: {}. Status {}, started {}.",
                            verdict_text(run), run.id, run.experiment, run.device,
                            run.profile.empty() ? "" : " with profile `" + run.profile + "`",
                            env_summary(view.detail.env), shape, view.detail.trials.size(),
                            view.detail.trials.size() == 1 ? "" : "s",
                            status_parts.empty() ? "none recorded" : join(status_parts, ", "), run.status,
                            date_of(run.started_at)));
  if (!run.error.empty()) doc.paragraph("Run error: `" + lines_of(run.error).front() + "`");
  if (run.replay_of) doc.paragraph(fmt::format("This run replays run {}.", *run.replay_of));
}

void add_hypothesis(Document& doc, const json& spec) {
  doc.heading(2, "Hypothesis");
  const auto& hypothesis = field(spec, "hypothesis");
  doc.paragraph(hypothesis.is_string() ? hypothesis.get<std::string>() : "(the spec states no hypothesis)");
}

void add_key_values(Document& doc, const json& object, const std::vector<std::string>& swept, const std::string& prefix) {
  TableBlock table;
  table.headers = {"field", "value"};
  for (const auto& [key, value] : object.items()) {
    std::string cell = text_of(value);
    if (std::find(swept.begin(), swept.end(), prefix + key) != swept.end()) cell += " (swept, see Method)";
    table.rows.push_back({"`" + key + "`", cell});
  }
  doc.table(std::move(table));
}

void add_setup(Document& doc, const RunView& view) {
  const auto& detail = view.detail;
  const auto& spec = detail.spec;
  doc.heading(2, "Setup");
  std::vector<std::string> facts;
  facts.push_back(fmt::format("Experiment `{}`, kind `{}`, spec hash `{}`", detail.run.experiment,
                              text_of(field(spec, "kind")), detail.run.spec_hash.substr(0, 12)));
  facts.push_back(fmt::format("Device `{}`{}", detail.run.device,
                              detail.run.profile.empty() ? " (no profile: the spec's own dims)"
                                                         : " with profile `" + detail.run.profile + "` applied"));
  if (const auto& limit = field(detail.run.args, "memory_limit_bytes"); limit.is_number())
    facts.push_back("Memory limit " + format_bytes(limit.get<double>()) + " (`--memory-limit`)");
  facts.push_back(fmt::format("Started {}, finished {}", date_of(detail.run.started_at), date_of(detail.run.finished_at)));
  doc.bullets(std::move(facts));
  if (const auto& dims = field(spec, "dims"); dims.is_object() && !dims.empty()) {
    doc.heading(3, "Dimensions");
    add_key_values(doc, dims, view.swept_keys, "dims.");
    const auto number = [&](const char* key) -> std::optional<double> {
      const auto& v = field(dims, key);
      return v.is_number() ? std::optional<double>(v.get<double>()) : std::nullopt;
    };
    if (const auto anchors = number("anchors"), block = number("block_size"), context = number("context");
        anchors && block && context && !std::count(view.swept_keys.begin(), view.swept_keys.end(), "dims.anchors"))
      doc.paragraph(fmt::format("Q_LEN = anchors × block_size = {:.0f}; KV_LEN = context + Q_LEN = {:.0f}.",
                                *anchors * *block, *context + *anchors * *block));
  }
  if (const auto& mask = field(spec, "mask"); mask.is_object() && !mask.empty()) {
    std::vector<std::string> parts;
    for (const auto& [key, value] : mask.items()) parts.push_back("`" + key + "=" + text_of(value) + "`");
    doc.paragraph("Mask: " + join(parts, ", ") + ".");
  }
  if (const auto& params = field(spec, "params"); params.is_object() && !params.empty()) {
    doc.heading(3, "Parameters");
    add_key_values(doc, params, view.swept_keys, "params.");
  }
  doc.heading(3, "Environment");
  doc.paragraph(fmt::format("Env `{}`: {}.", short_id(detail.run.env_id), env_summary(detail.env)));
  // Every fingerprint leaf, grouped by component as `harness diff` groups changes.
  auto leaves = diff_envs(json::object(), detail.env);
  TableBlock table;
  table.headers = {"component", "key", "value"};
  for (const auto& leaf : leaves) table.rows.push_back({leaf.component, "`" + leaf.key + "`", leaf.after});
  if (!table.rows.empty()) doc.table(std::move(table));
}

void add_method(Document& doc, const RunView& view) {
  const auto& spec = view.detail.spec;
  doc.heading(2, "Method");
  std::vector<std::string> facts;
  if (const auto& variants = field(spec, "variants"); variants.is_object() && !variants.empty()) {
    std::vector<std::string> parts;
    for (const auto& [name, settings] : variants.items()) parts.push_back("`" + name + "` " + settings.dump());
    facts.push_back("Variants: " + join(parts, "; "));
  } else {
    facts.push_back("Variants: " + join(view.variants, ", "));
  }
  std::string repeats = "Repeats: " + text_of(field(spec, "repeats"));
  if (field(spec, "warmup").is_number()) repeats += ", after " + text_of(field(spec, "warmup")) + " warmup step(s)";
  facts.push_back(repeats + "; each variant runs isolated in its own child process");
  if (const auto& sweep = field(spec, "sweep"); sweep.is_object() && !sweep.empty()) {
    std::vector<std::string> parts;
    for (const auto& [key, values] : sweep.items()) parts.push_back("`" + key + "` over " + text_of(values));
    facts.push_back("Sweep: " + join(parts, "; ") + fmt::format(" ({} points)", view.points.size()));
  } else if (view.points.size() > 1) {
    std::vector<std::string> labels;
    for (const auto& point : view.points) labels.push_back(point_label(point));
    facts.push_back(fmt::format("Sweep points ({}): {}", view.points.size(), join(labels, "; ")));
  } else {
    facts.push_back("No sweep: one point");
  }
  if (const auto& measure = field(spec, "measure"); measure.is_array() && !measure.empty()) {
    std::vector<std::string> names;
    for (const auto& m : measure) names.push_back("`" + text_of(m) + "`");
    facts.push_back("Measured: " + join(names, ", "));
  }
  if (const auto& check = field(spec, "check"); check.is_object() && field(check, "enabled") == true)
    facts.push_back(fmt::format("Correctness: outputs and gradients against an fp32 dense reference, allowed error "
                                "{} × the dense path's own low-precision error + {}",
                                text_of(field(check, "factor")), text_of(field(check, "atol"))));
  doc.bullets(std::move(facts));
  if (const auto& rules = field(spec, "verdict"); rules.is_array() && !rules.empty()) {
    std::vector<std::string> clauses;
    for (const auto& rule : rules) {
      if (rule.contains("if"))
        clauses.push_back("if `" + text_of(rule["if"]) + "` then **" + text_of(field(rule, "then")) + "**");
      else if (rule.contains("else"))
        clauses.push_back("otherwise **" + text_of(rule["else"]) + "**");
      else
        clauses.push_back("`" + rule.dump() + "`");
    }
    doc.paragraph("Verdict rule, first clause that holds: " + join(clauses, "; ") + ".");
  }
}

void add_results(Document& doc, const RunView& view, const std::vector<Figure>& figures) {
  doc.heading(2, "Results");
  const auto metrics = view.primary_metrics();
  const bool any_point = view.points.size() > 1 || (!view.points.empty() && !view.points.front().empty());
  TableBlock table;
  if (any_point) table.headers.push_back("point");
  table.headers.insert(table.headers.end(), {"variant", "status"});
  const size_t fixed = table.headers.size();
  for (const auto& m : metrics) table.headers.push_back(m);
  table.right_align.assign(table.headers.size(), false);
  for (size_t c = fixed; c < table.headers.size(); ++c) table.right_align[c] = true;
  for (const auto& point : view.points) {
    for (const auto& variant : view.variants) {
      const auto trials = view.trials_at(point, variant);
      bool any_metric = false;
      std::vector<std::string> row;
      if (any_point) row.push_back(point_or_dash(point));
      row.push_back(variant.empty() ? "(run)" : variant);
      row.push_back(status_summary(trials));
      for (const auto& m : metrics) {
        const Series* s = view.find(point, variant, m);
        any_metric = any_metric || s;
        row.push_back(s ? spread_cell(*s) : "-");
      }
      if (trials.empty() && !any_metric) continue;
      table.rows.push_back(std::move(row));
    }
  }
  if (table.rows.empty()) {
    doc.paragraph("No trial or metric was recorded.");
  } else {
    doc.paragraph("Medians over the repeats, [min–max] where the repeats differ. Every metric is listed under "
                  "\"All measurements\".");
    doc.table(std::move(table));
  }
  for (const auto& figure : figures) doc.figure(figure);
}

void add_evidence(Document& doc, const db::Run& run) {
  doc.heading(2, "Verdict and evidence");
  const auto& evidence = run.evidence;
  std::string head = "**" + verdict_text(run) + "**";
  if (field(evidence, "if").is_string()) head += ", by the clause `" + evidence["if"].get<std::string>() + "`";
  else if (evidence.contains("then")) head += ", by the rule's last (else) clause";
  doc.paragraph(head + ".");
  if (field(evidence, "reason").is_string()) doc.paragraph(evidence["reason"].get<std::string>());
  std::vector<std::string> lines;
  if (const auto& values = field(evidence, "values"); values.is_array()) {
    for (const auto& value : values) {
      const std::string metric = value.value("metric", "");
      const std::string unit = unit_from_name(metric);
      std::string line = "`" + value.value("variant", "") + (metric.empty() ? "" : "." + metric) + "`";
      if (field(value, "value").is_number()) line += " = " + format_value(value["value"].get<double>(), unit);
      if (field(value, "threshold").is_number() && value.value("op", "") != "!=")
        line += " " + value.value("op", "") + " " + format_value(value["threshold"].get<double>(), unit);
      if (field(value, "held").is_boolean()) line += value["held"].get<bool>() ? " (holds)" : " (does not hold)";
      if (field(value, "point").is_object() && !value["point"].empty()) line += " at " + point_label(value["point"]);
      lines.push_back(line);
    }
  }
  // Anything else the rule recorded (fits, R², counts): shown as stored.
  for (const auto& [key, value] : evidence.items()) {
    if (key == "if" || key == "then" || key == "reason" || key == "values") continue;
    if ((value.is_array() || value.is_object()) && value.empty()) continue;
    std::string text = value.is_string() ? value.get<std::string>() : value.dump();
    if (text.size() > 400) text = text.substr(0, 400) + " …";
    lines.push_back("`" + key + "`: " + text);
  }
  if (!lines.empty()) doc.bullets(std::move(lines));
  if (evidence.empty()) doc.paragraph("No evidence was stored with this verdict.");
}

void add_memory_model(Document& doc, const RunView& view) {
  doc.heading(2, "Memory model against measured");
  const bool any_point = std::any_of(view.points.begin(), view.points.end(), [](const json& p) { return !p.empty(); });
  TableBlock table;
  table.headers = {"point", "variant", "quantity", "predicted", "measured", "error"};
  table.right_align = {false, false, false, true, true, true};
  double worst = 0.0;
  std::string worst_where;
  for (const auto& s : view.series) {
    if (!is_model(s.metric)) continue;
    const std::string measured_name = s.metric.substr(6);
    const Series* measured = view.find(s.point, s.variant, measured_name);
    const std::string unit = s.unit.empty() ? unit_from_name(measured_name) : s.unit;
    std::string measured_cell = "-", error_cell = "-";
    if (measured) {
      measured_cell = format_value(measured->spread.median, unit);
      if (s.spread.median != 0.0) {
        const double error = (measured->spread.median - s.spread.median) / s.spread.median;
        error_cell = fmt::format("{:+.1f} %", 100.0 * error);
        if (std::fabs(error) > std::fabs(worst)) {
          worst = error;
          worst_where = fmt::format("`{}` of {}{}", measured_name, s.variant,
                                    s.point.empty() ? "" : " at " + point_label(s.point));
        }
      }
    } else {
      const auto trials = view.trials_at(s.point, s.variant);
      for (const auto* t : trials)
        if (t->status != "ok") {
          measured_cell = "(trial " + t->status + ")";
          if (t->requested_bytes) measured_cell += ", requested " + format_bytes(static_cast<double>(*t->requested_bytes));
        }
    }
    table.rows.push_back({point_or_dash(s.point), s.variant, "`" + measured_name + "`", format_value(s.spread.median, unit),
                          measured_cell, error_cell});
  }
  if (!any_point) {
    table.headers.erase(table.headers.begin());
    table.right_align.erase(table.right_align.begin());
    for (auto& row : table.rows) row.erase(row.begin());
  }
  if (table.rows.empty()) {
    doc.paragraph("No memory-model predictions (`model_*` metrics) were recorded with this run.");
    return;
  }
  doc.paragraph("Error = (measured − predicted) / predicted, measured as the median over repeats.");
  doc.table(std::move(table));
  if (!worst_where.empty())
    doc.paragraph(fmt::format("Largest deviation: {:+.1f} % ({}).", 100.0 * worst, worst_where));
}

// The allocator snapshots the run kept (an OOM's, or --memory-snapshot's): the timeline of
// allocated and reserved bytes and the largest allocations at the OOM or the peak, each named with
// the tensors the memory model predicts for that trial.
void add_memory_snapshots(Document& doc, const RunView& view, const std::string& db_path) {
  const auto& detail = view.detail;
  std::vector<const db::Artifact*> snapshots;
  for (const auto& artifact : detail.artifacts)
    if (artifact.kind == "memory_snapshot") snapshots.push_back(&artifact);
  if (snapshots.empty()) return;
  doc.heading(2, "Allocator snapshots");
  doc.paragraph("PyTorch's caching-allocator history of the step (open the file in PyTorch's memory_viz: "
                "`python -m torch.cuda._memory_viz trace_plot FILE -o snapshot.html`). Bars name the tensors of that "
                "size in the memory model's prediction for the trial.");
  // A row names its file inside the db's artifact folder; one edited to point elsewhere (a db
  // from someone else) is named, never opened.
  const db::ArtifactFolder folder(db_path);
  int index = 0;
  for (const auto* artifact : snapshots) {
    const db::Trial* trial = nullptr;
    for (const auto& t : detail.trials)
      if (artifact->trial_id && t.id == *artifact->trial_id) trial = &t;
    const std::string whose = trial ? fmt::format("`{}`{} ({})", trial->variant,
                                                  trial->point.empty() ? "" : " at " + point_label(trial->point), trial->status)
                                    : "the run";
    const db::ResolvedArtifact resolved = folder.resolve(artifact->path);
    if (resolved.place == db::ResolvedArtifact::Place::outside) {
      doc.paragraph(fmt::format("Snapshot of {}: `{}` is outside the db's artifact folder ({}); not read", whose,
                                clip_text(artifact->path, 200), resolved.problem));
      continue;
    }
    const std::string& path = resolved.file;
    SnapshotSummary summary;
    try {
      summary = read_snapshot(path);
    } catch (const std::exception& error) {
      doc.paragraph(fmt::format("Snapshot of {}: `{}` cannot be read: {}", whose, artifact->path, error.what()));
      continue;
    }
    if (trial) {
      try {
        const spec::Spec trial_spec = spec::spec_at_point(
            spec::parse_spec(detail.spec, "run " + std::to_string(detail.run.id), true),
            trial->point.is_object() ? trial->point : json::object());
        name_blocks(summary, memory_model::predict(trial_spec, trial->variant, "cuda"));
      } catch (const std::exception&) {
        // Not an attention_step spec, or one the model does not cover: the bars stay unnamed.
      }
    }
    std::string text = fmt::format("Snapshot of {}: `{}`, {} allocator events; peak {} allocated, largest block {}",
                                   whose, artifact->path, summary.trace_events,
                                   format_bytes(static_cast<double>(summary.peak_allocated)),
                                   format_bytes(static_cast<double>(summary.largest_block)));
    if (summary.oom)
      text += fmt::format("; the OOM asked for {}{} with {} allocated and {} reserved",
                          format_bytes(static_cast<double>(summary.oom->requested_bytes)),
                          summary.oom->name.empty() ? "" : " (" + summary.oom->name + ")",
                          format_bytes(static_cast<double>(summary.oom->allocated)),
                          format_bytes(static_cast<double>(summary.oom->reserved)));
    doc.paragraph(text + ".");
    const std::string id = "snapshot-" + std::to_string(++index);
    doc.figure({id + "-peak",
                fmt::format("Largest allocations at the {} of {}", summary.oom ? "OOM" : "peak", whose),
                render_snapshot_peak_svg(summary, 8, fmt::format("Largest allocations at the {}", summary.oom ? "OOM" : "peak"))});
    doc.figure({id + "-timeline", fmt::format("Allocated and reserved bytes over the recorded step of {}", whose),
                render_snapshot_timeline_svg(summary, "Allocator timeline")});
  }
}

void add_failures(Document& doc, const db::Store& store, const RunView& view, const std::vector<db::Run>& replays) {
  const auto& detail = view.detail;
  doc.heading(2, "Failures and replays");
  std::vector<const db::Trial*> failed;
  for (const auto& t : detail.trials)
    if (t.status != "ok") failed.push_back(&t);
  if (detail.trials.empty()) {
    doc.paragraph("No trials were recorded.");
  } else if (failed.empty()) {
    doc.paragraph(fmt::format("All {} trials ended ok.", detail.trials.size()));
  } else {
    TableBlock table;
    table.headers = {"point", "variant", "status", "exit", "requested", "time"};
    table.right_align = {false, false, false, false, true, true};
    for (const auto* t : failed) {
      const std::string exit = t->signal ? fmt::format("signal {}", *t->signal)
                               : t->exit_code ? std::to_string(*t->exit_code) : "-";
      table.rows.push_back({point_or_dash(t->point), t->variant, "**" + t->status + "**", exit,
                            t->requested_bytes ? format_bytes(static_cast<double>(*t->requested_bytes)) : "-",
                            fmt::format("{:.1f} s", t->duration_s)});
    }
    doc.table(std::move(table));
    for (const auto* t : failed) {
      const std::string where = t->point.empty() ? "" : " at " + point_label(t->point);
      if (!t->error.empty()) {
        doc.paragraph(fmt::format("`{}`{} ({}): error", t->variant, where, t->status));
        doc.code(quote_lines(t->error, kQuotedLines, false));
      }
      if (!t->stderr_tail.empty() && (t->error.empty() || t->status == "crashed" || t->status == "timeout")) {
        doc.paragraph(fmt::format("`{}`{} ({}): last lines of stderr", t->variant, where, t->status));
        doc.code(quote_lines(t->stderr_tail, kQuotedLines, true));
      }
    }
  }
  std::vector<std::string> capsules;
  for (const auto& artifact : detail.artifacts) {
    if (artifact.kind != "capsule") continue;
    std::string owner;
    for (const auto& t : detail.trials)
      if (artifact.trial_id && t.id == *artifact.trial_id)
        owner = " of `" + t.variant + "`" + (t.point.empty() ? "" : " at " + point_label(t.point)) + " (" + t.status + ")";
    capsules.push_back(fmt::format("`{}`{}, {}, sha256 `{}`", artifact.path, owner,
                                   format_bytes(static_cast<double>(artifact.bytes)), artifact.sha256.substr(0, 16)));
  }
  if (!capsules.empty()) {
    doc.paragraph("Capsules kept (the recorded steps `harness replay` re-executes):");
    doc.bullets(std::move(capsules));
  }
  if (replays.empty()) {
    doc.paragraph(failed.empty() ? "No replays recorded." : "No replay of this run is recorded yet (see Reproduce).");
    return;
  }
  TableBlock table;
  table.headers = {"replay run", "started", "device", "env", "status", "verdict", "trials"};
  for (const auto& replay : replays) {
    const auto replay_detail = store.get_run(replay.id);
    std::vector<std::string> trial_parts;
    std::string env_text = short_id(replay.env_id);
    if (replay_detail) {
      for (const auto& t : replay_detail->trials)
        trial_parts.push_back(t.variant + (t.point.empty() ? "" : " @ " + point_label(t.point)) + " " + t.status);
      if (replay.env_id != detail.run.env_id) {
        const auto changes = diff_envs(detail.env, replay_detail->env);
        if (!changes.empty()) env_text += " (changed: " + join(changed_components(changes), ", ") + ")";
      } else {
        env_text += " (same)";
      }
    }
    std::string verdict = verdict_text(replay);
    if (field(replay.evidence, "reproduced").is_boolean())
      verdict += replay.evidence["reproduced"].get<bool>() ? " (reproduced)" : " (not reproduced)";
    table.rows.push_back({std::to_string(replay.id), date_of(replay.started_at), replay.device, env_text, replay.status,
                          verdict, join(trial_parts, ", ")});
  }
  doc.paragraph(fmt::format("Replays of this run ({}):", replays.size()));
  doc.table(std::move(table));
}

// The metric the verdict read (first evidence value), else the first result column.
std::pair<std::string, std::string> key_metric(const RunView& view) {
  const auto& values = field(view.detail.run.evidence, "values");
  if (values.is_array())
    for (const auto& value : values)
      if (value.is_object() && value.contains("metric") && value["metric"].is_string())
        return {value.value("variant", ""), value["metric"].get<std::string>()};
  const auto primary = view.primary_metrics();
  return {view.variants.empty() ? "" : view.variants.front(), primary.empty() ? "" : primary.front()};
}

void add_history(Document& doc, const db::Store& store, const RunView& view) {
  const auto& current = view.detail.run;
  doc.heading(2, "History across envs");
  db::RunFilter filter;
  filter.experiment = current.experiment;
  filter.limit = 0;
  std::vector<db::Run> runs;
  for (auto& run : store.list_runs(filter))
    if (!run.replay_of && run.status != "running") runs.push_back(std::move(run));
  if (runs.size() <= 1) {
    doc.paragraph("This is the only finished run of `" + current.experiment + "` in the db.");
    return;
  }
  const auto [key_variant, key_name] = key_metric(view);
  // The point the key metric is read at: the last point (largest sweep value), in every run.
  const json reference_point = view.points.empty() ? json::object() : view.points.back();

  // Verdicts per env, newest run first within each env.
  std::map<std::string, std::vector<const db::Run*>> by_env;
  std::vector<std::string> env_order;
  for (const auto& run : runs) {
    if (!by_env.count(run.env_id)) env_order.push_back(run.env_id);
    by_env[run.env_id].push_back(&run);
  }
  TableBlock envs;
  envs.headers = {"env", "toolchain", "runs", "verdicts", "latest"};
  envs.right_align = {false, false, true, false, false};
  for (const auto& env_id : env_order) {
    const auto& env_runs = by_env[env_id];
    std::map<std::string, int> verdicts;
    for (const auto* run : env_runs) ++verdicts[verdict_text(*run)];
    std::vector<std::string> parts;
    for (const auto& [verdict, count] : verdicts) parts.push_back(fmt::format("{} ×{}", verdict, count));
    const auto fingerprint = store.get_env(env_id).value_or(json::object());
    envs.rows.push_back({"`" + short_id(env_id) + "`" + (env_id == current.env_id ? " (this run)" : ""),
                         env_summary(fingerprint), std::to_string(env_runs.size()), join(parts, ", "),
                         fmt::format("{} (run {})", verdict_text(*env_runs.front()), env_runs.front()->id)});
  }
  doc.paragraph(fmt::format("{} finished runs of `{}` under {} env{}:", runs.size(), current.experiment,
                            env_order.size(), env_order.size() == 1 ? "" : "s"));
  doc.table(std::move(envs));

  TableBlock table;
  table.headers = {"run", "started", "env", "device", "status", "verdict"};
  for (const auto& variant : view.variants) table.headers.push_back("`" + variant + "." + key_name + "`");
  table.right_align.assign(table.headers.size(), false);
  for (size_t c = 6; c < table.headers.size(); ++c) table.right_align[c] = true;
  for (size_t i = 0; i < runs.size() && i < kHistoryRows; ++i) {
    const auto& run = runs[i];
    std::vector<std::string> row = {std::to_string(run.id) + (run.id == current.id ? " (this)" : ""),
                                    date_of(run.started_at), "`" + short_id(run.env_id) + "`", run.device, run.status,
                                    verdict_text(run)};
    const auto detail = store.get_run(run.id);
    const auto series = detail ? collect_series(detail->metrics) : std::vector<Series>{};
    for (const auto& variant : view.variants) {
      const Series* s = find_series(series, reference_point, variant, key_name);
      std::string cell = s ? spread_cell(*s) : "-";
      if (!s) {
        // A run with other sweep points: its last point, named.
        const Series* last = nullptr;
        for (const auto& candidate : series)
          if (candidate.variant == variant && candidate.metric == key_name) last = &candidate;
        if (last) cell = spread_cell(*last) + (last->point.empty() ? "" : " (at " + point_label(last->point) + ")");
      }
      row.push_back(cell);
    }
    table.rows.push_back(std::move(row));
  }
  doc.paragraph(fmt::format("Every run, newest first{}; key metric `{}`{} (the one the verdict reads{}):",
                            runs.size() > kHistoryRows ? fmt::format(" ({} shown)", kHistoryRows) : "", key_name,
                            reference_point.empty() ? "" : " at " + point_label(reference_point),
                            key_variant.empty() ? "" : ", there of `" + key_variant + "`"));
  doc.table(std::move(table));
}

void add_reproduce(Document& doc, const RunView& view, const std::vector<db::Run>& replays, const std::string& db_path,
                   const std::optional<db::Run>& compare_with) {
  const auto& run = view.detail.run;
  const std::string db = " --db " + shell_quote(db_path);
  doc.heading(2, "Reproduce");
  std::vector<std::string> lines;
  if (const auto& recorded = field(view.detail.env, "git_commit"); recorded.is_string()) {
    // "<sha>-dirty": built with uncommitted changes, which no checkout brings back.
    std::string commit = recorded.get<std::string>();
    const bool dirty = commit.size() > 6 && commit.compare(commit.size() - 6, 6, "-dirty") == 0;
    if (dirty) commit.resize(commit.size() - 6);
    lines.push_back(fmt::format("# built from commit {}{} (harness {}): git checkout {} && scripts/setup.sh", commit,
                                dirty ? " plus uncommitted changes" : "",
                                text_of(field(view.detail.env, "harness_version")), commit));
  }
  lines.push_back("# the run itself");
  lines.push_back(reproduce_command(run, db_path));
  lines.push_back("# what was recorded, and this writeup");
  lines.push_back(fmt::format("harness show {}{}", run.id, db));
  lines.push_back(fmt::format("harness writeup {} -o {}-run{}.md --html{}", run.id, run.experiment, run.id, db));
  const bool any_failed = std::any_of(view.detail.trials.begin(), view.detail.trials.end(),
                                      [](const db::Trial& t) { return t.status != "ok"; });
  if (any_failed || !replays.empty()) {
    lines.push_back("# re-execute the recorded failing step (same or another device)");
    lines.push_back(fmt::format("harness replay {}{}", run.id, db));
  }
  if (compare_with) {
    lines.push_back(fmt::format("# compare with the latest run under the previous env ({})", short_id(compare_with->env_id)));
    lines.push_back(fmt::format("harness diff {} {}{}", compare_with->id, run.id, db));
  }
  doc.code(join(lines, "\n") + "\n", "sh");
  doc.paragraph("The spec is the one stored with the run (hash `" + run.spec_hash.substr(0, 12) +
                "`): if the file in `experiments/` changed since, `harness show " + std::to_string(run.id) +
                " --json` prints the exact one.");
}

void add_all_measurements(Document& doc, const RunView& view) {
  doc.heading(2, "All measurements");
  TableBlock table;
  table.headers = {"point", "variant", "metric", "median", "min", "max", "n"};
  table.right_align = {false, false, false, true, true, true, true};
  for (const auto& s : view.series)
    table.rows.push_back({point_or_dash(s.point), s.variant.empty() ? "(run)" : s.variant, "`" + s.metric + "`",
                          format_value(s.spread.median, s.unit), format_value(s.spread.min, s.unit),
                          format_value(s.spread.max, s.unit),
                          s.repeated ? std::to_string(s.spread.count) : "1 (once)"});
  if (table.rows.empty()) {
    doc.paragraph("No metrics were recorded.");
  } else {
    doc.table(std::move(table));
  }
}

std::string stem_of(const std::string& output_path) {
  for (const std::string extension : {".md", ".html", ".htm", ".markdown"})
    if (output_path.size() > extension.size() &&
        output_path.compare(output_path.size() - extension.size(), extension.size(), extension) == 0)
      return output_path.substr(0, output_path.size() - extension.size());
  return output_path;
}

}  // namespace

std::string shell_quote(const std::string& word) {
  const bool safe = !word.empty() && std::all_of(word.begin(), word.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::string("_-./:=,+@%").find(c) != std::string::npos;
  });
  if (safe) return word;
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string reproduce_command(const db::Run& run, const std::string& db_path) {
  const auto& args = run.args;
  // A run that recorded its whole command line is repeated verbatim.
  if (const auto& argv = field(args, "argv"); argv.is_array() && !argv.empty()) {
    std::vector<std::string> words = {"harness"};
    for (const auto& word : argv)
      if (word.is_string()) words.push_back(shell_quote(word.get<std::string>()));
    return join(words, " ");
  }
  std::vector<std::string> words = {"harness", "run"};
  const auto& experiment = field(args, "experiment");
  words.push_back(shell_quote(experiment.is_string() ? experiment.get<std::string>() : run.experiment));
  words.push_back("--device");
  words.push_back(shell_quote(run.device));
  if (const auto& sets = field(args, "set"); sets.is_array())
    for (const auto& set : sets)
      if (set.is_string()) {
        words.push_back("--set");
        words.push_back(shell_quote(set.get<std::string>()));
      }
  if (!run.profile.empty()) {
    words.push_back("--profile");
    words.push_back(shell_quote(run.profile));
  } else if (run.device == "cpu") {
    words.push_back("--no-profile");
  }
  if (const auto& limit = field(args, "memory_limit_bytes"); limit.is_number_integer()) {
    const int64_t bytes = limit.get<int64_t>();
    constexpr int64_t kGiB = int64_t{1} << 30, kMiB = int64_t{1} << 20;
    words.push_back("--memory-limit");
    words.push_back(bytes % kGiB == 0   ? std::to_string(bytes / kGiB) + "GiB"
                    : bytes % kMiB == 0 ? std::to_string(bytes / kMiB) + "MiB"
                                        : std::to_string(bytes));
  }
  if (const auto& python = field(args, "python"); python.is_string()) {
    words.push_back("--python");
    words.push_back(shell_quote(python.get<std::string>()));
  }
  words.push_back("--db");
  words.push_back(shell_quote(db_path));
  return join(words, " ");
}

db::RunDetail resolve_writeup_target(const db::Store& store, const std::string& target) {
  db::RunFilter any;
  any.limit = 1;
  if (store.list_runs(any).empty()) throw UsageError("no runs in " + store.path() + " (run an experiment first)");
  const bool numeric = !target.empty() && std::all_of(target.begin(), target.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
  if (numeric) {
    int64_t id = 0;
    try {
      id = std::stoll(target);
    } catch (const std::out_of_range&) {
      throw UsageError("run id " + target + " is out of range");
    }
    auto detail = store.get_run(id);
    if (!detail) throw UsageError(fmt::format("no run {} in {} (`harness runs` lists them)", id, store.path()));
    return std::move(*detail);
  }
  const auto latest = store.latest_run(target, std::nullopt);
  if (!latest) {
    std::vector<std::string> names;
    for (const auto& row : store.list_experiments())
      if (std::find(names.begin(), names.end(), row.name) == names.end()) names.push_back(row.name);
    throw UsageError(fmt::format("'{}' is neither a run id nor an experiment with finished runs in {} (experiments: {})",
                                 target, store.path(), names.empty() ? "none" : join(names, ", ")));
  }
  return std::move(*store.get_run(latest->id));
}

Writeup build_writeup(const db::Store& store, const db::RunDetail& detail, const std::string& db_path) {
  const RunView view(detail);
  Writeup writeup;
  writeup.run_id = detail.run.id;
  writeup.experiment = detail.run.experiment;
  Document& doc = writeup.document;
  doc.title = fmt::format("{}: {} (run {})", detail.run.experiment, verdict_text(detail.run), detail.run.id);
  const auto replays = store.list_replays(detail.run.id);
  // The newest run under another env, for the diff command in Reproduce.
  std::optional<db::Run> compare_with;
  db::RunFilter filter;
  filter.experiment = detail.run.experiment;
  filter.limit = 0;
  for (const auto& run : store.list_runs(filter))
    if (run.id < detail.run.id && run.env_id != detail.run.env_id && !run.replay_of && run.status != "running") {
      compare_with = run;
      break;
    }

  add_summary(doc, view);
  add_hypothesis(doc, detail.spec);
  add_setup(doc, view);
  add_method(doc, view);
  add_results(doc, view, make_figures(view));
  add_evidence(doc, detail.run);
  add_memory_model(doc, view);
  add_memory_snapshots(doc, view, db_path);
  add_failures(doc, store, view, replays);
  add_history(doc, store, view);
  add_reproduce(doc, view, replays, db_path, compare_with);
  add_all_measurements(doc, view);
  return writeup;
}

WrittenFiles write_writeup(const Writeup& writeup, const std::string& output_path, bool html) {
  namespace fs = std::filesystem;
  const std::string stem = stem_of(output_path);
  const bool html_path = stem != output_path && output_path.size() >= 5 &&
                         (output_path.substr(output_path.size() - 5) == ".html" ||
                          output_path.substr(output_path.size() - 4) == ".htm");
  WrittenFiles files;
  const std::string figure_stem = fs::path(stem).filename().string();
  for (const auto* figure : writeup.document.figures()) {
    const std::string path = stem + "-" + figure->id + ".svg";
    write_file_atomic(path, figure->svg);
    files.figures.push_back(path);
  }
  files.markdown = html_path ? stem + ".md" : (stem == output_path ? output_path + ".md" : output_path);
  write_file_atomic(files.markdown, render_markdown(writeup.document, figure_stem + "-"));
  if (html || html_path) {
    files.html = html_path ? output_path : stem + ".html";
    write_file_atomic(files.html, render_html(writeup.document));
  }
  return files;
}

}  // namespace harness::analysis
