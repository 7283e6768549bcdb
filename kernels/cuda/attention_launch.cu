// Host launchers of the fused attention kernels: head-dim switch -> config -> grid -> launch ->
// launch check. No LibTorch here (fused_attention_cuda.cpp is the LibTorch boundary).

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/attention_config.h"
#include "kernels/cuda/attention_params.h"
#include "kernels/cuda/bwd_kernels.cuh"
#include "kernels/cuda/bwd_prep_kernel.cuh"
#include "kernels/cuda/bwd_wgmma_atomic_kernel.cuh"
#include "kernels/cuda/bwd_wgmma_kernels.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fwd_kernel.cuh"
#include "kernels/cuda/fwd_wgmma_kernel.cuh"
#include "kernels/cuda/mask_bits.cuh"
#include "kernels/cuda/tile_scheduler.cuh"
#include "kernels/cuda/tiling.h"

namespace harness::kernels::cuda {

namespace {

//! The launcher's TileShape of a tiling.h tile (one packing rule for launcher and memory model).
TileShape tile_shape(const tiling::Tile& tile) {
  return TileShape{static_cast<int32_t>(tile.rows), static_cast<int32_t>(tile.heads_packed),
                   static_cast<int32_t>(tile.block_m), static_cast<int32_t>(tile.block_n)};
}

void require_supported(const AttentionShape& shape) {
  if (!head_dim_supported(shape.head_dim)) {
    throw UnsupportedConfig("fused_cuda attention: head_dim " + std::to_string(shape.head_dim) +
                            " has no kernel (64 and 128 do)");
  }
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

//! Raises a kernel's dynamic shared memory limit to at least `bytes` on the current device: the
//! attribute sticks, so it is set only when a launch needs more than the largest set so far (a
//! kernel launched with two sizes, like the forwards with and without an O tile of their own,
//! must never have its limit lowered under the larger), and a launch costs no driver call otherwise.
template <class Kernel>
void set_smem_limit(Kernel kernel, int bytes) {
  int device = 0;
  HARNESS_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> limits;
  const auto key = std::make_pair(reinterpret_cast<const void*>(kernel), device);
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = limits.find(key);
  if (found != limits.end() && found->second >= bytes) return;
  HARNESS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  limits[key] = bytes;
}

//! Launches `kernel` as `ctas` CTAs of `threads` threads with `smem_bytes` of dynamic shared memory
//! (its limit raised first) and checks the launch; `name` goes into the error.
template <typename... KernelParams, typename... Args>
void launch_kernel(void (*kernel)(KernelParams...), const char* name, int64_t ctas, int threads, int smem_bytes,
                   cudaStream_t stream, const Args&... args) {
  set_smem_limit(kernel, smem_bytes);
  kernel<<<static_cast<unsigned>(ctas), threads, smem_bytes, stream>>>(args...);
  check_cuda(cudaGetLastError(), (std::string("launch of ") + name).c_str(), __func__, __FILE__, __LINE__);
}

//! launch_kernel for a kernel that may start before the kernel ahead of it in the stream has
//! finished (programmatic dependent launch), when `overlap` is true (LaunchOptions::programmatic
//! and the kernel's own reasons): its CTAs may be scheduled once every CTA of the kernel ahead has
//! exited (none of this folder's kernels signals earlier), before that kernel's completion is
//! signalled and its memory flushed, and wait for it with grid_dependency_wait() (device_utils.cuh)
//! before they read its results or write what it may read. What it hides: the launch latency and
//! the kernel's setup. The kernel must call grid_dependency_wait() in every thread that touches
//! global memory the kernel ahead may use, and in at least one thread of every CTA.
template <typename... KernelParams, typename... Args>
void launch_kernel_after(bool overlap, void (*kernel)(KernelParams...), const char* name, int64_t ctas, int threads,
                         int smem_bytes, cudaStream_t stream, const Args&... args) {
  if (!overlap) return launch_kernel(kernel, name, ctas, threads, smem_bytes, stream, args...);
  set_smem_limit(kernel, smem_bytes);
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(ctas));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  check_cuda(cudaLaunchKernelEx(&config, kernel, args...), (std::string("launch of ") + name).c_str(), __func__, __FILE__,
             __LINE__);
}

// ---- Scratch layout (tiling.h) -------------------------------------------------------------------

static_assert(sizeof(WorkItem) == tiling::kWorkItemBytes, "tiling.h sizes the schedule in WorkItems");
static_assert(sizeof(float2) == tiling::kRowStatBytes, "tiling.h sizes the row statistics as float2");
static_assert(sizeof(device::QueryMaskRow) == tiling::kQueryMaskRowBytes, "tiling.h sizes the mask rows");

tiling::BwdScratch bwd_layout(const AttentionShape& shape, const BlockListParams& dq_blocks,
                              const BlockListParams& dkdv_blocks, BwdKernel kernel) {
  // wgmma_atomic also needs its fp32 dQ accumulator [B, H, q_pad, D] (tiling::bwd_scratch).
  return tiling::bwd_scratch(shape.batch, shape.heads, shape.kv_heads, shape.q_len, dq_blocks.num_q_blocks,
                             dkdv_blocks.num_kv_blocks, bwd_kernel_deterministic(kernel) ? 0 : shape.head_dim);
}

void check_scratch(const void* scratch, size_t have, size_t need, const char* what) {
  if (need > 0 && (scratch == nullptr || have < need)) {
    throw UnsupportedConfig(std::string("fused_cuda attention: ") + what + " scratch of " + std::to_string(have) +
                            " bytes, needs " + std::to_string(need));
  }
}

// ---- Tensor maps (TMA) ----------------------------------------------------------------------------

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

//! 4-D map (head dim, rows, heads, batch) of a bf16 [B, heads, rows, D] tensor with boxes of 64
//! columns x box_rows rows x box_heads heads, 128-byte swizzle (the wgmma operand layout, see
//! hopper_utils.cuh). Out-of-bounds rows load as zeros and are not stored.
CUtensorMap tensor_map(const TensorRef& t, int head_dim, int rows, int heads, int batch, int box_rows, int box_heads,
                       const char* what) {
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(std::max(rows, 1)),
                              static_cast<cuuint64_t>(std::max(heads, 1)), static_cast<cuuint64_t>(std::max(batch, 1))};
  cuuint64_t strides[3] = {static_cast<cuuint64_t>(t.stride_row) * 2, static_cast<cuuint64_t>(t.stride_head) * 2,
                           static_cast<cuuint64_t>(t.stride_batch) * 2};
  // A dimension of size 1 is never stepped over, but TMA still rejects a zero (broadcast) stride.
  for (int i = 0; i < 3; ++i) {
    if (dims[i + 1] == 1 || strides[i] == 0) strides[i] = i == 0 ? dims[0] * 2 : strides[i - 1] * dims[i];
  }
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_rows), static_cast<cuuint32_t>(box_heads), 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  // A training loop passes the same tensors (the caching allocator hands the same addresses back)
  // with the same shapes on every step: the last maps encoded are kept, keyed by everything that
  // goes into them (a map is a pure function of these). One cache for the process (the backward
  // runs on autograd's threads, the forward on the caller's), behind a mutex.
  struct Entry {
    const void* data;
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
    if (e.data == t.data && std::equal(dims, dims + 4, e.dims) && std::equal(strides, strides + 3, e.strides) &&
        std::equal(box, box + 4, e.box))
      return e.map;
  }
  CUtensorMap map;
  const CUresult status = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, t.data, dims, strides, box,
                                               element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status == CUDA_SUCCESS) {
    Entry& e = cache[next];
    e.data = t.data;
    std::copy(dims, dims + 4, e.dims);
    std::copy(strides, strides + 3, e.strides);
    std::copy(box, box + 4, e.box);
    e.map = map;
    next = (next + 1) % kEntries;
    used = std::max(used, next == 0 ? kEntries : next);
  }
  if (status != CUDA_SUCCESS) {
    throw CudaError(std::string("fused_cuda attention: cuTensorMapEncodeTiled failed (CUresult ") + std::to_string(status) +
                    ") for " + what + ": dims [" + std::to_string(dims[0]) + ", " + std::to_string(dims[1]) + ", " +
                    std::to_string(dims[2]) + ", " + std::to_string(dims[3]) + "], byte strides [" + std::to_string(strides[0]) +
                    ", " + std::to_string(strides[1]) + ", " + std::to_string(strides[2]) + "], box [64, " +
                    std::to_string(box_rows) + ", " + std::to_string(box_heads) + ", 1]");
  }
  return map;
}

