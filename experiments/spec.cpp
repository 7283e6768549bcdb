// Experiment specs: read the JSON (keeping the written order), apply a profile, a model and --set
// overrides, then validate everything in one pass so that the user sees every problem at once.
// Each problem names the file (or the profile / override that caused it), the JSON path and what
// was expected. The steps live in spec_schema.cpp, spec_overrides.cpp and spec_validate.cpp
// (experiments/spec_loader.h).

#include "experiments/spec.h"

#include <algorithm>
#include <filesystem>

#include "core/json_input.h"
#include "experiments/spec_loader.h"
#include "kernels/cuda/attention_config.h"

namespace harness::spec {

using namespace loader;

namespace {

OrderedJson to_ordered(const nlohmann::json& json) { return OrderedJson::parse(json.dump()); }

}  // namespace

std::string dims_product_problem(const kernels::AttentionGeometry& g) {
  // Each factor is within its own bound (at most 2^25), so no product below overflows.
  if (g.batch < 1 || g.heads < 1 || g.head_dim < 1 || g.anchors < 1 || g.block_size < 1 || g.context < 0 ||
      g.batch > kMaxBatch || g.heads > kMaxHeads || g.head_dim > kMaxHeadDim || g.anchors > kMaxPositions ||
      g.block_size > kMaxBlockSize || g.context > kMaxPositions)
    return "a dim outside its bounds (experiments/README.md, \"Bounds\")";
  const int64_t q_len = g.q_len(), kv_len = g.kv_len();
  if (q_len > kMaxPositions)
    return "anchors × block_size = " + std::to_string(q_len) + " query positions; at most " + std::to_string(kMaxPositions);
  if (g.batch * g.heads * q_len > kMaxScorePairs / kv_len)
    return "batch × heads × Q_LEN × KV_LEN = " + std::to_string(g.batch) + " × " + std::to_string(g.heads) + " × " +
           std::to_string(q_len) + " × " + std::to_string(kv_len) +
           " query-key pairs in one layer; at most 2^46 (its fp32 scores alone would pass 256 TiB)";
  if (g.batch * g.heads * (q_len + kv_len) > kMaxTensorElements / g.head_dim)
    return "batch × heads × (Q_LEN + KV_LEN) × head_dim passes 2^40 elements in one layer's q, k, v and output";
  return "";
}

std::string SpecIssue::to_string() const {
  std::string out = source + ": ";
  if (!path.empty()) out += path + ": ";
  return out + message;
}

namespace {
std::string describe_issues(const std::vector<SpecIssue>& issues, size_t more) {
  std::string out;
  const size_t shown = std::min(issues.size(), kMaxIssuesShown);
  for (size_t i = 0; i < shown; ++i) out += (i ? "\n" : "") + issues[i].to_string();
  if (shown < issues.size() + more)
    out += "\n... and " + std::to_string(issues.size() + more - shown) + " more problems";
  return out;
}}  // namespace

namespace {
// An issue as printed: values a user wrote (a 10 MB name, a --set of 60 000 brackets) are cut to
// a few hundred bytes wherever they appear.
SpecIssue clipped(SpecIssue issue) {
  issue.source = clip_text(issue.source, 300);
  issue.path = clip_text(issue.path, 200);
  issue.message = clip_text(issue.message, 500);
  return issue;
}

std::vector<SpecIssue> clipped(std::vector<SpecIssue> issues) {
  for (SpecIssue& issue : issues) issue = clipped(std::move(issue));
  return issues;
}
}  // namespace

SpecError::SpecError(std::vector<SpecIssue> issues, size_t more)
    : SpecError(Clipped{}, clipped(std::move(issues)), more) {}

SpecError::SpecError(Clipped, std::vector<SpecIssue> issues, size_t more)
    : std::runtime_error(describe_issues(issues, more)), issues_(std::move(issues)), more_(more) {
  if (issues_.size() > kMaxIssuesKept + 1) {  // the one closing remark a checker may add
    more_ += issues_.size() - kMaxIssuesKept;
    issues_.resize(kMaxIssuesKept);
  }
}

bool has_profile(const nlohmann::json& raw, const std::string& profile) {
  const auto profiles = raw.find("profiles");
  return profiles != raw.end() && profiles->is_object() && profiles->contains(profile) &&
         (*profiles)[profile].is_object();
}


Spec load_spec_text(const std::string& text, const std::string& source, const LoadOptions& options) {
  OrderedJson raw;
  try {
    raw = parse_json_input(text);
  } catch (const JsonInputError& e) {
    throw SpecError({{source, e.path(), e.message()}});
  }
  if (!raw.is_object())
    throw SpecError({{source, "", "expected a JSON object at the top level, got " + describe(raw)}});

  std::vector<SpecIssue> issues;
  std::vector<Origin> origins;
  OrderedJson resolved = raw;
  resolved.erase("profiles");

  // The profile: the one asked for, else the implicit one when the spec defines it.
  const auto profiles_of_raw = raw.find("profiles");
  const bool defines_implicit = !options.implicit_profile.empty() && profiles_of_raw != raw.end() &&
                                profiles_of_raw->is_object() && profiles_of_raw->contains(options.implicit_profile) &&
                                (*profiles_of_raw)[options.implicit_profile].is_object();
  const std::string profile = !options.profile.empty() ? options.profile : defines_implicit ? options.implicit_profile : "";
  // Profiles that are not applied are only checked for unknown fields; the applied one is merged
  // and validated with the rest, its issues attributed to it.
  Checker profile_checker(source, {}, {});
  check_profiles(raw, profile, profile_checker);
  if (!profile.empty()) {
    const std::string profile_source = source + " (profile " + profile + ")";
    if (profiles_of_raw == raw.end() || !profiles_of_raw->is_object() || !profiles_of_raw->contains(profile) ||
        !(*profiles_of_raw)[profile].is_object()) {
      std::vector<std::string> names;
      if (raw.contains("profiles") && raw["profiles"].is_object()) {
        for (const auto& item : raw["profiles"].items()) names.push_back(item.key());
      }
      profile_checker.issue("profiles",
                            "unknown profile \"" + profile + "\"; " +
                                (names.empty() ? "the spec defines no profiles" : "the spec defines: " + join(names)));
    } else {
      if (raw.contains("profile") && raw["profile"] != profile && raw["profile"] != "") {
        profile_checker.issue("profile", "this spec was already resolved with profile " + describe(raw["profile"]));
      }
      OrderedJson patch = raw["profiles"][profile];
      for (const std::string key : {"profile", "profiles"}) {
        if (patch.contains(key)) {
          profile_checker.issue(child("profiles." + profile, key),
                                "unknown field \"" + key + "\"; known fields of profiles." + profile + ": " +
                                    schema().profile->field_names());
          patch.erase(key);
        }
      }
      deep_merge(resolved, patch);
      std::vector<std::string> written;
      leaf_paths(patch, "", written);
      for (const std::string& path : written) origins.push_back({path, profile_source});
      resolved["profile"] = profile;
    }
  }
  const size_t profile_more = profile_checker.count() - profile_checker.issues().size();
  issues = std::move(profile_checker.issues());
  apply_model(resolved, options, source, issues, origins);
  for (const std::string& argument : options.overrides) {
    if (argument.rfind("model=", 0) == 0) continue;  // applied by apply_model
    // `--set dims.anchors=[128,256]` sweeps the field; `--set dims.anchors=256` pins a swept one.
    const auto equals = argument.find('=');
    const std::string path = equals == std::string::npos ? "" : argument.substr(0, equals);
    if (!path.empty()) {
      OrderedJson value;
      try {
        value = override_value(argument.substr(equals + 1)).value_or(OrderedJson());
      } catch (const JsonInputError&) {
        // Reported with its path by apply_override below.
      }
      if (value.is_array() && sweep_path_problem(path).empty() && !is_array_field(path)) {
        resolved["sweep"][path] = value;
        resolved.erase("sweep_order");
        origins.push_back({"sweep." + path, source + " (--set " + argument + ")"});
        origins.push_back({path, source + " (--set " + argument + ")"});
        continue;
      }
    }
    apply_override(resolved, argument, source, issues, origins);
    // A shape set by hand after the model's is no longer the model's.
    if (resolved.contains("model") && is_model_dim(path)) resolved.erase("model");
    if (!path.empty() && resolved.contains("sweep") && resolved["sweep"].is_object() && resolved["sweep"].contains(path)) {
      resolved["sweep"].erase(path);
      resolved.erase("sweep_order");
      if (resolved["sweep"].empty()) resolved.erase("sweep");
    }
  }
  return validate(resolved, source, std::move(origins), options.allow_faults, std::move(issues), profile_more);
}

std::string read_spec_text(const std::string& path) {
  try {
    return read_json_input_file(path);
  } catch (const JsonInputError& error) {
    throw SpecError({{path, "", error.message()}});
  }
}

Spec load_spec_file(const std::string& path, const LoadOptions& options) {
  return load_spec_text(read_spec_text(path), path, options);
}

Spec parse_spec(const nlohmann::json& resolved, const std::string& source, bool allow_faults) {
  return validate(to_ordered(resolved), source, {}, allow_faults, {});
}

std::optional<std::string> find_spec(const std::string& name_or_path, const std::vector<std::string>& search_dirs) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::path given(name_or_path);
  if (given.extension() == ".json" && fs::is_regular_file(given, error)) return given.string();
  if (name_or_path.empty() || given.has_parent_path()) return std::nullopt;
  const std::string stem = given.extension() == ".json" ? given.stem().string() : name_or_path;
  for (const std::string& dir : search_dirs) {
    const fs::path candidate = fs::path(dir) / (stem + ".json");
    if (fs::is_regular_file(candidate, error)) return candidate.string();
  }
  return std::nullopt;
}

std::vector<std::string> known_fwd_kernels() {
  std::vector<std::string> names;
  for (const auto kernel : kernels::cuda::kFwdKernels) names.emplace_back(kernels::cuda::fwd_kernel_label(kernel));
  return names;
}

std::vector<std::string> known_bwd_kernels() {
  std::vector<std::string> names;
  for (const auto kernel : kernels::cuda::kBwdKernels) names.emplace_back(kernels::cuda::bwd_kernel_label(kernel));
  return names;
}

std::string kernel_choice_text(const Variant& variant) {
  if (!variant.sets_kernel_choice) return "";
  const auto name = [](const std::string& kernel) { return kernel.empty() ? std::string("autotuned") : kernel; };
  return "fwd=" + name(variant.fwd_kernel) + " bwd=" + name(variant.bwd_kernel) +
         " deterministic=" + (variant.deterministic ? "true" : "false");
}

}  // namespace harness::spec
