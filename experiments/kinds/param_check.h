#pragma once
// Checks of a kind's "params" object shared by the kinds' spec validators (the *_info.cpp files):
// header-only and nlohmann-only, because those files go into a library that must not depend on
// anything else. Each check appends (path, message) problems, the message naming what was expected
// and what was found.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiments/kinds/registry.h"

namespace harness::kinds::param_check {

//! What a JSON value is, for messages: `the string "four"`, `-3`, `an array`, ...
inline std::string describe(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::boolean: return value.get<bool>() ? "true" : "false";
    case nlohmann::json::value_t::string: return "the string " + value.dump();
    case nlohmann::json::value_t::array: return "an array of " + std::to_string(value.size());
    case nlohmann::json::value_t::object: return "an object";
    default: return value.dump();
  }
}

//! Comma-separated names.
inline std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

//! `params` must be an object whose keys are all in `known`. False when it is not an object.
inline bool check_object(const nlohmann::json& params, const std::string& kind, const std::vector<std::string>& known,
                         ParamIssues& issues) {
  if (!params.is_object()) {
    issues.emplace_back("params", "expected an object with the parameters of kind " + kind + ", got " + describe(params));
    return false;
  }
  for (const auto& [key, value] : params.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      issues.emplace_back("params." + key, "unknown parameter of kind " + kind + "; known: " + join(known));
    }
  }
  return true;
}

//! params[name], when present, must be an integer in [low, high].
inline void check_integer(const nlohmann::json& params, const std::string& name, int64_t low, int64_t high,
                          ParamIssues& issues) {
  if (!params.contains(name)) return;
  const nlohmann::json& value = params.at(name);
  const bool in_range = value.is_number_integer() && value.get<int64_t>() >= low && value.get<int64_t>() <= high &&
                        !(value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(high));
  if (!in_range) {
    issues.emplace_back("params." + name, "expected an integer from " + std::to_string(low) + " to " + std::to_string(high) +
                                              ", got " + describe(value));
  }
}

//! params[name], when present, must be a number in [low, high].
inline void check_number(const nlohmann::json& params, const std::string& name, double low, double high,
                         const std::string& what, ParamIssues& issues) {
  if (!params.contains(name)) return;
  const nlohmann::json& value = params.at(name);
  if (!value.is_number() || value.get<double>() < low || value.get<double>() > high) {
    issues.emplace_back("params." + name, "expected " + what + ", got " + describe(value));
  }
}

}  // namespace harness::kinds::param_check
