#include "experiments/sweep.h"

namespace harness::spec {

std::vector<nlohmann::json> cross_points(const std::vector<SweepAxis>& axes) {
  std::vector<nlohmann::json> points = {nlohmann::json::object()};
  for (const SweepAxis& axis : axes) {
    std::vector<nlohmann::json> next;
    next.reserve(points.size() * axis.values.size());
    for (const nlohmann::json& point : points) {
      for (const nlohmann::json& value : axis.values) {
        nlohmann::json extended = point;
        extended[axis.path] = value;
        next.push_back(std::move(extended));
      }
    }
    points = std::move(next);
  }
  return points;
}

std::vector<nlohmann::json> sweep_points(const Spec& spec) { return cross_points(spec.sweep); }

void set_path(nlohmann::json& document, const std::string& path, const nlohmann::json& value) {
  nlohmann::json* target = &document;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!target->is_object()) *target = nlohmann::json::object();
    target = &(*target)[part];
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  *target = value;
}

Spec spec_at_point(const Spec& spec, const nlohmann::json& point) {
  // A point of the sweep was resolved and validated when the spec loaded; a spec without a sweep
  // is its own only point.
  for (const ResolvedPoint& resolved : spec.points) {
    if (resolved.point == point) {
      Spec at_point = *resolved.spec;
      at_point.source = spec.source;
      return at_point;
    }
  }
  if (spec.sweep.empty() && point.is_object() && point.empty()) return spec;
  nlohmann::json resolved = spec.resolved;
  resolved.erase("sweep");
  resolved.erase("sweep_order");
  for (const auto& [path, value] : point.items()) set_path(resolved, path, value);
  Spec at_point = parse_spec(resolved, spec.source, true);
  at_point.source = spec.source;
  return at_point;
}

std::vector<std::pair<nlohmann::json, Spec>> points_with_specs(const Spec& spec) {
  std::vector<std::pair<nlohmann::json, Spec>> points;
  if (spec.points.empty()) {
    // A spec loaded without a sweep, or one whose points were not kept: resolved point by point.
    for (const nlohmann::json& point : sweep_points(spec)) points.emplace_back(point, spec_at_point(spec, point));
    return points;
  }
  points.reserve(spec.points.size());
  for (const ResolvedPoint& resolved : spec.points) {
    points.emplace_back(resolved.point, *resolved.spec);
    points.back().second.source = spec.source;
  }
  return points;
}

std::string point_label(const nlohmann::json& point, const std::string& separator) {
  if (!point.is_object()) return point.dump();
  std::string label;
  for (const auto& [path, value] : point.items()) {
    const auto dot = path.rfind('.');
    label += (label.empty() ? "" : separator) + (dot == std::string::npos ? path : path.substr(dot + 1)) + "=" +
             (value.is_string() ? value.get<std::string>() : value.dump());
  }
  return label;
}

}  // namespace harness::spec