//! Maps of the three tensor families: q-side [B, H, Q_LEN, D] with boxes of box_heads x box_rows
//! packed rows, kv-side [B, H_KV, KV_LEN, D] with boxes of box_rows keys, and the box one consumer
//! warpgroup stores (its 64 packed rows of a q-side tile, see store_consumer_rows).
CUtensorMap q_side_map(const TensorRef& t, const AttentionShape& s, int box_rows, int box_heads, const char* what) {
  return tensor_map(t, s.head_dim, s.q_len, s.heads, s.batch, box_rows, box_heads, what);
}
CUtensorMap kv_side_map(const TensorRef& t, const AttentionShape& s, int box_rows, const char* what) {
  return tensor_map(t, s.head_dim, s.kv_len, s.kv_heads, s.batch, box_rows, 1, what);
}
CUtensorMap consumer_rows_map(const TensorRef& t, const AttentionShape& s, const TileShape& tile, const char* what) {
  return q_side_map(t, s, std::min(tile.block_m, 64), std::max(1, 64 / tile.block_m), what);
}

// ---- Launches ------------------------------------------------------------------------------------

template <class Cfg>
void launch_fwd_mma(const FwdParams& params, const WorkItem* schedule, int64_t ctas, cudaStream_t stream) {
  launch_kernel(device::attention_fwd_kernel<Cfg>, "attention_fwd_kernel", ctas, Cfg::kThreads, Cfg::kSmemBytes, stream,
                params, schedule);
}

