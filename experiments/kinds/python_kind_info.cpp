// What the spec validator knows of kind python: a user's script, run with the interpreter of
// `harness run --python` in the trial child, that prints one JSON object of metrics.
#include <algorithm>
#include <stdexcept>

#include "experiments/kinds/python_kind_info.h"
#include "experiments/kinds/registry.h"

namespace harness::kinds {
namespace {

std::string describe(const nlohmann::json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return std::string(value.type_name()) + " " + text;
}

std::string child(const std::string& path, const std::string& key) { return path + "." + key; }

bool is_metric_name(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

bool is_env_name(const std::string& name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

// The harness sets these for the script: the device it chose and the memory cap of --memory-limit.
const std::vector<std::string>& reserved_env() {
  static const std::vector<std::string> names = {"CUDA_VISIBLE_DEVICES", "HARNESS_MEMORY_LIMIT_BYTES"};
  return names;
}

// Keys of the script's JSON that say how it ended rather than carry a metric (python_kind.h).
const std::vector<std::string>& protocol_keys() {
  static const std::vector<std::string> keys = {"skipped", "oom", "error", "requested_bytes", "units", "status"};
  return keys;
}

bool contains(const std::vector<std::string>& list, const std::string& item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

void check_unknown(const nlohmann::json& object, const std::string& path, const std::vector<std::string>& known,
                   ParamIssues& issues) {
  for (const auto& [key, value] : object.items()) {
    if (contains(known, key)) continue;
    std::string list;
    for (const auto& name : known) list += (list.empty() ? "" : ", ") + name;
    issues.emplace_back(child(path, key), "unknown field; known: " + list);
  }
}

void read_args(const nlohmann::json& object, const std::string& path, std::vector<std::string>& out,
               ParamIssues& issues) {
  const auto found = object.find("args");
  if (found == object.end()) return;
  if (!found->is_array()) {
    issues.emplace_back(child(path, "args"), "expected an array of strings (argv, no shell), got " + describe(*found));
    return;
  }
  for (size_t i = 0; i < found->size(); ++i) {
    const auto& arg = (*found)[i];
    if (arg.is_string()) {
      out.push_back(arg.get<std::string>());
    } else {
      issues.emplace_back(child(path, "args") + "." + std::to_string(i),
                          "expected a string (numbers too are written as strings: \"128\"), got " + describe(arg));
    }
  }
}

void read_env(const nlohmann::json& object, const std::string& path, std::map<std::string, std::string>& out,
              ParamIssues& issues) {
  const auto found = object.find("env");
  if (found == object.end()) return;
  if (!found->is_object()) {
    issues.emplace_back(child(path, "env"), "expected an object of NAME: \"value\", got " + describe(*found));
    return;
  }
  for (const auto& [name, value] : found->items()) {
    const std::string p = child(child(path, "env"), name);
    if (!is_env_name(name)) {
      issues.emplace_back(p, "not an environment variable name (letters, digits, _; not starting with a digit)");
    } else if (contains(reserved_env(), name)) {
      issues.emplace_back(p, "set by the harness for every script (the chosen device, --memory-limit); not settable");
    } else if (!value.is_string()) {
      issues.emplace_back(p, "expected a string, got " + describe(value));
    } else {
      out[name] = value.get<std::string>();
    }
  }
}

void read_metrics(const nlohmann::json& params, std::map<std::string, std::string>& out, ParamIssues& issues) {
  const auto found = params.find("metrics");
  if (found == params.end()) return;
  if (!found->is_object()) {
    issues.emplace_back("params.metrics",
                        "expected an object of metric name: unit (e.g. {\"bwd_peak_bytes\": \"bytes\"}), got " +
                            describe(*found));
    return;
  }
  for (const auto& [name, unit] : found->items()) {
    const std::string p = child("params.metrics", name);
    if (!is_metric_name(name)) {
      issues.emplace_back(p, "metric names must match [a-z0-9_]+ (verdict rules read variant.metric)");
      continue;
    }
    if (contains(protocol_keys(), name)) {
      issues.emplace_back(p, "\"" + name + "\" is a key of the script protocol, not a metric");
      continue;
    }
    if (!unit.is_string()) {
      issues.emplace_back(p, "expected the unit as a string (\"bytes\", \"ms\", \"\" or any other), got " + describe(unit));
      continue;
    }
    // Verdict rules take the dimension of a quantity from the metric's name, so the unit must agree.
    const std::string text = unit.get<std::string>();
    const bool bytes_name = name.ends_with("_bytes"), ms_name = name.ends_with("_ms");
    if (bytes_name && text != "bytes") {
      issues.emplace_back(p, "a metric ending in _bytes is a size: its unit must be \"bytes\", got \"" + text + "\"");
    } else if (ms_name && text != "ms") {
      issues.emplace_back(p, "a metric ending in _ms is a duration: its unit must be \"ms\", got \"" + text + "\"");
    } else if (!bytes_name && text == "bytes") {
      issues.emplace_back(p, "a size must be named ..._bytes (verdict rules read the dimension from the name)");
    } else if (!ms_name && text == "ms") {
      issues.emplace_back(p, "a duration must be named ..._ms (verdict rules read the dimension from the name)");
    } else {
      out[name] = text;
    }
  }
}

PythonParams read_params(const nlohmann::json& params, ParamIssues& issues) {
  PythonParams out;
  if (!params.is_object()) {
    issues.emplace_back("params", "expected an object with at least \"script\", got " + describe(params));
    return out;
  }
  check_unknown(params, "params", {"script", "args", "env", "timeout_s", "metrics", "variants"}, issues);
  const auto script = params.find("script");
  if (script == params.end()) {
    issues.emplace_back("params.script", "required: the script to run (relative paths resolve against the spec's folder)");
  } else if (!script->is_string() || script->get<std::string>().empty()) {
    issues.emplace_back("params.script", "expected a non-empty path, got " + describe(*script));
  } else {
    out.script = script->get<std::string>();
  }
  read_args(params, "params", out.args, issues);
  read_env(params, "params", out.env, issues);
  if (const auto timeout = params.find("timeout_s"); timeout != params.end()) {
    if (!timeout->is_number() || timeout->get<double>() <= 0) {
      issues.emplace_back("params.timeout_s", "expected a positive number of seconds, got " + describe(*timeout));
    } else {
      out.timeout_s = timeout->get<double>();
    }
  }
  read_metrics(params, out.metrics, issues);
  if (const auto variants = params.find("variants"); variants != params.end()) {
    if (!variants->is_object()) {
      issues.emplace_back("params.variants",
                          "expected an object of variant name: {\"args\": [...], \"env\": {...}}, got " +
                              describe(*variants));
    } else {
      for (const auto& [name, body] : variants->items()) {
        const std::string p = child("params.variants", name);
        if (!body.is_object()) {
          issues.emplace_back(p, "expected an object with \"args\" and/or \"env\", got " + describe(body));
          continue;
        }
        check_unknown(body, p, {"args", "env"}, issues);
        PythonVariantParams variant;
        read_args(body, p, variant.args, issues);
        read_env(body, p, variant.env, issues);
        out.variants[name] = std::move(variant);
      }
    }
  }
  return out;
}

}  // namespace

PythonParams parse_python_params(const nlohmann::json& params) {
  ParamIssues issues;
  PythonParams out = read_params(params, issues);
  if (!issues.empty()) {
    std::string message = "invalid python params:";
    for (const auto& [path, text] : issues) message += "\n  " + path + ": " + text;
    throw std::invalid_argument(message);
  }
  return out;
}

std::vector<std::string> python_verdict_metrics(const nlohmann::json& params) {
  ParamIssues issues;
  const PythonParams parsed = read_params(params, issues);
  std::vector<std::string> names;
  for (const auto& [name, unit] : parsed.metrics) names.push_back(name);
  return names;
}

KindInfo python_kind() {
  KindInfo kind;
  kind.name = "python";
  kind.summary = "a Python script run by the chosen interpreter on the trial's device; records the JSON it prints";
  // Every variant runs the same script; what tells variants apart is params.variants.NAME.args.
  kind.impls = {"script"};
  // The script decides what it measures; params.metrics declares what the verdict may read.
  kind.measures = {};
  kind.default_measures = {};
  kind.verdict_metrics = {};
  kind.check_params = [](const nlohmann::json& params, ParamIssues& issues) { read_params(params, issues); };
  return kind;
}

}  // namespace harness::kinds
