#pragma once
// Sweeps: a spec's "sweep" crosses the values of any dims, mask or params field (e.g.
// {"dims.anchors": [128, 256, 512], "dims.layers": [1, 5]}); each combination is a point, and each
// point is run as its own fully resolved spec. Torch-free.

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiments/spec.h"

namespace harness::spec {

//! Every combination of the axes' values, the first axis outermost; each point is an object
//! {path: value}. No axes: one empty point.
std::vector<nlohmann::json> cross_points(const std::vector<SweepAxis>& axes);
//! The points of a spec's sweep ({} alone without a sweep).
std::vector<nlohmann::json> sweep_points(const Spec& spec);
//! The spec at one point: the swept fields set to the point's values, the sweep removed. A point
//! of sweep_points() is the one the loader resolved and validated (Spec::points), so this does not
//! fail for those and costs a copy; any other point is resolved and validated here (SpecError).
Spec spec_at_point(const Spec& spec, const nlohmann::json& point);
//! Every point with its spec, in the order of sweep_points(): the points the loader resolved
//! (Spec::points), or the spec itself as its one point {} without a sweep. No point is validated
//! again.
std::vector<std::pair<nlohmann::json, Spec>> points_with_specs(const Spec& spec);
//! "anchors=128 layers=5" (last path component = value, joined by `separator`); "" for the empty
//! point; a point that is not an object is printed as JSON.
std::string point_label(const nlohmann::json& point, const std::string& separator = " ");
//! Sets `path` ("dims.anchors") in a JSON object, creating objects on the way.
void set_path(nlohmann::json& document, const std::string& path, const nlohmann::json& value);

}  // namespace harness::spec
