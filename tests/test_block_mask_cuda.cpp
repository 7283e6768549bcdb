// GPU BlockMask builder (build_block_mask_cuda, and MaskContext::block_mask on a CUDA device)
// against the CPU builder: every tensor equal, on awkward sizes and at the real dims, plus a
// timing print of the GPU build at the real dims. Needs a GPU and the CUDA kernels; elsewhere the
// tests return early.

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "kernels/attention.h"
#include "kernels/block_mask.h"
#include "kernels/mask_desc.h"
#include "tests/catch.h"
#include "tests/gpu.h"
#include "tests/mask_cases.h"

#ifdef HARNESS_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>

#include "kernels/cuda/block_mask_cuda.h"
#endif

using namespace harness::kernels;

#ifdef HARNESS_WITH_CUDA_KERNELS

namespace {

using harness::test::have_gpu;
using harness::test::NamedMask;

// Every field and tensor of the GPU BlockMask equals the CPU one (same dtype, shape and values).
void check_equal(const BlockMask& gpu, const BlockMask& cpu) {
  CHECK(gpu.q_len == cpu.q_len);
  CHECK(gpu.kv_len == cpu.kv_len);
  CHECK(gpu.block_m == cpu.block_m);
  CHECK(gpu.block_n == cpu.block_n);
  CHECK(gpu.num_q_blocks == cpu.num_q_blocks);
  CHECK(gpu.num_kv_blocks == cpu.num_kv_blocks);
  const std::vector<std::pair<const char*, std::pair<const at::Tensor*, const at::Tensor*>>> tensors = {
      {"kv_num_blocks", {&gpu.kv_num_blocks, &cpu.kv_num_blocks}},
      {"kv_indices", {&gpu.kv_indices, &cpu.kv_indices}},
      {"full_kv_num_blocks", {&gpu.full_kv_num_blocks, &cpu.full_kv_num_blocks}},
      {"full_kv_indices", {&gpu.full_kv_indices, &cpu.full_kv_indices}},
      {"q_num_blocks", {&gpu.q_num_blocks, &cpu.q_num_blocks}},
      {"q_indices", {&gpu.q_indices, &cpu.q_indices}},
      {"full_q_num_blocks", {&gpu.full_q_num_blocks, &cpu.full_q_num_blocks}},
      {"full_q_indices", {&gpu.full_q_indices, &cpu.full_q_indices}},
  };
  for (const auto& [name, pair] : tensors) {
    INFO("tensor " << name);
    const at::Tensor& on_gpu = *pair.first;
    const at::Tensor& on_cpu = *pair.second;
    CHECK(on_gpu.is_cuda());
    CHECK(on_gpu.is_contiguous());
    CHECK(on_gpu.scalar_type() == at::kInt);
    CHECK(on_gpu.sizes() == on_cpu.sizes());
    CHECK(at::equal(on_gpu.cpu(), on_cpu));
  }
}

// The GPU builder directly and through MaskContext (which must now build on the GPU too).
void check_mask(const NamedMask& named, int64_t block_m, int64_t block_n, const at::Device& device) {
  INFO(named.name << " Q " << named.mask.q_len << " KV " << named.mask.kv_len << " blocks " << block_m << "x"
                  << block_n);
  const BlockMask cpu = build_block_mask(named.mask, block_m, block_n);
  MaskContext context(named.mask);
  const BlockMask direct =
      build_block_mask_cuda(named.mask, block_m, block_n, device, context.anchors(device), context.doc_id(device),
                            context.bits(device));
  check_equal(direct, cpu);
  check_equal(context.block_mask(block_m, block_n, device), cpu);
}

AttentionGeometry geometry(int64_t anchors, int64_t context) {
  AttentionGeometry result;
  result.anchors = anchors;
  result.block_size = 16;
  result.context = context;
  return result;
}

}  // namespace

TEST_CASE("GPU BlockMask equals the CPU one on awkward sizes", "[cuda][block_mask]") {
  if (!have_gpu()) return;
  const at::Device device(at::kCUDA, 0);
  // Context 1000, 3 draft blocks of 16: Q 48, KV 1048, neither a multiple of 128, 64 or 32.
  const auto masks = harness::test::every_mask_kind(geometry(3, 1000), {100, 650, 250});
  const std::vector<std::pair<int64_t, int64_t>> block_sizes = {{128, 128}, {64, 64}, {16, 16}, {32, 128}, {128, 48}};
  for (const auto& named : masks) {
    for (const auto& [block_m, block_n] : block_sizes) check_mask(named, block_m, block_n, device);
  }
}

