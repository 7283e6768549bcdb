#pragma once
// What changed between two JSON documents (env fingerprints, specs): every leaf whose value
// differs, by dotted path, and for fingerprints the toolchain component it belongs to.

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace harness::analysis {

//! One leaf that differs. A missing leaf reads "(absent)".
struct JsonChange {
  std::string component;  //!< "LibTorch", "CUDA runtime/driver", ... ("" for non-fingerprints)
  std::string key;        //!< dotted path: "env_vars.OMP_NUM_THREADS", "python.torch"
  std::string before;
  std::string after;
};

//! Every leaf of a JSON document by dotted path ("env_vars.OMP_NUM_THREADS"), strings as they are,
//! other values as JSON text; objects are walked, arrays are leaves.
std::map<std::string, std::string> json_leaves(const nlohmann::json& value);

//! Leaves of `a` and `b` that differ, in path order; objects are walked, arrays compared whole.
std::vector<JsonChange> diff_json(const nlohmann::json& a, const nlohmann::json& b);

//! The toolchain component a fingerprint key belongs to: LibTorch, CUDA runtime/driver, cuDNN,
//! nvcc, GPU, Python torch, Python triton, Python, env vars, build, host, or other.
std::string env_component(const std::string& key);

//! diff_json of two fingerprints with components filled, grouped by component (the order above).
std::vector<JsonChange> diff_envs(const nlohmann::json& a, const nlohmann::json& b);

//! The components that changed, in that order, each once.
std::vector<std::string> changed_components(const std::vector<JsonChange>& changes);

//! A one-line description of a fingerprint: "LibTorch 2.11.0 · CUDA 12.8 · NVIDIA H200 · py torch 2.9".
std::string env_summary(const nlohmann::json& env);

}  // namespace harness::analysis
