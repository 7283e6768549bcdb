#pragma once
// `harness bisect`: the search over an ordered list of candidates (package versions, envs,
// builds) for the first one whose run reads like the bad end's, as git bisect does over commits
// (a candidate that cannot install or run is skipped, and the answer is then a range), how one
// probe's runs are read and judged against the two ends (a verdict, a trial status, or a metric
// compared with the diff's noise-aware rule), and the bisect's report (table, plot, env diff).

#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "analysis/diff.h"
#include "analysis/document.h"
#include "db/store.h"

namespace harness::analysis {

//! How a probe went.
enum class ProbeOutcome { kGood, kBad, kSkip };

//! "good", "bad", "skip".
const char* outcome_name(ProbeOutcome outcome);

//! The bracket of a binary search over candidates 0..count-1, where 0 is known good and
//! count-1 known bad: each probe moves an end inward, a skipped candidate is never probed again.
class BisectSearch {
 public:
  //! Throws std::invalid_argument for fewer than two candidates.
  explicit BisectSearch(size_t count);

  //! The candidate to probe next: of those strictly between the ends and not skipped, the one
  //! nearest the middle (the lower on a tie); nullopt when none is left.
  std::optional<size_t> next() const;
  //! Records a probe of `position`, which must lie strictly between the ends.
  void record(size_t position, ProbeOutcome outcome);

  size_t last_good() const { return last_good_; }
  size_t first_bad() const { return first_bad_; }
  //! Skipped candidates strictly between the ends: the change is at one of them or at first_bad.
  std::vector<size_t> unresolved() const;
  //! Most probes between the ends a search of `count` candidates needs without skips:
  //! ceil(log2(count - 1)).
  static int max_probes(size_t count);

 private:
  size_t last_good_ = 0;
  size_t first_bad_;
  std::set<size_t> skipped_;
};

//! What a bisect compares.
enum class BisectMode { kVerdict, kStatus, kMetric };

//! "verdict", "status", "metric".
const char* mode_name(BisectMode mode);

//! The quantity a bisect reads from each probe's runs.
struct BisectTarget {
  BisectMode mode = BisectMode::kVerdict;
  std::string variant;       //!< status and metric modes ("" for metric: the one variant that has it)
  std::string metric;        //!< metric mode
  double threshold = 0.10;   //!< metric mode: smallest change that counts, relative to the good end's median

  //! "verdict", "status of eager", "eager.bwd_peak_bytes (threshold 10 %)".
  std::string describe() const;
};

//! A probe's runs reduced to what the target compares.
struct ProbeReading {
  bool usable = false;
  std::string why_not;     //!< when not usable: the runs' error, a missing metric
  std::string verdict;
  std::string status;      //!< the variant's trial status (points joined by ',')
  std::optional<SideValues> metric;  //!< the metric's values over every run (repeats pooled)
  std::string unit;
};

//! Reads the runs of one probe (several when it was repeated inside the noise).
ProbeReading read_probe(const BisectTarget& target, const std::vector<db::RunDetail>& runs);

//! The target with its variant filled in from the good end's run (metric mode without a
//! variant: the one variant that measured the metric). Throws UsageError naming the choices
//! when the metric is not measured or is measured by several variants, or the variant is unknown.
BisectTarget resolve_target(const BisectTarget& target, const db::RunDetail& good_run);

//! Checks that the two ends read differently: different verdicts, different statuses, or a
//! metric change that the diff calls (outside the noise) and that reaches the threshold. Throws
//! UsageError saying what both ends read when they do not.
void check_ends(const BisectTarget& target, const ProbeReading& good, const ProbeReading& bad,
                const std::string& good_label, const std::string& bad_label);

//! How a probe reads against the two ends.
struct ProbeJudgement {
  ProbeOutcome outcome = ProbeOutcome::kSkip;
  std::string reason;
  bool inside_noise = false;  //!< metric mode: neither end's side is clear; more repeats may decide
};

//! Judges a usable probe against the ends (check_ends held for them).
ProbeJudgement judge_probe(const BisectTarget& target, const ProbeReading& good, const ProbeReading& bad,
                           const ProbeReading& probe);

//! What changed in the installed packages between two envs ({name: version} maps): one
//! JsonChange per package whose version differs, is added or is removed, by name.
std::vector<JsonChange> package_changes(const nlohmann::json& before, const nlohmann::json& after);

//! The report of a bisect: what was searched, the answer, every candidate (probed or not) with
//! its reading, a plot of the metric across the candidates, what else changed between the last
//! good and first bad envs, and the commands that reproduce both ends.
Document bisect_document(const db::Bisect& bisect, const std::vector<db::BisectProbe>& probes,
                         const std::string& db_path);

//! The text `harness bisect` and `harness bisect show` print.
std::string bisect_text(const db::Bisect& bisect, const std::vector<db::BisectProbe>& probes);

//! The JSON form (--json).
nlohmann::json bisect_json(const db::Bisect& bisect, const std::vector<db::BisectProbe>& probes);

}  // namespace harness::analysis
