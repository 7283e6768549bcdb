// The fused attention's host interface (attention_params.h): which kernels exist for a shape, their
// tilings, scratch and descriptions, the tensor maps, and the dispatch from a problem's head dims
// and element type to the launchers of that instantiation (attention_launch_hd*.cu). No LibTorch
// here (fused_attention_cuda.cpp is the LibTorch boundary).

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <iterator>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda/attention_config.h"
#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/attention_params.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mask_device.cuh"
#include "kernels/cuda/tiling.h"

namespace harness::kernels::cuda {

namespace launch {

TileShape tile_shape(const tiling::Tile& tile) {
  return TileShape{static_cast<int32_t>(tile.rows), static_cast<int32_t>(tile.heads_packed),
                   static_cast<int32_t>(tile.block_m), static_cast<int32_t>(tile.block_n)};
}

void require_supported(const AttentionShape& shape) {
  if (!shape_supported(shape)) throw UnsupportedConfig(unsupported_shape_reason(shape));
  if (shape.kv_heads < 1 || shape.heads % shape.kv_heads != 0) {
    throw UnsupportedConfig("fused_cuda attention: heads " + std::to_string(shape.heads) +
                            " is not a multiple of kv_heads " + std::to_string(shape.kv_heads));
  }
}

void check_blocks(const BlockListParams& blocks, const TileShape& tile, const char* kernel) {
  if (blocks.block_m != tile.block_m || blocks.block_n != tile.block_n) {
    throw UnsupportedConfig(std::string("fused_cuda attention: the ") + kernel + " kernel needs a BlockMask at (" +
                            std::to_string(tile.block_m) + ", " + std::to_string(tile.block_n) + "), got (" +
                            std::to_string(blocks.block_m) + ", " + std::to_string(blocks.block_n) + ")");
  }
}

void check_scratch(const void* scratch, size_t have, size_t need, const char* what) {
  if (need > 0 && (scratch == nullptr || have < need)) {
    throw UnsupportedConfig(std::string("fused_cuda attention: ") + what + " scratch of " + std::to_string(have) +
                            " bytes, needs " + std::to_string(need));
  }
}

static_assert(sizeof(WorkItem) == tiling::kWorkItemBytes, "tiling.h sizes the schedule in WorkItems");
static_assert(sizeof(float2) == tiling::kRowStatBytes, "tiling.h sizes the row statistics as float2");
static_assert(sizeof(device::QueryMaskRow) == tiling::kQueryMaskRowBytes, "tiling.h sizes the mask rows");

tiling::BwdScratch bwd_layout(const AttentionShape& shape, const BlockListParams& dq_blocks,
                              const BlockListParams& dkdv_blocks, BwdKernel kernel) {
  // wgmma_atomic also needs its fp32 dQ accumulator [B, H, q_pad, D] (tiling::bwd_scratch).
  return tiling::bwd_scratch(shape.batch, shape.heads, shape.kv_heads, shape.q_len, shape.head_dim, dq_blocks.num_q_blocks,
                             dkdv_blocks.num_kv_blocks, !bwd_kernel_deterministic(kernel));
}

// ---- Tensor maps (TMA) ----------------------------------------------------------------------------

namespace {

//! cuTensorMapEncodeTiled through the runtime's driver entry point (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found{};
    HARNESS_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || function == nullptr) {
      throw CudaError("fused_cuda attention: the driver has no cuTensorMapEncodeTiled (needs CUDA 12 or newer)");
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  return encode;
}

}  // namespace

CUtensorMap tensor_map(const TensorRef& t, ElementType element, int columns, int rows, int heads, int batch, int box_rows,
                       int box_heads, const char* what) {
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(columns), static_cast<cuuint64_t>(std::max(rows, 1)),
                              static_cast<cuuint64_t>(std::max(heads, 1)), static_cast<cuuint64_t>(std::max(batch, 1))};
  cuuint64_t strides[3] = {static_cast<cuuint64_t>(t.stride_row) * 2, static_cast<cuuint64_t>(t.stride_head) * 2,
                           static_cast<cuuint64_t>(t.stride_batch) * 2};
  // A dimension of size 1 is never stepped over, but TMA still rejects a zero (broadcast) stride.
  for (int i = 0; i < 3; ++i) {
    if (dims[i + 1] == 1 || strides[i] == 0) strides[i] = i == 0 ? dims[0] * 2 : strides[i - 1] * dims[i];
  }
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_rows), static_cast<cuuint32_t>(box_heads), 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type =
      element == ElementType::fp16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  // A training loop passes the same tensors (the caching allocator hands the same addresses back)
  // with the same shapes on every step: the last maps encoded are kept, keyed by everything that
  // goes into them (a map is a pure function of these). One cache for the process (the backward
  // runs on autograd's threads, the forward on the caller's), behind a mutex.
  struct Entry {
    const void* data;
    CUtensorMapDataType type;
    cuuint64_t dims[4], strides[3];
    cuuint32_t box[4];
    CUtensorMap map;
  };
  constexpr int kEntries = 32;
  static std::mutex mutex;
  static Entry cache[kEntries];
  static int used = 0, next = 0;
  const std::lock_guard<std::mutex> lock(mutex);
  for (int i = 0; i < used; ++i) {
    const Entry& e = cache[i];
    if (e.data == t.data && e.type == type && std::equal(dims, dims + 4, e.dims) && std::equal(strides, strides + 3, e.strides) &&
        std::equal(box, box + 4, e.box))
      return e.map;
  }
  CUtensorMap map;
  const CUresult status = tensor_map_encoder()(&map, type, 4, t.data, dims, strides, box, element_strides,
                                               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS) {
    throw CudaError(std::string("fused_cuda attention: cuTensorMapEncodeTiled failed (CUresult ") + std::to_string(status) +
                    ") for " + what + ": dims [" + std::to_string(dims[0]) + ", " + std::to_string(dims[1]) + ", " +
                    std::to_string(dims[2]) + ", " + std::to_string(dims[3]) + "], byte strides [" + std::to_string(strides[0]) +
                    ", " + std::to_string(strides[1]) + ", " + std::to_string(strides[2]) + "], box [64, " +
                    std::to_string(box_rows) + ", " + std::to_string(box_heads) + ", 1]");
  }
  Entry& e = cache[next];
  e.data = t.data;
  e.type = type;
  std::copy(dims, dims + 4, e.dims);
  std::copy(strides, strides + 3, e.strides);
  std::copy(box, box + 4, e.box);
  e.map = map;
  next = (next + 1) % kEntries;
  used = std::max(used, next == 0 ? kEntries : next);
  return map;
}

