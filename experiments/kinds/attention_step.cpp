#include "experiments/kinds/attention_step.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>

#include <algorithm>
#include <csignal>
#include <cmath>
#include <stdexcept>
#include <thread>

#include "experiments/kinds/memory.h"
#include "kernels/attention.h"
#include "kernels/mask_desc.h"

namespace harness::kinds {
namespace {

at::ScalarType scalar_type(const std::string& dtype) {
  if (dtype == "bf16") return at::kBFloat16;
  if (dtype == "fp16") return at::kHalf;
  return at::kFloat;
}

// One layer's tensors. Inputs are drawn in fp32 on the CPU from a seeded generator and then cast
// and moved, so every variant and every device sees the same numbers.
struct LayerInputs {
  at::Tensor q, k, v, grad_out;
};

LayerInputs make_inputs(const spec::Spec& spec, int64_t layer, const at::Device& device) {
  const auto& d = spec.dims;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(spec.seed * 1000003ULL + static_cast<uint64_t>(layer));
  const auto cpu = at::TensorOptions().dtype(at::kFloat);
  const auto to_device = [&](const at::Tensor& t) { return t.to(device, scalar_type(spec.dtype)); };
  LayerInputs in;
  in.q = to_device(at::randn({d.batch, d.heads, d.q_len(), d.head_dim}, gen, cpu));
  in.k = to_device(at::randn({d.batch, d.kv_heads, d.kv_len(), d.head_dim}, gen, cpu));
  in.v = to_device(at::randn({d.batch, d.kv_heads, d.kv_len(), d.head_dim}, gen, cpu));
  in.grad_out = to_device(at::randn({d.batch, d.heads, d.q_len(), d.head_dim}, gen, cpu));
  return in;
}

[[noreturn]] void inject_fault(const std::string& fault, const at::Device& device) {
  if (fault == "segfault") std::raise(SIGSEGV);
  if (fault == "abort") std::abort();
  if (fault == "hang")
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  if (fault == "oom") {
    // Far more than any machine has: the allocator refuses and reports the request.
    at::empty({int64_t{1} << 50}, at::TensorOptions().dtype(at::kByte).device(device));
  }
  throw std::runtime_error("fault injection: exception thrown inside the trial (fault=" + fault + ")");
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  const auto diff = (a.to(at::kFloat) - b.to(at::kFloat)).abs();
  if (!diff.isfinite().all().item<bool>()) return std::numeric_limits<double>::infinity();
  return diff.max().item<double>();
}

struct StepTensors {
  at::Tensor out, dq, dk, dv;
};

// One forward+backward of the dense reference on copies of the inputs in `dtype`.
StepTensors dense_step(const LayerInputs& in, kernels::MaskContext& mask, at::ScalarType dtype, double scale) {
  auto q = in.q.detach().to(dtype).requires_grad_(true);
  auto k = in.k.detach().to(dtype).requires_grad_(true);
  auto v = in.v.detach().to(dtype).requires_grad_(true);
  auto out = kernels::dense_attention(q, k, v, mask.dense(q.device()), scale);
  out.backward(in.grad_out.to(dtype));
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

// Compares the variant's layer-0 tensors with an fp32 reference; the allowance is relative to
// the error the dense path makes in the same low precision (STYLE.md).
void check_against_reference(const spec::Spec& spec, const std::string& impl, const LayerInputs& in,
                             const StepTensors& got, kernels::MaskContext& mask, double scale,
                             std::vector<MetricValue>& metrics) {
  const StepTensors reference = dense_step(in, mask, at::kFloat, scale);
  const at::ScalarType dtype = scalar_type(spec.dtype);
  const StepTensors lowp = impl == "dense" ? got : dense_step(in, mask, dtype, scale);
  const std::pair<const char*, std::pair<at::Tensor, std::pair<at::Tensor, at::Tensor>>> rows[] = {
      {"out", {got.out, {lowp.out, reference.out}}},
      {"dq", {got.dq, {lowp.dq, reference.dq}}},
      {"dk", {got.dk, {lowp.dk, reference.dk}}},
      {"dv", {got.dv, {lowp.dv, reference.dv}}},
  };
  bool match = true;
  double worst = 0.0;
  for (const auto& [name, tensors] : rows) {
    const double err = max_abs_diff(tensors.first, tensors.second.second);
    const double lowp_err = max_abs_diff(tensors.second.first, tensors.second.second);
    const double allowed = spec.tolerance.factor * lowp_err + spec.tolerance.atol;
    match = match && std::isfinite(err) && err <= allowed;
    worst = std::max(worst, err);
    metrics.push_back({std::string(name) + "_max_abs_err", err, "", -1});
    metrics.push_back({std::string(name) + "_dense_lowp_err", lowp_err, "", -1});
  }
  metrics.push_back({"max_abs_err", worst, "", -1});
  metrics.push_back({"match", match ? 1.0 : 0.0, "", -1});
}

TrialResult run_step(const spec::Spec& spec, const spec::Variant& variant, const at::Device& device,
                     int64_t memory_limit_bytes, kernels::DispatchTrace& trace) {
  TrialResult result;
  MemoryMeter meter(device);
  watch_cuda_oom(device);
  if (memory_limit_bytes > 0) set_memory_limit(device, memory_limit_bytes);
  const double scale = 1.0 / std::sqrt(static_cast<double>(spec.dims.head_dim));

  kernels::MaskContext mask(kernels::resolve_mask(spec.mask, spec.dims));
  std::vector<LayerInputs> inputs;
  for (int64_t layer = 0; layer < spec.layers; ++layer) inputs.push_back(make_inputs(spec, layer, device));
  if (!variant.fault.empty()) inject_fault(variant.fault, device);

  kernels::AttentionOptions options;
  options.impl = variant.impl == "dense" ? kernels::AttentionImpl::dense : kernels::AttentionImpl::fused;
  options.scale = scale;
  options.trace = &trace;
  // The spec's BlockMask block size tiles the CPU fused kernel; the CUDA kernels choose their own
  // tiles (and build their BlockMasks at that granularity), named in the dispatch trace.
  options.cpu_tiles = {spec.mask_block, spec.mask_block};

  StepTensors layer0;
  PhaseTimer timer(device);
  for (int iteration = 0; iteration < spec.warmup + spec.repeats; ++iteration) {
    const bool measured = iteration >= spec.warmup;
    const int repeat = iteration - spec.warmup;
    std::vector<at::Tensor> qs, ks, vs, outs, grads;
    for (const auto& in : inputs) {
      qs.push_back(in.q.detach().requires_grad_(true));
      ks.push_back(in.k.detach().requires_grad_(true));
      vs.push_back(in.v.detach().requires_grad_(true));
      grads.push_back(in.grad_out);
    }
    synchronize(device);
    meter.reset_peak();
    const int64_t before_fwd = meter.current();
    timer.start();
    for (size_t layer = 0; layer < inputs.size(); ++layer)
      outs.push_back(kernels::attention(qs[layer], ks[layer], vs[layer], mask, options));
    const double fwd_ms = timer.stop();
    const int64_t fwd_peak = meter.peak() - before_fwd;

    synchronize(device);
    meter.reset_peak();
    const int64_t before_bwd = meter.current();
    timer.start();
    torch::autograd::backward(outs, grads);
    const double bwd_ms = timer.stop();
    const int64_t bwd_peak = meter.peak() - before_bwd;

    if (measured) {
      result.metrics.push_back({"fwd_peak_bytes", static_cast<double>(fwd_peak), "bytes", repeat});
      result.metrics.push_back({"bwd_peak_bytes", static_cast<double>(bwd_peak), "bytes", repeat});
      result.metrics.push_back({"fwd_ms", fwd_ms, "ms", repeat});
      result.metrics.push_back({"bwd_ms", bwd_ms, "ms", repeat});
    }
    if (iteration + 1 == spec.warmup + spec.repeats)
      layer0 = {outs[0].detach(), qs[0].grad(), ks[0].grad(), vs[0].grad()};
  }
  // The reference check is the harness's, not the experiment's: it runs without the cap.
  if (memory_limit_bytes > 0) set_memory_limit(device, 0);
  if (spec.check) check_against_reference(spec, variant.impl, inputs[0], layer0, mask, scale, result.metrics);
  return result;
}

}  // namespace

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
        {"op", d.op}, {"impl", d.impl}, {"device", d.device}, {"reason", d.reason}, {"config", d.config}};
    auto same = std::find_if(json["dispatch"].begin(), json["dispatch"].end(), [&](const nlohmann::json& seen) {
      return seen["op"] == record["op"] && seen["impl"] == record["impl"] && seen["device"] == record["device"] &&
             seen["reason"] == record["reason"] && seen["config"] == record["config"];
    });
    if (same != json["dispatch"].end()) {
      (*same)["calls"] = (*same)["calls"].get<int>() + 1;
    } else {
      json["dispatch"].push_back(record);
      json["dispatch"].back()["calls"] = 1;
    }
  }
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
                               d.value("reason", ""), d.value("config", "")});
  return result;
}