//! The persistent forwards' work item counter: after the schedule (tiling::fwd_scratch_bytes), in
//! the kept schedule's buffer if there is one, else in the scratch.
int* fwd_item_counter(const FwdParams& params, int64_t ctas) {
  auto* base = params.schedule.items ? reinterpret_cast<unsigned char*>(params.schedule.items)
                                     : static_cast<unsigned char*>(params.scratch);
  return reinterpret_cast<int*>(base + tiling::align_scratch(ctas * tiling::kWorkItemBytes));
}

//! The forward's mask bit table (tiling::fwd_mask_bits_offset), with the kept schedule if there is
//! one, else in the scratch; null for a kernel that reads none.
uint64_t* fwd_mask_bits(const FwdParams& params) {
  const AttentionShape& s = params.shape;
  if (tiling::fwd_mask_bits_bytes(s.heads, s.kv_heads, params.blocks.num_q_blocks, params.kernel) == 0) return nullptr;
  auto* base = params.schedule.items ? reinterpret_cast<unsigned char*>(params.schedule.items)
                                     : static_cast<unsigned char*>(params.scratch);
  return reinterpret_cast<uint64_t*>(
      base + tiling::fwd_mask_bits_offset(s.batch, s.heads, s.kv_heads, params.blocks.num_q_blocks, params.kernel));
}

//! Launches one of mask_bits.cuh's table kernels: one thread per entry, grid-strided past 4096 CTAs.
template <typename Bits>
void launch_mask_bits_kernel(void (*kernel)(MaskParams, BlockListParams, Bits*), const char* name, int64_t entries,
                             const MaskParams& mask, const BlockListParams& blocks, Bits* bits, cudaStream_t stream) {
  constexpr int kThreads = 256;
  launch_kernel(kernel, name, std::min<int64_t>(tiling::ceil_div(entries, kThreads), 4096), kThreads, 0, stream, mask, blocks,
                bits);
}

//! Fills the row bit table of a blocks' tiling (the forward's format, mask_bits.cuh).
void launch_row_bits(const MaskParams& mask, const BlockListParams& blocks, uint64_t* bits, cudaStream_t stream) {
  launch_mask_bits_kernel(device::build_fwd_mask_bits_kernel, "build_fwd_mask_bits_kernel",
                          tiling::mask_bit_words(blocks.num_q_blocks, blocks.block_m, blocks.block_n), mask, blocks, bits, stream);
}

template <class Cfg>
void launch_fwd_wgmma(const FwdParams& params, const TileShape& tile, const WorkItem* schedule, int64_t ctas,
                      cudaStream_t stream, const LaunchOptions& launch) {
  static_assert(Cfg::kBlockM == 64 || Cfg::kBlockM == 128, "one or two warpgroups of 64 rows");
  if (tile.rows != Cfg::kBlockM || tile.block_n != Cfg::kBlockN) {
    throw UnsupportedConfig("fused_cuda attention: forward tiling " + std::to_string(tile.rows) + "x" +
                            std::to_string(tile.block_n) + " does not match its kernel's " + std::to_string(Cfg::kBlockM) +
                            "x" + std::to_string(Cfg::kBlockN));
  }
  const AttentionShape& s = params.shape;
  device::FwdTensorMaps maps;
  maps.q = q_side_map(params.q, s, tile.block_m, tile.heads_packed, "q");
  maps.k = kv_side_map(params.k, s, Cfg::kBlockN, "k");
  maps.v = kv_side_map(params.v, s, Cfg::kBlockN, "v");
  maps.o = consumer_rows_map(params.o, s, tile, "o");
  // Persistent: as many CTAs as fit at once, each taking the next work item from a counter after
  // the schedule when done with one. The kernel leaves the counter at 0, so one kept with the
  // schedule (zeroed by launch_fwd when it built the schedule) needs no memset launch; one in the
  // scratch is zeroed here.
  const int64_t grid = scheduling::fwd_grid(ctas, Cfg::kMinBlocksPerSm, Cfg::kPersistent, params.max_ctas);
  int* counter = nullptr;
  if (grid < ctas) {
    counter = fwd_item_counter(params, ctas);
    if (params.schedule.items == nullptr) HARNESS_CUDA_CHECK(cudaMemsetAsync(counter, 0, sizeof(int), stream));
  }
  // O in its own tile and Q in two buffers only for persistent CTAs (a CTA with one item has no
  // next Q to load early).
  // H200, session 10, persistent, dflash 512 anchors: wgmma_m128_n64 0.385 -> 0.374 ms with the O tile
  // (the second Q buffer, session 11: no change measured).
  const bool own_o = Cfg::kOwnO && counter != nullptr;
  // Overlaps the kernel ahead (programmatic launch; the kernel waits for it before it reads or
  // writes global memory) unless that is the schedule's kernel or the counter's memset.
  launch_kernel_after(params.schedule.built() && launch.programmatic, device::attention_fwd_wgmma_kernel<Cfg>,
                      "attention_fwd_wgmma_kernel", grid, Cfg::kThreads, Cfg::kSmemBytes + (own_o ? 2 * Cfg::kQBytes : 0), stream,
                      params, maps, schedule, static_cast<int>(ctas), counter, own_o,
                      static_cast<const uint64_t*>(fwd_mask_bits(params)));
}

