// Verdict rules: quantities with units, the condition grammar, and evaluation against the
// outcomes of an experiment's variants.
//
// Grammar (no parentheses; && binds tighter than ||):
//   condition  := conjunction ("||" conjunction)*
//   conjunction:= comparison ("&&" comparison)*
//   comparison := ["!"] variant "." metric | variant "." metric op operand     op: < <= > >= == !=
// A bare `variant.metric` means `!= 0` and `!variant.metric` means `== 0`; `variant.status` is
// compared (== or !=) with a word.

#include <algorithm>
#include <array>
#include <cctype>
#include <set>
#include <charconv>
#include <cstdint>
#include <cmath>
#include <stdexcept>
#include <string_view>

#include "core/byte_size.h"
#include "core/json_input.h"
#include "experiments/kinds/registry.h"
#include "experiments/verdict.h"

namespace harness::spec {
namespace {

//! What a quantity measures; metrics ending in _bytes are sizes, those ending in _ms durations.
enum class Dimension { none, bytes, time };

struct Unit {
  std::string_view suffix;
  double scale;  //!< to the base unit: bytes, milliseconds
  Dimension dimension;
};

// Byte units come from core/byte_size.h (exact case here); durations are the rule's own.
constexpr std::array<Unit, 5> kTimeUnits = {{
    {"ns", 1e-6, Dimension::time},
    {"us", 1e-3, Dimension::time},
    {"ms", 1.0, Dimension::time},
    {"s", 1e3, Dimension::time},
    {"min", 60e3, Dimension::time},
}};

constexpr std::string_view kUnitList = "B, KiB, MiB, GiB, TiB, KB, MB, GB, TB, ns, us, ms, s, min";

struct Quantity {
  double value = 0.0;
  Dimension dimension = Dimension::none;
};

std::string_view trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  const auto last = text.find_last_not_of(" \t\r\n");
  return text.substr(first, last - first + 1);
}

std::optional<Quantity> parse_quantity_with_dimension(std::string_view text) {
  text = trim(text);
  if (text.empty()) return std::nullopt;
  double number = 0.0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (error != std::errc() || !std::isfinite(number)) return std::nullopt;
  const std::string_view suffix = trim(text.substr(static_cast<size_t>(end - text.data())));
  if (suffix.empty()) return Quantity{number, Dimension::none};
  if (const auto scale = byte_unit_scale(suffix, UnitCase::kExact)) return Quantity{number * *scale, Dimension::bytes};
  for (const Unit& unit : kTimeUnits) {
    if (unit.suffix == suffix) return Quantity{number * unit.scale, unit.dimension};
  }
  return std::nullopt;
}

const std::vector<std::string>& status_words() {
  static const std::vector<std::string> words = {"ok", "oom", "unsupported", "error", "nonfinite", "crashed", "timeout"};
  return words;
}

Dimension metric_dimension(std::string_view metric) {
  if (metric.ends_with("_bytes")) return Dimension::bytes;
  if (metric.ends_with("_ms")) return Dimension::time;
  return Dimension::none;
}

std::string_view dimension_phrase(Dimension dimension) {
  switch (dimension) {
    case Dimension::bytes:
      return "a size in bytes";
    case Dimension::time:
      return "a duration";
    case Dimension::none:
      return "a plain number";
  }
  return "a plain number";
}

std::string join(const std::vector<std::string>& items, std::string_view separator) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += separator;
    out += items[i];
  }
  return out;
}

bool is_identifier(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

std::vector<std::string_view> split(std::string_view text, std::string_view separator) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  for (size_t at = text.find(separator); at != std::string_view::npos; at = text.find(separator, start)) {
    parts.push_back(text.substr(start, at - start));
    start = at + separator.size();
  }
  parts.push_back(text.substr(start));
  return parts;
}

