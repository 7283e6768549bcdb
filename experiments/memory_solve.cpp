#include "experiments/memory_solve.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdlib>
#include <regex>
#include <stdexcept>

#include "core/byte_size.h"
#include "experiments/sweep.h"

namespace harness::memory_model {
namespace {

// The dims whose every tensor size is monotone in them (bytes never shrink as they grow), so
// the values that hit an interval are one contiguous range per tensor kind.
int64_t* dim_field(kernels::AttentionGeometry& dims, const std::string& path) {
  if (path == "dims.context") return &dims.context;
  if (path == "dims.anchors") return &dims.anchors;
  if (path == "dims.heads") return &dims.heads;
  if (path == "dims.batch") return &dims.batch;
  return nullptr;
}

std::string full_dim_path(const std::string& dim) {
  const std::string path = dim.rfind("dims.", 0) == 0 ? dim : "dims." + dim;
  kernels::AttentionGeometry probe;
  if (!dim_field(probe, path))
    throw std::invalid_argument("cannot solve for '" + dim + "': solvable dims are dims.context, dims.anchors, dims.heads, dims.batch");
  return path;
}

// Beyond this a dim is not a plausible answer (a million tokens of context), and sums of tensor
// sizes stay far from int64 overflow (2^20 × the other dims of the real case × 5 layers < 2^60).
constexpr int64_t kMaxValue = int64_t{1} << 20;

// Request of each tensor kind (same shape+dtype = one kind) at one value of the dim.
struct KindAt {
  std::string tensor;
  std::vector<std::string> others;
  std::vector<std::string> variants;
  Allocation allocation;
  int64_t request = 0;
};

class Evaluator {
 public:
  Evaluator(const spec::Spec& spec, std::string dim, std::string device_kind, const ModelOptions& options)
      : spec_(spec), dim_(std::move(dim)), device_kind_(std::move(device_kind)), options_(options) {}

  int64_t request_of(int64_t bytes) const { return device_kind_ == "cuda" ? cuda_request_bytes(bytes) : bytes; }

  // The allocation named `tensor` of `variant` at `value` (nullopt when the model rejects the value).
  std::optional<Allocation> allocation_at(const std::string& variant, const std::string& tensor, int64_t value) const {
    spec::Spec at = spec_;
    *dim_field(at.dims, dim_) = value;
    try {
      const Prediction prediction = predict(at, variant, device_kind_, options_);
      for (const Allocation& a : prediction.allocations)
        if (a.tensor == tensor) return a;
    } catch (const std::exception&) {
    }
    return std::nullopt;
  }

  // Every tensor kind of every variant at `value`, grouped by shape and dtype.
  std::vector<KindAt> kinds_at(int64_t value) const {
    spec::Spec at = spec_;
    *dim_field(at.dims, dim_) = value;
    std::vector<KindAt> kinds;
    for (const spec::Variant& variant : spec_.variants) {
      Prediction prediction;
      try {
        prediction = predict(at, variant.name, device_kind_, options_);
      } catch (const std::exception&) {
        continue;
      }
      for (const Allocation& a : prediction.allocations) {
        auto found = std::find_if(kinds.begin(), kinds.end(), [&](const KindAt& k) {
          return k.allocation.shape == a.shape && k.allocation.dtype == a.dtype;
        });
        if (found == kinds.end()) {
          kinds.push_back({a.tensor, {}, {variant.name}, a, request_of(a.bytes)});
          continue;
        }
        if (std::find(found->variants.begin(), found->variants.end(), variant.name) == found->variants.end())
          found->variants.push_back(variant.name);
        if (a.tensor != found->tensor && std::find(found->others.begin(), found->others.end(), a.tensor) == found->others.end())
          found->others.push_back(a.tensor);
      }
    }
    return kinds;
  }

