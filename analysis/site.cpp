#include "analysis/site.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "analysis/bisect.h"
#include "analysis/diff.h"
#include "analysis/document.h"
#include "analysis/env_diff.h"
#include "analysis/run_sections.h"
#include "analysis/series.h"
#include "analysis/site_history.h"
#include "analysis/site_html.h"
#include "analysis/svg_plot.h"
#include "analysis/writeup.h"
#include "core/errors.h"
#include "core/files.h"
#include "core/printer.h"

namespace harness::analysis {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using site::h;
using site::link;

// The file that marks a folder as a site this command wrote (so rebuilding may replace it).
const char* const kMarker = ".harness-site";
// Plots shown open on an experiment page; the others are folded under "More metrics".
constexpr size_t kOpenPlots = 6;
// More series than this in one plot, and a sweep's plot is split into one plot per point.
constexpr size_t kMaxSeriesPerPlot = 8;
// Palette indices of data series: red (1) is kept for the regression rings.
const int kSeriesColors[] = {0, 2, 3, 4, 5, 6, 7, 8, 9};
constexpr int kWorseColor = 1;
// Rows of an experiment's verdict-flip table; of the run list of an env page.
constexpr size_t kListedFlips = 100;
constexpr size_t kListedEnvRuns = 50;
// Envs per side-by-side table.
constexpr size_t kEnvColumns = 8;
// Characters of a run's error in the index.
constexpr size_t kIndexErrorChars = 160;

std::string date_of(const std::string& iso) {
  if (iso.size() < 16) return iso.empty() ? "-" : iso;
  return iso.substr(0, 10) + " " + iso.substr(11, 5);
}

std::string short_id(const std::string& id) { return id.empty() ? "(none)" : id.substr(0, 12); }

std::string text_of(const json& value) {
  if (value.is_string()) return value.get<std::string>();
  return value.is_null() ? "" : value.dump();
}

std::string commit_of(const json& env) {
  if (!env.is_object() || !env.contains("git_commit")) return "";
  return text_of(env["git_commit"]).substr(0, 12);
}

std::string verdict_text(const std::string& verdict) { return verdict.empty() ? "(none)" : verdict; }

std::string cut(const std::string& text, size_t chars) {
  if (text.size() <= chars) return text;
  size_t at = chars;
  while (at > 0 && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) --at;
  return text.substr(0, at) + "…";
}

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string out;
  for (const auto& part : parts) out += (out.empty() ? "" : separator) + part;
  return out;
}

// Percent-encodes a path for an href (keeps letters, digits, -._~/).
std::string url_path(const std::string& path) {
  std::string out;
  for (unsigned char c : path) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' ||
        c == '~' || c == '/')
      out += static_cast<char>(c);
    else
      out += fmt::format("%{:02X}", c);
  }
  return out;
}

// ---- the site's data -------------------------------------------------------------------------

struct Site {
  const db::Store& store;
  SiteOptions options;
  fs::path final_dir;  // absolute: where the site will be
  fs::path staging;    // where it is written first
  fs::path db_dir;
  std::vector<db::RunDetail> details;  // newest first
  std::map<int64_t, const db::RunDetail*> by_id;
  std::vector<site::ExperimentHistory> histories;
  std::map<int64_t, const site::HistoryRun*> history_of;
  std::map<int64_t, const site::ExperimentHistory*> experiment_of;
  std::map<int64_t, std::vector<int64_t>> replays_of;
  std::vector<std::string> env_order;  // first seen first
  std::map<std::string, json> envs;
  std::map<std::string, size_t> env_runs;
  std::vector<db::Bisect> bisects;
  std::map<int64_t, std::vector<int64_t>> bisects_of_run;
  std::set<std::string> experiments;                          // every experiment a run names: each gets a page
  std::set<std::pair<std::string, std::string>> env_pairs;  // envs compared on a page: consecutive ones, and a run's with its predecessor's
  SiteStats stats;

  Site(const db::Store& s, SiteOptions o) : store(s), options(std::move(o)) {}

  void write(const std::string& relative, const std::string& content) {
    const fs::path path = staging / relative;
    fs::create_directories(path.parent_path());
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << content;
    out.close();
    if (!out) throw InfraError("site: cannot write " + path.string());
    stats.bytes += content.size();
    if (relative.size() > 5 && relative.compare(relative.size() - 5, 5, ".html") == 0) {
      ++stats.pages;
      if (content.size() > stats.largest_page_bytes) {
        stats.largest_page_bytes = content.size();
        stats.largest_page = relative;
      }
    }
  }
};

std::string run_href(int64_t id) { return "run/" + std::to_string(id) + ".html"; }
std::string experiment_href(const std::string& name, size_t page_number = 1) {
  return "experiment/" + site::slug(name) + "/" + (page_number <= 1 ? std::string("index.html")
                                                                    : fmt::format("page-{}.html", page_number));
}
std::string env_href(const std::string& env_id) { return "env/" + site::slug(env_id) + ".html"; }
std::string envdiff_href(const std::string& a, const std::string& b) {
  return "envdiff/" + site::slug(a).substr(0, 16) + "_" + site::slug(b).substr(0, 16) + ".html";
}
std::string bisect_href(int64_t id) { return "bisect/" + std::to_string(id) + ".html"; }

std::string run_link(const std::string& root, int64_t id) { return link(root + run_href(id), std::to_string(id)); }
std::string env_link(const std::string& root, const std::string& env_id) {
  return env_id.empty() ? "-" : link(root + env_href(env_id), short_id(env_id));
}

std::string env_summary_of(const Site& s, const std::string& env_id) {
  const auto found = s.envs.find(env_id);
  return found == s.envs.end() ? "" : env_summary(found->second);
}

// ---- experiment pages: plots, strips, flips, regressions -------------------------------------

struct SeriesKey {
  size_t track = 0;
  json point;
  std::string variant;
  bool operator==(const SeriesKey& other) const {
    return track == other.track && point == other.point && variant == other.variant;
  }
};

std::string point_tip(const site::HistoryRun& run, const Series& series, const std::string& metric) {
  const auto& r = run.detail->run;
  std::string tip = fmt::format("run {} · {} · {}{}\n{} {}", r.id, date_of(r.started_at), series.variant.empty() ? "(run)" : series.variant,
                                series.point.empty() ? "" : " at " + point_label(series.point), metric,
                                format_value(series.spread.median, series.unit));
  if (series.repeated && series.spread.count > 1)
    tip += fmt::format(" (median of {}, {}–{})", series.spread.count, format_value(series.spread.min, series.unit),
                       format_value(series.spread.max, series.unit));
  tip += fmt::format("\nenv {} {}", short_id(r.env_id), env_summary(run.detail->env));
  const std::string commit = commit_of(run.detail->env);
  tip += fmt::format("\n{}verdict {} · {}", commit.empty() ? "" : "commit " + commit + " · ", verdict_text(r.verdict), r.device);
  return tip;
}

