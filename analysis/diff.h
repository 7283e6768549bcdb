#pragma once
// `harness diff`: two runs of one experiment compared — what changed in the toolchain, in the
// setup, in the trials' outcomes and, per (point, variant, metric), in the measurements, with a
// change called only outside the noise of the repeats.

#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "analysis/env_diff.h"
#include "analysis/series.h"
#include "analysis/stats.h"
#include "core/printer.h"
#include "db/store.h"

namespace harness::analysis {

//! One side of a metric comparison.
struct SideValues {
  Spread spread;
  bool repeated = false;  //!< repeats (not a single value)
  std::vector<double> values;
};

//! A metric compared between run A and run B at one point for one variant.
struct MetricComparison {
  nlohmann::json point = nlohmann::json::object();
  std::string variant;
  std::string metric;
  std::string unit;
  std::optional<SideValues> a;
  std::optional<SideValues> b;
  std::optional<double> delta;        //!< median B - median A
  std::optional<double> ratio;        //!< median B / median A (absent when A's median is 0)
  std::optional<MannWhitney> test;    //!< when both sides have kMannWhitneyMinRepeats repeats or more
  std::string rule;                   //!< "mann-whitney", "range" or "" (a side is missing)
  bool called = false;                //!< the change is outside the noise
  Worse worse = Worse::kUnknown;
  bool regression = false;            //!< called, in the direction that is worse
  bool improvement = false;           //!< called, in the direction that is better
};

//! A trial whose status differs between the runs.
struct TrialChange {
  nlohmann::json point = nlohmann::json::object();
  std::string variant;
  std::string before;  //!< status in A, or "(absent)"
  std::string after;   //!< status in B, or "(absent)"
  bool regression = false;  //!< ok in A, not ok in B
};

//! Everything `harness diff` reports about two runs.
struct RunDiff {
  db::Run a;
  db::Run b;
  std::string env_summary_a;
  std::string env_summary_b;
  std::vector<JsonChange> env_changes;    //!< fingerprint leaves, grouped by component
  std::vector<JsonChange> setup_changes;  //!< device, profile and resolved spec leaves
  std::vector<TrialChange> trial_changes;
  std::vector<MetricComparison> metrics;
  bool verdict_flipped = false;

  //! A called metric change in the bad direction, or a trial that was ok and is not.
  bool regressed() const;
};

//! A side's median with its repeats' range ("0.31 ms [0.30–0.33 ms]"), "-" when absent.
std::string side_text(const std::optional<SideValues>& side, const std::string& unit);

//! The change and the rule that called it: "+12.0 MiB ×1.05, mann-whitney p=0.008" ("-" for none).
std::string change_text(const MetricComparison& comparison);

//! Decides whether a change between two sets of values is called. With kMannWhitneyMinRepeats
//! repeats or more on both sides the Mann-Whitney test decides (p < kSignificance), since one
//! outlier among many repeats widens a range without making the shift less real; with fewer,
//! the change is called only when the min..max ranges do not overlap.
void judge(MetricComparison& comparison);

//! Compares two runs. Throws UsageError when they are runs of different experiments.
RunDiff diff_runs(const db::RunDetail& a, const db::RunDetail& b);

//! The JSON form of a run diff (what `harness diff --json` prints for two runs).
nlohmann::json to_json(const RunDiff& diff);

//! Changed leaves as a table: (component,) key, then the values under the labels `a` and `b`.
Table changes_table(const std::vector<JsonChange>& changes, bool with_component, const std::string& a, const std::string& b);

//! The trial status changes: point, variant, status in run A, in run B, "WORSE" for a trial that
//! was ok and is not.
Table run_diff_trials_table(const RunDiff& diff);

//! The metrics table of a diff: (point,) variant, metric, run A, run B (median [min–max]), delta,
//! ratio, p, call ("WORSE", "better", "changed", "only in A/B"); only called changes and one-sided
//! rows when `changes_only`.
Table run_diff_metrics_table(const RunDiff& diff, bool changes_only);

//! Writes the diff as text: env changes (unless `with_env` is false), setup, verdict, trials,
//! then the metrics table (only called changes and one-sided rows when `changes_only`).
void print_run_diff(std::ostream& out, const RunDiff& diff, bool with_env, bool changes_only);

//! The diff as Markdown for a CI comment: a one-line outcome (regression, verdict flip), the two
//! runs, the env changes folded in a <details>, trial status changes, then only the called metric
//! changes (and metrics one side lacks) with the rule that called each.
std::string run_diff_markdown(const RunDiff& diff);

//! The latest runs of each experiment under two envs, compared.
struct EnvDiff {
  std::string env_a;
  std::string env_b;
  std::string env_summary_a;
  std::string env_summary_b;
  std::vector<JsonChange> env_changes;
  std::vector<RunDiff> experiments;        //!< experiments with a run under both envs
  std::vector<std::string> only_a;         //!< experiments with runs under env A only
  std::vector<std::string> only_b;

  //! Any experiment regressed.
  bool regressed() const;
  //! Any experiment's verdict flipped.
  bool verdict_flipped() const;
};

//! The env whose id is `prefix` or starts with it. Throws UsageError when none or several match.
std::string resolve_env_id(const db::Store& store, const std::string& prefix);

//! Compares the latest finished, non-replay run of each experiment (or only `experiment`) under
//! env A with the one under env B. Throws UsageError when no experiment has runs under both.
EnvDiff diff_envs_latest(const db::Store& store, const std::string& env_a, const std::string& env_b,
                         const std::optional<std::string>& experiment);

//! JSON form of an env diff.
nlohmann::json to_json(const EnvDiff& diff);

//! Text form of an env diff: the env changes once, then each experiment's run diff.
void print_env_diff(std::ostream& out, const EnvDiff& diff, bool changes_only);

//! Markdown form of an env diff: the outcome over all experiments, the env changes, then each
//! experiment's called changes as run_diff_markdown writes them.
std::string env_diff_markdown(const EnvDiff& diff);

}  // namespace harness::analysis
