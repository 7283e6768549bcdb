// GPU BlockMask builder: the same classification and lists as kernels::build_block_mask on the
// CPU (kernels/block_mask.cpp), from the device mask predicate of mask_device.cuh.
//   1. classify: one CTA per (q block, kv block) pair evaluates every in-range element and writes
//      a state byte (empty / partial / full). A ragged edge block is full when all of its in-range
//      elements are visible, exactly the CPU rule, because only in-range elements are evaluated.
//   2. lists: one thread per q-block row (kv lists) and one per kv-block column (transposed q
//      lists) scans its states in ascending order, so the indices are ascending by construction.
// Sizes are small (dflash Q 2048, KV 10240, block 128: 16 x 80 pairs of 16384 elements, 21M
// predicate evaluations), so both kernels stay simple rather than clever.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/block_mask_build.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mask_device.cuh"

namespace harness::kernels::cuda {

namespace {

//! State byte of one (q block, kv block) pair; the values match nothing outside this file.
enum PairState : uint8_t { kEmpty = 0, kPartial = 1, kFull = 2 };

//! Threads per classify CTA: 16384 elements of a 128x128 pair are 64 per thread.
constexpr int kClassifyThreads = 256;
//! Threads per list CTA (one row or column each).
constexpr int kListThreads = 128;

__global__ void __launch_bounds__(kClassifyThreads) classify_pairs_kernel(const __grid_constant__ BlockMaskBuildParams params) {
  const int pair = blockIdx.x;
  const int q_block = pair / params.num_kv_blocks;
  const int kv_block = pair - q_block * params.num_kv_blocks;
  const int q_begin = q_block * params.block_m;
  const int kv_begin = kv_block * params.block_n;
  const int rows = min(params.block_m, params.mask.q_len - q_begin);
  const int columns = min(params.block_n, params.mask.kv_len - kv_begin);
  // Thread t starts at element t of the pair in row-major order and steps by blockDim.x elements,
  // tracked as (row, column) with a carry instead of a 64-bit division per element.
  const int row_step = blockDim.x / columns;
  const int column_step = blockDim.x % columns;
  int row = threadIdx.x / columns;
  int column = threadIdx.x % columns;
  bool any_visible = false;
  bool all_visible = true;
  // A thread that has seen a visible and an invisible element has its final answer (partial).
  while (row < rows && !(any_visible && !all_visible)) {
    const device::QueryMask query = device::query_mask(params.mask, q_begin + row);
    const bool seen = device::visible(query, params.mask.doc_id, kv_begin + column);
    any_visible |= seen;
    all_visible &= seen;
    row += row_step;
    column += column_step;
    if (column >= columns) {
      column -= columns;
      ++row;
    }
  }
  // Every thread reaches both barriers (the early exit above only leaves the loop).
  const int any_in_block = __syncthreads_or(any_visible);
  const int all_in_block = __syncthreads_and(all_visible);
  if (threadIdx.x == 0) {
    params.pair_states[pair] = !any_in_block ? kEmpty : (all_in_block ? kFull : kPartial);
  }
}

//! Writes one partial list and one full list of `length` entries: the ascending positions whose
//! state is partial / full, then zeros, and the two counts.
__device__ void write_lists(const uint8_t* states, int64_t state_stride, int length, int32_t* partial_count,
                            int32_t* partial_indices, int32_t* full_count, int32_t* full_indices) {
  int partial = 0;
  int full = 0;
  for (int position = 0; position < length; ++position) {
    const uint8_t state = states[position * state_stride];
    if (state == kPartial) partial_indices[partial++] = position;
    if (state == kFull) full_indices[full++] = position;
  }
  for (int position = partial; position < length; ++position) partial_indices[position] = 0;
  for (int position = full; position < length; ++position) full_indices[position] = 0;
  *partial_count = partial;
  *full_count = full;
}

//! Threads [0, num_q_blocks) build the kv lists of one q block each; the next num_kv_blocks
//! threads the q lists of one kv block each (states is [q block][kv block]).
__global__ void __launch_bounds__(kListThreads) build_lists_kernel(const __grid_constant__ BlockMaskBuildParams params) {
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int num_q_blocks = params.num_q_blocks;
  const int num_kv_blocks = params.num_kv_blocks;
  if (thread < num_q_blocks) {
    const int q_block = static_cast<int>(thread);
    const int64_t row = static_cast<int64_t>(q_block) * num_kv_blocks;
    write_lists(params.pair_states + row, 1, num_kv_blocks, params.kv_num_blocks + q_block, params.kv_indices + row,
                params.full_kv_num_blocks + q_block, params.full_kv_indices + row);
  } else if (thread < static_cast<int64_t>(num_q_blocks) + num_kv_blocks) {
    const int kv_block = static_cast<int>(thread - num_q_blocks);
    const int64_t row = static_cast<int64_t>(kv_block) * num_q_blocks;
    write_lists(params.pair_states + kv_block, num_kv_blocks, num_q_blocks, params.q_num_blocks + kv_block,
                params.q_indices + row, params.full_q_num_blocks + kv_block, params.full_q_indices + row);
  }
}

}  // namespace

void run_block_mask_build(const BlockMaskBuildParams& params, cudaStream_t stream) {
  if (params.num_q_blocks == 0 || params.num_kv_blocks == 0) return;
  const unsigned pairs = static_cast<unsigned>(params.num_q_blocks) * static_cast<unsigned>(params.num_kv_blocks);
  classify_pairs_kernel<<<pairs, kClassifyThreads, 0, stream>>>(params);
  HARNESS_CUDA_LAUNCH_CHECK("classify_pairs_kernel");
  const unsigned lines = static_cast<unsigned>(params.num_q_blocks) + static_cast<unsigned>(params.num_kv_blocks);
  build_lists_kernel<<<(lines + kListThreads - 1) / kListThreads, kListThreads, 0, stream>>>(params);
  HARNESS_CUDA_LAUNCH_CHECK("build_lists_kernel");
}

}  // namespace harness::kernels::cuda