//! A wgmma forward kernel and its configuration; the tiling table the host sizes BlockMasks and
//! scratch with (fwd_kernel_tiling, attention_config.h) must agree with the configuration.
template <FwdKernel kKernel, class Cfg>
struct WgmmaFwd {
  using Config = Cfg;
  static_assert(fwd_kernel_tiling(kKernel).rows == Cfg::kBlockM && fwd_kernel_tiling(kKernel).block_n == Cfg::kBlockN,
                "the tiling table matches the kernel's configuration");
};

//! Calls f(WgmmaFwd<kernel, its FwdWgmmaConfig>{}) for a wgmma forward kernel and returns true;
//! false for any other (the mma.sync forward). The one place a kernel's configuration is named:
//! launch_fwd launches it, describe_fwd_config describes it.
template <int kHeadDim, typename F>
bool with_wgmma_fwd_config(FwdKernel kernel, F&& f) {
  switch (kernel) {
    case FwdKernel::wgmma_m128_n128:
      f(WgmmaFwd<FwdKernel::wgmma_m128_n128, FwdWgmmaConfig<kHeadDim, 128, 2, 2, 1>>{});
      return true;
    case FwdKernel::wgmma_m128_n64:
      f(WgmmaFwd<FwdKernel::wgmma_m128_n64, FwdWgmmaConfig<kHeadDim, 64, 2, 3, 1>>{});
      return true;
    case FwdKernel::wgmma_m64_n64:
      f(WgmmaFwd<FwdKernel::wgmma_m64_n64, FwdWgmmaConfig<kHeadDim, 64, 1, 2, 2>>{});
      return true;
    case FwdKernel::wgmma_m128_n128_pingpong:
      f(WgmmaFwd<FwdKernel::wgmma_m128_n128_pingpong, FwdWgmmaConfig<kHeadDim, 128, 2, 3, 1, true>>{});
      return true;
    case FwdKernel::wgmma_m64_n64_overlap:
      f(WgmmaFwd<FwdKernel::wgmma_m64_n64_overlap, FwdWgmmaConfig<kHeadDim, 64, 1, 2, 2, true>>{});
      return true;
    case FwdKernel::wgmma_m64_n128_overlap:
      f(WgmmaFwd<FwdKernel::wgmma_m64_n128_overlap, FwdWgmmaConfig<kHeadDim, 128, 1, 2, kHeadDim == 64 ? 2 : 1, true>>{});
      return true;
    case FwdKernel::wgmma_m64_n64_overlap_kv_major:  // the same kernels, their CTA tables kv head by kv head
    case FwdKernel::wgmma_m128_n128_pingpong_kv_major:
    case FwdKernel::wgmma_m64_n128_overlap_kv_major:
      return with_wgmma_fwd_config<kHeadDim>(fwd_kernel_base(kernel), std::forward<F>(f));
    case FwdKernel::mma_m128_n64:
      return false;
  }
  return false;
}

