#pragma once
// Statistics for comparing two sets of repeats: medians, spreads and the Mann-Whitney U test.
// Torch-free and dependency-free, so the tests can check it against published values.

#include <vector>

namespace harness::analysis {

//! Median, extremes and count of one set of repeats.
struct Spread {
  double median = 0.0;
  double min = 0.0;
  double max = 0.0;
  int count = 0;
};

//! Spread of `values` (all zero for none).
Spread spread_of(const std::vector<double>& values);

//! True when the closed ranges [a.min, a.max] and [b.min, b.max] share a value.
bool ranges_overlap(const Spread& a, const Spread& b);

//! Outcome of a two-sided Mann-Whitney U test.
struct MannWhitney {
  double u = 0.0;        //!< U of the first sample: pairs (a_i, b_j) with a_i > b_j, ties counting one half
  double p_value = 1.0;  //!< two-sided
  bool exact = false;    //!< exact null distribution (no ties, small samples) or normal approximation
};

//! How the p-value of the Mann-Whitney test is computed.
enum class PValueMethod {
  kAuto,    //!< exact when there are no ties and n + m <= 40, else the normal approximation
  kNormal,  //!< always the normal approximation (tie and continuity corrected)
};

//! Two-sided Mann-Whitney U test of `a` against `b`. Throws std::invalid_argument when either
//! sample is empty.
MannWhitney mann_whitney_u(const std::vector<double>& a, const std::vector<double>& b,
                           PValueMethod method = PValueMethod::kAuto);

//! A 95 % confidence interval of a proportion.
struct Interval {
  double low = 0.0;
  double high = 1.0;
};

//! Wilson score interval (95 %) of `events` out of `trials`; [0, 1] when trials is 0.
Interval wilson_interval(double events, double trials);

//! Fewest repeats on each side for which the Mann-Whitney test decides whether a change is called.
inline constexpr int kMannWhitneyMinRepeats = 5;
//! Significance level of that test.
inline constexpr double kSignificance = 0.05;

}  // namespace harness::analysis
