#pragma once
// Summaries of per-repeat metrics: medians with their spread, per variant and metric.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "db/store.h"

namespace harness {

//! Median and spread of one metric over repeats.
struct MetricSummary {
  double median = 0.0;
  double min = 0.0;
  double max = 0.0;
  int count = 0;
  std::string unit;
};

//! Summaries keyed by (variant, metric name). Values measured once (repeat -1) summarize to
//! themselves; when both exist, the repeats win.
std::map<std::pair<std::string, std::string>, MetricSummary> summarize(const std::vector<db::Metric>& metrics);

//! Median of values (mean of the two middle ones for an even count); 0 for none.
double median(std::vector<double> values);

}  // namespace harness