// The plots of one window of an experiment's runs.
std::vector<std::string> experiment_plots(const site::ExperimentHistory& history, const std::vector<size_t>& window) {
  std::map<std::string, std::vector<SeriesKey>> keys_of;
  for (const size_t i : window) {
    const auto& run = history.runs[i];
    for (const auto& series : run.series) {
      if (series.metric.rfind("model_", 0) == 0) continue;
      auto& keys = keys_of[series.metric];
      const SeriesKey key{run.track, series.point, series.variant};
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
    }
  }
  std::vector<std::string> metrics;
  for (const auto& [metric, keys] : keys_of) metrics.push_back(metric);
  std::stable_sort(metrics.begin(), metrics.end(),
                   [](const std::string& a, const std::string& b) { return metric_rank(a) < metric_rank(b); });
  std::vector<std::string> categories;
  for (const size_t i : window) categories.push_back(std::to_string(history.runs[i].detail->run.id));
  std::vector<PlotMark> marks;
  for (size_t j = 0; j < window.size(); ++j) {
    const auto& run = history.runs[window[j]];
    if (!run.env_changed) continue;
    marks.push_back({static_cast<double>(j), "env",
                     fmt::format("run {}: env changed ({})", run.detail->run.id,
                                 join(changed_components(run.diff.env_changes), ", "))});
  }

  std::vector<std::string> figures;
  for (const auto& metric : metrics) {
    const auto& keys = keys_of[metric];
    // Groups of series drawn together: all of them, or one plot per sweep point when too many.
    std::vector<std::pair<std::optional<json>, std::vector<SeriesKey>>> groups;
    if (keys.size() <= kMaxSeriesPerPlot) {
      groups.push_back({std::nullopt, keys});
    } else {
      for (const auto& key : keys) {
        auto found = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return *g.first == key.point; });
        if (found == groups.end()) groups.push_back({key.point, {key}});
        else found->second.push_back(key);
      }
    }
    for (const auto& [group_point, group_keys] : groups) {
      std::set<json> points;
      for (const auto& key : group_keys) points.insert(key.point);
      Plot plot;
      plot.title = metric + (group_point && !group_point->empty() ? " at " + point_label(*group_point) : "");
      plot.x_label = "run, oldest to newest (dashed: the env changed)";
      plot.categories = categories;
      plot.dodge = false;
      plot.x_marks = marks;
      PlotSeries worse;
      worse.label = "called worse";
      worse.color = kWorseColor;
      worse.line = false;
      worse.marker = Marker::kHollowCircle;
      int color_index = 0;
      for (const auto& key : group_keys) {
        PlotSeries series;
        series.label = key.variant.empty() ? "(run)" : key.variant;
        if (points.size() > 1 && !key.point.empty()) series.label += " @ " + point_label(key.point);
        if (history.tracks.size() > 1) series.label += " · " + history.tracks[key.track].label;
        series.color = kSeriesColors[color_index++ % static_cast<int>(std::size(kSeriesColors))];
        series.band = true;
        for (size_t j = 0; j < window.size(); ++j) {
          const auto& run = history.runs[window[j]];
          if (run.track != key.track) continue;
          const Series* s = find_series(run.series, key.point, key.variant, metric);
          if (!s) continue;
          if (plot.y_unit.empty()) plot.y_unit = s->unit;
          PlotPoint point;
          point.x = static_cast<double>(j);
          point.y = s->spread.median;
          point.low = s->spread.min;
          point.high = s->spread.max;
          point.tip = point_tip(run, *s, metric);
          point.key = fmt::format("{}|{}|{}", run.detail->run.id, key.variant, key.point.dump());
          if (const auto* c = run.comparison(key.point, key.variant, metric); c && c->regression) {
            PlotPoint ring = point;
            ring.tip = fmt::format("run {}: {} of {} called WORSE than run {}: {} → {} ({})", run.detail->run.id, metric,
                                   series.label, run.previous->run.id, side_text(c->a, c->unit), side_text(c->b, c->unit),
                                   change_text(*c));
            ring.key.clear();
            ring.low.reset();
            ring.high.reset();
            worse.points.push_back(std::move(ring));
          }
          series.points.push_back(std::move(point));
        }
        plot.series.push_back(std::move(series));
      }
      plot.y_label = metric;
      if (!worse.points.empty()) plot.series.push_back(std::move(worse));
      figures.push_back(fmt::format("<figure class=\"plot\" data-metric=\"{}\">\n{}</figure>\n", h(metric), render_svg(plot)));
    }
  }
  return figures;
}

std::string verdict_strips(const site::ExperimentHistory& history, const std::vector<size_t>& window, const std::string& root) {
  std::ostringstream out;
  for (size_t t = 0; t < history.tracks.size(); ++t) {
    std::ostringstream strip;
    int cells = 0;
    for (const size_t i : window) {
      const auto& run = history.runs[i];
      if (run.track != t) continue;
      ++cells;
      const auto& r = run.detail->run;
      const std::string title = fmt::format("run {} · {} · {} · status {}{}", r.id, date_of(r.started_at),
                                            verdict_text(r.verdict), r.status,
                                            run.verdict_flip ? " · flipped from " + verdict_text(run.previous->run.verdict) : "");
      strip << "<a href=\"" << root << run_href(r.id) << "\"" << (run.verdict_flip ? " class=\"flip\"" : "") << " style=\"background:"
            << site::verdict_color(r.verdict) << "\" title=\"" << h(title) << "\">" << h(cut(verdict_text(r.verdict), 8)) << "</a>";
    }
    if (!cells) continue;
    if (history.tracks.size() > 1) out << "<p class=\"meta\">" << h(history.tracks[t].label) << "</p>\n";
    out << "<div class=\"strip\">" << strip.str() << "</div>\n";
  }
  return out.str();
}