template <int kHeadDim>
void launch_fwd(const FwdParams& params, cudaStream_t stream, const LaunchOptions& launch) {
  const TileShape tile = fwd_tile_shape(params.shape, params.kernel);
  check_blocks(params.blocks, tile, "forward");
  const int64_t ctas = tiling::fwd_ctas(params.shape.batch, params.shape.heads, params.shape.kv_heads,
                                        params.blocks.num_q_blocks, params.kernel);
  if (ctas == 0) return;
  check_scratch(params.scratch, params.scratch_bytes, fwd_scratch_bytes(params.shape, params.blocks, params.kernel), "forward");
  WorkItem* schedule = params.schedule.items ? params.schedule.items : static_cast<WorkItem*>(params.scratch);
  if (!params.schedule.built()) {
    scheduling::launch_schedule(device::WorkClass{}, scheduling::fwd_items(params.blocks, ctas), params.shape,
                                fwd_kernel_schedule_order(params.kernel), launch.schedule_order, schedule, stream);
    // A kept schedule's counter: zeroed once, here; the persistent kernels leave it at 0.
    if (params.schedule.items) HARNESS_CUDA_CHECK(cudaMemsetAsync(fwd_item_counter(params, ctas), 0, sizeof(int), stream));
    // The partial blocks' mask bits, kept with the schedule (they depend on the mask and the
    // tiling only).
    if (uint64_t* bits = fwd_mask_bits(params)) launch_row_bits(params.mask, params.blocks, bits, stream);
  }
  if (params.kernel == FwdKernel::mma_m128_n64) return launch_fwd_mma<FwdConfig<kHeadDim>>(params, schedule, ctas, stream);
  const bool launched = with_wgmma_fwd_config<kHeadDim>(params.kernel, [&](auto wgmma) {
    launch_fwd_wgmma<typename decltype(wgmma)::Config>(params, tile, schedule, ctas, stream, launch);
  });
  if (!launched) {
    throw UnsupportedConfig("fused_cuda attention: unknown forward kernel " + std::to_string(static_cast<int>(params.kernel)));
  }
}

//! The atomic-dQ backward after the prep kernel: zero the fp32 dQ accumulator, rank the dK/dV
//! work items, the main kernel (all five GEMMs per step, dQ bulk-added), then dQ to bf16.
template <class Cfg>
void launch_bwd_atomic(const BwdParams& params, const TileShape& dkdv_tile, const tiling::BwdScratch& layout,
                       const device::BwdScratch& scratch, cudaStream_t stream, const LaunchOptions& launch) {
  constexpr int kHeadDim = Cfg::kHeadDim;
  using ConvertCfg = BwdDqConvertConfig<kHeadDim>;
  const AttentionShape& s = params.shape;
  // The prep kernel has zeroed the fp32 accumulator. An empty dK/dV block list contributes no CTA
  // (the self-test times the parts apart this way). The main kernel is launched plainly: launched
  // to overlap the prep kernel (griddepcontrol in its producer and reducer), it ran 1.2-1.4%
  // slower on causal-128 even where nothing overlapped (H200, Nsight Compute, session 13; PERF_NOTES
  // v11); the dQ conversion after it is launched to overlap its end.
  if (layout.dkdv_ctas > 0) {
    const int splits = static_cast<int>(layout.dkdv_splits);
    if (!params.schedule.built()) {
      scheduling::launch_schedule(scheduling::bwd_atomic_items(params, dkdv_tile, splits), device::WorkClass{}, s,
                                  ScheduleOrder::batch, launch.schedule_order, scratch.schedule, stream);
    }
    device::BwdTensorMaps maps;
    maps.q_dkdv = q_side_map(params.q, s, dkdv_tile.block_m, dkdv_tile.heads_packed, "q");
    maps.dout_dkdv = q_side_map(params.dout, s, dkdv_tile.block_m, dkdv_tile.heads_packed, "dout");
    maps.k_dkdv = kv_side_map(params.k, s, Cfg::kKeys, "k");
    maps.v_dkdv = kv_side_map(params.v, s, Cfg::kKeys, "v");
    maps.dk = kv_side_map(params.dk, s, 64, "dk");  // one consumer's 64 keys
    maps.dv = kv_side_map(params.dv, s, 64, "dv");
    launch_kernel(device::attention_bwd_atomic_kernel<Cfg>, "attention_bwd_atomic_kernel", layout.dkdv_ctas * splits,
                  Cfg::kThreads, Cfg::kSmemBytes, stream, params, maps, scratch);
  }
  // dQ's rows, then with split kv blocks dK's and dV's.
  const int64_t rows = static_cast<int64_t>(s.batch) * s.heads * s.q_len +
                       (scratch.dkdv_accum != nullptr ? 2ll * s.batch * s.kv_heads * s.kv_len : 0);
  const int64_t ctas = (rows + ConvertCfg::kRowsPerCta - 1) / ConvertCfg::kRowsPerCta;
  launch_kernel_after(launch.programmatic, device::attention_bwd_dq_convert_kernel<ConvertCfg>,
                      "attention_bwd_dq_convert_kernel", ctas, ConvertCfg::kThreads, 0, stream, params, scratch);
}

