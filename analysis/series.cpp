#include "analysis/series.h"

#include <algorithm>
#include <map>
#include <set>

namespace harness::analysis {
namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Metrics shown first in tables; any others follow alphabetically.
const std::vector<std::string> kLeadingMetrics = {
    "fwd_peak_bytes", "bwd_peak_bytes", "fwd_ms", "bwd_ms", "failure_rate", "failures", "trials", "match", "max_abs_err"};

}  // namespace

int metric_rank(const std::string& metric) {
  const auto found = std::find(kLeadingMetrics.begin(), kLeadingMetrics.end(), metric);
  return found == kLeadingMetrics.end() ? static_cast<int>(kLeadingMetrics.size())
                                        : static_cast<int>(found - kLeadingMetrics.begin());
}

std::vector<Series> collect_series(const std::vector<db::Metric>& metrics) {
  struct Group {
    Series series;
    std::vector<double> singles;
  };
  std::map<std::string, int> variant_seen;  // first appearance
  std::map<std::tuple<nlohmann::json, std::string, std::string>, Group> groups;
  for (const auto& m : metrics) {
    variant_seen.emplace(m.variant, static_cast<int>(variant_seen.size()));
    auto& group = groups[{m.point, m.variant, m.name}];
    if (group.series.metric.empty()) {
      group.series.point = m.point;
      group.series.variant = m.variant;
      group.series.metric = m.name;
    }
    if (group.series.unit.empty()) group.series.unit = m.unit;
    if (m.repeat >= 0) {
      group.series.values.push_back(m.value);
    } else {
      group.singles.push_back(m.value);
    }
  }
  std::vector<Series> out;
  out.reserve(groups.size());
  for (auto& [key, group] : groups) {
    Series s = std::move(group.series);
    s.repeated = !s.values.empty();
    if (!s.repeated) s.values = std::move(group.singles);
    s.spread = spread_of(s.values);
    out.push_back(std::move(s));
  }
  std::stable_sort(out.begin(), out.end(), [&](const Series& x, const Series& y) {
    if (x.point != y.point) return x.point < y.point;
    if (x.variant != y.variant) return variant_seen[x.variant] < variant_seen[y.variant];
    const int rx = metric_rank(x.metric), ry = metric_rank(y.metric);
    if (rx != ry) return rx < ry;
    return x.metric < y.metric;
  });
  return out;
}

const Series* find_series(const std::vector<Series>& series, const nlohmann::json& point, const std::string& variant,
                          const std::string& metric) {
  for (const auto& s : series)
    if (s.metric == metric && s.variant == variant && s.point == point) return &s;
  return nullptr;
}

Worse worse_direction(const std::string& metric, const std::string& unit) {
  // Predictions and interval bounds are not outcomes: a change in them is reported, never
  // judged (a model's number changes when the spec does, not when the code regresses).
  if (metric.rfind("model_", 0) == 0 || contains(metric, "ci95") || ends_with(metric, "_lo") ||
      ends_with(metric, "_hi") || ends_with(metric, "_low") || ends_with(metric, "_high"))
    return Worse::kUnknown;
  if (metric == "match" || contains(metric, "speedup") || contains(metric, "throughput") ||
      contains(metric, "tflops") || ends_with(metric, "_per_s"))
    return Worse::kDown;
  if (unit == "bytes" || unit == "ms" || unit == "s" || unit == "us" || contains(metric, "bytes") ||
      ends_with(metric, "_ms") || ends_with(metric, "_s") || ends_with(metric, "_us"))
    return Worse::kUp;
  // Numerical errors are left without a direction: they move with the inputs and the dims (a
  // bf16 error of 0.0045 against 0.0051 is no regression); `match` is what judges them.
  if (contains(metric, "fail") || contains(metric, "crash")) return Worse::kUp;
  return Worse::kUnknown;
}

std::string unit_from_name(const std::string& metric) {
  if (contains(metric, "bytes")) return "bytes";
  if (ends_with(metric, "_ms")) return "ms";
  return "";
}

std::vector<std::string> variant_order(const db::RunDetail& detail) {
  std::vector<std::string> order;
  auto add = [&](const std::string& variant) {
    if (std::find(order.begin(), order.end(), variant) == order.end()) order.push_back(variant);
  };
  for (const auto& trial : detail.trials) add(trial.variant);
  for (const auto& metric : detail.metrics) add(metric.variant);
  return order;
}

std::vector<nlohmann::json> point_order(const db::RunDetail& detail) {
  std::set<nlohmann::json> points;
  for (const auto& trial : detail.trials) points.insert(trial.point);
  for (const auto& metric : detail.metrics) points.insert(metric.point);
  return {points.begin(), points.end()};
}

}  // namespace harness::analysis