//! One `variant.metric [op operand]` of a condition.
struct Comparison {
  std::string text;  //!< as written, trimmed
  std::string variant;
  std::string metric;
  std::string op;  //!< "!=" for a bare read (against 0)
  double threshold = 0.0;
  std::string word;  //!< status comparisons
};

//! A condition as alternatives (||) of conjunctions (&&), with the problems found parsing it.
struct Condition {
  std::vector<std::vector<Comparison>> alternatives;
  std::vector<std::string> problems;
};

// `vocabulary` null: any metric name is accepted and any word-compared metric takes any word (for
// conditions that were validated already).
std::optional<Comparison> parse_comparison(std::string_view text, std::vector<std::string>& problems,
                                           const ConditionVocabulary* vocabulary) {
  Comparison comparison;
  comparison.text = std::string(text);
  const std::string quoted = "\"" + clip_text(comparison.text, 120) + "\"";
  // "!variant.metric": the bare read negated (== 0).
  const bool negated = !text.empty() && text.front() == '!' && text.substr(0, 2) != "!=";
  if (negated) text = trim(text.substr(1));
  static constexpr std::array<std::string_view, 6> kOperators = {"<=", ">=", "==", "!=", "<", ">"};
  size_t op_at = std::string_view::npos;
  std::string_view op;
  for (size_t i = 0; i < text.size() && op_at == std::string_view::npos; ++i) {
    for (std::string_view candidate : kOperators) {
      if (text.substr(i, candidate.size()) == candidate) {
        op_at = i;
        op = candidate;
        break;
      }
    }
    if (op_at == std::string_view::npos && text[i] == '=') {
      problems.push_back("in " + quoted + ": a single \"=\"; compare with \"==\"");
      return std::nullopt;
    }
  }
  const std::string_view reference = trim(text.substr(0, op_at));
  const auto dot = reference.find('.');
  if (dot == std::string_view::npos || !is_identifier(reference.substr(0, dot)) ||
      !is_identifier(reference.substr(dot + 1))) {
    problems.push_back("in " + quoted + ": expected variant.metric (lower-case letters, digits, _) before " +
                       (op.empty() ? std::string("the end") : "\"" + std::string(op) + "\"") + ", got \"" +
                       std::string(reference) + "\"");
    return std::nullopt;
  }
  comparison.variant = std::string(reference.substr(0, dot));
  comparison.metric = std::string(reference.substr(dot + 1));
  const bool word_metric = comparison.metric == "status" || comparison.metric == "growth";
  if (vocabulary && !word_metric) {
    const auto& metrics = vocabulary->numbers;
    if (std::find(metrics.begin(), metrics.end(), comparison.metric) == metrics.end()) {
      std::vector<std::string> known = metrics;
      for (const auto& entry : vocabulary->words) known.push_back(entry.first);
      problems.push_back("in " + quoted + ": unknown metric \"" + comparison.metric +
                         "\"; known metrics: " + join(known, ", "));
      return std::nullopt;
    }
  }
  const std::string_view operand = op.empty() ? std::string_view() : trim(text.substr(op_at + op.size()));
  if (negated && (!op.empty() || word_metric)) {
    problems.push_back("in " + quoted + ": \"!\" negates a bare numeric read (\"!" + comparison.variant + "." +
                       comparison.metric + "\" means == 0); it does not go with an operator or a word");
    return std::nullopt;
  }
  if (word_metric) {
    if (vocabulary && !vocabulary->words.count(comparison.metric)) {
      problems.push_back("in " + quoted + ": " + comparison.metric +
                         " can only be read by specs with a \"scaling\" section");
      return std::nullopt;
    }
    if (op != "==" && op != "!=") {
      problems.push_back("in " + quoted + ": " + comparison.metric + " is compared with == or != and a word, e.g. \"" +
                         comparison.variant + (comparison.metric == "status" ? ".status == ok\"" : ".growth == q_kv\""));
      return std::nullopt;
    }
    if (vocabulary) {
      const auto& words = vocabulary->words.at(comparison.metric);
      if (std::find(words.begin(), words.end(), operand) == words.end()) {
        problems.push_back("in " + quoted + ": unknown " + comparison.metric + " \"" + std::string(operand) + "\"; " +
                           (comparison.metric == "status" ? "statuses" : "models") + ": " + join(words, ", "));
        return std::nullopt;
      }
    }
    comparison.op = std::string(op);
    comparison.word = std::string(operand);
    return comparison;
  }
  if (op.empty()) {
    comparison.op = negated ? "==" : "!=";
    comparison.threshold = 0.0;
    return comparison;
  }
  const auto quantity = parse_quantity_with_dimension(operand);
  if (!quantity) {
    problems.push_back("in " + quoted + ": expected a number with an optional unit (" + std::string(kUnitList) +
                       ") after \"" + std::string(op) + "\", got \"" + std::string(operand) + "\"");
    return std::nullopt;
  }
  const Dimension expected = metric_dimension(comparison.metric);
  if (quantity->dimension != Dimension::none && quantity->dimension != expected) {
    problems.push_back("in " + quoted + ": \"" + std::string(operand) + "\" is " +
                       std::string(dimension_phrase(quantity->dimension)) + " but " + comparison.metric + " is " +
                       std::string(dimension_phrase(expected)));
    return std::nullopt;
  }
  comparison.op = std::string(op);
  comparison.threshold = quantity->value;
  return comparison;
}