TEST_CASE("GPU BlockMask with interleaved documents takes the element-wise path, and agrees", "[cuda][block_mask]") {
  if (!have_gpu()) return;
  const at::Device device(at::kCUDA, 0);
  // Documents are not contiguous spans here (resolve_mask never makes this, a hand-built mask
  // can), so the builder evaluates every element instead of intersecting intervals.
  ResolvedMask mask;
  mask.kind = MaskKind::document_causal;
  mask.q_len = 100;
  mask.kv_len = 300;
  for (int64_t kv = 0; kv < mask.kv_len; ++kv) mask.doc_id.push_back(static_cast<int32_t>((kv / 7) % 3));
  for (const auto& [block_m, block_n] : std::vector<std::pair<int64_t, int64_t>>{{16, 16}, {64, 64}, {32, 128}}) {
    check_mask(NamedMask{"document_causal, interleaved documents", mask}, block_m, block_n, device);
  }
}

TEST_CASE("GPU BlockMask equals the CPU one at the real dims", "[cuda][block_mask]") {
  if (!have_gpu()) return;
  const at::Device device(at::kCUDA, 0);
  // 128 draft blocks of 16 after a context of 8192: Q 2048, KV 10240; four equal documents.
  const auto masks = harness::test::every_mask_kind(geometry(128, 8192), {2048, 2048, 2048, 2048});
  for (const auto& named : masks) {
    // 128x128, and the tilings the attention kernels ask for (64-row and 128-row tiles of 4
    // packed heads: 16x64, 16x128, 32x64, 32x128).
    for (const auto& [block_m, block_n] :
         std::vector<std::pair<int64_t, int64_t>>{{128, 128}, {64, 128}, {16, 64}, {16, 128}, {32, 64}, {32, 128}}) {
      check_mask(named, block_m, block_n, device);
    }
  }
}

TEST_CASE("GPU BlockMask build time at the real dims", "[cuda][block_mask][timing]") {
  if (!have_gpu()) return;
  const at::Device device(at::kCUDA, 0);
  MaskDesc desc;
  desc.kind = MaskKind::dflash;
  desc.documents = 4;
  desc.seed = 7;
  const ResolvedMask mask = resolve_mask(desc, geometry(128, 8192));
  MaskContext context(mask);
  const at::Tensor& anchors = context.anchors(device);
  const at::Tensor& doc_id = context.doc_id(device);
  const at::Tensor& bits = context.bits(device);

  // Host-visible time of one build including its kernels: synchronize, build, synchronize.
  const auto time_once = [&] {
    at::cuda::getCurrentCUDAStream(device.index()).synchronize();
    const auto start = std::chrono::steady_clock::now();
    const BlockMask built = build_block_mask_cuda(mask, 128, 128, device, anchors, doc_id, bits);
    at::cuda::getCurrentCUDAStream(device.index()).synchronize();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  };
  for (int i = 0; i < 3; ++i) time_once();
  std::vector<double> times;
  for (int i = 0; i < 20; ++i) times.push_back(time_once());
  std::sort(times.begin(), times.end());
  const double median = (times[9] + times[10]) / 2;

  // Per build when 20 are enqueued back to back (CUDA events around all of them): the GPU-side
  // cost a step pays, without the two synchronizations of time_once.
  const auto stream = at::cuda::getCurrentCUDAStream(device.index());
  at::cuda::CUDAEvent start_event(cudaEventDefault), stop_event(cudaEventDefault);
  stream.synchronize();
  start_event.record(stream);
  for (int i = 0; i < 20; ++i) build_block_mask_cuda(mask, 128, 128, device, anchors, doc_id, bits);
  stop_event.record(stream);
  stop_event.synchronize();
  const double enqueued_ms = start_event.elapsed_time(stop_event) / 20;

  const auto cpu_start = std::chrono::steady_clock::now();
  const BlockMask cpu = build_block_mask(mask, 128, 128);
  const double cpu_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - cpu_start).count();

  WARN("BlockMask build, dflash Q 2048 KV 10240 4 docs, block 128x128: GPU median of 20 " << median << " ms (min "
       << times.front() << ", max " << times.back() << "; " << enqueued_ms
       << " ms each when enqueued back to back), CPU once " << cpu_ms << " ms, "
       << cpu.partial_pairs() << " partial + " << cpu.full_pairs() << " full pairs of "
       << cpu.num_q_blocks * cpu.num_kv_blocks);
  check_equal(build_block_mask_cuda(mask, 128, 128, device, anchors, doc_id, bits), cpu);
}

#endif  // HARNESS_WITH_CUDA_KERNELS
