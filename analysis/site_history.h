#pragma once
// An experiment's history as `harness site` shows it: its runs in time order, split into tracks
// (runs that measure the same thing: one resolved spec on one kind of device), each run compared
// with the one before it in its track by `harness diff`'s own code (diff_runs: the noise-aware
// call of analysis/diff.h), so that regressions and verdict flips on the site are the ones the
// diff reports.

#include <string>
#include <vector>

#include "analysis/diff.h"
#include "analysis/series.h"
#include "db/store.h"

namespace harness::analysis::site {

//! One run in its experiment's history.
struct HistoryRun {
  const db::RunDetail* detail = nullptr;
  std::vector<Series> series;             //!< its metrics grouped (collect_series)
  size_t track = 0;                       //!< index into ExperimentHistory::tracks
  const db::RunDetail* previous = nullptr;  //!< the run before it in its track, if any
  bool has_diff = false;                  //!< diff holds diff_runs(previous, this)
  RunDiff diff;
  bool verdict_flip = false;              //!< its verdict differs from the previous run's in the track
  bool env_changed = false;               //!< its env differs from the previous run's in the track
  int regressions = 0;                    //!< called metric regressions plus trials that were ok and are not

  //! The comparison of (point, variant, metric) with the previous run, or nullptr.
  const MetricComparison* comparison(const nlohmann::json& point, const std::string& variant,
                                     const std::string& metric) const;
};

//! Runs of one spec on one kind of device.
struct Track {
  std::string key;    //!< spec hash + device kind
  std::string label;  //!< "cpu · spec 1a2b3c4d" (the spec part only when the experiment has several specs)
  std::vector<size_t> runs;  //!< indices into ExperimentHistory::runs, oldest first
};

//! Every finished run of one experiment (replays and runs still running left out), oldest first.
struct ExperimentHistory {
  std::string name;
  std::vector<HistoryRun> runs;
  std::vector<Track> tracks;

  int flips() const;
  int regressions() const;
};

//! "cpu" for "cpu", "cuda" for "cuda:0" or "cuda:0,cuda:1": what kind of device a run used.
std::string device_kind(const std::string& device);

//! The histories of every experiment among `details` (sorted by name). Pointers into `details`
//! stay valid as long as it does.
std::vector<ExperimentHistory> build_histories(const std::vector<db::RunDetail>& details);

}  // namespace harness::analysis::site
