// The memory model against the peaks attention_step measures on the CPU (the tracking allocator
// counts every byte LibTorch allocates through c10's CPU allocator, unrounded), for dense and fused,
// 1 and 3 layers, at bwd_fusion's CPU profile dims and at shapes that take the model's other
// branches (fp32 without GQA, fp16 with a causal mask and small tiles).
// Also: a variant's CUDA kernel choice (spec "kernel" / "deterministic") on the CPU trial path.
//
// Tolerance: the model replays the step's allocations op by op, so on one thread it agrees to the
// byte (it does in every case here with torch 2.11); we allow 0.5 % + 1 KiB for allocations LibTorch
// makes that the model leaves out by design (one-element results such as `.all()` of the dense path,
// freed at once) and for small changes inside LibTorch's kernels between versions. A model that
// misses one tensor of the step misses by far more: the smallest tensor it lists at these dims, a
// row vector of one q block, is 1-2 KiB, a kv tile 16-64 KiB, a score-sized tensor 1.5-12 MiB.
// With several threads the fused kernel's tile buffers coexist only as far as the workers happen to
// overlap, so there the measured peak must lie between the model for one thread and for all of them.

#include <ATen/Parallel.h>

#include <cmath>
#include <string>

#include "trials/attention_step.h"
#include "experiments/memory_model.h"
#include "experiments/spec.h"
#include "tests/catch.h"

namespace {

using harness::memory_model::ModelOptions;
namespace memory_model = harness::memory_model;

// bwd_fusion.json's "cpu" profile (4 heads, 2 kv heads, head_dim 64, 32 anchors, context 1024, bf16,
// dflash mask with 4 documents, before_anchor and bidirectional by default, BlockMask 128), written
// out because harness_torch_tests is not given the experiments folder.
const char* const kBwdFusionCpu = R"({
  "name": "bwd_fusion_cpu", "hypothesis": "model vs measured", "kind": "attention_step",
  "dims": {"batch": 1, "heads": 4, "kv_heads": 2, "head_dim": 64, "anchors": 32, "block_size": 16,
           "context": 1024, "dtype": "bf16", "layers": 1},
  "mask": {"type": "dflash", "documents": 4, "seed": 0},
  "block_mask": {"block_size": 128},
  "variants": {"fused": {"impl": "fused"}, "dense": {"impl": "dense"}},
  "measure": ["fwd_peak_bytes", "bwd_peak_bytes"],
  "repeats": 1, "warmup": 1, "timeout_s": 60, "seed": 0, "check": {"enabled": false},
  "verdict": [{"else": "DONE"}]
})";

harness::spec::Spec load(const std::vector<std::string>& overrides) {
  harness::spec::LoadOptions options;
  options.overrides = overrides;
  return harness::spec::load_spec_text(kBwdFusionCpu, "test_memory_measured", options);
}

struct Measured {
  double fwd = -1, bwd = -1;
};

Measured measure(const harness::spec::Spec& spec, const std::string& variant) {
  harness::kinds::TrialRequest context;
  context.variant = variant;
  context.device = "cpu";
  const auto result = harness::kinds::run_attention_step(spec, context);
  INFO("trial status " << result.status << ": " << result.error);
  REQUIRE(result.status == "ok");
  Measured m;
  for (const auto& metric : result.metrics) {
    if (metric.name == "fwd_peak_bytes") m.fwd = metric.value;
    if (metric.name == "bwd_peak_bytes") m.bwd = metric.value;
  }
  REQUIRE(m.fwd >= 0);
  REQUIRE(m.bwd >= 0);
  return m;
}

double allowed(double measured) { return 0.005 * measured + 1024.0; }

//! Runs every variant with 1 and 3 layers on one thread and compares both peaks with the model.
void check_single_thread(const std::vector<std::string>& overrides) {
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  for (const char* layers : {"1", "3"}) {
    auto with_layers = overrides;
    with_layers.push_back(std::string("dims.layers=") + layers);
    const auto spec = load(with_layers);
    for (const char* variant : {"dense", "fused"}) {
      const auto predicted = memory_model::predict(spec, variant, "cpu", ModelOptions{1});
      const Measured measured = measure(spec, variant);
      INFO(variant << ", " << layers << " layer(s): fwd measured " << static_cast<int64_t>(measured.fwd) << " model "
                   << predicted.fwd_peak_bytes << "; bwd measured " << static_cast<int64_t>(measured.bwd) << " model "
                   << predicted.bwd_peak_bytes);
      CHECK(std::abs(measured.fwd - static_cast<double>(predicted.fwd_peak_bytes)) <= allowed(measured.fwd));
      CHECK(std::abs(measured.bwd - static_cast<double>(predicted.bwd_peak_bytes)) <= allowed(measured.bwd));
    }
  }
  at::set_num_threads(threads);
}

}  // namespace