// Rows of regression tables: one per called regression and per trial that was ok and is not.
std::vector<std::vector<std::string>> regression_rows(const site::HistoryRun& run, const std::string& root, bool with_experiment) {
  std::vector<std::vector<std::string>> rows;
  if (!run.has_diff) return rows;
  const auto& r = run.detail->run;
  auto start = [&]() {
    std::vector<std::string> row = {run_link(root, r.id), h(date_of(r.started_at))};
    if (with_experiment) row.push_back(link(root + experiment_href(r.experiment), r.experiment));
    row.push_back(run_link(root, run.previous->run.id));
    return row;
  };
  for (const auto& t : run.diff.trial_changes) {
    if (!t.regression) continue;
    auto row = start();
    row.insert(row.end(), {h(point_label(t.point).empty() ? "-" : point_label(t.point)), h(t.variant), "trial status",
                           h(t.before), h(t.after), "<span class=\"worse\">ok → " + h(t.after) + "</span>"});
    rows.push_back(std::move(row));
  }
  for (const auto& c : run.diff.metrics) {
    if (!c.regression) continue;
    auto row = start();
    row.insert(row.end(), {h(point_label(c.point).empty() ? "-" : point_label(c.point)), h(c.variant.empty() ? "(run)" : c.variant),
                           h(c.metric), h(side_text(c.a, c.unit)), h(side_text(c.b, c.unit)),
                           "<span class=\"worse\">" + h(change_text(c)) + "</span>"});
    rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<std::string> regression_headers(bool with_experiment) {
  std::vector<std::string> headers = {"run", "started"};
  if (with_experiment) headers.push_back("experiment");
  headers.insert(headers.end(), {"against run", "point", "variant", "metric", "before", "after", "change (rule)"});
  return headers;
}

std::string flips_table(const site::ExperimentHistory& history, const std::string& root) {
  std::vector<std::vector<std::string>> rows;
  size_t total = 0;
  for (auto it = history.runs.rbegin(); it != history.runs.rend(); ++it) {
    if (!it->verdict_flip) continue;
    if (++total > kListedFlips) continue;
    const auto& r = it->detail->run;
    std::string env = it->env_changed ? "changed: " + join(changed_components(it->diff.env_changes), ", ") : "same";
    rows.push_back({run_link(root, r.id), h(date_of(r.started_at)), h(history.tracks[it->track].label),
                    run_link(root, it->previous->run.id),
                    "<span class=\"flip\">" + h(verdict_text(it->previous->run.verdict)) + " → " + h(verdict_text(r.verdict)) + "</span>",
                    h(env), env_link(root, r.env_id)});
  }
  if (rows.empty()) return "<p>No verdict flipped: every run reads like the run before it on its track.</p>\n";
  std::string out = total > kListedFlips ? fmt::format("<p class=\"meta\">{} flips; the newest {} listed.</p>\n", total, kListedFlips) : "";
  return out + site::table_html_raw({"run", "started", "track", "after run", "verdict", "env", "env id"}, rows);
}

std::string runs_table(const Site& s, const site::ExperimentHistory& history, const std::vector<size_t>& window,
                       const std::string& root) {
  std::vector<std::vector<std::string>> rows;
  for (auto it = window.rbegin(); it != window.rend(); ++it) {
    const auto& run = history.runs[*it];
    const auto& r = run.detail->run;
    rows.push_back({run_link(root, r.id), h(date_of(r.started_at)), h(r.device), h(history.tracks[run.track].label),
                    env_link(root, r.env_id), h(env_summary_of(s, r.env_id)), h(commit_of(run.detail->env)), h(r.status),
                    run.verdict_flip ? "<span class=\"flip\">⚑ " + h(verdict_text(r.verdict)) + "</span>" : h(verdict_text(r.verdict)),
                    run.regressions ? "<span class=\"worse\">" + std::to_string(run.regressions) + "</span>" : ""});
  }
  return site::table_html_raw({"run", "started", "device", "track", "env", "toolchain", "commit", "status", "verdict", "worse"},
                              rows, {true, false, false, false, false, false, false, false, false, true});
}

void write_experiment_pages(Site& s, const site::ExperimentHistory& history) {
  const std::string root = "../../";
  const size_t total = history.runs.size();
  const size_t window_size = std::max<size_t>(1, s.options.history_window);
  const size_t pages = std::max<size_t>(1, (total + window_size - 1) / window_size);
  const auto& latest = *history.runs.back().detail;
  const std::string hypothesis = latest.spec.contains("hypothesis") ? text_of(latest.spec["hypothesis"]) : "";
  for (size_t page_number = 1; page_number <= pages; ++page_number) {
    // Page 1 holds the newest runs.
    const size_t end = total - std::min(total, (page_number - 1) * window_size);
    const size_t begin = end - std::min(end, window_size);
    std::vector<size_t> window;
    for (size_t i = begin; i < end; ++i) window.push_back(i);
    std::ostringstream body;
    body << "<h1>" << h(history.name) << "</h1>\n";
    if (!hypothesis.empty()) body << "<p><strong>Hypothesis.</strong> " << h(hypothesis) << "</p>\n";
    body << fmt::format("<p class=\"meta\">{} finished runs on {} track{} · {} verdict flip{} · {} regression{} called · "
                        "latest verdict {} (run {})</p>\n",
                        total, history.tracks.size(), history.tracks.size() == 1 ? "" : "s", history.flips(),
                        history.flips() == 1 ? "" : "s", history.regressions(), history.regressions() == 1 ? "" : "s",
                        h(verdict_text(latest.run.verdict)), run_link(root, latest.run.id));
    std::string pager = fmt::format("<div class=\"pager\">runs {}–{} of {} (page {} of {})", begin + 1, end, total,
                                    page_number, pages);
    if (page_number > 1) pager += " " + link(root + experiment_href(history.name, page_number - 1), "← newer");
    if (page_number < pages) pager += " " + link(root + experiment_href(history.name, page_number + 1), "older →");
    pager += "</div>\n";
    body << pager;
    if (history.tracks.size() > 1) {
      std::vector<std::string> labels;
      for (const auto& track : history.tracks) labels.push_back(h(track.label) + fmt::format(" ({} runs)", track.runs.size()));
      body << "<p class=\"meta\">Tracks (runs of one spec on one kind of device, each compared with the run before "
              "it on its track): "
           << join(labels, "; ") << "</p>\n";
    }
    body << "<h2>Verdict history</h2>\n<p class=\"meta\">One box per run, oldest first; ⚑ marks a verdict that "
            "differs from the run before it on its track.</p>\n"
         << verdict_strips(history, window, root);
    body << "<h3>Verdict flips</h3>\n" << flips_table(history, root);

    std::vector<std::vector<std::string>> regressions;
    for (auto it = window.rbegin(); it != window.rend(); ++it)
      for (auto& row : regression_rows(history.runs[*it], root, false)) regressions.push_back(std::move(row));
    body << "<h2>Regressions</h2>\n<p class=\"meta\">Each run against the run before it on its track, by the rule of "
            "<code>harness diff</code>: a change is called when the repeats' min–max ranges do not overlap, or by a "
            "Mann-Whitney test (p &lt; 0.05) with 5 or more repeats on both sides; a regression is a called change the "
            "worse way, or a trial that was ok and is not.</p>\n";
    if (regressions.empty()) body << "<p>None called among these runs.</p>\n";
    else body << site::table_html_raw(regression_headers(false), regressions);

    body << "<h2>Metrics over the runs</h2>\n<p class=\"meta\">Each metric's median per run, oldest run first, with a "
            "shaded band from its smallest to its largest repeat; a red ring marks a change <code>harness diff</code> calls "
            "worse; a dashed line, a run whose env differs from the run before it. Hover a point for its numbers.</p>\n";
    const auto figures = experiment_plots(history, window);
    if (figures.empty()) body << "<p>No metrics recorded.</p>\n";
    body << "<div class=\"plots\">\n";
    for (size_t i = 0; i < figures.size() && i < kOpenPlots; ++i) body << figures[i];
    body << "</div>\n";
    if (figures.size() > kOpenPlots) {
      body << fmt::format("<details><summary>More metrics ({})</summary>\n<div class=\"plots\">\n", figures.size() - kOpenPlots);
      for (size_t i = kOpenPlots; i < figures.size(); ++i) body << figures[i];
      body << "</div>\n</details>\n";
    }
    body << "<h2>Runs</h2>\n" << runs_table(s, history, window, root) << pager;
    s.write(experiment_href(history.name, page_number), site::page(history.name, root, "experiments", body.str()));
  }
}

// An experiment whose runs are all replays or still running has no history, but its runs link to
// its page: that page lists them.
void write_unfinished_experiments(Site& s) {
  std::map<std::string, std::vector<const db::RunDetail*>> without_history;
  for (const auto& detail : s.details)
    if (!s.history_of.count(detail.run.id) &&
        std::none_of(s.histories.begin(), s.histories.end(),
                     [&](const site::ExperimentHistory& x) { return x.name == detail.run.experiment; }))
      without_history[detail.run.experiment].push_back(&detail);
  const std::string root = "../../";
  for (const auto& [name, runs] : without_history) {
    std::vector<std::vector<std::string>> rows;
    for (const auto* detail : runs)
      rows.push_back({run_link(root, detail->run.id), h(date_of(detail->run.started_at)), h(detail->run.device),
                      h(detail->run.status), h(verdict_text(detail->run.verdict)),
                      detail->run.replay_of ? "replays run " + run_link(root, *detail->run.replay_of) : ""});
    const std::string body = "<h1>" + h(name) + "</h1>\n<p>No finished run of its own yet: only replays or runs still "
                             "running.</p>\n" +
                             site::table_html_raw({"run", "started", "device", "status", "verdict", ""}, rows, {true});
    s.write(experiment_href(name), site::page(name, root, "experiments", body));
  }
}

// ---- run pages --------------------------------------------------------------------------------

std::string artifact_section(Site& s, const db::RunDetail& detail, const std::string& root) {
  const auto entries = run_artifacts(detail, s.options.db_path);
  if (entries.empty()) return "";
  std::ostringstream out;
  out << "<h2>Artifacts</h2>\n<ul class=\"artifacts\">\n";
  for (const auto& entry : entries) {
    const fs::path file(entry.path);
    std::string href;
    std::error_code error;
    const bool exists = !entry.outside && fs::is_regular_file(file, error);
    if (exists && s.options.copy_artifacts) {
      // Only files inside the db's folder are copied: the db is untrusted, and a row must not
      // pull an arbitrary file of this machine into a site that is published.
      const fs::path inside = file.lexically_relative(s.db_dir);
      if (!inside.empty() && *inside.begin() != ".." && !inside.is_absolute()) {
        const fs::path target = s.staging / "artifacts" / inside;
        fs::create_directories(target.parent_path());
        if (!fs::exists(target)) {
          fs::copy_file(file, target, error);
          if (error) throw InfraError("site: cannot copy " + file.string() + ": " + error.message());
          s.stats.bytes += fs::file_size(target);
          ++s.stats.artifacts_copied;
        }
        href = root + url_path(("artifacts" / inside).generic_string());
      }
    } else if (exists) {
      href = url_path(fs::relative(file, s.final_dir / "run", error).generic_string());
      if (error) href = "file://" + url_path(file.generic_string());
    }
    out << "<li><strong>" << h(entry.artifact.kind) << "</strong>" << h(entry.owner) << ": ";
    if (!href.empty()) out << "<a href=\"" << h(href) << "\">" << h(file.filename().string()) << "</a>";
    else out << h(entry.path) << (exists ? " (outside the db's folder: not copied)" : " (file missing)");
    out << " (" << h(format_bytes(static_cast<double>(entry.artifact.bytes))) << ", sha256 " << h(entry.artifact.sha256.substr(0, 16))
        << ")";
    if (entry.artifact.kind == "trace")
      out << "<div class=\"howto\">Chrome trace: open <a href=\"https://ui.perfetto.dev\">ui.perfetto.dev</a> and drop the "
             "file on it (or Open trace file); the harness ranges name each phase.</div>";
    else if (entry.artifact.kind == "memory_snapshot")
      out << "<div class=\"howto\">Allocator snapshot: open <a href=\"https://pytorch.org/memory_viz\">pytorch.org/memory_viz</a> "
             "and drop the file on it.</div>";
    if (!entry.summary.empty()) out << "<div class=\"howto\">" << h(entry.summary) << "</div>";
    for (const auto& line : entry.open) out << "<div class=\"howto\"><code>" << h(line) << "</code></div>";
    out << "</li>\n";
  }
  out << "</ul>\n";
  return out.str();
}

std::string comparison_section(const site::HistoryRun& run, const std::string& root) {
  if (!run.has_diff) return "<h2>Compared with the run before</h2>\n<p>The first run of its track: nothing to compare with.</p>\n";
  const auto& diff = run.diff;
  std::ostringstream out;
  out << "<h2>Compared with run " << run_link(root, run.previous->run.id) << "</h2>\n<p class=\"meta\">The run before it on its "
      << "track, by <code>harness diff " << run.previous->run.id << " " << run.detail->run.id << "</code>'s rule.</p>\n<ul>\n";
  out << "<li>verdict: "
      << (diff.verdict_flipped ? "<span class=\"flip\">" + h(verdict_text(diff.a.verdict)) + " → " + h(verdict_text(diff.b.verdict)) + " (flipped)</span>"
                               : h(verdict_text(diff.b.verdict)) + " (unchanged)")
      << "</li>\n";
  out << "<li>env: "
      << (diff.a.env_id == diff.b.env_id ? std::string("same")
                                         : "changed (" + h(join(changed_components(diff.env_changes), ", ")) + "): " +
                                               link(root + envdiff_href(diff.a.env_id, diff.b.env_id), "side by side"))
      << "</li>\n";
  out << fmt::format("<li>{} regression{} called</li>\n</ul>\n", run.regressions, run.regressions == 1 ? "" : "s");
  if (!diff.env_changes.empty()) {
    out << "<details><summary>Env changes (" << diff.env_changes.size() << ")</summary>\n"
        << site::table_html(changes_table(diff.env_changes, true, fmt::format("run {}", diff.a.id), fmt::format("run {}", diff.b.id)))
        << "</details>\n";
  }
  if (!diff.trial_changes.empty()) {
    out << site::table_html(run_diff_trials_table(diff));
  }
  const Table metrics = run_diff_metrics_table(diff, true);
  if (metrics.rows.empty()) out << "<p>No metric changed outside the noise.</p>\n";
  else out << site::table_html(metrics, "diff");
  return out.str();
}

std::string run_page_body(Site& s, const db::RunDetail& detail) {
  const std::string root = "../";
  const auto& run = detail.run;
  const auto lines = run_header_lines(detail);
  std::ostringstream body;
  body << "<h1>run " << run.id << " · " << link(root + experiment_href(run.experiment), run.experiment) << "</h1>\n";
  std::vector<std::string> facts = {"status " + h(run.status), "verdict " + h(verdict_text(run.verdict)),
                                    "env " + env_link(root, run.env_id) + " " + h(env_summary(detail.env))};
  if (run.replay_of) facts.push_back("replays run " + run_link(root, *run.replay_of));
  if (const auto replays = s.replays_of.find(run.id); replays != s.replays_of.end()) {
    std::vector<std::string> links;
    for (const int64_t id : replays->second) links.push_back(run_link(root, id));
    facts.push_back("replayed by run " + join(links, ", "));
  }
  if (const auto bisects = s.bisects_of_run.find(run.id); bisects != s.bisects_of_run.end()) {
    std::vector<std::string> links;
    for (const int64_t id : bisects->second) links.push_back(link(root + bisect_href(id), "bisect " + std::to_string(id)));
    facts.push_back("probe of " + join(links, ", "));
  }
  body << "<p class=\"meta\">" << join(facts, " · ") << "</p>\n";
  body << site::pre(join(std::vector<std::string>(lines.begin() + 1, lines.end()), "\n"), "lines");
  if (const auto found = s.history_of.find(run.id); found != s.history_of.end()) body << comparison_section(*found->second, root);
  body << "<h2>Trials</h2>\n" << site::table_html(run_trials_table(detail));
  body << "<h2>Metrics</h2>\n<p class=\"meta\">Median over repeats, [min–max] for times.</p>\n";
  const Table metrics = run_metrics_table(detail, true);
  body << (metrics.rows.empty() ? "<p>None recorded.</p>\n" : site::table_html(metrics));
  if (const Table check = run_check_table(detail); !check.rows.empty())
    body << "<h2>Correctness check</h2>\n<p class=\"meta\">" << h(kCheckTableTitle) << "</p>\n" << site::table_html(check);
  std::vector<std::string> verdict = run_verdict_lines(detail);
  for (auto& line : run_check_failure_lines(detail)) verdict.push_back(std::move(line));
  body << "<h2>Verdict</h2>\n" << site::pre(join(verdict, "\n"), "lines");
  body << "<h2>Dispatch trace</h2>\n";
  const Table dispatch = run_dispatch_table(detail);
  body << (dispatch.rows.empty() ? "<p>(none recorded)</p>\n" : site::table_html(dispatch));
  body << artifact_section(s, detail, root);
  for (const auto& tail : run_stderr_tails(detail)) body << "<h3>" << h(tail.title) << "</h3>\n" << site::pre(tail.text);
  body << "<h2>Env " << h(run.env_id.substr(0, 16)) << "</h2>\n" << site::table_html(run_env_table(detail));
  body << "<h2>Reproduce</h2>\n"
       << site::pre(reproduce_command(run, s.options.db_path) + "\nharness show " + std::to_string(run.id) + " --db " +
                    shell_quote(s.options.db_path));
  return body.str();
}

// ---- index, experiments, regressions ----------------------------------------------------------

void write_index(Site& s) {
  // Compact rows over lists of distinct values, so 10 000 runs stay a small script.
  std::vector<std::string> experiments, devices, statuses, verdicts;
  std::map<std::string, int> experiment_index, device_index, status_index, verdict_index, env_index;
  auto index_of = [](std::map<std::string, int>& indices, std::vector<std::string>& values, const std::string& value) {
    const auto [it, added] = indices.emplace(value, static_cast<int>(values.size()));
    if (added) values.push_back(value);
    return it->second;
  };
  json envs = json::array();
  json rows = json::array();
  for (const auto& detail : s.details) {
    const auto& r = detail.run;
    const auto env_found = env_index.find(r.env_id);
    int env = 0;
    if (env_found == env_index.end()) {
      env = static_cast<int>(envs.size());
      env_index.emplace(r.env_id, env);
      envs.push_back({short_id(r.env_id), env_summary_of(s, r.env_id), r.env_id.empty() ? "" : site::slug(r.env_id)});
    } else {
      env = env_found->second;
    }
    const auto history = s.history_of.find(r.id);
    const bool flip = history != s.history_of.end() && history->second->verdict_flip;
    const int worse = history != s.history_of.end() ? history->second->regressions : 0;
    rows.push_back({r.id, index_of(experiment_index, experiments, r.experiment), index_of(device_index, devices, r.device),
                    r.profile, index_of(status_index, statuses, r.status), index_of(verdict_index, verdicts, r.verdict), env,
                    date_of(r.started_at), flip ? 1 : 0, worse, cut(first_line(r.error), kIndexErrorChars)});
  }
  json experiment_list = json::array();
  for (const auto& name : experiments) experiment_list.push_back({name, site::slug(name)});
  const json data = {{"experiments", experiment_list}, {"devices", devices}, {"statuses", statuses},
                     {"verdicts", verdicts},           {"envs", envs},       {"rows", rows}};
  s.write("runs.js", "window.HARNESS_RUNS = " + site::script_json(data) + ";\n");

  // The first page, rendered without the script (the script replaces it with the same rows).
  std::vector<std::vector<std::string>> first;
  for (size_t i = 0; i < s.details.size() && i < s.options.runs_per_page; ++i) {
    const auto& r = s.details[i].run;
    const auto history = s.history_of.find(r.id);
    const bool flip = history != s.history_of.end() && history->second->verdict_flip;
    const int worse = history != s.history_of.end() ? history->second->regressions : 0;
    first.push_back({run_link("", r.id), link(experiment_href(r.experiment), r.experiment), h(r.device),
                     h(r.profile.empty() ? "-" : r.profile), h(r.status),
                     flip ? "<span class=\"flip\">⚑ " + h(verdict_text(r.verdict)) + "</span>" : h(r.verdict.empty() ? "-" : r.verdict),
                     worse ? "<span class=\"worse\">" + std::to_string(worse) + "</span>" : "", env_link("", r.env_id),
                     h(date_of(r.started_at)), h(cut(first_line(r.error), kIndexErrorChars))});
  }
  std::string table = site::table_html_raw({"run", "experiment", "device", "profile", "status", "verdict", "worse", "env",
                                            "started", "error"},
                                           first, {true, false, false, false, false, false, true});
  // The script fills this body: give it an id.
  const auto at = table.find("</tr>\n");
  table = table.substr(0, at + 6) + "</thead><tbody id=\"runs-body\">\n" + table.substr(at + 6);
  table.replace(table.find("<table>\n<tr>"), 12, "<table>\n<thead><tr>");
  table.replace(table.rfind("</table>"), 8, "</tbody></table>");

  std::ostringstream body;
  body << "<h1>Runs</h1>\n"
       << fmt::format("<p class=\"meta\">{} runs of {} experiments under {} envs in <code>{}</code> · site written {} · "
                      "⚑ a verdict flip, worse: regressions called against the run before it.</p>\n",
                      s.details.size(), s.histories.size(), s.envs.size(), h(s.options.db_path), h(db::now_iso8601()));
  body << R"(<div class="filters">
<label>experiment <select id="f-experiment"><option value="">all</option></select></label>
<label>device <select id="f-device"><option value="">all</option></select></label>
<label>status <select id="f-status"><option value="">all</option></select></label>
<label>verdict <select id="f-verdict"><option value="">all</option></select></label>
<label>env <select id="f-env"><option value="">all</option></select></label>
<label>text <input id="f-text" type="search" placeholder="error, verdict, run"/></label>
<label><input id="f-flips" type="checkbox"/> flips only</label>
<label><input id="f-worse" type="checkbox"/> regressions only</label>
</div>
<div class="pager"><button id="p-prev" type="button">← newer</button><span id="p-info"></span><button id="p-next" type="button">older →</button></div>
)";
  body << table;
  body << fmt::format("<noscript><p>Without JavaScript the newest {} runs are listed; every run is on its "
                      "experiment's pages (<a href=\"experiments.html\">Experiments</a>).</p></noscript>\n",
                      s.options.runs_per_page);
  s.write("index.html", site::page("Runs", "", "runs", body.str(), "<script src=\"runs.js\"></script>\n<script src=\"site.js\"></script>\n"));
}

void write_experiments(Site& s) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& history : s.histories) {
    const auto& latest = *history.runs.back().detail;
    std::set<std::string> envs;
    for (const auto& run : history.runs) envs.insert(run.detail->run.env_id);
    rows.push_back({link(experiment_href(history.name), history.name),
                    h(cut(latest.spec.contains("hypothesis") ? text_of(latest.spec["hypothesis"]) : "", 180)),
                    std::to_string(history.runs.size()), std::to_string(history.tracks.size()), std::to_string(envs.size()),
                    run_link("", latest.run.id) + " " + h(verdict_text(latest.run.verdict)),
                    history.flips() ? "<span class=\"flip\">" + std::to_string(history.flips()) + "</span>" : "0",
                    history.regressions() ? "<span class=\"worse\">" + std::to_string(history.regressions()) + "</span>" : "0"});
  }
  std::ostringstream body;
  body << "<h1>Experiments</h1>\n<p class=\"meta\">Finished runs (replays aside) of each experiment; flips and "
          "regressions are counted against the run before on the same track.</p>\n";
  body << (rows.empty() ? "<p>No finished runs.</p>\n"
                        : site::table_html_raw({"experiment", "hypothesis", "runs", "tracks", "envs", "latest", "flips", "regressions"},
                                               rows, {false, false, true, true, true, false, true, true}));
  s.write("experiments.html", site::page("Experiments", "", "experiments", body.str()));
}

