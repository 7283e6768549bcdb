#pragma once
// Inside the spec loader, shared by its files and by nothing else: the schema (which fields exist
// where), the checker that collects every problem with the source that wrote its path, and the
// steps of loading. The public interface is experiments/spec.h.
//
//   spec_schema.cpp     the schema, the checker's helpers, schema queries (sweepable? array?)
//   spec_validate.cpp   the resolved document checked section by section, a sweep point by point
//   spec_overrides.cpp  profiles merged, --model and --set applied, each write's origin recorded
//   spec.cpp            the public entry points: read, resolve, validate, find

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/json_input.h"
#include "experiments/spec.h"

namespace harness::spec::loader {

using OrderedJson = nlohmann::ordered_json;

// ------------------------------------------------------------------------------------------------
// Schema: which fields exist where. Types and ranges are checked by the validator; the schema
// answers "is this a field at all?" for the file, its profiles and --set paths alike.

struct SchemaNode;
using SchemaPtr = std::shared_ptr<const SchemaNode>;

struct SchemaNode {
  enum class Kind { value, object, map, array, any };  // any: free-form below (a kind's params)
  Kind kind = Kind::value;
  std::vector<std::pair<std::string, SchemaPtr>> fields;  //!< object: its fields, in documented order
  SchemaPtr element;                                      //!< map: each value; array: each element

  const SchemaNode* field(const std::string& name) const {
    for (const auto& [field_name, node] : fields) {
      if (field_name == name) return node.get();
    }
    return nullptr;
  }
  std::string field_names() const {
    std::string out;
    for (const auto& entry : fields) out += (out.empty() ? "" : ", ") + entry.first;
    return out;
  }
};

struct Schema {
  SchemaPtr root;     //!< a spec file
  SchemaPtr profile;  //!< one profile: any spec field except profile(s)
};

const Schema& schema();

//! Why `path` cannot be swept, or "" when it can: it must name a field of dims, mask, block_mask,
//! check, params or a top-level number such as repeats, never the experiment's identity, variants
//! or rule.
std::string sweep_path_problem(const std::string& path);
//! Whether `path` names an array-valued field (such as mask.doc_lengths), which an array sets
//! rather than sweeps.
bool is_array_field(const std::string& path);

// ------------------------------------------------------------------------------------------------
// Helpers for messages.

std::string join(const std::vector<std::string>& items, const std::string& separator = ", ");

template <typename T>
bool contains(const std::vector<T>& items, const T& item) {
  return std::find(items.begin(), items.end(), item) != items.end();
}

bool is_identifier(const std::string& text);
//! "path.key", or "key" at the top.
std::string child(const std::string& path, const std::string& key);
//! `"abc" (string)`, `0 (number)`, `null`: what was found, for messages.
std::string describe(const OrderedJson& value);
//! An integer, also one written as an exactly representable float (1e3); nullopt otherwise.
std::optional<int64_t> as_integer(const OrderedJson& value);

// ------------------------------------------------------------------------------------------------
// Where a value came from: the file, a profile, or a --set override. Issues are attributed to the
// last of these that wrote the path (or a path it is part of).

struct Origin {
  std::string path;
  std::string source;
};

inline bool path_overlaps(const std::string& a, const std::string& b) {
  const auto under = [](const std::string& inner, const std::string& outer) {
    return inner == outer ||
           (inner.size() > outer.size() && inner.compare(0, outer.size(), outer) == 0 && inner[outer.size()] == '.');
  };
  return !a.empty() && !b.empty() && (under(a, b) || under(b, a));
}

//! Collects issues while the validator walks the spec.
class Checker {
 public:
  Checker(std::string source, std::vector<Origin> origins, std::vector<SpecIssue> issues, size_t more = 0)
      : source_(std::move(source)), origins_(std::move(origins)), issues_(std::move(issues)), more_(more) {}

