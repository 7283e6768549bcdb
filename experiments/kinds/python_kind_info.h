#pragma once
// The "params" of kind python, checked and read in one place: the spec validator checks them
// (python_kind().check_params), the runner reads them (parse_python_params). Torch-free and
// LibTorch-free; only nlohmann_json.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace harness::kinds {

//! What one variant adds to the script's command line and environment.
struct PythonVariantParams {
  std::vector<std::string> args;              //!< appended after params.args
  std::map<std::string, std::string> env;     //!< over params.env
};

//! The checked "params" of a python spec.
struct PythonParams {
  std::string script;                         //!< as written; relative paths resolve against the spec's folder
  std::vector<std::string> args;              //!< after `--device D`, for every variant
  std::map<std::string, std::string> env;     //!< added to the script's environment
  std::optional<double> timeout_s;            //!< the script's own limit (the spec's timeout_s caps it)
  std::map<std::string, std::string> metrics; //!< declared metric name -> unit: what the verdict may read
  std::map<std::string, PythonVariantParams> variants;  //!< by variant name; a variant absent here adds nothing
};

//! Reads checked params; throws std::invalid_argument listing every problem check_params finds.
PythonParams parse_python_params(const nlohmann::json& params);

//! The metric names a python spec declares in params.metrics, which its verdict may read (the
//! kind cannot list them statically: they are the script's). Only the well-formed entries.
std::vector<std::string> python_verdict_metrics(const nlohmann::json& params);

}  // namespace harness::kinds