void write_regressions(Site& s) {
  std::vector<const site::HistoryRun*> runs;
  for (const auto& history : s.histories)
    for (const auto& run : history.runs)
      if (run.regressions) runs.push_back(&run);
  std::sort(runs.begin(), runs.end(), [](const auto* a, const auto* b) {
    if (a->detail->run.started_at != b->detail->run.started_at) return a->detail->run.started_at > b->detail->run.started_at;
    return a->detail->run.id > b->detail->run.id;
  });
  std::vector<std::vector<std::string>> rows;
  size_t total = 0;
  for (const auto* run : runs) {
    for (auto& row : regression_rows(*run, "", true)) {
      if (++total <= s.options.listed_regressions) rows.push_back(std::move(row));
    }
  }
  std::ostringstream body;
  body << "<h1>Regressions</h1>\n<p class=\"meta\">Every run against the run before it on its track (same spec, same "
          "kind of device), judged by <code>harness diff</code>'s rule; newest first.";
  if (total > rows.size()) body << fmt::format(" {} regressions; the newest {} listed.", total, rows.size());
  body << "</p>\n";
  body << (rows.empty() ? "<p>No regression called.</p>\n" : site::table_html_raw(regression_headers(true), rows));
  s.write("regressions.html", site::page("Regressions", "", "regressions", body.str()));
}

