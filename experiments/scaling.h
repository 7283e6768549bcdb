#pragma once
// Scaling fits over a sweep: how a measured metric (e.g. the backward peak) grows with the sizes
// the sweep changes. Each model is a regressor computed from a point's dims; a least-squares line
// y = slope·x + intercept is fitted per variant and model, and the model with the best R² names
// the growth. Torch-free.

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiments/spec.h"

namespace harness::spec {

//! The regressor of a model at a point: q_kv = heads·Q·KV (one layer's materialized score matrix),
//! q_plus_kv = heads·(Q+KV)·head_dim (tensors linear in the sequence lengths); layers_q_kv and
//! layers_q_plus_kv the same times layers (tensors every layer of the stack keeps).
double model_regressor(const std::string& model, const Spec& point_spec);

//! One measured value of a variant at a point, with the regressors of that point.
struct ScalingSample {
  std::string variant;
  std::map<std::string, double> regressors;  //!< model -> x
  double value = 0.0;
};

//! A least-squares line and how well it explains the values.
struct Fit {
  std::string model;
  double slope = 0.0;
  double intercept = 0.0;
  double r2 = 0.0;  //!< 1 - SS_res / SS_tot; 1 for a perfect fit
  int points = 0;
};

//! The fits of one variant; growth is the model with the best R² ("" with fewer than 2 points).
struct VariantScaling {
  std::vector<Fit> fits;
  std::string growth;
};

//! Fits every model for every variant of the samples.
std::map<std::string, VariantScaling> fit_scaling(const Scaling& scaling, const std::vector<ScalingSample>& samples);
//! Least squares of y on x; r2 = 1 when every y is equal and predicted exactly.
Fit fit_line(const std::vector<double>& x, const std::vector<double>& y);

}  // namespace harness::spec
