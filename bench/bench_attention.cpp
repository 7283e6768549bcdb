// harness_bench_attention: times the harness's attention (fused CUDA kernels by default) on one
// problem and prints one JSON object per implementation: fwd/bwd medians, peak extra memory,
// visible pairs, TFLOP/s, plus the resolved mask (anchors, document lengths) so that
// bench/attention_vs_flex.py can rebuild the identical mask for torch.compile(flex_attention).
//
//   harness_bench_attention --mask dflash --anchors 128 [--context 8192 --heads 32 --kv-heads 8
//       --head-dim 128 --documents 4 --window 0 --batch 1 --seed 0 --reps 20 --impl fused|dense|both
//       --fwd-kernel NAME --bwd-kernel NAME --deterministic 0|1]
//
// --fwd-kernel / --bwd-kernel force a CUDA kernel (AttentionOptions::cuda_kernels; default: the
// autotuner's pick); --deterministic 1 asks for the deterministic backward.
//
// Timing: CUDA events around the op only, median of --reps after 3 warm-ups, enqueued back to back
// without host synchronization (host dispatch overhead hidden, as in triton's do_bench), with a
// 256 MB write before each op so that every op starts with a cold L2 (the H200's L2 is 60 MB).
// Memory: in a separate synchronized step, peak bytes allocated by the caching allocator during
// the op minus what was allocated before it (the op's own extra memory: outputs, saved tensors,
// scratch; for the backward the gradients and scratch).
// Host: host_fwd_us / host_bwd_us, the host's own time per call (steady clock around the call in
// steady state, GPU kept busy); phase_fwd_ms / phase_bwd_ms, each op timed as the harness's phase
// timer does (host synchronized first, so the host work before the first launch is inside the
// events): its excess over fwd_ms / bwd_ms is what the host side costs a measured phase.
// FLOPs count visible (q, kv) pairs only: fwd 4 * pairs * D, bwd 10 * pairs * D (2 and 5 matmuls
// of 2 FLOPs per multiply-add), summed over batch and heads.

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/cuda.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/bench_case.h"
#include "kernels/attention.h"
#include "kernels/mask_desc.h"

namespace {

using harness::kernels::AttentionImpl;
using harness::kernels::AttentionOptions;
using harness::kernels::DispatchTrace;
using harness::kernels::MaskContext;
using nlohmann::json;

using Options = harness::bench::CaseOptions;
const std::string kExtraUsage = " [--reps N] [--impl fused|dense|both] [--fwd-kernel NAME] [--bwd-kernel NAME] [--deterministic 0|1]";

Options parse(int argc, char** argv) {
  Options o = harness::bench::parse_case(argc, argv, "harness_bench_attention", kExtraUsage,
                                         [](Options& opt, const std::string& flag, const std::string& value) {
                                           if (flag == "--reps") {
                                             opt.reps = std::stoi(value);
                                           } else if (flag == "--impl") {
                                             opt.impl = value;
                                           } else if (flag == "--fwd-kernel") {
                                             opt.fwd_kernel = value;
                                           } else if (flag == "--bwd-kernel") {
                                             opt.bwd_kernel = value;
                                           } else {
                                             return false;
                                           }
                                           return true;
                                         });
  if (o.impl != "fused" && o.impl != "dense" && o.impl != "both") {
    harness::bench::case_usage("harness_bench_attention", "--impl must be fused, dense or both", kExtraUsage);
  }
  if (o.reps < 1) harness::bench::case_usage("harness_bench_attention", "--reps must be >= 1", kExtraUsage);
  return o;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

int64_t allocated_now(int device) {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device)
      .allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .current;
}
int64_t allocated_peak(int device) {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device)
      .allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .peak;
}