template <int kHeadDim>
void launch_bwd(const BwdParams& params, cudaStream_t stream, const LaunchOptions& launch) {
  using PrepCfg = BwdPrepConfig<kHeadDim>;
  using DqCfg = BwdDqConfig<kHeadDim>;
  using DkdvCfg = BwdDkdvConfig<kHeadDim>;
  const TileShape dq_tile = bwd_dq_tile_shape(params.shape);
  const TileShape dkdv_tile = bwd_dkdv_tile_shape(params.shape);
  check_blocks(params.dq_blocks, dq_tile, "dQ");
  check_blocks(params.dkdv_blocks, dkdv_tile, "dK/dV");
  if (params.shape.batch == 0 || params.shape.q_len == 0) return;
  const tiling::BwdScratch layout = bwd_layout(params.shape, params.dq_blocks, params.dkdv_blocks, params.kernel);
  check_scratch(params.scratch, params.scratch_bytes, layout.bytes, "backward");
  auto* base = static_cast<unsigned char*>(params.scratch);
  device::BwdScratch scratch;
  scratch.row_stats = reinterpret_cast<float2*>(base + layout.row_stats);
  scratch.mask_rows = reinterpret_cast<device::QueryMaskRow*>(base + layout.mask_rows);
  scratch.schedule = params.schedule.items ? params.schedule.items : reinterpret_cast<WorkItem*>(base + layout.schedule);
  // The key bit table follows the schedule, in the kept buffer or in the scratch alike.
  auto* kept = reinterpret_cast<unsigned char*>(scratch.schedule);
  scratch.key_bits = kept + (layout.key_bits - layout.schedule);
  scratch.row_bits = reinterpret_cast<uint64_t*>(kept + (layout.row_bits - layout.schedule));
  scratch.q_pad = static_cast<int>(tiling::padded_q_len(params.shape.q_len));
  scratch.dq_accum = layout.dq_accum_bytes ? reinterpret_cast<float*>(base + layout.dq_accum) : nullptr;
  scratch.dkdv_accum = layout.dkdv_accum_bytes ? reinterpret_cast<float*>(base + layout.dkdv_accum) : nullptr;
  scratch.kv_pad = params.dkdv_blocks.num_kv_blocks * dkdv_tile.block_n;
  scratch.dkdv_splits = static_cast<int32_t>(layout.dkdv_splits);

  const int64_t rows = static_cast<int64_t>(params.shape.batch) * params.shape.heads * scratch.q_pad;
  const int64_t prep_ctas = (rows + PrepCfg::kRowsPerCta - 1) / PrepCfg::kRowsPerCta;
  launch_kernel_after(launch.programmatic, device::attention_bwd_prep_kernel<PrepCfg>, "attention_bwd_prep_kernel",
                      prep_ctas, PrepCfg::kThreads, 0, stream, params, scratch);
  // The partial steps' mask bits (mask_bits.cuh), kept with the schedule like it: the dK/dV
  // kernels' and the deterministic dQ tile's. Built whatever the kernel, since the merged schedule's
  // buffer is shared by wgmma and mma (mma reads no table, but whichever of the two builds the
  // schedule first must leave the tables for the other).
  if (!params.schedule.built() && params.dkdv_blocks.num_kv_blocks > 0) {
    launch_mask_bits_kernel(device::build_bwd_key_bits_kernel, "build_bwd_key_bits_kernel",
                            params.dkdv_blocks.num_kv_blocks * tiling::kBwdMaskBitSlots * params.dkdv_blocks.block_n, params.mask,
                            params.dkdv_blocks, scratch.key_bits, stream);
  }
  if (!params.schedule.built() && params.kernel != BwdKernel::wgmma_atomic && params.dq_blocks.num_q_blocks > 0) {
    launch_row_bits(params.mask, params.dq_blocks, scratch.row_bits, stream);
  }

  if (params.kernel == BwdKernel::wgmma_atomic) {
    return launch_bwd_atomic<BwdWgmmaAtomicConfig<kHeadDim, 2>>(params, dkdv_tile, layout, scratch, stream, launch);
  }
  // An empty block list contributes no CTA (the self-test times the two kinds apart this way).
  const int64_t ctas = layout.dkdv_ctas + layout.dq_ctas;
  if (ctas == 0) return;
  if (!params.schedule.built()) {
    scheduling::launch_schedule(scheduling::bwd_dkdv_items(params, dkdv_tile), scheduling::bwd_dq_items(params, dq_tile),
                                params.shape, ScheduleOrder::batch, launch.schedule_order, scratch.schedule, stream);
  }

  if (params.kernel == BwdKernel::mma) {
    return launch_kernel(device::attention_bwd_kernel<DkdvCfg, DqCfg>, "attention_bwd_kernel", ctas, DkdvCfg::kThreads,
                         kBwdSmemBytes<kHeadDim>, stream, params, scratch);
  }
  using Cfg = BwdWgmmaConfig<kHeadDim, 2>;
  const AttentionShape& s = params.shape;
  device::BwdTensorMaps maps;
  maps.q_dkdv = q_side_map(params.q, s, dkdv_tile.block_m, dkdv_tile.heads_packed, "q");
  maps.dout_dkdv = q_side_map(params.dout, s, dkdv_tile.block_m, dkdv_tile.heads_packed, "dout");
  maps.k_dkdv = kv_side_map(params.k, s, Cfg::kDkdvKeys, "k");
  maps.v_dkdv = kv_side_map(params.v, s, Cfg::kDkdvKeys, "v");
  maps.dk = kv_side_map(params.dk, s, 64, "dk");  // one consumer's 64 keys
  maps.dv = kv_side_map(params.dv, s, 64, "dv");
  maps.q_dq = q_side_map(params.q, s, dq_tile.block_m, dq_tile.heads_packed, "q");
  maps.dout_dq = q_side_map(params.dout, s, dq_tile.block_m, dq_tile.heads_packed, "dout");
  maps.k_dq = kv_side_map(params.k, s, Cfg::kDqBlockN, "k");
  maps.v_dq = kv_side_map(params.v, s, Cfg::kDqBlockN, "v");
  maps.dq = consumer_rows_map(params.dq, s, dq_tile, "dq");
  launch_kernel(device::attention_bwd_wgmma_kernel<Cfg>, "attention_bwd_wgmma_kernel", ctas, Cfg::kThreads, Cfg::kSmemBytes,
                stream, params, maps, scratch);
}

