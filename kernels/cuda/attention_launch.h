#pragma once
// What the launchers of kernels/cuda share on the host (internal to this folder's .cu files; the
// public interface is attention_params.h): checks, tensor maps, kernel launches and the scratch
// layout (attention_launch.cu), the schedule and mask-bit table launches (tile_scheduler.cu,
// mask_bits.cu), and the per-head-dims launchers that attention_launch_hd*.cu instantiate
// (attention_launch_kernels.cuh) so that each head dim's kernels compile in a translation unit of
// their own.

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "kernels/cuda/attention_config.h"
#include "kernels/cuda/attention_params.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/tiling.h"

namespace harness::kernels::cuda {

namespace device {
struct WorkClass;
}  // namespace device

namespace launch {

//! The launcher's TileShape of a tiling.h tile (one packing rule for launcher and memory model).
TileShape tile_shape(const tiling::Tile& tile);
//! UnsupportedConfig unless the shape has kernels and its heads divide into kv heads.
void require_supported(const AttentionShape& shape);
//! UnsupportedConfig unless `blocks` is a BlockMask at the tile's (block_m, block_n).
void check_blocks(const BlockListParams& blocks, const TileShape& tile, const char* kernel);
//! UnsupportedConfig unless the scratch holds `need` bytes.
void check_scratch(const void* scratch, size_t have, size_t need, const char* what);
//! The backward scratch of `kernel` (tiling::bwd_scratch).
tiling::BwdScratch bwd_layout(const AttentionShape& shape, const BlockListParams& dq_blocks,
                              const BlockListParams& dkdv_blocks, BwdKernel kernel);

//! 4-D TMA map (columns, rows, heads, batch) of a [B, heads, rows, columns] tensor of the shape's
//! element type, with boxes of 64 columns x box_rows rows x box_heads heads, 128-byte swizzle (the
//! wgmma operand layout, hopper_utils.cuh). Out-of-bounds rows and columns load as zeros and are
//! not stored: a head dim padded to a multiple of 64 reads and writes only the real columns.
CUtensorMap tensor_map(const TensorRef& t, ElementType element, int columns, int rows, int heads, int batch, int box_rows,
                       int box_heads, const char* what);
//! q-side [B, H, Q_LEN, columns] maps with boxes of box_heads x box_rows packed rows, kv-side
//! [B, H_KV, KV_LEN, columns] maps with boxes of box_rows keys, and the box one consumer
//! warpgroup stores (its 64 packed rows of a q-side tile, see store_consumer_rows).
CUtensorMap q_side_map(const TensorRef& t, const AttentionShape& s, int columns, int box_rows, int box_heads,
                       const char* what);
CUtensorMap kv_side_map(const TensorRef& t, const AttentionShape& s, int columns, int box_rows, const char* what);
CUtensorMap consumer_rows_map(const TensorRef& t, const AttentionShape& s, int columns, const TileShape& tile,
                              const char* what);

//! The persistent forwards' work item counter: after the schedule (tiling::fwd_scratch_bytes), in
//! the kept schedule's buffer if there is one, else in the scratch.
int* fwd_item_counter(const FwdParams& params, int64_t ctas);
//! The forward's mask bit table (tiling::fwd_mask_bits_offset), with the kept schedule if there is
//! one, else in the scratch; null for a kernel that reads none.
uint64_t* fwd_mask_bits(const FwdParams& params);

//! Writes the longest-first CTA table of two work classes in `order`, or in `requested` unless that
//! is kernel_default (LaunchOptions::schedule_order); tile_scheduler.cu.
void launch_schedule(const device::WorkClass& first, const device::WorkClass& second, const AttentionShape& shape,
                     ScheduleOrder order, ScheduleOrder requested, WorkItem* schedule, cudaStream_t stream);
//! Fills the row bit table of a blocks' tiling (the forward's format) / the backward's key bit
//! table (mask_bits.cu).
void launch_row_bits(const MaskParams& mask, const BlockListParams& blocks, uint64_t* bits, cudaStream_t stream);
void launch_key_bits(const MaskParams& mask, const BlockListParams& blocks, unsigned char* bits, cudaStream_t stream);

//! The launchers of one instantiation (attention_launch_kernels.cuh; instantiated per head dims in
//! attention_launch_hd*.cu).
template <class Dims>
void fwd(const FwdParams& params, cudaStream_t stream, const LaunchOptions& launch);
template <class Dims>
void bwd(const BwdParams& params, cudaStream_t stream, const LaunchOptions& launch);

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

}  // namespace launch
}  // namespace harness::kernels::cuda