Condition parse_condition(const std::string& text, const ConditionVocabulary* vocabulary) {
  Condition condition;
  if (trim(text).empty()) {
    condition.problems.push_back("the condition is empty");
    return condition;
  }
  // Each problem quotes at most a clipped piece of the condition, empty comparisons are counted in
  // one problem, and at most kMaxConditionProblems are kept: `&&` written 100 000 times is one
  // short message, not 100 000 copies of the condition.
  constexpr size_t kMaxConditionProblems = 20;
  size_t empty = 0;
  for (std::string_view alternative : split(text, "||")) {
    std::vector<Comparison> conjunction;
    for (std::string_view part : split(alternative, "&&")) {
      part = trim(part);
      if (part.empty()) {
        ++empty;
        continue;
      }
      if (auto comparison = parse_comparison(part, condition.problems, vocabulary))
        conjunction.push_back(std::move(*comparison));
      if (condition.problems.size() > kMaxConditionProblems) condition.problems.pop_back();
    }
    condition.alternatives.push_back(std::move(conjunction));
  }
  if (empty > 0)
    condition.problems.push_back("in \"" + clip_text(text, 120) + "\": " +
                                 (empty == 1 ? std::string("an empty comparison") : std::to_string(empty) + " empty comparisons") +
                                 " next to && or ||");
  return condition;
}

bool compare(double value, const std::string& op, double threshold) {
  if (op == "<") return value < threshold;
  if (op == "<=") return value <= threshold;
  if (op == ">") return value > threshold;
  if (op == ">=") return value >= threshold;
  if (op == "==") return value == threshold;
  return value != threshold;
}

//! A read that could not be made: the verdict it forces and why.
struct Unreadable {
  std::string verdict;
  nlohmann::json details;
};

//! Reads one comparison's value: the evidence entry and whether it held, or why it cannot be read.
struct Reading {
  nlohmann::json entry;
  bool held = false;
  std::optional<Unreadable> unreadable;
};