std::string describe_tile(const char* name, const TileShape& tile) {
  return std::string(name) + " " + std::to_string(tile.rows) + "x" + std::to_string(tile.block_n) + " (" +
         std::to_string(tile.heads_packed) + " heads x " + std::to_string(tile.block_m) + " q)";
}

}  // namespace

bool head_dim_supported(int head_dim) { return head_dim == 64 || head_dim == 128; }

size_t fwd_scratch_bytes(const AttentionShape& shape, const BlockListParams& blocks, FwdKernel kernel) {
  require_supported(shape);
  return static_cast<size_t>(tiling::fwd_scratch_bytes(shape.batch, shape.heads, shape.kv_heads, blocks.num_q_blocks, kernel));
}

const std::vector<FwdKernel>& fwd_kernels() {
  static const std::vector<FwdKernel> kernels(std::begin(kFwdKernels), std::end(kFwdKernels));
  return kernels;
}

const char* fwd_kernel_name(FwdKernel kernel) { return fwd_kernel_label(kernel); }

bool parse_fwd_kernel(const std::string& name, FwdKernel* kernel) {
  return kernel_from_label(name, kFwdKernels, fwd_kernel_label, kernel);
}

FwdKernel default_fwd_kernel(const AttentionShape& shape) {
  require_supported(shape);
  return kDefaultFwdKernel;
}

size_t bwd_scratch_bytes(const AttentionShape& shape, const BlockListParams& dq_blocks, const BlockListParams& dkdv_blocks,
                         BwdKernel kernel) {
  return static_cast<size_t>(bwd_layout(shape, dq_blocks, dkdv_blocks, kernel).bytes);
}

size_t fwd_schedule_bytes(const AttentionShape& shape, const BlockListParams& blocks, FwdKernel kernel) {
  return fwd_scratch_bytes(shape, blocks, kernel);  // the forward's scratch is its schedule
}

size_t bwd_schedule_bytes(const AttentionShape& shape, const BlockListParams& dq_blocks, const BlockListParams& dkdv_blocks,
                          BwdKernel kernel) {
  require_supported(shape);
  return static_cast<size_t>(bwd_layout(shape, dq_blocks, dkdv_blocks, kernel).kept_bytes);
}

TileShape fwd_tile_shape(const AttentionShape& shape, FwdKernel kernel) {
  require_supported(shape);
  static_assert(FwdConfig<64>::kBlockM == FwdConfig<128>::kBlockM && FwdConfig<64>::kBlockN == FwdConfig<128>::kBlockN,
                "one forward tiling for both head dims");
  static_assert(fwd_kernel_tiling(FwdKernel::mma_m128_n64).rows == FwdConfig<128>::kBlockM &&
                    fwd_kernel_tiling(FwdKernel::mma_m128_n64).block_n == FwdConfig<128>::kBlockN,
                "the tiling table matches the mma.sync forward's config");
  return tile_shape(tiling::fwd_tile(shape.heads, shape.kv_heads, kernel));
}

TileShape bwd_dq_tile_shape(const AttentionShape& shape) {
  require_supported(shape);
  return tile_shape(tiling::bwd_dq_tile(shape.heads, shape.kv_heads));
}