json bench_impl(const Options& o, AttentionImpl impl, MaskContext& mask, int64_t pairs) {
  const int device = 0;
  const auto cuda = at::TensorOptions().device(at::kCUDA, device).dtype(at::kBFloat16);
  const auto& m = mask.mask();
  at::manual_seed(static_cast<uint64_t>(o.seed) + 1);
  const at::Tensor q = at::randn({o.batch, o.heads, m.q_len, o.head_dim}, cuda);
  const at::Tensor k = at::randn({o.batch, o.kv_heads, m.kv_len, o.head_dim}, cuda);
  const at::Tensor v = at::randn({o.batch, o.kv_heads, m.kv_len, o.value_head_dim()}, cuda);
  const at::Tensor dout = at::randn({o.batch, o.heads, m.q_len, o.value_head_dim()}, cuda);
  at::Tensor flush = at::empty({256 << 20}, cuda.dtype(at::kByte));
  DispatchTrace trace;
  AttentionOptions options;
  options.impl = impl;
  options.trace = &trace;
  options.deterministic = o.deterministic != 0;
  options.cuda_kernels.fwd = o.fwd_kernel;
  options.cuda_kernels.bwd = o.bwd_kernel;
  const auto stream = at::cuda::getCurrentCUDAStream(device);
  auto leaf = [](const at::Tensor& t) { return t.detach().requires_grad_(true); };

  // Timing pass: reps back to back with no host synchronization, so the host enqueues ahead of
  // the GPU and its dispatch overhead (autograd, mask cache lookups) stays out of the events.
  const int total = o.reps + 3;
  std::vector<c10::cuda::CUDAEvent> events;
  for (int i = 0; i < 4 * total; ++i) events.emplace_back(cudaEventDefault);
  for (int rep = 0; rep < total; ++rep) {
    const at::Tensor ql = leaf(q), kl = leaf(k), vl = leaf(v);
    flush.fill_(rep & 0xff);
    events[4 * rep].record(stream);
    at::Tensor out = harness::kernels::attention(ql, kl, vl, mask, options);
    events[4 * rep + 1].record(stream);
    flush.fill_(rep & 0xff);
    events[4 * rep + 2].record(stream);
    out.backward(dout);
    events[4 * rep + 3].record(stream);
  }
  std::vector<double> fwd_ms, bwd_ms;
  for (int rep = 3; rep < total; ++rep) {  // the first 3 are warm-up
    events[4 * rep + 3].synchronize();
    fwd_ms.push_back(events[4 * rep].elapsed_time(events[4 * rep + 1]));
    bwd_ms.push_back(events[4 * rep + 2].elapsed_time(events[4 * rep + 3]));
  }

  // Host pass: the host's own time per call (steady clock around the call, the GPU kept busy by
  // the L2 flush so that no call waits for it), and the phase as the harness times it: the host
  // synchronized before the first event, so the host work before the first launch is inside the
  // events (trials/memory.h PhaseTimer). Its excess over the back-to-back time is what the host
  // side costs a measured phase.
  std::vector<double> host_fwd_us, host_bwd_us, phase_fwd_ms, phase_bwd_ms;
  for (int rep = 0; rep < total; ++rep) {
    const at::Tensor ql = leaf(q), kl = leaf(k), vl = leaf(v);
    flush.fill_(rep & 0xff);
    c10::cuda::device_synchronize();
    events[4 * rep].record(stream);
    auto start = std::chrono::steady_clock::now();
    at::Tensor out = harness::kernels::attention(ql, kl, vl, mask, options);
    const double fwd_host = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    events[4 * rep + 1].record(stream);
    flush.fill_(rep & 0xff);
    c10::cuda::device_synchronize();
    events[4 * rep + 2].record(stream);
    start = std::chrono::steady_clock::now();
    out.backward(dout);
    const double bwd_host = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    events[4 * rep + 3].record(stream);
    events[4 * rep + 3].synchronize();
    if (rep < 3) continue;
    host_fwd_us.push_back(fwd_host);
    host_bwd_us.push_back(bwd_host);
    phase_fwd_ms.push_back(events[4 * rep].elapsed_time(events[4 * rep + 1]));
    phase_bwd_ms.push_back(events[4 * rep + 2].elapsed_time(events[4 * rep + 3]));
  }

  // Memory pass: one more step, synchronized, with the allocator's peak reset before each op.
  const at::Tensor ql = leaf(q), kl = leaf(k), vl = leaf(v);
  c10::cuda::device_synchronize();
  const int64_t before_fwd = allocated_now(device);
  c10::cuda::CUDACachingAllocator::resetPeakStats(device);
  at::Tensor out = harness::kernels::attention(ql, kl, vl, mask, options);
  c10::cuda::device_synchronize();
  const int64_t fwd_peak = allocated_peak(device) - before_fwd;
  const int64_t before_bwd = allocated_now(device);
  c10::cuda::CUDACachingAllocator::resetPeakStats(device);
  out.backward(dout);
  c10::cuda::device_synchronize();
  const int64_t bwd_peak = allocated_peak(device) - before_bwd;
  const double fwd = median(fwd_ms), bwd = median(bwd_ms);
  // Matmul FLOPs per visible pair and head: fwd QKᵀ (D) and PV (D_V); bwd QKᵀ again, dQ and dK (D),
  // dP and dV (D_V); 4·D and 10·D when D_V = D.
  const double pair_heads = static_cast<double>(pairs) * o.batch * o.heads;
  const double fwd_flops = 2.0 * pair_heads * static_cast<double>(o.head_dim + o.value_head_dim());
  const double bwd_flops = 2.0 * pair_heads * static_cast<double>(3 * o.head_dim + 2 * o.value_head_dim());
  json records = json::array();
  for (const auto& r : trace.records()) {
    if (records.size() >= 2) break;  // one fwd and one bwd record tell the dispatch
    records.push_back({{"op", r.op}, {"impl", r.impl}, {"config", r.config}, {"reason", r.reason}});
  }
  // Sums of the inputs: bench/attention_vs_flex.py checks that every peer timed the same tensors.
  json input_sums = json::array();
  for (const at::Tensor* t : {&q, &k, &v, &dout}) input_sums.push_back(t->to(at::kFloat).sum().item<double>());
  return {{"impl", impl == AttentionImpl::fused ? "fused" : "dense"},
          {"input_sums", input_sums},
          {"fwd_ms", fwd},
          {"bwd_ms", bwd},
          {"fwd_ms_all", fwd_ms},
          {"bwd_ms_all", bwd_ms},
          {"host_fwd_us", median(host_fwd_us)},
          {"host_bwd_us", median(host_bwd_us)},
          {"phase_fwd_ms", median(phase_fwd_ms)},
          {"phase_bwd_ms", median(phase_bwd_ms)},
          {"fwd_peak_bytes", fwd_peak},
          {"bwd_peak_bytes", bwd_peak},
          {"fwd_tflops", fwd_flops / (fwd * 1e-3) / 1e12},
          {"bwd_tflops", bwd_flops / (bwd * 1e-3) / 1e12},
          {"dispatch", records}};
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  json result;
  try {
    harness::bench::ResolvedCase resolved;
    try {
      resolved = harness::bench::resolve_case(o);
    } catch (const std::invalid_argument& error) {
      harness::bench::case_usage("harness_bench_attention", error.what(), kExtraUsage);
    }
    result = harness::bench::describe_case(o, resolved);
    result["deterministic"] = o.deterministic != 0;
    result["kernels"] = {{"fwd", o.fwd_kernel}, {"bwd", o.bwd_kernel}};
    result["reps"] = o.reps;
    result["results"] = json::array();
    if (!torch::cuda::is_available()) throw std::runtime_error("no CUDA device");
    result["device"] = at::cuda::getCurrentDeviceProperties()->name;
    MaskContext mask(resolved.mask);
    if (o.impl != "dense") result["results"].push_back(bench_impl(o, AttentionImpl::fused, mask, resolved.pairs));
    if (o.impl != "fused") result["results"].push_back(bench_impl(o, AttentionImpl::dense, mask, resolved.pairs));
  } catch (const harness::kernels::UnsupportedError& error) {
    // No kernel for this shape or dtype: a value, as a trial records it (bench/attention_vs_flex.py
    // shows the row as "cannot run").
    result["unsupported"] = error.what();
    std::cout << result.dump() << std::endl;
    return 0;
  } catch (const std::exception& error) {
    result["error"] = error.what();
    std::cout << result.dump() << std::endl;
    return 1;
  }
  std::cout << result.dump() << std::endl;
  return 0;
}