Reading read(const Comparison& comparison, const std::map<std::string, VariantOutcome>& outcomes) {
  Reading reading;
  const auto found = outcomes.find(comparison.variant);
  if (found == outcomes.end()) {
    reading.unreadable = Unreadable{"INCONCLUSIVE",
                                    {{"reason", "no outcome was recorded for variant \"" + comparison.variant + "\""},
                                     {"variant", comparison.variant},
                                     {"metric", comparison.metric},
                                     {"status", "missing"},
                                     {"error", ""}}};
    return reading;
  }
  const VariantOutcome& outcome = found->second;
  reading.entry = {{"comparison", comparison.text},
                   {"variant", comparison.variant},
                   {"metric", comparison.metric},
                   {"op", comparison.op}};
  if (comparison.metric == "status") {
    reading.held = (outcome.status == comparison.word) == (comparison.op == "==");
    reading.entry["value"] = outcome.status;
    reading.entry["expected"] = comparison.word;
    reading.entry["held"] = reading.held;
    return reading;
  }
  if (comparison.metric == "growth") {
    const auto word = outcome.words.find("growth");
    if (word == outcome.words.end()) {
      reading.unreadable = Unreadable{"INCONCLUSIVE",
                                      {{"reason", "no fit for variant \"" + comparison.variant +
                                                      "\": fewer than two points measured its metric"},
                                       {"variant", comparison.variant},
                                       {"metric", comparison.metric},
                                       {"status", outcome.status},
                                       {"error", outcome.error}}};
      return reading;
    }
    reading.held = (word->second == comparison.word) == (comparison.op == "==");
    reading.entry["value"] = word->second;
    reading.entry["expected"] = comparison.word;
    reading.entry["held"] = reading.held;
    return reading;
  }
  const nlohmann::json failure = {{"variant", comparison.variant},
                                  {"metric", comparison.metric},
                                  {"status", outcome.status},
                                  {"error", outcome.error}};
  if (outcome.status == "unsupported") {
    reading.unreadable = Unreadable{"INVALID", failure};
    reading.unreadable->details["reason"] =
        "variant \"" + comparison.variant + "\" is unsupported in this configuration: " + outcome.error;
    return reading;
  }
  const auto value = outcome.values.find(comparison.metric);
  if (value == outcome.values.end()) {
    reading.unreadable = Unreadable{"INCONCLUSIVE", failure};
    reading.unreadable->details["reason"] =
        outcome.status == "ok"
            ? "variant \"" + comparison.variant + "\" ran but recorded no " + comparison.metric
            : "variant \"" + comparison.variant + "\" did not produce " + comparison.metric + ": its trial ended " +
                  outcome.status + (outcome.error.empty() ? std::string() : ": " + outcome.error);
    return reading;
  }
  reading.held = compare(value->second, comparison.op, comparison.threshold);
  reading.entry["value"] = value->second;
  reading.entry["threshold"] = comparison.threshold;
  reading.entry["held"] = reading.held;
  return reading;
}

}  // namespace

std::optional<double> parse_quantity(const std::string& text) {
  const auto quantity = parse_quantity_with_dimension(text);
  if (!quantity) return std::nullopt;
  return quantity->value;
}

ConditionVocabulary default_vocabulary() { return vocabulary_for("attention_step", std::nullopt); }

ConditionVocabulary vocabulary_for(const std::string& kind, const std::optional<Scaling>& scaling) {
  ConditionVocabulary vocabulary;
  // An unknown kind is reported by itself; its rule is read as attention_step's meanwhile.
  const kinds::KindInfo* info = kinds::find_kind(kind);
  if (!info) info = kinds::find_kind("attention_step");
  vocabulary.numbers = info->verdict_metrics;
  vocabulary.words["status"] = status_words();
  if (scaling) {
    vocabulary.words["growth"] = scaling->models;
    for (const std::string& model : scaling->models) {
      for (const char* what : {"r2_", "slope_"}) vocabulary.numbers.push_back(what + model);
    }
  }
  return vocabulary;
}

std::vector<std::string> check_verdict_condition(const std::string& condition,
                                                 const std::vector<std::string>& variants) {
  return check_verdict_condition(condition, variants, default_vocabulary());
}