TileShape bwd_dkdv_tile_shape(const AttentionShape& shape) {
  require_supported(shape);
  return tile_shape(tiling::bwd_dkdv_tile(shape.heads, shape.kv_heads));
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

std::string describe_fwd_config(const AttentionShape& shape, FwdKernel kernel) {
  std::string text = describe_tile((std::string("fwd ") + fwd_kernel_name(kernel) + ":").c_str(), fwd_tile_shape(shape, kernel));
  if (kernel == FwdKernel::mma_m128_n64) {
    return text + " warps=" + std::to_string(FwdConfig<128>::kWarps) + " mma.sync.m16n8k16.bf16 cp.async x2, longest first";
  }
  auto describe = [&](auto wgmma) { text += describe_wgmma_fwd<typename decltype(wgmma)::Config>(); };
  if (shape.head_dim == 64) {
    with_wgmma_fwd_config<64>(kernel, describe);
  } else {
    with_wgmma_fwd_config<128>(kernel, describe);
  }
  if (fwd_kernel_schedule_order(kernel) == ScheduleOrder::kv_head) text += ", kv head by kv head";
  return text;
}

std::string describe_bwd_config(const AttentionShape& shape, BwdKernel kernel) {
  const std::string tiles = std::string("bwd ") + bwd_kernel_name(kernel) + ": " + describe_tile("dkdv", bwd_dkdv_tile_shape(shape)) +
                            " + " + describe_tile("dq", bwd_dq_tile_shape(shape)) + " in one launch, longest first, ";
  if (kernel == BwdKernel::mma) return tiles + "warps=8 mma.sync, deterministic (no atomics)";
  if (!bwd_kernel_deterministic(kernel)) {
    const TileShape dkdv = bwd_dkdv_tile_shape(shape);
    const int64_t splits = bwd_dkdv_splits(shape, kernel);
    const std::string per_block =
        splits > 1 ? " per kv block split over " + std::to_string(splits) +
                         " CTAs (the GQA group's head packs shared out), dK/dV in fp32 by bulk reduce-add"
                   : " per kv block over the GQA group";
    return std::string("bwd ") + bwd_kernel_name(kernel) + ": " + describe_tile("dkdv", dkdv) + per_block +
           ", 5 GEMMs per step, longest first, TMA producer + 2 wgmma consumer warpgroups, ring x2, dQ in fp32 by bulk "
           "reduce-add + convert; NOT deterministic (" +
           (splits > 1 ? "dQ, dK and dV summation order)" : "dQ summation order)");
  }
  return tiles + "TMA producer + 2 wgmma consumer warpgroups, ring x2, deterministic (no atomics)";
}

const std::vector<BwdKernel>& bwd_kernels() {
  static const std::vector<BwdKernel> kernels(std::begin(kBwdKernels), std::end(kBwdKernels));
  return kernels;
}

const std::vector<BwdKernel>& deterministic_bwd_kernels() {
  static const std::vector<BwdKernel> kernels(std::begin(kDeterministicBwdKernels), std::end(kDeterministicBwdKernels));
  return kernels;
}

bool bwd_kernel_is_deterministic(BwdKernel kernel) { return bwd_kernel_deterministic(kernel); }

int64_t bwd_dkdv_splits(const AttentionShape& shape, BwdKernel kernel) {
  if (bwd_kernel_deterministic(kernel)) return 1;
  const int64_t block_n = bwd_dkdv_tile_shape(shape).block_n;
  return tiling::bwd_atomic_dkdv_splits(shape.batch, shape.heads, shape.kv_heads, tiling::ceil_div(shape.kv_len, block_n));
}

BwdKernel default_bwd_kernel(bool deterministic) {
  return deterministic ? kDefaultDeterministicBwdKernel : kDefaultBwdKernel;
}

const char* bwd_kernel_name(BwdKernel kernel) { return bwd_kernel_label(kernel); }

bool parse_bwd_kernel(const std::string& name, BwdKernel* kernel) {
  return kernel_from_label(name, kBwdKernels, bwd_kernel_label, kernel);
}

void run_attention_fwd(const FwdParams& params, cudaStream_t stream, const LaunchOptions& launch) {
  require_supported(params.shape);
  switch (params.shape.head_dim) {
    case 64: return launch_fwd<64>(params, stream, launch);
    case 128: return launch_fwd<128>(params, stream, launch);
  }
  throw UnsupportedConfig("fused_cuda attention: head_dim " + std::to_string(params.shape.head_dim));
}

void run_attention_bwd(const BwdParams& params, cudaStream_t stream, const LaunchOptions& launch) {
  require_supported(params.shape);
  switch (params.shape.head_dim) {
    case 64: return launch_bwd<64>(params, stream, launch);
    case 128: return launch_bwd<128>(params, stream, launch);
  }
  throw UnsupportedConfig("fused_cuda attention: head_dim " + std::to_string(params.shape.head_dim));
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