// ---- envs --------------------------------------------------------------------------------------

void write_envs(Site& s) {
  // The list, with where each env was used.
  std::map<std::string, std::pair<std::string, std::string>> seen;  // first and last start
  std::map<std::string, std::set<std::string>> experiments_of;
  for (const auto& detail : s.details) {
    auto& range = seen[detail.run.env_id];
    if (range.first.empty() || detail.run.started_at < range.first) range.first = detail.run.started_at;
    if (detail.run.started_at > range.second) range.second = detail.run.started_at;
    experiments_of[detail.run.env_id].insert(detail.run.experiment);
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& env_id : s.env_order) {
    std::vector<std::string> names(experiments_of[env_id].begin(), experiments_of[env_id].end());
    rows.push_back({env_link("", env_id), h(env_summary_of(s, env_id)), h(date_of(seen[env_id].first)),
                    h(date_of(seen[env_id].second)), std::to_string(s.env_runs[env_id]), h(cut(join(names, ", "), 120))});
  }
  std::ostringstream body;
  body << "<h1>Envs</h1>\n<p class=\"meta\">Each toolchain fingerprint the runs were recorded under, first seen "
          "first.</p>\n";
  body << site::table_html_raw({"env", "toolchain", "first run", "last run", "runs", "experiments"}, rows,
                               {false, false, false, false, true, false});

  // Side by side: the keys whose values differ between the envs.
  std::vector<std::map<std::string, std::string>> leaves;
  std::set<std::string> keys;
  for (const auto& env_id : s.env_order) {
    leaves.push_back(json_leaves(s.envs[env_id]));
    for (const auto& [key, value] : leaves.back()) keys.insert(key);
  }
  body << "<h2>Side by side</h2>\n";
  if (s.env_order.size() < 2) {
    body << "<p>One env only: nothing to compare.</p>\n";
  } else {
    body << "<p class=\"meta\">The fingerprint keys whose values differ between envs; consecutive envs compared "
            "experiment by experiment below.</p>\n";
    for (size_t first = 0; first < s.env_order.size(); first += kEnvColumns) {
      const size_t last = std::min(s.env_order.size(), first + kEnvColumns);
      std::vector<std::string> headers = {"key"};
      for (size_t e = first; e < last; ++e) headers.push_back(env_link("", s.env_order[e]));
      std::vector<std::vector<std::string>> matrix;
      for (const auto& key : keys) {
        std::set<std::string> values;
        for (const auto& env : leaves) values.insert(env.count(key) ? env.at(key) : "(absent)");
        if (values.size() < 2) continue;
        std::vector<std::string> row = {h(key)};
        for (size_t e = first; e < last; ++e) row.push_back(h(leaves[e].count(key) ? leaves[e].at(key) : "(absent)"));
        matrix.push_back(std::move(row));
      }
      body << site::table_html_raw(headers, matrix, {}, "matrix");
    }
    std::vector<std::vector<std::string>> pairs;
    for (size_t e = 1; e < s.env_order.size(); ++e) {
      const auto& a = s.env_order[e - 1];
      const auto& b = s.env_order[e];
      pairs.push_back({env_link("", a), env_link("", b), h(join(changed_components(diff_envs(s.envs[a], s.envs[b])), ", ")),
                       link(envdiff_href(a, b), "compare")});
    }
    body << "<h2>Consecutive envs compared</h2>\n" << site::table_html_raw({"env A", "env B", "changed", ""}, pairs);
  }
  s.write("envs.html", site::page("Envs", "", "envs", body.str()));

  // One page per env, and one per consecutive pair.
  for (size_t e = 0; e < s.env_order.size(); ++e) {
    const auto& env_id = s.env_order[e];
    const std::string root = "../";
    std::ostringstream page;
    page << "<h1>env " << h(short_id(env_id)) << "</h1>\n<p class=\"meta\">" << h(env_summary_of(s, env_id)) << " · id "
         << h(env_id) << "</p>\n";
    if (e > 0) page << "<p>" << link(root + envdiff_href(s.env_order[e - 1], env_id), "compared with the env before") << "</p>\n";
    if (e + 1 < s.env_order.size())
      page << "<p>" << link(root + envdiff_href(env_id, s.env_order[e + 1]), "compared with the env after") << "</p>\n";
    Table fingerprint;
    fingerprint.headers = {"key", "value"};
    for (const auto& [key, value] : leaves[e]) fingerprint.rows.push_back({key, value});
    page << "<h2>Fingerprint</h2>\n" << site::table_html(fingerprint);
    std::vector<std::vector<std::string>> runs;
    for (const auto& detail : s.details) {
      if (detail.run.env_id != env_id) continue;
      if (runs.size() == kListedEnvRuns) break;
      runs.push_back({run_link(root, detail.run.id), link(root + experiment_href(detail.run.experiment), detail.run.experiment),
                      h(date_of(detail.run.started_at)), h(detail.run.device), h(detail.run.status), h(verdict_text(detail.run.verdict))});
    }
    page << fmt::format("<h2>Runs ({}; the newest {} listed)</h2>\n", s.env_runs[env_id], runs.size())
         << site::table_html_raw({"run", "experiment", "started", "device", "status", "verdict"}, runs, {true});
    s.write(env_href(env_id), site::page("env " + short_id(env_id), root, "envs", page.str()));
  }
  for (const auto& [a, b] : s.env_pairs) {
    const std::string root = "../";
    std::ostringstream page;
    page << "<h1>env " << env_link(root, a) << " → env " << env_link(root, b) << "</h1>\n";
    page << site::table_html_raw({"", "env", "toolchain"}, {{"A", env_link(root, a), h(env_summary_of(s, a))},
                                                           {"B", env_link(root, b), h(env_summary_of(s, b))}});
    const auto changes = diff_envs(s.envs[a], s.envs[b]);
    page << "<h2>Fingerprint changes</h2>\n"
         << (changes.empty() ? "<p>None.</p>\n" : site::table_html(changes_table(changes, true, "env A", "env B")));
    page << "<h2>The latest run of each experiment under both</h2>\n<p class=\"meta\">As <code>harness diff --env "
         << h(short_id(a)) << " --env " << h(short_id(b)) << "</code> compares them: called changes only.</p>\n";
    try {
      const auto diff = diff_envs_latest(s.store, a, b, std::nullopt);
      for (const auto& run_diff : diff.experiments) {
        page << "<h3>" << link(root + experiment_href(run_diff.a.experiment), run_diff.a.experiment) << ": run "
             << run_link(root, run_diff.a.id) << " → run " << run_link(root, run_diff.b.id)
             << (run_diff.regressed() ? " <span class=\"worse\">regression</span>" : "") << "</h3>\n";
        page << "<p>verdict "
             << (run_diff.verdict_flipped ? "<span class=\"flip\">" + h(verdict_text(run_diff.a.verdict)) + " → " +
                                                h(verdict_text(run_diff.b.verdict)) + " (flipped)</span>"
                                          : h(verdict_text(run_diff.a.verdict)) + " (unchanged)")
             << "</p>\n";
        const Table metrics = run_diff_metrics_table(run_diff, true);
        page << (metrics.rows.empty() ? "<p>No metric changed outside the noise.</p>\n" : site::table_html(metrics, "diff"));
      }
      if (!diff.only_a.empty()) page << "<p>Only under env A: " << h(join(diff.only_a, ", ")) << "</p>\n";
      if (!diff.only_b.empty()) page << "<p>Only under env B: " << h(join(diff.only_b, ", ")) << "</p>\n";
    } catch (const UsageError& error) {
      page << "<p>" << h(error.what()) << "</p>\n";
    }
    s.write(envdiff_href(a, b), site::page("env " + short_id(a) + " → " + short_id(b), root, "envs", page.str()));
  }
}