std::vector<std::string> check_verdict_condition(const std::string& condition,
                                                 const std::vector<std::string>& variants,
                                                 const ConditionVocabulary& vocabulary) {
  Condition parsed = parse_condition(condition, &vocabulary);
  const std::set<std::string> known(variants.begin(), variants.end());
  std::set<std::string> unknown;
  for (const auto& conjunction : parsed.alternatives) {
    for (const Comparison& comparison : conjunction) {
      if (parsed.problems.size() >= 20) break;
      if (!known.count(comparison.variant) && unknown.insert(comparison.variant).second) {
        parsed.problems.push_back("in \"" + clip_text(comparison.text, 120) + "\": unknown variant \"" +
                                  clip_text(comparison.variant, 60) + "\"; variants: " + join(variants, ", "));
      }
    }
  }
  return parsed.problems;
}

std::vector<std::pair<std::string, std::string>> verdict_condition_reads(const std::string& condition) {
  const Condition parsed = parse_condition(condition, nullptr);
  if (!parsed.problems.empty()) throw std::invalid_argument("verdict condition: " + parsed.problems.front());
  std::vector<std::pair<std::string, std::string>> reads;
  for (const auto& conjunction : parsed.alternatives) {
    for (const Comparison& comparison : conjunction) reads.emplace_back(comparison.variant, comparison.metric);
  }
  return reads;
}

namespace {

// The atoms of the rule's conditions for the failed-check analysis: a variant's `match` as a
// boolean variable, `status` comparisons of such a variant, and every other comparison as a
// free atom (its truth unconstrained, so the analysis may see paths the metrics exclude: it errs
// towards asking for an explicit clause, never towards letting a failed check through).
struct CheckAtoms {
  std::vector<std::string> match_variants;  // variables 0..M-1
  std::vector<std::string> free_texts;      // variables M..M+F-1
  std::vector<std::string> status_texts;    // status comparisons, with their variant
  std::vector<std::string> status_variants;
  std::vector<Comparison> status_comparisons;
};

size_t index_of(std::vector<std::string>& list, const std::string& item) {
  const auto found = std::find(list.begin(), list.end(), item);
  if (found != list.end()) return static_cast<size_t>(found - list.begin());
  list.push_back(item);
  return list.size() - 1;
}

std::string atom_key(const Comparison& c) {
  return c.variant + "." + c.metric + " " + c.op + " " + (c.word.empty() ? std::to_string(c.threshold) : c.word);
}

}  // namespace