CUtensorMap q_side_map(const TensorRef& t, const AttentionShape& s, int columns, int box_rows, int box_heads,
                       const char* what) {
  return tensor_map(t, s.dtype, columns, s.q_len, s.heads, s.batch, box_rows, box_heads, what);
}
CUtensorMap kv_side_map(const TensorRef& t, const AttentionShape& s, int columns, int box_rows, const char* what) {
  return tensor_map(t, s.dtype, columns, s.kv_len, s.kv_heads, s.batch, box_rows, 1, what);
}
CUtensorMap consumer_rows_map(const TensorRef& t, const AttentionShape& s, int columns, const TileShape& tile,
                              const char* what) {
  return q_side_map(t, s, columns, std::min(tile.block_m, 64), std::max(1, 64 / tile.block_m), what);
}

int* fwd_item_counter(const FwdParams& params, int64_t ctas) {
  auto* base = params.schedule.items ? reinterpret_cast<unsigned char*>(params.schedule.items)
                                     : static_cast<unsigned char*>(params.scratch);
  return reinterpret_cast<int*>(base + tiling::align_scratch(ctas * tiling::kWorkItemBytes));
}

uint64_t* fwd_mask_bits(const FwdParams& params) {
  const AttentionShape& s = params.shape;
  if (tiling::fwd_mask_bits_bytes(s.heads, s.kv_heads, params.blocks.num_q_blocks, params.kernel) == 0) return nullptr;
  auto* base = params.schedule.items ? reinterpret_cast<unsigned char*>(params.schedule.items)
                                     : static_cast<unsigned char*>(params.scratch);
  return reinterpret_cast<uint64_t*>(
      base + tiling::fwd_mask_bits_offset(s.batch, s.heads, s.kv_heads, params.blocks.num_q_blocks, params.kernel));
}

}  // namespace launch

