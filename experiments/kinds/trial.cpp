#include "experiments/kinds/trial.h"

#include <algorithm>

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

}  // namespace harness::kinds
