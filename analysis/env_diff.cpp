#include "analysis/env_diff.h"

#include <algorithm>
#include <map>

namespace harness::analysis {
namespace {

const char* const kAbsent = "(absent)";

std::string leaf_text(const nlohmann::json& value) {
  return value.is_string() ? value.get<std::string>() : value.dump();
}

void flatten(const nlohmann::json& value, const std::string& prefix, std::map<std::string, std::string>& out) {
  // An empty object has no leaves: {"env_vars": {}} and {"env_vars": {"X": "1"}} differ in X only.
  if (value.is_object()) {
    for (const auto& [key, child] : value.items()) flatten(child, prefix.empty() ? key : prefix + "." + key, out);
    return;
  }
  out[prefix.empty() ? "(root)" : prefix] = leaf_text(value);
}

bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

// First match wins; a prefix ending in '.' or '_' matches a family of keys.
struct ComponentRule {
  const char* prefix;
  const char* component;
};
const ComponentRule kComponentRules[] = {
    {"python.torch", "Python torch"},
    {"python.triton", "Python triton"},
    {"python", "Python"},
    {"libtorch", "LibTorch"},
    {"torch", "LibTorch"},
    {"cuda_runtime", "CUDA runtime/driver"},
    {"cuda_driver", "CUDA runtime/driver"},
    {"cudnn", "cuDNN"},
    {"nvcc", "nvcc"},
    {"cuda_archs", "nvcc"},
    {"gpu", "GPU"},
    {"device", "GPU"},
    {"env_vars", "env vars"},
    {"host_compiler", "build"},
    {"build", "build"},
    {"sanitize", "build"},
    {"harness_version", "build"},
    {"git_commit", "build"},
    {"cxx_flags", "build"},
    {"os", "host"},
    {"kernel", "host"},
    {"arch", "host"},
    {"cpu", "host"},
    {"hostname", "host"},
};
const std::vector<std::string> kComponentOrder = {"LibTorch", "CUDA runtime/driver", "cuDNN", "nvcc", "GPU",
                                                  "Python torch", "Python triton", "Python", "env vars", "build",
                                                  "host", "other"};

int component_rank(const std::string& component) {
  return static_cast<int>(std::find(kComponentOrder.begin(), kComponentOrder.end(), component) -
                          kComponentOrder.begin());
}

std::string string_at(const nlohmann::json& env, const std::string& key) {
  const auto found = env.find(key);
  if (found == env.end() || found->is_null()) return "";
  return leaf_text(*found);
}

}  // namespace

std::map<std::string, std::string> json_leaves(const nlohmann::json& value) {
  std::map<std::string, std::string> out;
  flatten(value, "", out);
  return out;
}

std::vector<JsonChange> diff_json(const nlohmann::json& a, const nlohmann::json& b) {
  std::map<std::string, std::string> left, right;
  flatten(a, "", left);
  flatten(b, "", right);
  std::vector<JsonChange> changes;
  for (const auto& [key, value] : left) {
    const auto other = right.find(key);
    if (other == right.end()) {
      changes.push_back({"", key, value, kAbsent});
    } else if (other->second != value) {
      changes.push_back({"", key, value, other->second});
    }
  }
  for (const auto& [key, value] : right)
    if (!left.count(key)) changes.push_back({"", key, kAbsent, value});
  std::sort(changes.begin(), changes.end(), [](const auto& x, const auto& y) { return x.key < y.key; });
  return changes;
}

std::string env_component(const std::string& key) {
  for (const auto& rule : kComponentRules) {
    const std::string prefix = rule.prefix;
    if (key == prefix || starts_with(key, prefix + ".") || starts_with(key, prefix + "_")) return rule.component;
  }
  return "other";
}

std::vector<JsonChange> diff_envs(const nlohmann::json& a, const nlohmann::json& b) {
  auto changes = diff_json(a, b);
  for (auto& change : changes) change.component = env_component(change.key);
  std::stable_sort(changes.begin(), changes.end(), [](const auto& x, const auto& y) {
    return component_rank(x.component) < component_rank(y.component);
  });
  return changes;
}

std::vector<std::string> changed_components(const std::vector<JsonChange>& changes) {
  std::vector<std::string> components;
  for (const auto& change : changes)
    if (std::find(components.begin(), components.end(), change.component) == components.end())
      components.push_back(change.component);
  return components;
}

std::string env_summary(const nlohmann::json& env) {
  if (!env.is_object() || env.empty()) return "(no env recorded)";
  std::vector<std::string> parts;
  if (const auto torch = string_at(env, "libtorch"); !torch.empty()) parts.push_back("LibTorch " + torch);
  if (const auto cuda = string_at(env, "cuda_runtime"); !cuda.empty() && cuda != "none") {
    std::string part = "CUDA " + cuda;
    if (const auto driver = string_at(env, "cuda_driver"); !driver.empty() && driver != "none")
      part += " (driver " + driver + ")";
    parts.push_back(part);
  }
  if (const auto gpu = string_at(env, "gpu_name"); !gpu.empty()) parts.push_back(gpu);
  if (env.contains("python") && env["python"].is_object()) {
    const auto& python = env["python"];
    std::string part = "Python";
    if (const auto version = string_at(python, "version"); !version.empty()) part += " " + version;
    if (const auto torch = string_at(python, "torch"); !torch.empty()) part += ", torch " + torch;
    if (const auto triton = string_at(python, "triton"); !triton.empty()) part += ", triton " + triton;
    parts.push_back(part);
  }
  if (const auto commit = string_at(env, "git_commit"); !commit.empty()) parts.push_back("commit " + commit.substr(0, 10));
  std::string text;
  for (const auto& part : parts) text += (text.empty() ? "" : " · ") + part;
  return text.empty() ? "(fingerprint without toolchain fields)" : text;
}

}  // namespace harness::analysis