  void issue(const std::string& path, std::string message, const std::vector<std::string>& related = {}) {
    add({source_for(path, related), path, std::move(message)});
  }
  //! Keeps the first kMaxIssuesKept problems (clipped), counts the rest.
  void add(SpecIssue issue) {
    if (issues_.size() < kMaxIssuesKept) {
      issue.source = clip_text(issue.source, 300);
      issue.path = clip_text(issue.path, 200);
      issue.message = clip_text(issue.message, 500);
      issues_.push_back(std::move(issue));
    } else {
      ++more_;
    }
  }
  //! Keeps `issue` even past kMaxIssuesKept (one closing remark, such as where checking stopped).
  void note(SpecIssue issue) {
    issue.message = clip_text(issue.message, 500);
    issues_.push_back(std::move(issue));
  }
  //! Counts problems found elsewhere and not kept there.
  void count_more(size_t more) { more_ += more; }
  //! Problems found so far, kept or counted.
  size_t count() const { return issues_.size() + more_; }
  std::vector<SpecIssue>& issues() { return issues_; }
  SpecError error() { return SpecError(std::move(issues_), more_); }

  //! The member, or nullptr when absent (reported when required).
  const OrderedJson* member(const OrderedJson& object, const std::string& path, const std::string& key, bool required) {
    const auto found = object.find(key);
    if (found == object.end()) {
      if (required) issue(child(path, key), "required field is missing");
      return nullptr;
    }
    return &*found;
  }

  //! An integer in [minimum, maximum]; nullopt when absent or wrong (the latter reported).
  std::optional<int64_t> integer(const OrderedJson& object, const std::string& path, const std::string& key,
                                 bool required, int64_t minimum, const std::string& expected,
                                 int64_t maximum = std::numeric_limits<int64_t>::max()) {
    const OrderedJson* value = member(object, path, key, required);
    if (!value) return std::nullopt;
    const auto number = as_integer(*value);
    if (!number || *number < minimum) {
      issue(child(path, key), "expected " + expected + ", got " + describe(*value));
      return std::nullopt;
    }
    if (*number > maximum) {
      issue(child(path, key),
            "expected " + expected + " no larger than " + std::to_string(maximum) + ", got " + describe(*value));
      return std::nullopt;
    }
    return number;
  }

  //! A finite number above (or, with inclusive, at least) minimum.
  std::optional<double> number(const OrderedJson& object, const std::string& path, const std::string& key,
                               double minimum, bool inclusive, const std::string& expected) {
    const OrderedJson* value = member(object, path, key, false);
    if (!value) return std::nullopt;
    const bool ok = value->is_number() && std::isfinite(value->get<double>()) &&
                    (inclusive ? value->get<double>() >= minimum : value->get<double>() > minimum);
    if (!ok) {
      issue(child(path, key), "expected " + expected + ", got " + describe(*value));
      return std::nullopt;
    }
    return value->get<double>();
  }

  //! A non-empty string.
  std::optional<std::string> string(const OrderedJson& object, const std::string& path, const std::string& key,
                                    bool required) {
    const OrderedJson* value = member(object, path, key, required);
    if (!value) return std::nullopt;
    if (!value->is_string() || value->get<std::string>().empty()) {
      issue(child(path, key), "expected a non-empty string, got " + describe(*value));
      return std::nullopt;
    }
    return value->get<std::string>();
  }

  //! One of a list of words.
  std::optional<std::string> choice(const OrderedJson& object, const std::string& path, const std::string& key,
                                    bool required, const std::string& what, const std::string& known,
                                    bool (*valid)(const std::string&)) {
    const auto text = string(object, path, key, required);
    if (text && !valid(*text)) {
      issue(child(path, key), "unknown " + what + " \"" + *text + "\"; known: " + known);
      return std::nullopt;
    }
    return text;
  }