TEST_CASE("memory model matches the measured CPU peaks at bwd_fusion's CPU profile", "[memory_model]") {
  check_single_thread({});
}

TEST_CASE("memory model matches the measured CPU peaks in fp32 without GQA", "[memory_model]") {
  check_single_thread({"dims.dtype=fp32", "dims.heads=4", "dims.kv_heads=4", "dims.anchors=8",
                       "dims.context=256", "block_mask.block_size=64"});
}

TEST_CASE("memory model matches the measured CPU peaks in fp16 with a causal mask and small tiles", "[memory_model]") {
  check_single_thread({"dims.dtype=fp16", "dims.heads=8", "dims.kv_heads=2", "dims.anchors=16", "dims.context=512",
                       "mask.type=causal", "block_mask.block_size=32"});
}

TEST_CASE("with several threads the fused CPU peaks lie between the model for one and for all threads",
          "[memory_model]") {
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  const auto spec = load({"dims.layers=3"});
  const auto one = memory_model::predict(spec, "fused", "cpu", ModelOptions{1});
  const auto two = memory_model::predict(spec, "fused", "cpu", ModelOptions{2});
  const Measured measured = measure(spec, "fused");
  INFO("fwd measured " << static_cast<int64_t>(measured.fwd) << " model " << one.fwd_peak_bytes << ".." << two.fwd_peak_bytes
                       << "; bwd measured " << static_cast<int64_t>(measured.bwd) << " model " << one.bwd_peak_bytes << ".."
                       << two.bwd_peak_bytes);
  CHECK(measured.fwd >= static_cast<double>(one.fwd_peak_bytes) - allowed(measured.fwd));
  CHECK(measured.fwd <= static_cast<double>(two.fwd_peak_bytes) + allowed(measured.fwd));
  CHECK(measured.bwd >= static_cast<double>(one.bwd_peak_bytes) - allowed(measured.bwd));
  CHECK(measured.bwd <= static_cast<double>(two.bwd_peak_bytes) + allowed(measured.bwd));
  at::set_num_threads(threads);
}

TEST_CASE("a variant's CUDA kernel choice is recorded in the trace, not used, on the CPU", "[attention_step]") {
  // The same CPU trial with and without the choice: it runs the CPU fused kernel either way (one
  // kernel, one backward), the trace's first record names what the spec asked for.
  const auto spec = load({"variants.fused.kernel.fwd=wgmma_m64_n64", "variants.fused.kernel.bwd=wgmma",
                          "variants.fused.deterministic=true", "check.enabled=true"});
  harness::kinds::TrialRequest context;
  context.variant = "fused";
  context.device = "cpu";
  const auto result = harness::kinds::run_attention_step(spec, context);
  INFO("trial status " << result.status << ": " << result.error);
  REQUIRE(result.status == "ok");
  REQUIRE(result.dispatch.size() >= 3);
  CHECK(result.dispatch[0].op == "attention_options");
  CHECK(result.dispatch[0].impl == "fused");
  CHECK(result.dispatch[0].config == "fwd=wgmma_m64_n64 bwd=wgmma deterministic=true");
  CHECK(result.dispatch[0].reason.find("recorded, not used on cpu") != std::string::npos);
  bool fused_cpu_fwd = false, fused_cpu_bwd = false;
  for (const auto& record : result.dispatch) {
    fused_cpu_fwd |= record.op == "attention_fwd" && record.impl == "fused_cpu";
    fused_cpu_bwd |= record.op == "attention_bwd" && record.impl == "fused_cpu";
  }
  CHECK(fused_cpu_fwd);
  CHECK(fused_cpu_bwd);
  // Without a choice there is no options record.
  const auto plain = harness::kinds::run_attention_step(load({}), context);
  REQUIRE(plain.status == "ok");
  for (const auto& record : plain.dispatch) CHECK(record.op != "attention_options");
}

TEST_CASE("memory model matches the measured CPU peaks with v_head_dim 128 under head_dim 192 (MLA)", "[memory_model]") {
  check_single_thread({"dims.head_dim=192", "dims.v_head_dim=128", "dims.anchors=8", "dims.context=256",
                       "mask.type=causal", "block_mask.block_size=32"});
}
