#include "experiments/kinds/trial.h"

#include <algorithm>
#include <stdexcept>
#include <type_traits>

namespace harness::kinds {

nlohmann::json to_json(const TrialResult& result) {
  nlohmann::json json;
  json["status"] = result.status;
  json["error"] = result.error;
  if (result.requested_bytes) json["requested_bytes"] = *result.requested_bytes;
  json["metrics"] = nlohmann::json::array();
  for (const auto& m : result.metrics)
    json["metrics"].push_back({{"name", m.name}, {"value", m.value}, {"unit", m.unit}, {"repeat", m.repeat}});
  // Every call records its decision; identical decisions (warm-up, repeats, layers) are kept
  // once with their count, in the order they first happened.
  json["dispatch"] = nlohmann::json::array();
  for (const auto& d : result.dispatch) {
    const nlohmann::json record = {
        {"op", d.op}, {"impl", d.impl}, {"device", d.device}, {"reason", d.reason}, {"config", d.config}, {"kernel", d.kernel}};
    auto same = std::find_if(json["dispatch"].begin(), json["dispatch"].end(), [&](const nlohmann::json& seen) {
      return seen["op"] == record["op"] && seen["impl"] == record["impl"] && seen["device"] == record["device"] &&
             seen["reason"] == record["reason"] && seen["config"] == record["config"] && seen["kernel"] == record["kernel"];
    });
    if (same != json["dispatch"].end()) {
      (*same)["calls"] = (*same)["calls"].get<int>() + 1;
    } else {
      json["dispatch"].push_back(record);
      json["dispatch"].back()["calls"] = 1;
    }
  }
  json["details"] = result.details;
  json["artifacts"] = nlohmann::json::array();
  for (const auto& a : result.artifacts)
    json["artifacts"].push_back({{"kind", a.kind}, {"sha256", a.sha256}, {"path", a.path}, {"bytes", a.bytes}});
  return json;
}

TrialResult trial_result_from_json(const nlohmann::json& json) {
  TrialResult result;
  result.status = json.at("status").get<std::string>();
  result.error = json.value("error", "");
  if (json.contains("requested_bytes")) result.requested_bytes = json.at("requested_bytes").get<int64_t>();
  for (const auto& m : json.value("metrics", nlohmann::json::array()))
    result.metrics.push_back({m.at("name").get<std::string>(), m.at("value").get<double>(),
                              m.value("unit", ""), m.value("repeat", -1)});
  for (const auto& d : json.value("dispatch", nlohmann::json::array()))
    result.dispatch.push_back({d.value("op", ""), d.value("impl", ""), d.value("device", ""),
                               d.value("reason", ""), d.value("config", ""), d.value("kernel", "")});
  result.details = json.value("details", nlohmann::json::object());
  for (const auto& a : json.value("artifacts", nlohmann::json::array()))
    result.artifacts.push_back({a.value("kind", ""), a.value("sha256", ""), a.value("path", ""),
                                a.value("bytes", int64_t{0})});
  return result;
}

namespace {

// The request's fields, each read and written by one entry: JSON name and member (Request: the
// request, const when it is written out).
template <typename Visit, typename Request>
void visit_fields(Visit&& visit, Request& request) {
  visit("spec_file", request.spec_file);
  visit("variant", request.variant);
  visit("device", request.device);
  visit("devices", request.devices);
  visit("result_path", request.result_path);
  visit("memory_limit_bytes", request.memory_limit_bytes);
  visit("allow_faults", request.allow_faults);
  visit("python", request.python);
  visit("spec_dir", request.spec_dir);
  visit("artifact_dir", request.artifact_dir);
  visit("keep_capsules", request.keep_capsules);
  visit("memory_snapshot", request.memory_snapshot);
  visit("trace", request.trace);
  visit("replay_capsule", request.replay_capsule);
  visit("judge_outputs", request.judge_outputs);
  visit("timeout_s", request.timeout_s);
}

template <typename T>
bool has_type(const nlohmann::json& value) {
  if constexpr (std::is_same_v<T, std::string>) return value.is_string();
  if constexpr (std::is_same_v<T, bool>) return value.is_boolean();
  if constexpr (std::is_same_v<T, int64_t>) return value.is_number_integer();
  if constexpr (std::is_same_v<T, double>) return value.is_number();
  if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    if (!value.is_array()) return false;
    for (const auto& element : value)
      if (!element.is_string()) return false;
    return true;
  }
  return false;
}

template <typename T>
const char* type_text() {
  if constexpr (std::is_same_v<T, std::string>) return "a string";
  if constexpr (std::is_same_v<T, bool>) return "true or false";
  if constexpr (std::is_same_v<T, int64_t>) return "an integer";
  if constexpr (std::is_same_v<T, double>) return "a number";
  return "an array of strings";
}

}  // namespace

nlohmann::json to_json(const TrialRequest& request) {
  nlohmann::json json = nlohmann::json::object();
  visit_fields([&](const char* name, const auto& field) { json[name] = field; }, request);
  return json;
}

TrialRequest trial_request_from_json(const nlohmann::json& json) {
  if (!json.is_object()) throw std::invalid_argument("a trial request is a JSON object, got " + std::string(json.type_name()));
  TrialRequest request;
  size_t known = 0;
  visit_fields(
      [&](const char* name, auto& field) {
        using T = std::decay_t<decltype(field)>;
        const auto found = json.find(name);
        if (found == json.end()) return;
        ++known;
        if (!has_type<T>(*found))
          throw std::invalid_argument(std::string("trial request field \"") + name + "\": expected " + type_text<T>() +
                                      ", got " + found->dump().substr(0, 80));
        field = found->get<T>();
      },
      request);
  if (known != json.size()) {
    const nlohmann::json defaults = to_json(TrialRequest{});
    for (const auto& [key, value] : json.items())
      if (!defaults.contains(key)) throw std::invalid_argument("trial request field \"" + key + "\" is not one a trial has");
  }
  return request;
}

}  // namespace harness::kinds