 private:
  const spec::Spec& spec_;
  std::string dim_;
  std::string device_kind_;
  ModelOptions options_;
};

// Smallest value in [lo, hi] whose request is >= target, given request(value) is non-decreasing;
// hi + 1 when there is none. Values the model rejects count as "below" (they are the small ones:
// e.g. a context shorter than the anchors).
template <typename Request>
int64_t first_at_least(int64_t lo, int64_t hi, int64_t target, const Request& request) {
  while (lo <= hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    const auto r = request(mid);
    if (r && *r >= target) hi = mid - 1;
    else lo = mid + 1;
  }
  return lo;
}

std::string join(const std::vector<std::string>& parts) {
  std::string text;
  for (const auto& part : parts) text += (text.empty() ? "" : ",") + part;
  return text;
}

}  // namespace

const std::vector<std::string>& solvable_dims() {
  static const std::vector<std::string> dims = {"dims.context", "dims.anchors", "dims.heads", "dims.batch"};
  return dims;
}

RequestInterval request_interval(const std::string& message_text, int64_t requested_bytes) {
  RequestInterval interval{requested_bytes, requested_bytes, requested_bytes, ""};
  static const std::regex sized(
      R"((?:tried to allocate|requested(?:_bytes)?\s*[=:]?)\s*([0-9]+)(?:\.([0-9]+))?\s*(TiB|GiB|MiB|KiB|TB|GB|MB|KB|bytes|byte|B)?)",
      std::regex::icase);
  static const std::regex bare(R"(^\s*([0-9]+)(?:\.([0-9]+))?\s*(TiB|GiB|MiB|KiB|TB|GB|MB|KB|bytes|byte|B)?\s*$)",
                               std::regex::icase);
  std::smatch match;
  if (!std::regex_search(message_text, match, sized) && !std::regex_match(message_text, match, bare)) return interval;
  const std::string unit = match[3].str();
  const auto scale = unit.empty() ? std::optional<double>(1.0) : byte_unit_scale(unit);
  if (!scale) return interval;
  const double unit_bytes = *scale;
  const std::string fraction = match[2].str();
  const double value = std::stod(match[1].str() + (fraction.empty() ? "" : "." + fraction));
  // The message rounds to its last printed digit: half of that digit either side.
  const double half = 0.5 * std::pow(10.0, -static_cast<double>(fraction.size())) * unit_bytes;
  if (half < 1.0) return interval;  // printed in bytes: exact
  interval.low = static_cast<int64_t>(std::ceil(value * unit_bytes - half));
  interval.high = static_cast<int64_t>(std::ceil(value * unit_bytes + half)) - 1;  // half-open above
  interval.nominal = static_cast<int64_t>(std::llround(value * unit_bytes));
  interval.printed = match[1].str() + (fraction.empty() ? "" : "." + fraction) + " " + match[3].str();
  return interval;
}

std::vector<DimSolve> solve(const std::vector<std::pair<nlohmann::json, spec::Spec>>& point_specs,
                            const std::vector<std::string>& dims, const std::vector<std::string>& pinned,
                            const RequestInterval& interval, const std::string& device_kind, const ModelOptions& options) {
  if (interval.low <= 0 || interval.high < interval.low) throw std::invalid_argument("solve: the byte interval is empty");
  std::vector<DimSolve> result;
  for (const std::string& requested_dim : dims) {
    DimSolve dim_solve;
    dim_solve.dim = full_dim_path(requested_dim);
    const std::string& dim = dim_solve.dim;
    if (std::find(pinned.begin(), pinned.end(), dim) != pinned.end()) {
      dim_solve.skipped = "pinned by --set";
      result.push_back(std::move(dim_solve));
      continue;
    }
    for (const auto& [point, point_spec] : point_specs) {
      if (point_spec.kind != "attention_step") continue;
      const Evaluator evaluator(point_spec, dim, device_kind, options);
      spec::Spec probe = point_spec;
      const int64_t spec_value = *dim_field(probe.dims, dim);
      // Tensor kinds as the spec has them; each is followed along the dim by its (variant, name).
      // The model takes heads only in multiples of kv_heads (GQA groups); the search runs over
      // those multiples, so that every value it probes is one the model answers for.
      const int64_t step = dim == "dims.heads" ? std::max<int64_t>(1, point_spec.dims.kv_heads) : 1;
      const int64_t max_steps = kMaxValue / step;
      for (const KindAt& kind : evaluator.kinds_at(spec_value)) {
        const std::string& variant = kind.variants.front();
        // Both in multiples of `step`: the allocator's request and the tensor's own bytes.
        auto request = [&](int64_t multiple) -> std::optional<int64_t> {
          const auto a = evaluator.allocation_at(variant, kind.tensor, multiple * step);
          if (!a) return std::nullopt;
          return evaluator.request_of(a->bytes);
        };
        auto tensor_bytes = [&](int64_t multiple) -> std::optional<int64_t> {
          const auto a = evaluator.allocation_at(variant, kind.tensor, multiple * step);
          if (!a) return std::nullopt;
          return a->bytes;
        };
        const auto at_one = request(1), at_max = request(max_steps);
        if (at_one && at_max && *at_one == *at_max) continue;  // does not depend on this dim
        const int64_t first_step = first_at_least(1, max_steps, interval.low, request);
        const int64_t past_step = first_at_least(first_step, max_steps, interval.high + 1, request);
        if (first_step > max_steps || past_step == first_step) continue;
        const int64_t last_step = past_step - 1;

        // The value whose tensor is nearest the printed size (the allocator's rounding makes a
        // plateau of equal requests; the tensor itself tells them apart); a valid spec when one
        // exists nearby (anchors fit the context, ...).
        int64_t best_step = std::min(first_at_least(first_step, last_step, interval.nominal, tensor_bytes), last_step);
        if (best_step > first_step) {
          const auto below = tensor_bytes(best_step - 1), here = tensor_bytes(best_step);
          if (below && here && std::llabs(interval.nominal - *below) < std::llabs(*here - interval.nominal)) --best_step;
        }
        const int64_t first = first_step * step, last = last_step * step;
        int64_t best = best_step * step;
        Solution solution;
        solution.dim = dim;
        solution.point = point;
        solution.spec_value = spec_value;
        solution.first = first;
        solution.last = last;
        std::string problem;
        bool valid = false;
        for (int64_t distance = 0; distance <= last - first && distance < 4096 * step && !valid; distance += step) {
          for (const int64_t candidate : {best - distance, best + distance}) {
            if (candidate < first || candidate > last) continue;
            nlohmann::json at_point = point;
            at_point[dim] = candidate;
            try {
              (void)spec::spec_at_point(point_spec, at_point);
              best = candidate;
              valid = true;
              break;
            } catch (const std::exception& error) {
              if (problem.empty()) problem = error.what();
            }
            if (distance == 0) break;
          }
        }
        if (!valid) solution.invalid = problem.empty() ? "no valid value in the range" : problem;
        solution.best = best;
        const auto best_allocation = evaluator.allocation_at(variant, kind.tensor, best);
        if (!best_allocation) continue;
        solution.best_tensor_bytes = best_allocation->bytes;
        solution.best_request_bytes = evaluator.request_of(best_allocation->bytes);
        solution.best_shape = best_allocation->shape;
        solution.dtype = best_allocation->dtype;
        solution.tensor = kind.tensor;
        solution.others = kind.others;
        solution.variants = join(kind.variants);
        solution.phase = best_allocation->phase;
        solution.note = best_allocation->note;
        for (const auto& [path, value] : point.items())
          if (path != dim) solution.set_args.push_back(path + "=" + (value.is_string() ? value.get<std::string>() : value.dump()));
        solution.set_args.push_back(dim + "=" + std::to_string(best));
        dim_solve.solutions.push_back(std::move(solution));
      }
    }
    result.push_back(std::move(dim_solve));
  }
  return result;
}

nlohmann::json to_json(const DimSolve& solve) {
  nlohmann::json json = {{"dim", solve.dim}, {"solutions", nlohmann::json::array()}};
  if (!solve.skipped.empty()) json["skipped"] = solve.skipped;
  for (const Solution& s : solve.solutions) {
    nlohmann::json row = {{"point", s.point},
                          {"spec_value", s.spec_value},
                          {"first", s.first},
                          {"last", s.last},
                          {"best", s.best},
                          {"request_bytes", s.best_request_bytes},
                          {"tensor_bytes", s.best_tensor_bytes},
                          {"shape", s.best_shape},
                          {"dtype", s.dtype},
                          {"tensor", s.tensor},
                          {"same_size", s.others},
                          {"variants", s.variants},
                          {"phase", s.phase},
                          {"note", s.note},
                          {"set", s.set_args}};
    if (!s.invalid.empty()) row["invalid"] = s.invalid;
    json["solutions"].push_back(std::move(row));
  }
  return json;
}

}  // namespace harness::memory_model