std::vector<std::pair<size_t, std::string>> failed_check_problems(const std::vector<VerdictClause>& clauses) {
  std::vector<Condition> conditions;
  for (const VerdictClause& clause : clauses) {
    if (clause.condition.empty()) {
      conditions.emplace_back();
      continue;
    }
    conditions.push_back(parse_condition(clause.condition, nullptr));
    if (!conditions.back().problems.empty()) return {};  // reported by the syntax check
  }
  CheckAtoms atoms;
  for (const Condition& condition : conditions)
    for (const auto& conjunction : condition.alternatives)
      for (const Comparison& c : conjunction)
        if (c.metric == "match") index_of(atoms.match_variants, c.variant);
  if (atoms.match_variants.empty()) return {};
  for (const Condition& condition : conditions)
    for (const auto& conjunction : condition.alternatives)
      for (const Comparison& c : conjunction) {
        if (c.metric == "match") continue;
        const bool status_of_checked = c.metric == "status" && std::find(atoms.match_variants.begin(), atoms.match_variants.end(),
                                                                         c.variant) != atoms.match_variants.end();
        if (status_of_checked) {
          const std::string key = atom_key(c);
          if (std::find(atoms.status_texts.begin(), atoms.status_texts.end(), key) == atoms.status_texts.end()) {
            atoms.status_texts.push_back(key);
            atoms.status_variants.push_back(c.variant);
            atoms.status_comparisons.push_back(c);
          }
        } else {
          index_of(atoms.free_texts, atom_key(c));
        }
      }
  const size_t match_count = atoms.match_variants.size();
  const size_t status_count = atoms.status_texts.size();
  const size_t variables = match_count + status_count + atoms.free_texts.size();
  // 2^16 assignments at most; beyond that the rule is too large to analyse here.
  if (variables > 16) return {};
  // Per clause: whether it fires with every recorded check passed, and which variants' failed
  // checks it also fires with.
  std::vector<bool> reached_passing(clauses.size(), false);
  std::vector<std::vector<bool>> reached_failing(clauses.size(), std::vector<bool>(match_count, false));
  for (uint32_t assignment = 0; assignment < (1u << variables); ++assignment) {
    const auto bit = [&](size_t variable) { return (assignment >> variable) & 1u; };
    // Match values are recorded only for variants whose trial was ok.
    std::vector<bool> ok(match_count, true);
    for (size_t s = 0; s < status_count; ++s) {
      const Comparison& c = atoms.status_comparisons[s];
      const bool truth_if_ok = (c.word == "ok") == (c.op == "==");
      if (static_cast<bool>(bit(match_count + s)) != truth_if_ok)
        ok[index_of(atoms.match_variants, c.variant)] = false;
    }
    const auto holds = [&](const Comparison& c) -> bool {
      if (c.metric == "match") {
        const size_t m = index_of(atoms.match_variants, c.variant);
        return compare(bit(m) ? 1.0 : 0.0, c.op, c.threshold);
      }
      const std::string key = atom_key(c);
      const auto status = std::find(atoms.status_texts.begin(), atoms.status_texts.end(), key);
      if (status != atoms.status_texts.end())
        return bit(match_count + static_cast<size_t>(status - atoms.status_texts.begin()));
      return bit(match_count + status_count + index_of(atoms.free_texts, key));
    };
    for (size_t i = 0; i < clauses.size(); ++i) {
      bool fires = conditions[i].alternatives.empty();  // the else
      for (const auto& conjunction : conditions[i].alternatives) {
        fires = std::all_of(conjunction.begin(), conjunction.end(), holds);
        if (fires) break;
      }
      if (!fires) continue;
      bool all_pass = true;
      for (size_t m = 0; m < match_count; ++m) {
        if (ok[m] && !bit(m)) {
          reached_failing[i][m] = true;
          all_pass = false;
        }
      }
      if (all_pass) reached_passing[i] = true;
      break;
    }
  }
  // A clause that a passing step reaches claims something about the step; if a failed check
  // reaches it too, the wrong result reads as that claim.
  std::vector<std::pair<size_t, std::string>> problems;
  std::vector<bool> named(match_count, false);
  for (size_t i = 0; i < clauses.size(); ++i) {
    if (!reached_passing[i]) continue;
    for (size_t m = 0; m < match_count; ++m) {
      if (!reached_failing[i][m] || named[m]) continue;
      named[m] = true;  // the first such clause per variant: fixing it usually fixes the later ones
      const std::string& variant = atoms.match_variants[m];
      std::string upper = variant;
      for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
      problems.emplace_back(
          i, "\"" + clauses[i].then + "\" is reached both when the checks passed and when " + variant +
                 "'s correctness check failed (" + variant + ".match == 0), so a wrong result would read as \"" +
                 clauses[i].then + "\"; add a clause before it that catches the failed check, e.g. {\"if\": \"!" +
                 variant + ".match\", \"then\": \"" + upper + "_BUT_WRONG\"}");
    }
  }
  return problems;
}