TrialResult run_attention_step(const spec::Spec& spec, const std::string& variant_name, const std::string& device_name,
                               int64_t memory_limit_bytes) {
  const auto found = std::find_if(spec.variants.begin(), spec.variants.end(),
                                  [&](const spec::Variant& v) { return v.name == variant_name; });
  if (found == spec.variants.end()) throw std::invalid_argument("unknown variant '" + variant_name + "'");
  const at::Device device(device_name);
  kernels::DispatchTrace trace;
  TrialResult result;
  try {
    result = run_step(spec, *found, device, memory_limit_bytes, trace);
  } catch (const c10::OutOfMemoryError& error) {
    result = {};
    result.status = "oom";
    result.error = error.what_without_backtrace();
    result.requested_bytes = device.is_cuda() && last_cuda_oom_request() ? last_cuda_oom_request()
                                                                          : requested_bytes_from_message(result.error);
  } catch (const kernels::UnsupportedError& error) {
    result = {};
    result.status = "unsupported";
    result.error = error.what();
  } catch (const c10::Error& error) {
    // LibTorch's CPU allocator reports a failed allocation as a plain c10::Error ("can't
    // allocate memory: you tried to allocate N bytes"), not as an OutOfMemoryError.
    result = {};
    result.error = error.what_without_backtrace();
    const auto requested = requested_bytes_from_message(result.error);
    const bool allocation_failed = requested && (result.error.find("allocate memory") != std::string::npos ||
                                                 result.error.find("out of memory") != std::string::npos);
    result.status = allocation_failed ? "oom" : "error";
    if (allocation_failed) result.requested_bytes = requested;
  } catch (const std::exception& error) {
    result = {};
    result.status = "error";
    result.error = error.what();
  }
  result.dispatch = trace.records();
  return result;
}

}  // namespace harness::kinds