namespace {

using launch::require_supported;
using launch::tile_shape;

std::string describe_tile(const char* name, const TileShape& tile) {
  return std::string(name) + " " + std::to_string(tile.rows) + "x" + std::to_string(tile.block_n) + " (" +
         std::to_string(tile.heads_packed) + " heads x " + std::to_string(tile.block_m) + " q)";
}

//! What a wgmma forward configuration does, from its constants.
template <class Cfg>
std::string describe_wgmma_fwd() {
  std::string text = " TMA producer + " + std::to_string(Cfg::kConsumers) + " wgmma consumer warpgroup" +
                     (Cfg::kConsumers > 1 ? "s" : "");
  if (Cfg::kOverlap) {
    text += std::string(Cfg::kConsumers > 1 ? " in ping-pong" : "") + ", P V issued with the next S, K and V released apart";
  }
  text += ", K/V ring x" + std::to_string(Cfg::kStages);
  if (Cfg::kMinBlocksPerSm > 1) text += ", " + std::to_string(Cfg::kMinBlocksPerSm) + " CTAs/SM";
  if (Cfg::kPersistent) text += std::string(Cfg::kOwnO ? ", O tile of its own" : "") + ", persistent CTAs";
  return text + ", longest first";
}

//! The head dims and element type of a shape, as the dispatch record names them ("bf16 hd128",
//! "fp16 hd192/128"; with the instantiation where the dims are padded: "bf16 hd80 (runs hd128,
//! sums over 96)", "bf16 hd112 (runs hd128)").
std::string dims_text(const AttentionShape& shape) {
  const int qk = shape.head_dim, v = value_head_dim_of(shape);
  std::string text = std::string(element_type_label(shape.dtype)) + " hd" + std::to_string(qk) +
                     (v != qk ? "/" + std::to_string(v) : "");
  if (padded_head_dim(qk) != qk || padded_head_dim(v) != v) {
    text += " (runs hd" + std::to_string(padded_head_dim(qk)) +
            (padded_head_dim(v) != padded_head_dim(qk) ? "/" + std::to_string(padded_head_dim(v)) : "") +
            (sums_96_columns(qk, v) ? ", sums over " + std::to_string(kSumDim96) : "") + ")";
  }
  return text;
}

}  // namespace

bool shape_supported(const AttentionShape& shape) {
  return head_dims_have_kernels(shape.head_dim, value_head_dim_of(shape)) &&
         (shape.dtype == ElementType::bf16 || shape.dtype == ElementType::fp16);
}

std::string unsupported_shape_reason(const AttentionShape& shape) {
  if (shape_supported(shape)) return "";
  return "fused_cuda attention: head dims " + std::to_string(shape.head_dim) + "/" + std::to_string(value_head_dim_of(shape)) +
         " (q·k/v) " + element_type_label(shape.dtype) + " have no kernel; the kernels take " + kSupportedHeadDimsText;
}

size_t fwd_scratch_bytes(const AttentionShape& shape, const BlockListParams& blocks, FwdKernel kernel) {
  require_supported(shape);
  return static_cast<size_t>(tiling::fwd_scratch_bytes(shape.batch, shape.heads, shape.kv_heads, blocks.num_q_blocks, kernel));
}

const std::vector<FwdKernel>& fwd_kernels() {
  static const std::vector<FwdKernel> kernels(std::begin(kFwdKernels), std::end(kFwdKernels));
  return kernels;
}

std::vector<FwdKernel> fwd_candidates(const AttentionShape& shape) {
  std::vector<FwdKernel> kernels;
  if (!shape_supported(shape)) return kernels;
  for (const FwdKernel kernel : kFwdKernels) {
    if (fwd_kernel_supports(kernel, shape.head_dim, value_head_dim_of(shape))) kernels.push_back(kernel);
  }
  return kernels;
}

const char* fwd_kernel_name(FwdKernel kernel) { return fwd_kernel_label(kernel); }

bool parse_fwd_kernel(const std::string& name, FwdKernel* kernel) {
  return kernel_from_label(name, kFwdKernels, fwd_kernel_label, kernel);
}