// ---- bisects -----------------------------------------------------------------------------------

void write_bisects(Site& s) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& bisect : s.bisects) {
    rows.push_back({link(bisect_href(bisect.id), std::to_string(bisect.id)),
                    s.experiments.count(bisect.experiment) ? link(experiment_href(bisect.experiment), bisect.experiment)
                                                           : h(bisect.experiment),
                    h(bisect.package.empty() ? "-" : bisect.package), h(bisect.mode), h(bisect.good), h(bisect.bad), h(bisect.status),
                    h(bisect.last_good.empty() ? "-" : bisect.last_good), h(bisect.first_bad.empty() ? "-" : bisect.first_bad),
                    h(date_of(bisect.started_at))});
    const std::string root = "../";
    std::ostringstream page;
    try {
      const auto probes = s.store.list_bisect_probes(bisect.id);
      std::vector<std::vector<std::string>> probe_rows;
      for (const auto& probe : probes) {
        std::vector<std::string> runs;
        for (const int64_t id : probe.run_ids) runs.push_back(s.by_id.count(id) ? run_link(root, id) : h(std::to_string(id)));
        probe_rows.push_back({std::to_string(probe.seq), h(probe.label), h(probe.outcome), join(runs, ", "), h(probe.reason)});
      }
      const Document document = bisect_document(bisect, probes, s.options.db_path);
      page << "<h1>" << h(document.title) << "</h1>\n<h2>Probes and their runs</h2>\n"
           << site::table_html_raw({"probe", "candidate", "outcome", "runs", "reason"}, probe_rows, {true})
           << render_html_blocks(document);
    } catch (const std::exception& error) {
      page << "<h1>bisect " << bisect.id << "</h1>\n<p>Its report cannot be rendered from the db: " << h(error.what()) << "</p>\n";
    }
    s.write(bisect_href(bisect.id), site::page("bisect " + std::to_string(bisect.id), root, "bisects", page.str()));
  }
  std::ostringstream body;
  body << "<h1>Bisects</h1>\n";
  body << (rows.empty() ? "<p>No bisect recorded (<code>harness bisect</code>).</p>\n"
                        : site::table_html_raw({"bisect", "experiment", "package", "mode", "good", "bad", "status", "last good",
                                                "first bad", "started"},
                                               rows, {true}));
  s.write("bisects.html", site::page("Bisects", "", "bisects", body.str()));
}

