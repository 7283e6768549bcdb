#include "trials/attention_step.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cmath>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

#include "core/files.h"
#include "core/oom_message.h"
#include "experiments/tolerance.h"
#include "trials/correctness.h"
#include "trials/memory.h"
#include "trials/step_evidence.h"
#include "kernels/attention.h"
#include "kernels/mask_desc.h"
#include "replay/capsule.h"
#include "replay/mask_bits.h"

namespace harness::kinds {
namespace {

at::ScalarType scalar_type(const std::string& dtype) {
  if (dtype == "bf16") return at::kBFloat16;
  if (dtype == "fp16") return at::kHalf;
  return at::kFloat;
}

// One layer's tensors on the trial's device.
struct LayerInputs {
  at::Tensor q, k, v, grad_out;
};

// The step's inputs on the CPU in the spec's dtype. They are drawn in fp32 on the CPU from a
// generator seeded by the spec's seed and the layer, then cast, so every variant and every device
// sees the same numbers (casting on the CPU or the GPU rounds alike).
replay::StepTensors make_step(const spec::Spec& spec, const kernels::ResolvedMask& mask, const std::string& fault) {
  const auto& d = spec.dims;
  const auto cpu = at::TensorOptions().dtype(at::kFloat);
  replay::StepTensors step;
  for (int64_t layer = 0; layer < spec.layers; ++layer) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(spec.seed * 1000003ULL + static_cast<uint64_t>(layer));
    const auto draw = [&](int64_t heads, int64_t length, int64_t head_dim) {
      return at::randn({d.batch, heads, length, head_dim}, gen, cpu).to(scalar_type(spec.dtype));
    };
    // v and the output (so grad_out) have v_head_dim, which defaults to head_dim.
    step.q.push_back(draw(d.heads, d.q_len(), d.head_dim));
    step.k.push_back(draw(d.kv_heads, d.kv_len(), d.head_dim));
    step.v.push_back(draw(d.kv_heads, d.kv_len(), d.value_head_dim()));
    step.grad_out.push_back(draw(d.heads, d.q_len(), d.value_head_dim()));
  }
  if (fault == "nan") {
    // Test-only: data that overflows inside the step, as a bad batch would. Query 0 of head 0 is
    // near the dtype's largest value and the keys of KV head 0 are all 1, so its fp32 scores are
    // +inf and its softmax NaN; the inputs stay finite (in fp16, 3e38 is itself Inf).
    step.q[0].select(0, 0).select(0, 0).select(0, 0).fill_(3.0e38);
    step.k[0].select(0, 0).select(0, 0).fill_(1.0);
  }
  if (mask.kind == kernels::MaskKind::dflash) step.anchors = mask.anchors;
  if (mask.kind == kernels::MaskKind::blockmask) {
    step.mask_bits = replay::mask_bits_tensor(mask);
  } else {
    step.doc_id = mask.doc_id;
  }
  return step;
}

// The spec's mask: drawn from its description, or a blockmask's bits from its file.
kernels::ResolvedMask spec_mask(const spec::Spec& spec) {
  if (spec.mask.kind != kernels::MaskKind::blockmask) return kernels::resolve_mask(spec.mask, spec.dims);
  if (spec.mask.file.empty())
    throw std::invalid_argument("mask blockmask: its bits travel in a capsule (mask.in_capsule): run it with harness replay");
  return replay::load_mask_file(spec.mask.file, spec.dims.q_len(), spec.dims.kv_len());
}

// The resolved mask of a replayed step: the spec's description, with the recorded anchors and
// document ids (a Python step carries its own) in place of the ones drawn from it; a blockmask's
// bits from the capsule.
kernels::ResolvedMask replayed_mask(const spec::Spec& spec, const replay::StepTensors& step) {
  if (spec.mask.kind == kernels::MaskKind::blockmask && step.mask_bits.defined()) {
    return replay::mask_from_tensors({{"mask.bits", step.mask_bits}}, spec.dims.q_len(), spec.dims.kv_len(),
                                     "the capsule's mask.bits");
  }
  kernels::ResolvedMask mask = spec_mask(spec);
  if (step.anchors) mask.anchors = *step.anchors;
  if (step.doc_id) mask.doc_id = *step.doc_id;
  return mask;
}

at::Tensor rng_state(const at::Device& device) {
  at::Generator generator = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void restore_rng_state(const at::Device& device, const at::Tensor& state) {
  if (!state.defined()) return;
  at::Generator generator = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
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

// Non-finite values found in the step: the first tensor (in the order the step makes them) that has any.
class NonfiniteError : public std::runtime_error {
 public:
  NonfiniteError(const std::string& message, nlohmann::json where) : std::runtime_error(message), where_(std::move(where)) {}
  const nlohmann::json& where() const { return where_; }

 private:
  nlohmann::json where_;
};

// Throws NonfiniteError when `tensor` has a NaN or Inf. A sum in fp64 is non-finite exactly when
// an element is (finite bf16/fp32 values cannot overflow it: at most 3.4e38 x 1e9 elements), and
// needs one reduction instead of a bool tensor as large as the input; counting happens only when
// something was found.
void check_finite(const at::Tensor& tensor, const std::string& name, const std::string& phase, int64_t layer,
                  int iteration) {
  if (std::isfinite(tensor.sum(at::kDouble).item<double>())) return;
  const at::Tensor flat = tensor.detach().flatten();
  const int64_t nan_count = at::isnan(flat).sum().item<int64_t>();
  const int64_t inf_count = at::isinf(flat).sum().item<int64_t>();
  int64_t first = at::logical_not(at::isfinite(flat)).to(at::kByte).argmax().item<int64_t>();
  std::vector<int64_t> index(static_cast<size_t>(tensor.dim()));
  for (int64_t dim = tensor.dim() - 1; dim >= 0; --dim) {
    index[static_cast<size_t>(dim)] = first % tensor.size(dim);
    first /= tensor.size(dim);
  }
  const std::string phase_words = phase == "fwd" ? "forward" : phase == "bwd" ? "backward" : "inputs";
  std::string at_text;
  for (size_t i = 0; i < index.size(); ++i) at_text += (i ? ", " : "") + std::to_string(index[i]);
  throw NonfiniteError("non-finite values in " + name + " of layer " + std::to_string(layer) + " (" + phase_words +
                           "): " + std::to_string(nan_count) + " NaN, " + std::to_string(inf_count) +
                           " Inf; first at [" + at_text + "]",
                       {{"tensor", name},
                        {"phase", phase},
                        {"layer", layer},
                        {"iteration", iteration},
                        {"nan", nan_count},
                        {"inf", inf_count},
                        {"first_index", index}});
}

// What the trial recorded besides its result, kept outside it so that it survives an exception:
// the capsule of its inputs and, for a capsule that is kept, the outputs it produced.
struct StepRecord {
  std::optional<replay::WrittenCapsule> capsule;
  std::string capsule_error;       // why no capsule could be written (the step runs anyway)
  replay::NamedTensors outputs;    // CPU copies of the last iteration's outputs and gradients
  std::vector<ArtifactRef> evidence;  // allocator snapshot, profiler trace (step_evidence.h)
  nlohmann::json evidence_errors = nlohmann::json::object();  // why one could not be stored
};

// Saves the allocator snapshot into the record (an OOM's or the measured step's).
void keep_snapshot(const AllocatorHistory& history, const TrialRequest& context, StepRecord& record) {
  try {
    if (const auto snapshot = history.save(context.artifact_dir)) record.evidence.push_back(*snapshot);
  } catch (const std::exception& error) {
    record.evidence_errors["memory_snapshot"] = error.what();
  }
}

// Writes the capsule of the step's inputs before the step runs, and names it in the marker beside
// the result file, so that the parent finds it even when the step kills the process.
void record_capsule(const spec::Spec& spec, const TrialRequest& context, const replay::StepTensors& step,
                    StepRecord& record) {
  // A blockmask's bits travel in the capsule (mask.bits), so the replay needs no file.
  nlohmann::json resolved = spec.resolved;
  if (spec.mask.kind == kernels::MaskKind::blockmask) resolved["mask"] = {{"type", "blockmask"}, {"in_capsule", true}};
  nlohmann::json header = {{"role", "step"},
                           {"source", "trial"},
                           {"spec", std::move(resolved)},
                           {"variant", context.variant},
                           {"device", context.device},
                           {"env_id", ""},
                           {"seeds",
                            {{"inputs", spec.seed},
                             {"mask", spec.mask.seed},
                             {"inputs_rule", "layer L: CPU generator seeded with seed*1000003+L, randn fp32 in the order "
                                             "q, k, v, grad_out, then cast to the dtype"}}}};
  try {
    record.capsule = replay::write_capsule(context.artifact_dir, std::move(header), replay::step_tensors(step),
                                           replay::kStepExtension);
    if (!context.result_path.empty())
      write_file_atomic(replay::capsule_sidecar_path(context.result_path),
                        nlohmann::json{{"kind", "capsule"},
                                       {"sha256", record.capsule->sha256},
                                       {"path", record.capsule->path},
                                       {"bytes", record.capsule->bytes}}
                            .dump());
  } catch (const std::exception& error) {
    record.capsule_error = error.what();
  }
}

void keep_outputs(StepRecord& record, const std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& qs,
                  const std::vector<at::Tensor>& ks, const std::vector<at::Tensor>& vs) {
  if (!record.capsule) return;
  record.outputs.clear();
  for (size_t layer = 0; layer < outs.size(); ++layer) {
    const auto index = static_cast<int64_t>(layer);
    record.outputs.emplace_back(replay::layer_tensor_name("out", index), outs[layer].detach().to(at::kCPU));
    const std::pair<const char*, at::Tensor> grads[] = {{"dq", qs[layer].grad()}, {"dk", ks[layer].grad()},
                                                        {"dv", vs[layer].grad()}};
    for (const auto& [name, grad] : grads)
      if (grad.defined()) record.outputs.emplace_back(replay::layer_tensor_name(name, index), grad.to(at::kCPU));
  }
}

// The outputs another program computed for this step (replay --import of a step saved with its
// outputs), judged by the same check as the variant: whether that program's result is right by the
// flash-kernel rule, e.g. PyTorch's compiled flex_attention on the same inputs.
nlohmann::json judge_recorded_outputs(const spec::Spec& spec, const std::string& path, const LayerInputs& in,
                                      const at::Tensor& dense_mask, double scale, const at::Device& device) {
  try {
    const replay::CapsuleInfo info = replay::inspect_capsule(path, /*verify_payload=*/false);
    StepOutputs recorded;
    const std::pair<const char*, at::Tensor*> names[] = {
        {"out", &recorded.out}, {"dq", &recorded.dq}, {"dk", &recorded.dk}, {"dv", &recorded.dv}};
    for (const auto& [name, tensor] : names) {
      const replay::TensorEntry* entry = info.find(replay::layer_tensor_name(name, 0));
      if (!entry) return {{"error", std::string("the recorded outputs have no ") + name + " of layer 0"}};
      *tensor = replay::load_tensor(info, *entry).to(device);
    }
    const CheckResult check = check_step(spec.tolerance, {in.q, in.k, in.v, in.grad_out}, recorded, dense_mask, scale);
    nlohmann::json judged = {{"match", check.match}, {"tolerance", check.judged}};
    if (!check.failures.empty()) judged["check_failed"] = check.failures;
    return judged;
  } catch (const std::exception& error) {
    return {{"error", error.what()}};
  }
}

TrialResult run_step(const spec::Spec& spec, const spec::Variant& variant, const at::Device& device,
                     const TrialRequest& context, kernels::DispatchTrace& trace, StepRecord& record) {
  TrialResult result;
  MemoryMeter meter(device);
  watch_cuda_oom(device);
  if (context.memory_limit_bytes > 0) set_memory_limit(device, context.memory_limit_bytes);
  const double scale = 1.0 / std::sqrt(static_cast<double>(spec.dims.head_dim));

  // Fresh inputs (recorded in a capsule before the step runs), or the ones a capsule recorded.
  std::optional<kernels::MaskContext> mask;
  std::vector<LayerInputs> inputs;
  {
    replay::StepTensors step;
    if (context.replay_capsule.empty()) {
      kernels::ResolvedMask resolved = spec_mask(spec);
      step = make_step(spec, resolved, variant.fault);
      step.cpu_rng_state = rng_state(at::Device(at::kCPU));
      if (device.is_cuda()) step.cuda_rng_state = rng_state(device);
      if (!context.artifact_dir.empty()) record_capsule(spec, context, step, record);
      mask.emplace(std::move(resolved));
    } else {
      const replay::CapsuleInfo info = replay::inspect_capsule(context.replay_capsule, /*verify_payload=*/false);
      step = replay::load_step(info, spec);
      record.capsule = replay::WrittenCapsule{info.sha256, info.path, info.file_bytes, false};
      restore_rng_state(at::Device(at::kCPU), step.cpu_rng_state);
      if (device.is_cuda()) restore_rng_state(device, step.cuda_rng_state);
      mask.emplace(replayed_mask(spec, step));
    }
    for (size_t layer = 0; layer < step.q.size(); ++layer)
      inputs.push_back({step.q[layer].to(device), step.k[layer].to(device), step.v[layer].to(device),
                        step.grad_out[layer].to(device)});
  }
  for (size_t layer = 0; layer < inputs.size(); ++layer) {
    const auto index = static_cast<int64_t>(layer);
    check_finite(inputs[layer].q, "q", "input", index, 0);
    check_finite(inputs[layer].k, "k", "input", index, 0);
    check_finite(inputs[layer].v, "v", "input", index, 0);
    check_finite(inputs[layer].grad_out, "grad_out", "input", index, 0);
  }
  if (!variant.fault.empty() && variant.fault != "nan" && !variant.fault.starts_with("wrong_"))
    inject_fault(variant.fault, device);

  kernels::AttentionOptions options;
  options.impl = variant.impl == "dense" ? kernels::AttentionImpl::dense : kernels::AttentionImpl::fused;
  options.scale = scale;
  options.trace = &trace;
  // The spec's BlockMask block size tiles the CPU fused kernel; the CUDA kernels choose their own
  // tiles (and build their BlockMasks at that granularity), named in the dispatch trace.
  options.cpu_tiles = {spec.mask_block, spec.mask_block};
  // The variant's CUDA kernel choice (spec "kernel" / "deterministic"), recorded in the trace
  // first so that every trial shows what was asked; the CPU fused kernel has one kernel and one
  // (deterministic) backward, so there it is recorded and not used.
  options.cuda_kernels.fwd = variant.fwd_kernel;
  options.cuda_kernels.bwd = variant.bwd_kernel;
  options.deterministic = variant.deterministic;
  if (const std::string choice = spec::kernel_choice_text(variant); !choice.empty()) {
    const bool used = device.is_cuda() && options.impl == kernels::AttentionImpl::fused;
    trace.record({"attention_options", used ? "fused_cuda" : variant.impl, device.str(),
                  used ? "spec variant " + variant.name + " chooses the CUDA kernels"
                       : "spec variant " + variant.name + " chooses CUDA kernels; recorded, not used on " + device.str(),
                  choice});
  }

  StepOutputs layer0;
  PhaseTimer timer(device);
  // On a GPU the allocator's history is always recorded, so that a trial ending in an OOM keeps
  // the snapshot of how it got there; --memory-snapshot keeps the measured step's (the first
  // measured iteration) and --trace profiles that step.
  AllocatorHistory history(device);
  StepProfiler profiler(device);
  std::vector<kernels::DispatchRecord> fwd_records, bwd_records;  // of the previous iteration: range labels
  for (int iteration = 0; iteration < spec.warmup + spec.repeats; ++iteration) {
    const bool measured = iteration >= spec.warmup;
    const bool last = iteration + 1 == spec.warmup + spec.repeats;
    const int repeat = iteration - spec.warmup;
    const bool evidence_step = iteration == spec.warmup && !context.artifact_dir.empty();
    if (evidence_step && context.memory_snapshot) history.restart();
    if (evidence_step && context.trace) profiler.start();
    try {
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
      const size_t fwd_first_record = trace.records().size();
      for (size_t layer = 0; layer < inputs.size(); ++layer) {
        const PhaseRange range(phase_label("fwd layer " + std::to_string(layer), fwd_records));
        outs.push_back(kernels::attention(qs[layer], ks[layer], vs[layer], *mask, options));
      }
      const double fwd_ms = timer.stop();
      const int64_t fwd_peak = meter.peak() - before_fwd;
      try {
        for (size_t layer = 0; layer < outs.size(); ++layer)
          check_finite(outs[layer], "out", "fwd", static_cast<int64_t>(layer), iteration);
      } catch (const NonfiniteError&) {
        keep_outputs(record, outs, qs, ks, vs);
        throw;
      }

      synchronize(device);
      meter.reset_peak();
      const int64_t before_bwd = meter.current();
      timer.start();
      const size_t bwd_first_record = trace.records().size();
      {
        const PhaseRange range(phase_label("bwd", bwd_records));
        torch::autograd::backward(outs, grads);
      }
      const double bwd_ms = timer.stop();
      {
        const auto records = trace.records();
        fwd_records.assign(records.begin() + static_cast<std::ptrdiff_t>(fwd_first_record),
                           records.begin() + static_cast<std::ptrdiff_t>(bwd_first_record));
        bwd_records.assign(records.begin() + static_cast<std::ptrdiff_t>(bwd_first_record), records.end());
      }
      const int64_t bwd_peak = meter.peak() - before_bwd;
      try {
        for (size_t layer = 0; layer < outs.size(); ++layer) {
          const auto index = static_cast<int64_t>(layer);
          check_finite(qs[layer].grad(), "dq", "bwd", index, iteration);
          check_finite(ks[layer].grad(), "dk", "bwd", index, iteration);
          check_finite(vs[layer].grad(), "dv", "bwd", index, iteration);
        }
      } catch (const NonfiniteError&) {
        keep_outputs(record, outs, qs, ks, vs);
        throw;
      }

      if (measured) {
        result.metrics.push_back({"fwd_peak_bytes", static_cast<double>(fwd_peak), "bytes", repeat});
        result.metrics.push_back({"bwd_peak_bytes", static_cast<double>(bwd_peak), "bytes", repeat});
        result.metrics.push_back({"fwd_ms", fwd_ms, "ms", repeat});
        result.metrics.push_back({"bwd_ms", bwd_ms, "ms", repeat});
      }
      if (last) {
        layer0 = {outs[0].detach(), qs[0].grad(), ks[0].grad(), vs[0].grad()};
        keep_outputs(record, outs, qs, ks, vs);
      }
      if (evidence_step && context.trace) {
        try {
          record.evidence.push_back(profiler.stop_and_save(context.artifact_dir));
        } catch (const std::exception& error) {
          record.evidence_errors["trace"] = error.what();
        }
      }
      if (evidence_step && context.memory_snapshot) {
        keep_snapshot(history, context, record);
        history.stop();
      }
    } catch (const c10::OutOfMemoryError&) {
      if (device.is_cuda() && !context.artifact_dir.empty()) {
        try {
          bool at_the_oom = false;
          if (const auto snapshot = history.save_at_oom(context.artifact_dir, &at_the_oom)) {
            record.evidence.push_back(*snapshot);
            if (!at_the_oom)
              record.evidence_errors["memory_snapshot"] =
                  "taken after the failing step unwound (the allocator's OOM observer took none): its blocks are freed";
          }
        } catch (const std::exception& error) {
          record.evidence_errors["memory_snapshot"] = error.what();
        }
      }
      throw;
    }
  }
  history.stop();
  if (context.memory_snapshot && !device.is_cuda())
    record.evidence_errors["memory_snapshot"] = "allocator snapshots are recorded on CUDA devices only";
  // The reference check is the harness's, not the experiment's: it runs without the cap.
  if (context.memory_limit_bytes > 0) set_memory_limit(device, 0);
  if (spec.check) {
    plant_wrong_result(variant.fault, layer0);
    const CheckResult check = check_step(spec.tolerance, {inputs[0].q, inputs[0].k, inputs[0].v, inputs[0].grad_out},
                                         layer0, mask->dense(device), scale);
    result.metrics.insert(result.metrics.end(), check.metrics.begin(), check.metrics.end());
    result.details["tolerance"] = check.judged;
    if (!check.failures.empty()) result.details["check_failed"] = check.failures;
    if (!context.judge_outputs.empty())
      result.details["imported_check"] = judge_recorded_outputs(spec, context.judge_outputs, inputs[0], mask->dense(device),
                                                                scale, device);
  }
  return result;
}

// Keeps the capsule (and writes the outputs beside it) when the trial failed or capsules are kept;
// otherwise removes the capsule this trial created, and its marker.
void finish_capsule(TrialResult& result, StepRecord& record, const TrialRequest& context) {
  if (!record.capsule_error.empty()) result.details["capsule_error"] = record.capsule_error;
  if (!record.capsule) return;
  const bool mismatch = std::any_of(result.metrics.begin(), result.metrics.end(),
                                    [](const MetricValue& m) { return m.name == "match" && m.value == 0.0; });
  const bool failed = (result.status != "ok" && result.status != "unsupported") || mismatch;
  const replay::WrittenCapsule& capsule = *record.capsule;
  if (!failed && !context.keep_capsules) {
    if (capsule.created) ::unlink(capsule.path.c_str());
    if (!context.result_path.empty()) ::unlink(replay::capsule_sidecar_path(context.result_path).c_str());
    return;
  }
  result.artifacts.push_back({"capsule", capsule.sha256, capsule.path, capsule.bytes});
  if (record.outputs.empty() || context.artifact_dir.empty()) return;
  try {
    const nlohmann::json header = {{"role", "outputs"}, {"of", capsule.sha256}, {"variant", context.variant},
                                   {"device", context.device}, {"status", result.status}};
    const replay::WrittenCapsule outputs =
        replay::write_capsule(context.artifact_dir, header, record.outputs, replay::kOutputsExtension);
    result.artifacts.push_back({"outputs", outputs.sha256, outputs.path, outputs.bytes});
  } catch (const std::exception& error) {
    result.details["outputs_error"] = error.what();
  }
}

}  // namespace

TrialResult run_attention_step(const spec::Spec& spec, const TrialRequest& context) {
  const auto found = std::find_if(spec.variants.begin(), spec.variants.end(),
                                  [&](const spec::Variant& v) { return v.name == context.variant; });
  if (found == spec.variants.end()) throw std::invalid_argument("unknown variant '" + context.variant + "'");
  const at::Device device(context.device);
  kernels::DispatchTrace trace;
  StepRecord record;
  TrialResult result;
  try {
    result = run_step(spec, *found, device, context, trace, record);
  } catch (const NonfiniteError& error) {
    result = {};
    result.status = "nonfinite";
    result.error = error.what();
    result.details["nonfinite"] = error.where();
  } catch (const replay::CapsuleError& error) {
    result = {};
    result.status = "error";
    result.error = error.what();
    result.details["capsule_error"] = error.what();
  } catch (const c10::OutOfMemoryError& error) {
    result = {};
    result.status = "oom";
    result.error = error.what_without_backtrace();
    result.requested_bytes = device.is_cuda() && last_cuda_oom_request() ? last_cuda_oom_request()
                                                                          : allocator_requested_bytes(result.error);
  } catch (const kernels::UnsupportedError& error) {
    result = {};
    result.status = "unsupported";
    result.error = error.what();
  } catch (const c10::Error& error) {
    // LibTorch's CPU allocator reports a failed allocation as a plain c10::Error ("can't
    // allocate memory: you tried to allocate N bytes"), not as an OutOfMemoryError.
    result = {};
    result.error = error.what_without_backtrace();
    const auto requested = allocator_requested_bytes(result.error);
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
  finish_capsule(result, record, context);
  result.artifacts.insert(result.artifacts.end(), record.evidence.begin(), record.evidence.end());
  if (!record.evidence_errors.empty()) result.details["evidence_errors"] = record.evidence_errors;
  return result;
}

}  // namespace harness::kinds