std::optional<Verdict> failed_check_verdict(const Spec& spec, const std::map<std::string, VariantOutcome>& outcomes) {
  if (!spec.check) return std::nullopt;
  std::vector<std::string> read, read_match;
  for (const VerdictClause& clause : spec.verdict) {
    if (clause.condition.empty()) continue;
    const Condition condition = parse_condition(clause.condition, nullptr);
    for (const auto& conjunction : condition.alternatives)
      for (const Comparison& c : conjunction) {
        index_of(read, c.variant);
        if (c.metric == "match") index_of(read_match, c.variant);
      }
  }
  nlohmann::json failed = nlohmann::json::array();
  for (const std::string& variant : read) {
    if (std::find(read_match.begin(), read_match.end(), variant) != read_match.end()) continue;
    const auto outcome = outcomes.find(variant);
    if (outcome == outcomes.end()) continue;
    const auto match = outcome->second.values.find("match");
    if (match == outcome->second.values.end() || match->second != 0.0) continue;
    failed.push_back({{"variant", variant}, {"check_failed", outcome->second.check_failed}});
  }
  if (failed.empty()) return std::nullopt;
  std::string names;
  for (const auto& entry : failed)
    names += (names.empty() ? "" : "; ") + entry["variant"].get<std::string>() +
             (entry["check_failed"].get<std::string>().empty() ? "" : ": " + entry["check_failed"].get<std::string>());
  return Verdict{"INCONCLUSIVE",
                 {{"reason", "the result of a variant the rule reads failed the correctness check (" + names +
                                 "), and the rule does not read its match: no hypothesis verdict is drawn from a wrong result"},
                  {"check_failed", failed}}};
}

Verdict evaluate_verdict(const Spec& spec, const std::map<std::string, VariantOutcome>& outcomes) {
  if (auto guarded = failed_check_verdict(spec, outcomes)) return *guarded;
  nlohmann::json rejected = nlohmann::json::array();
  for (size_t index = 0; index < spec.verdict.size(); ++index) {
    const VerdictClause& clause = spec.verdict[index];
    if (clause.condition.empty()) {
      return {clause.then, {{"clause", index}, {"else", true}, {"then", clause.then}, {"rejected", rejected}}};
    }
    const Condition condition = parse_condition(clause.condition, nullptr);
    if (!condition.problems.empty()) {
      throw std::invalid_argument("verdict clause " + std::to_string(index) + " of " + spec.name + ": " +
                                  condition.problems.front());
    }
    // Three-valued: a comparison that cannot be read is unknown; false && unknown is false and
    // true || unknown is true, so a variant matters only when the clause's outcome depends on it.
    nlohmann::json values = nlohmann::json::array();
    std::optional<Unreadable> unknown;  // why the clause is undecided; INVALID before INCONCLUSIVE
    bool held = false;
    for (const auto& conjunction : condition.alternatives) {
      std::optional<Unreadable> conjunction_unknown;
      bool conjunction_false = false;
      for (const Comparison& comparison : conjunction) {
        Reading reading = read(comparison, outcomes);
        if (reading.unreadable) {
          if (!conjunction_unknown) {
            conjunction_unknown = std::move(reading.unreadable);
            conjunction_unknown->details["comparison"] = comparison.text;
          }
          continue;
        }
        values.push_back(std::move(reading.entry));
        if (!reading.held) {
          conjunction_false = true;
          break;
        }
      }
      if (conjunction_false) continue;
      if (!conjunction_unknown) {
        held = true;
        break;
      }
      if (!unknown || (unknown->verdict != "INVALID" && conjunction_unknown->verdict == "INVALID")) {
        unknown = std::move(conjunction_unknown);
      }
    }
    if (held) {
      return {clause.then,
              {{"clause", index},
               {"if", clause.condition},
               {"then", clause.then},
               {"values", values},
               {"rejected", rejected}}};
    }
    if (unknown) {
      nlohmann::json evidence = std::move(unknown->details);
      evidence["clause"] = index;
      evidence["if"] = clause.condition;
      evidence["values"] = values;
      evidence["rejected"] = rejected;
      return {unknown->verdict, std::move(evidence)};
    }
    rejected.push_back({{"clause", index}, {"if", clause.condition}, {"values", values}});
  }
  // Validation demands a final else, so this is reached only for a Spec built by hand.
  return {"INCONCLUSIVE",
          {{"reason", "no verdict clause held and the rule has no else clause"}, {"rejected", rejected}}};
}

}  // namespace harness::spec