FwdKernel default_fwd_kernel(const AttentionShape& shape) {
  require_supported(shape);
  const std::vector<FwdKernel> kernels = fwd_candidates(shape);
  if (kernels.empty()) throw UnsupportedConfig(unsupported_shape_reason(shape));
  return kernels.front();
}

size_t bwd_scratch_bytes(const AttentionShape& shape, const BlockListParams& dq_blocks, const BlockListParams& dkdv_blocks,
                         BwdKernel kernel) {
  require_supported(shape);
  return static_cast<size_t>(launch::bwd_layout(shape, dq_blocks, dkdv_blocks, kernel).bytes);
}

size_t fwd_schedule_bytes(const AttentionShape& shape, const BlockListParams& blocks, FwdKernel kernel) {
  return fwd_scratch_bytes(shape, blocks, kernel);  // the forward's scratch is its schedule
}

size_t bwd_schedule_bytes(const AttentionShape& shape, const BlockListParams& dq_blocks, const BlockListParams& dkdv_blocks,
                          BwdKernel kernel) {
  require_supported(shape);
  return static_cast<size_t>(launch::bwd_layout(shape, dq_blocks, dkdv_blocks, kernel).kept_bytes);
}

TileShape fwd_tile_shape(const AttentionShape& shape, FwdKernel kernel) {
  require_supported(shape);
  static_assert(fwd_kernel_tiling(FwdKernel::mma_m128_n64).rows == FwdConfig<HeadDims<128, 128, ElementType::bf16>>::kBlockM &&
                    fwd_kernel_tiling(FwdKernel::mma_m128_n64).block_n ==
                        FwdConfig<HeadDims<128, 128, ElementType::bf16>>::kBlockN,
                "the tiling table matches the mma.sync forward's config");
  return tile_shape(tiling::fwd_tile(shape.heads, shape.kv_heads, kernel));
}

TileShape bwd_dq_tile_shape(const AttentionShape& shape) {
  require_supported(shape);
  return tile_shape(tiling::bwd_dq_tile(shape.heads, shape.kv_heads, shape.head_dim));
}

TileShape bwd_dkdv_tile_shape(const AttentionShape& shape) {
  require_supported(shape);
  return tile_shape(tiling::bwd_dkdv_tile(shape.heads, shape.kv_heads, shape.head_dim));
}

std::string describe_fwd_config(const AttentionShape& shape, FwdKernel kernel) {
  std::string text = describe_tile((std::string("fwd ") + fwd_kernel_name(kernel) + ":").c_str(), fwd_tile_shape(shape, kernel));
  text += " " + dims_text(shape);
  if (kernel == FwdKernel::mma_m128_n64) {
    return text + " warps=" + std::to_string(FwdConfig<HeadDims<128, 128, ElementType::bf16>>::kWarps) +
           " mma.sync.m16n8k16 cp.async x2, longest first";
  }
  bool configured = false;
  with_head_dims(shape.head_dim, value_head_dim_of(shape), shape.dtype, [&](auto dims) {
    configured = with_wgmma_fwd_config<decltype(dims)>(
        kernel, [&](auto wgmma) { text += describe_wgmma_fwd<typename decltype(wgmma)::Config>(); });
  });
  if (!configured) return text + " (no configuration at these head dims)";
  if (fwd_kernel_schedule_order(kernel) == ScheduleOrder::kv_head) text += ", kv head by kv head";
  return text;
}

