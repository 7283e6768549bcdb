#include "analysis/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <utility>

namespace harness::analysis {
namespace {

// Up to this many values in total the exact null distribution is counted: C(40, 20) = 1.4e11
// arrangements fit a double exactly, and the table has (n+1)(m+1)(nm+1) <= 1.8e5 entries.
constexpr size_t kExactMaxTotal = 40;

// counts[u] = number of orderings of n a's and m b's whose U (a above b) equals u. Recurrence on
// the largest value: it is an a (adding m to U) or a b (adding nothing).
std::vector<double> u_distribution(int n, int m) {
  const int max_u = n * m;
  std::vector<std::vector<std::vector<double>>> table(
      static_cast<size_t>(n + 1), std::vector<std::vector<double>>(static_cast<size_t>(m + 1)));
  for (int i = 0; i <= n; ++i) {
    for (int j = 0; j <= m; ++j) {
      auto& counts = table[static_cast<size_t>(i)][static_cast<size_t>(j)];
      counts.assign(static_cast<size_t>(i * j + 1), 0.0);
      if (i == 0 || j == 0) {
        counts[0] = 1.0;
        continue;
      }
      const auto& a_largest = table[static_cast<size_t>(i - 1)][static_cast<size_t>(j)];
      const auto& b_largest = table[static_cast<size_t>(i)][static_cast<size_t>(j - 1)];
      for (size_t u = 0; u < a_largest.size(); ++u) counts[u + static_cast<size_t>(j)] += a_largest[u];
      for (size_t u = 0; u < b_largest.size(); ++u) counts[u] += b_largest[u];
    }
  }
  auto result = std::move(table[static_cast<size_t>(n)][static_cast<size_t>(m)]);
  result.resize(static_cast<size_t>(max_u + 1), 0.0);
  return result;
}

}  // namespace

Spread spread_of(const std::vector<double>& values) {
  Spread s;
  if (values.empty()) return s;
  std::vector<double> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  const size_t mid = sorted.size() / 2;
  s.median = sorted.size() % 2 ? sorted[mid] : 0.5 * (sorted[mid - 1] + sorted[mid]);
  s.min = sorted.front();
  s.max = sorted.back();
  s.count = static_cast<int>(sorted.size());
  return s;
}

Interval wilson_interval(double events, double trials) {
  if (trials <= 0.0) return {};
  // z for a two-sided 95 % interval. Wilson rather than the normal interval: it stays inside
  // [0, 1] and is not empty at 0 of n or n of n, the usual outcomes of a race experiment.
  constexpr double z = 1.959963984540054;
  const double p = events / trials, z2 = z * z;
  const double centre = (p + z2 / (2.0 * trials)) / (1.0 + z2 / trials);
  const double half = z * std::sqrt(p * (1.0 - p) / trials + z2 / (4.0 * trials * trials)) / (1.0 + z2 / trials);
  // The exact ends at 0 of n and n of n; computed, they come out a rounding error away.
  return {events <= 0.0 ? 0.0 : std::max(0.0, centre - half), events >= trials ? 1.0 : std::min(1.0, centre + half)};
}

bool ranges_overlap(const Spread& a, const Spread& b) { return a.min <= b.max && b.min <= a.max; }

MannWhitney mann_whitney_u(const std::vector<double>& a, const std::vector<double>& b, PValueMethod method) {
  if (a.empty() || b.empty()) throw std::invalid_argument("mann_whitney_u: both samples need at least one value");
  const size_t n = a.size(), m = b.size(), total = n + m;
  // Midranks of the pooled sample (1-based), and the tie groups for the variance correction.
  std::vector<std::pair<double, bool>> pooled;  // value, from a
  pooled.reserve(total);
  for (double v : a) pooled.emplace_back(v, true);
  for (double v : b) pooled.emplace_back(v, false);
  std::sort(pooled.begin(), pooled.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  double rank_sum_a = 0.0, tie_term = 0.0;
  bool ties = false;
  for (size_t start = 0; start < total;) {
    size_t end = start + 1;
    while (end < total && pooled[end].first == pooled[start].first) ++end;
    const double group = static_cast<double>(end - start);
    const double midrank = 0.5 * static_cast<double>(start + 1 + end);
    for (size_t k = start; k < end; ++k)
      if (pooled[k].second) rank_sum_a += midrank;
    if (group > 1) {
      ties = true;
      tie_term += group * group * group - group;
    }
    start = end;
  }
  const double nd = static_cast<double>(n), md = static_cast<double>(m), nm = nd * md;
  MannWhitney result;
  result.u = rank_sum_a - nd * (nd + 1.0) / 2.0;

  if (method == PValueMethod::kAuto && !ties && total <= kExactMaxTotal) {
    const auto counts = u_distribution(static_cast<int>(n), static_cast<int>(m));
    const double arrangements = std::accumulate(counts.begin(), counts.end(), 0.0);
    const auto u = static_cast<size_t>(std::llround(result.u));
    const double at_most = std::accumulate(counts.begin(), counts.begin() + static_cast<long>(u) + 1, 0.0);
    const double at_least = std::accumulate(counts.begin() + static_cast<long>(u), counts.end(), 0.0);
    result.p_value = std::min(1.0, 2.0 * std::min(at_most, at_least) / arrangements);
    result.exact = true;
    return result;
  }
  const double nt = static_cast<double>(total);
  const double variance = nm / 12.0 * ((nt + 1.0) - tie_term / (nt * (nt - 1.0)));
  if (variance <= 0.0) return result;  // every value tied: no evidence of a shift, p = 1
  const double z = std::max(0.0, std::fabs(result.u - nm / 2.0) - 0.5) / std::sqrt(variance);
  result.p_value = std::min(1.0, std::erfc(z / std::sqrt(2.0)));
  return result;
}

}  // namespace harness::analysis
