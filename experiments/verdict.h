#pragma once
// The verdict rule of a spec: its condition language (metrics of variants, quantities with units,
// words such as status and growth, && || !), its checking at spec load, and its evaluation over
// a run's outcomes. Torch-free.

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiments/spec.h"

namespace harness::spec {

//! What the verdict rule sees of one variant: the trial status and its summary metrics.
struct VariantOutcome {
  std::string status;                  //!< ok, oom, unsupported, error, crashed, timeout
  std::string error;
  std::map<std::string, double> values;  //!< metric name -> summary value (median over repeats)
  std::map<std::string, std::string> words;  //!< word-valued metrics, e.g. growth -> "q_kv"
  std::string check_failed;  //!< with match 0: which tensors failed the correctness check, and how
};

//! The verdict with the evidence that produced it.
struct Verdict {
  std::string verdict;       //!< the rule's result, or INVALID / INCONCLUSIVE
  nlohmann::json evidence;   //!< clause that fired, the values it read, or why none could be read
};

//! Evaluates the spec's rule. A failed correctness check never turns into a hypothesis verdict:
//! when a variant the rule reads has match 0 and the rule does not read that variant's match, the
//! verdict is INCONCLUSIVE, naming the variant and the failing tensors (failed_check_verdict); a
//! rule that reads match handles it itself (failed_check_problems makes sure at load time that it
//! does). A clause that reads a variant whose trial is "unsupported" gives INVALID; one that reads a metric a failed trial did not produce gives INCONCLUSIVE; both
//! name the variant and the reason in the evidence. Such a read counts only when the clause's
//! outcome depends on it (false && unknown is false, true || unknown is true).
Verdict evaluate_verdict(const Spec& spec, const std::map<std::string, VariantOutcome>& outcomes);

//! The guard of evaluate_verdict on its own: INCONCLUSIVE when a variant the rule reads failed the
//! correctness check and the rule does not read its match; nullopt otherwise.
std::optional<Verdict> failed_check_verdict(const Spec& spec, const std::map<std::string, VariantOutcome>& outcomes);

//! Clauses (index, problem) that a failed correctness check can reach although a step whose checks
//! all passed reaches them too (so they claim a hypothesis): e.g. [{"if": "fused.bwd_peak_bytes < 5GiB && fused.match", "then":
//! "FUSED"}, {"else": "DENSE"}] reads a wrong fused result as DENSE. Only rules that read some
//! variant's `match` are analysed (the others are covered by evaluate_verdict's guard). Comparisons
//! other than match and status are treated as independent, so a rule whose metrics exclude such a
//! path still has to say so with a clause. The conditions must be free of syntax errors.
std::vector<std::pair<size_t, std::string>> failed_check_problems(const std::vector<VerdictClause>& clauses);

//! Parses the quantities of verdict rules: sizes and durations with units, exact case: "5GiB",
//! "512MiB", "3e9", "2.5ms", "1s" (in bytes and ms). Size units are core/byte_size.h's.
std::optional<double> parse_quantity(const std::string& text);

//! What a verdict condition may read: numeric metrics, and metrics compared with words (status
//! and, for scaling specs, growth).
struct ConditionVocabulary {
  std::vector<std::string> numbers;
  std::map<std::string, std::vector<std::string>> words;
};
//! The vocabulary of attention_step specs without scaling.
ConditionVocabulary default_vocabulary();
//! The vocabulary of a kind's verdict metrics plus, with scaling, growth and the fit values.
ConditionVocabulary vocabulary_for(const std::string& kind, const std::optional<Scaling>& scaling);

//! Problems of one verdict condition: syntax, unknown metrics, unknown variants (checked against
//! `variants`), units that do not fit the metric, unknown words. Empty when it is fine.
std::vector<std::string> check_verdict_condition(const std::string& condition,
                                                 const std::vector<std::string>& variants);
//! Same with the metrics of `vocabulary`.
std::vector<std::string> check_verdict_condition(const std::string& condition,
                                                 const std::vector<std::string>& variants,
                                                 const ConditionVocabulary& vocabulary);
//! The (variant, metric) pairs a verdict condition reads, in the order written; the condition must
//! be free of syntax errors (std::invalid_argument otherwise).
std::vector<std::pair<std::string, std::string>> verdict_condition_reads(const std::string& condition);

}  // namespace harness::spec
