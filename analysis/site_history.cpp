#include "analysis/site_history.h"

#include <algorithm>
#include <map>
#include <set>

namespace harness::analysis::site {

const MetricComparison* HistoryRun::comparison(const nlohmann::json& point, const std::string& variant,
                                               const std::string& metric) const {
  if (!has_diff) return nullptr;
  for (const auto& c : diff.metrics)
    if (c.metric == metric && c.variant == variant && c.point == point) return &c;
  return nullptr;
}

int ExperimentHistory::flips() const {
  int count = 0;
  for (const auto& run : runs) count += run.verdict_flip;
  return count;
}

int ExperimentHistory::regressions() const {
  int count = 0;
  for (const auto& run : runs) count += run.regressions;
  return count;
}

std::string device_kind(const std::string& device) { return device.substr(0, device.find(':')); }

std::vector<ExperimentHistory> build_histories(const std::vector<db::RunDetail>& details) {
  std::map<std::string, std::vector<const db::RunDetail*>> by_experiment;
  for (const auto& detail : details) {
    if (detail.run.replay_of || detail.run.status == "running") continue;
    by_experiment[detail.run.experiment].push_back(&detail);
  }
  std::vector<ExperimentHistory> histories;
  for (auto& [name, runs] : by_experiment) {
    std::stable_sort(runs.begin(), runs.end(), [](const db::RunDetail* a, const db::RunDetail* b) {
      if (a->run.started_at != b->run.started_at) return a->run.started_at < b->run.started_at;
      return a->run.id < b->run.id;
    });
    ExperimentHistory history;
    history.name = name;
    std::set<std::string> specs;
    for (const auto* detail : runs) specs.insert(detail->run.spec_hash);
    std::map<std::string, size_t> track_of;
    for (const auto* detail : runs) {
      const std::string key = detail->run.spec_hash + " " + device_kind(detail->run.device);
      auto found = track_of.find(key);
      if (found == track_of.end()) {
        Track track;
        track.key = key;
        track.label = device_kind(detail->run.device) +
                      (detail->run.profile.empty() ? "" : " · profile " + detail->run.profile) +
                      (specs.size() > 1 ? " · spec " + detail->run.spec_hash.substr(0, 8) : "");
        found = track_of.emplace(key, history.tracks.size()).first;
        history.tracks.push_back(std::move(track));
      }
      Track& track = history.tracks[found->second];
      HistoryRun entry;
      entry.detail = detail;
      entry.series = collect_series(detail->metrics);
      entry.track = found->second;
      if (!track.runs.empty()) {
        entry.previous = history.runs[track.runs.back()].detail;
        entry.diff = diff_runs(*entry.previous, *detail);
        entry.has_diff = true;
        entry.verdict_flip = entry.diff.verdict_flipped;
        entry.env_changed = entry.previous->run.env_id != detail->run.env_id;
        for (const auto& c : entry.diff.metrics) entry.regressions += c.regression;
        for (const auto& t : entry.diff.trial_changes) entry.regressions += t.regression;
      }
      track.runs.push_back(history.runs.size());
      history.runs.push_back(std::move(entry));
    }
    histories.push_back(std::move(history));
  }
  return histories;
}

}  // namespace harness::analysis::site