  //! A seed: any non-negative integer up to 2^64 - 1.
  std::optional<uint64_t> seed(const OrderedJson& object, const std::string& path, const std::string& key) {
    const OrderedJson* value = member(object, path, key, false);
    if (!value) return std::nullopt;
    if (value->is_number_unsigned()) return value->get<uint64_t>();
    if (const auto number = as_integer(*value); number && *number >= 0) return static_cast<uint64_t>(*number);
    issue(child(path, key), "expected a non-negative integer, got " + describe(*value));
    return std::nullopt;
  }

  std::optional<bool> boolean(const OrderedJson& object, const std::string& path, const std::string& key) {
    const OrderedJson* value = member(object, path, key, false);
    if (!value) return std::nullopt;
    if (!value->is_boolean()) {
      issue(child(path, key), "expected true or false, got " + describe(*value));
      return std::nullopt;
    }
    return value->get<bool>();
  }

  //! An object member.
  const OrderedJson* object(const OrderedJson& parent, const std::string& path, const std::string& key, bool required) {
    const OrderedJson* value = member(parent, path, key, required);
    if (value && !value->is_object()) {
      issue(child(path, key), "expected an object, got " + describe(*value));
      return nullptr;
    }
    return value;
  }

 private:
  std::string source_for(const std::string& path, const std::vector<std::string>& related) const {
    for (auto origin = origins_.rbegin(); origin != origins_.rend(); ++origin) {
      if (path_overlaps(origin->path, path)) return origin->source;
      for (const std::string& other : related) {
        if (path_overlaps(origin->path, other)) return origin->source;
      }
    }
    return source_;
  }

  std::string source_;
  std::vector<Origin> origins_;
  std::vector<SpecIssue> issues_;
  size_t more_ = 0;
};

//! Reports fields the schema does not know, anywhere below `path`.
void check_known_fields(const OrderedJson& value, const SchemaNode& node, const std::string& path, Checker& checker);

// ------------------------------------------------------------------------------------------------
// Validation (spec_validate.cpp).

//! Profiles: an object of objects whose fields the schema knows. `skip` is the applied profile,
//! which is validated in full after merging.
void check_profiles(const OrderedJson& doc, const std::string& skip, Checker& checker);
//! The whole spec: the sweep's axes checked, then every point validated as its own spec (kept in
//! Spec::points); the returned spec is the first point's, with the sweep and the unswept resolved JSON.
Spec validate(const OrderedJson& doc, const std::string& source, std::vector<Origin> origins, bool allow_faults,
              std::vector<SpecIssue> earlier_issues, size_t earlier_more = 0);

// ------------------------------------------------------------------------------------------------
// Profiles and overrides (spec_overrides.cpp).

void deep_merge(OrderedJson& target, const OrderedJson& patch);
//! Paths of the values a profile writes (objects are merged, so their leaves are what changes).
void leaf_paths(const OrderedJson& value, const std::string& path, std::vector<std::string>& out);
//! The value of "--set path=value" as JSON; nullopt when it is not JSON (then it is meant as a
//! word: dims.dtype=fp16). JSON that breaks a limit (nesting, size, duplicate keys, a number out
//! of range) is an error, not a word: throws JsonInputError.
std::optional<OrderedJson> override_value(const std::string& text);
//! Applies one "--set path=value"; on a problem reports it and leaves the document unchanged.
void apply_override(OrderedJson& doc, const std::string& argument, const std::string& source,
                    std::vector<SpecIssue>& issues, std::vector<Origin>& origins);
//! Whether `path` is a dim a model sets (heads, kv_heads, head_dim, v_head_dim).
bool is_model_dim(const std::string& path);
//! The model (--model, --set model=NAME, or the spec's "model") written into dims: heads, kv_heads,
//! head_dim, and v_head_dim where it differs from head_dim. An unknown name is left for validation
//! to report with the known ones.
void apply_model(OrderedJson& resolved, const LoadOptions& options, const std::string& source,
                 std::vector<SpecIssue>& issues, std::vector<Origin>& origins);

}  // namespace harness::spec::loader
