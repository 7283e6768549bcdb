#include "experiments/scaling.h"

#include <cmath>
#include <stdexcept>

namespace harness::spec {

double model_regressor(const std::string& model, const Spec& point_spec) {
  const auto& d = point_spec.dims;
  const bool stacked = model.rfind("layers_", 0) == 0;
  const std::string base = stacked ? model.substr(7) : model;
  const double heads = static_cast<double>(d.batch) * static_cast<double>(d.heads) *
                       (stacked ? static_cast<double>(point_spec.layers) : 1.0);
  if (base == "q_kv") return heads * static_cast<double>(d.q_len()) * static_cast<double>(d.kv_len());
  if (base == "q_plus_kv") return heads * static_cast<double>(d.q_len() + d.kv_len()) * static_cast<double>(d.head_dim);
  throw std::invalid_argument("unknown scaling model \"" + model + "\"");
}

Fit fit_line(const std::vector<double>& x, const std::vector<double>& y) {
  Fit fit;
  fit.points = static_cast<int>(x.size());
  if (x.size() < 2 || x.size() != y.size()) return fit;
  double mean_x = 0.0, mean_y = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    mean_x += x[i];
    mean_y += y[i];
  }
  mean_x /= static_cast<double>(x.size());
  mean_y /= static_cast<double>(y.size());
  double sxx = 0.0, sxy = 0.0, syy = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxx += (x[i] - mean_x) * (x[i] - mean_x);
    sxy += (x[i] - mean_x) * (y[i] - mean_y);
    syy += (y[i] - mean_y) * (y[i] - mean_y);
  }
  fit.slope = sxx > 0.0 ? sxy / sxx : 0.0;
  fit.intercept = mean_y - fit.slope * mean_x;
  double residual = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double error = y[i] - (fit.slope * x[i] + fit.intercept);
    residual += error * error;
  }
  fit.r2 = syy > 0.0 ? 1.0 - residual / syy : (residual == 0.0 ? 1.0 : 0.0);
  return fit;
}

std::map<std::string, VariantScaling> fit_scaling(const Scaling& scaling, const std::vector<ScalingSample>& samples) {
  std::map<std::string, std::vector<const ScalingSample*>> by_variant;
  for (const ScalingSample& sample : samples) by_variant[sample.variant].push_back(&sample);
  std::map<std::string, VariantScaling> out;
  for (const auto& [variant, list] : by_variant) {
    VariantScaling result;
    double best = -INFINITY;
    for (const std::string& model : scaling.models) {
      std::vector<double> x, y;
      for (const ScalingSample* sample : list) {
        x.push_back(sample->regressors.at(model));
        y.push_back(sample->value);
      }
      Fit fit = fit_line(x, y);
      fit.model = model;
      if (fit.points >= 2 && fit.r2 > best) {
        best = fit.r2;
        result.growth = model;
      }
      result.fits.push_back(fit);
    }
    out[variant] = std::move(result);
  }
  return out;
}

}  // namespace harness::spec
