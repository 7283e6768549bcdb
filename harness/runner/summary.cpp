#include "harness/runner/summary.h"

#include <algorithm>

namespace harness {

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

std::map<std::pair<std::string, std::string>, MetricSummary> summarize(const std::vector<db::Metric>& metrics) {
  std::map<std::pair<std::string, std::string>, std::vector<double>> repeats, singles;
  std::map<std::pair<std::string, std::string>, std::string> units;
  for (const auto& m : metrics) {
    const auto key = std::make_pair(m.variant, m.name);
    (m.repeat >= 0 ? repeats : singles)[key].push_back(m.value);
    units[key] = m.unit;
  }
  std::map<std::pair<std::string, std::string>, MetricSummary> out;
  for (const auto& [key, unit] : units) {
    const auto& values = repeats.count(key) ? repeats[key] : singles[key];
    MetricSummary s;
    s.median = median(values);
    s.min = *std::min_element(values.begin(), values.end());
    s.max = *std::max_element(values.begin(), values.end());
    s.count = static_cast<int>(values.size());
    s.unit = unit;
    out[key] = s;
  }
  return out;
}

}  // namespace harness