// ---- the folder --------------------------------------------------------------------------------

fs::path checked_destination(const std::string& dir) {
  if (dir.empty()) throw UsageError("site: -o needs a folder");
  const fs::path target = fs::absolute(fs::path(dir)).lexically_normal();
  std::error_code error;
  if (fs::exists(target, error)) {
    if (!fs::is_directory(target, error)) throw UsageError("site: " + target.string() + " exists and is not a folder");
    const bool empty = fs::is_empty(target, error);
    if (!empty && !fs::exists(target / kMarker, error))
      throw UsageError("site: " + target.string() + " is a folder that holds other files (not a site written by harness "
                       "site); give a new or empty folder");
  }
  if (!fs::is_directory(target.parent_path(), error))
    throw UsageError("site: the folder " + target.parent_path().string() + " does not exist");
  return target;
}

}  // namespace

SiteStats write_site(const db::Store& store, const std::string& dir, const SiteOptions& options) {
  Site s(store, options);
  s.final_dir = checked_destination(dir);
  s.db_dir = fs::absolute(fs::path(options.db_path)).parent_path().lexically_normal();

  db::RunFilter all;
  all.limit = 0;
  for (const auto& run : store.list_runs(all))
    if (auto detail = store.get_run(run.id)) s.details.push_back(std::move(*detail));
  for (const auto& detail : s.details) {
    s.by_id[detail.run.id] = &detail;
    if (detail.run.replay_of) s.replays_of[*detail.run.replay_of].push_back(detail.run.id);
    if (!s.envs.count(detail.run.env_id)) s.envs[detail.run.env_id] = detail.env;
    ++s.env_runs[detail.run.env_id];
  }
  for (auto& [run, replays] : s.replays_of) std::sort(replays.begin(), replays.end());
  // Envs by their first run.
  for (auto it = s.details.rbegin(); it != s.details.rend(); ++it)
    if (!it->run.env_id.empty() && std::find(s.env_order.begin(), s.env_order.end(), it->run.env_id) == s.env_order.end())
      s.env_order.push_back(it->run.env_id);
  s.histories = site::build_histories(s.details);
  for (const auto& history : s.histories)
    for (const auto& run : history.runs) {
      s.history_of[run.detail->run.id] = &run;
      s.experiment_of[run.detail->run.id] = &history;
    }
  for (const auto& detail : s.details) s.experiments.insert(detail.run.experiment);
  for (size_t e = 1; e < s.env_order.size(); ++e) s.env_pairs.insert({s.env_order[e - 1], s.env_order[e]});
  for (const auto& [id, run] : s.history_of)
    if (run->env_changed) s.env_pairs.insert({run->previous->run.env_id, run->detail->run.env_id});
  s.bisects = store.list_bisects();
  for (const auto& bisect : s.bisects)
    for (const auto& probe : store.list_bisect_probes(bisect.id))
      for (const int64_t id : probe.run_ids) s.bisects_of_run[id].push_back(bisect.id);

  // Built beside the destination, then swapped in.
  s.staging = s.final_dir.parent_path() / fmt::format(".{}.partial-{}", s.final_dir.filename().string(), getpid());
  remove_tree(s.staging.string());
  fs::create_directories(s.staging);
  try {
    s.write(kMarker, "A site written by `harness site`; rebuilding replaces this folder.\n");
    s.write("site.css", site::site_css());
    s.write("site.js", site::site_js());
    write_index(s);
    write_experiments(s);
    for (const auto& history : s.histories) write_experiment_pages(s, history);
    write_unfinished_experiments(s);
    for (const auto& detail : s.details) {
      std::string body;
      try {
        body = run_page_body(s, detail);
      } catch (const InfraError&) {
        throw;
      } catch (const std::exception& error) {
        body = "<h1>run " + std::to_string(detail.run.id) + "</h1>\n<p>This run cannot be shown from the db: " + h(error.what()) +
               "</p>\n";
      }
      s.write(run_href(detail.run.id), site::page(fmt::format("run {} · {}", detail.run.id, detail.run.experiment), "../", "runs", body));
    }
    write_regressions(s);
    write_envs(s);
    write_bisects(s);
  } catch (...) {
    remove_tree(s.staging.string());
    throw;
  }
  std::error_code error;
  const fs::path old = s.final_dir.parent_path() / fmt::format(".{}.old-{}", s.final_dir.filename().string(), getpid());
  if (fs::exists(s.final_dir, error)) fs::rename(s.final_dir, old, error);
  if (error) {
    remove_tree(s.staging.string());
    throw InfraError("site: cannot move the previous " + s.final_dir.string() + " aside: " + error.message());
  }
  fs::rename(s.staging, s.final_dir, error);
  if (error) {
    remove_tree(s.staging.string());
    std::error_code restore;  // the previous site back where it was
    if (fs::exists(old, restore)) fs::rename(old, s.final_dir, restore);
    throw InfraError("site: cannot rename the built site into " + s.final_dir.string() + ": " + error.message());
  }
  remove_tree(old.string());
  s.stats.runs = s.details.size();
  s.stats.experiments = s.histories.size();
  return s.stats;
}

}  // namespace harness::analysis
