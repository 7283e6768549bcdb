#pragma once
// A run's metrics grouped per (sweep point, variant, metric): the repeats of each, their
// spread, and what is known about a metric from its name and unit (which direction is worse).
// Metric names are open-ended (every experiment kind adds its own), so nothing here lists them
// all: unknown names are grouped and compared like any other, only without a direction.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "analysis/stats.h"
#include "db/store.h"
#include "experiments/sweep.h"

namespace harness::analysis {

//! Every value of one metric of one variant at one sweep point.
struct Series {
  nlohmann::json point = nlohmann::json::object();  //!< {} without a sweep
  std::string variant;
  std::string metric;
  std::string unit;
  std::vector<double> values;  //!< the repeats, or the single value measured once
  bool repeated = false;       //!< values are repeats (repeat >= 0), not a single value
  Spread spread;
};

//! Groups metrics by (point, variant, metric). Repeats win over a single value of the same
//! key. Ordered by point (JSON order, numbers numerically), variant (first appearance), then
//! metric (the usual attention metrics first, the rest alphabetically).
std::vector<Series> collect_series(const std::vector<db::Metric>& metrics);

//! The series of that key, or nullptr.
const Series* find_series(const std::vector<Series>& series, const nlohmann::json& point, const std::string& variant,
                          const std::string& metric);

//! Which way a metric gets worse.
enum class Worse {
  kUp,       //!< bytes, times, failure and crash counts and rates
  kDown,     //!< match, speedups, throughput
  kUnknown,  //!< predictions (model_*), interval bounds, numerical errors, anything unrecognised
};

//! The direction in which `metric` (with `unit`) gets worse, from its name and unit.
Worse worse_direction(const std::string& metric, const std::string& unit);

//! Unit of a metric known only by name (evidence values carry no unit): "bytes", "ms" or "".
std::string unit_from_name(const std::string& metric);

//! "anchors=256, layers=5" for {"dims.anchors": 256, "dims.layers": 5}; "" for {}: the spec's
//! point label (experiments/sweep.h) with commas, as tables and figure legends print it.
inline std::string point_label(const nlohmann::json& point) { return spec::point_label(point, ", "); }

//! The rank of a metric in result tables: fwd/bwd peaks and times, match, errors, then the rest.
int metric_rank(const std::string& metric);

//! Variants in order of first appearance among the trials, then any others among the metrics.
std::vector<std::string> variant_order(const db::RunDetail& detail);

//! Distinct points of the run's trials and metrics, sorted.
std::vector<nlohmann::json> point_order(const db::RunDetail& detail);

}  // namespace harness::analysis