std::string describe_bwd_config(const AttentionShape& shape, BwdKernel kernel) {
  const std::string dims = " " + dims_text(shape) + ",";
  const std::string tiles = std::string("bwd ") + bwd_kernel_name(kernel) + ": " + describe_tile("dkdv", bwd_dkdv_tile_shape(shape)) +
                            " + " + describe_tile("dq", bwd_dq_tile_shape(shape)) + dims + " in one launch, longest first, ";
  if (kernel == BwdKernel::mma) return tiles + "warps=8 mma.sync, deterministic (no atomics)";
  if (!bwd_kernel_deterministic(kernel)) {
    const TileShape dkdv = bwd_dkdv_tile_shape(shape);
    const int64_t splits = bwd_dkdv_splits(shape, kernel);
    const std::string per_block =
        splits > 1 ? " per kv block split over " + std::to_string(splits) +
                         " CTAs (the GQA group's head packs shared out), dK/dV in fp32 by bulk reduce-add"
                   : " per kv block over the GQA group";
    return std::string("bwd ") + bwd_kernel_name(kernel) + ": " + describe_tile("dkdv", dkdv) + dims + per_block +
           ", 5 GEMMs per step, longest first, TMA producer + 2 wgmma consumer warpgroups, ring x2, dQ in fp32 by bulk "
           "reduce-add + convert; NOT deterministic (" +
           (splits > 1 ? "dQ, dK and dV summation order)" : "dQ summation order)");
  }
  const std::string split =
      bwd_splits_columns(shape.head_dim) ? "the consumers share the tiles' rows and split their 64-column blocks, " : "";
  return tiles + "TMA producer + 2 wgmma consumer warpgroups, " + split + "ring x2, deterministic (no atomics)";
}

const std::vector<BwdKernel>& bwd_kernels() {
  static const std::vector<BwdKernel> kernels(std::begin(kBwdKernels), std::end(kBwdKernels));
  return kernels;
}

const std::vector<BwdKernel>& deterministic_bwd_kernels() {
  static const std::vector<BwdKernel> kernels(std::begin(kDeterministicBwdKernels), std::end(kDeterministicBwdKernels));
  return kernels;
}

std::vector<BwdKernel> bwd_candidates(const AttentionShape& shape, bool deterministic) {
  std::vector<BwdKernel> kernels;
  if (!shape_supported(shape)) return kernels;
  for (const BwdKernel kernel : deterministic ? deterministic_bwd_kernels() : bwd_kernels()) {
    if (bwd_kernel_supports(kernel, shape.head_dim, value_head_dim_of(shape))) kernels.push_back(kernel);
  }
  return kernels;
}

bool bwd_kernel_is_deterministic(BwdKernel kernel) { return bwd_kernel_deterministic(kernel); }

int64_t bwd_dkdv_splits(const AttentionShape& shape, BwdKernel kernel) {
  if (bwd_kernel_deterministic(kernel)) return 1;
  const int64_t block_n = bwd_dkdv_tile_shape(shape).block_n;
  return tiling::bwd_atomic_dkdv_splits(shape.batch, shape.heads, shape.kv_heads, tiling::ceil_div(shape.kv_len, block_n));
}

BwdKernel default_bwd_kernel(const AttentionShape& shape, bool deterministic) {
  require_supported(shape);
  const std::vector<BwdKernel> kernels = bwd_candidates(shape, deterministic);
  if (kernels.empty()) throw UnsupportedConfig(unsupported_shape_reason(shape));
  return kernels.front();
}

const char* bwd_kernel_name(BwdKernel kernel) { return bwd_kernel_label(kernel); }

bool parse_bwd_kernel(const std::string& name, BwdKernel* kernel) {
  return kernel_from_label(name, kBwdKernels, bwd_kernel_label, kernel);
}

void run_attention_fwd(const FwdParams& params, cudaStream_t stream, const LaunchOptions& launch) {
  require_supported(params.shape);
  with_head_dims(params.shape.head_dim, value_head_dim_of(params.shape), params.shape.dtype,
                 [&](auto dims) { launch::fwd<decltype(dims)>(params, stream, launch); });
}

void run_attention_bwd(const BwdParams& params, cudaStream_t stream, const LaunchOptions& launch) {
  require_supported(params.shape);
  with_head_dims(params.shape.head_dim, value_head_dim_of(params.shape), params.shape.dtype,
                 [&](auto dims) { launch::bwd<decltype(dims)>(params, stream, launch); });
}

namespace device {
__global__ void hold_stream_kernel(unsigned long long nanoseconds) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
}
}  // namespace device

void hold_stream(cudaStream_t stream, unsigned microseconds) {
  device::hold_stream_kernel<<<1, 1, 0, stream>>>(1000ull * microseconds);
  check_cuda(cudaGetLastError(), "launch of hold_stream_kernel", __func__, __FILE__, __LINE__);
}

}  // namespace harness::kernels::cuda
