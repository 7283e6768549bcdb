// GPU BlockMask builder: the same classification and lists as kernels::build_block_mask on the
// CPU (kernels/block_mask.cpp), from the device mask predicate of mask_device.cuh.
//   1. classify, when documents are contiguous spans of positions (every mask resolve_mask makes):
//      one thread per query turns its predicate into two key intervals (the document-restricted
//      context range and the band), then one CTA per (q block, kv block) pair counts each in-range
//      row's visible keys by interval overlap and writes a state byte (empty / partial / full):
//      O(rows) per pair. Otherwise (a hand-made mask with interleaved documents): one CTA per
//      pair evaluates every in-range element, O(rows x columns). A ragged edge block is full when
//      all of its in-range elements are visible, exactly the CPU rule, in both forms.
//   2. lists: one thread per q-block row (kv lists) and one per kv-block column (transposed q
//      lists) scans its states in ascending order, so the indices are ascending by construction.
// Why intervals: at dflash Q 2048, KV 10240 the element form evaluates up to 21M predicates (each
// with its row's anchor and document loads) per tiling, while a fused forward there takes 0.11 ms.

#include <cuda_runtime.h>

#include <algorithm>
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

//! The in-range part of this CTA's (q block, kv block) pair (one CTA per pair, row-major).
struct PairRange {
  int q_begin, kv_begin;
  int rows, columns;  //!< in-range rows and columns (the ragged last blocks are smaller)
};
__device__ __forceinline__ PairRange pair_range(const BlockMaskBuildParams& params) {
  const int pair = blockIdx.x;
  const int q_block = pair / params.num_kv_blocks;
  const int kv_block = pair - q_block * params.num_kv_blocks;
  const int q_begin = q_block * params.block_m;
  const int kv_begin = kv_block * params.block_n;
  return {q_begin, kv_begin, min(params.block_m, params.mask.q_len - q_begin), min(params.block_n, params.mask.kv_len - kv_begin)};
}

//! Writes the pair's state byte from every thread's (any visible, all visible); every thread
//! must call it (two CTA barriers).
__device__ __forceinline__ void write_pair_state(const BlockMaskBuildParams& params, bool any_visible, bool all_visible) {
  const int any_in_block = __syncthreads_or(any_visible);
  const int all_in_block = __syncthreads_and(all_visible);
  if (threadIdx.x == 0) params.pair_states[blockIdx.x] = !any_in_block ? kEmpty : (all_in_block ? kFull : kPartial);
}

__global__ void __launch_bounds__(kClassifyThreads) classify_pairs_kernel(const __grid_constant__ BlockMaskBuildParams params) {
  const PairRange pair = pair_range(params);
  const int q_begin = pair.q_begin, kv_begin = pair.kv_begin, rows = pair.rows, columns = pair.columns;
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
    const bool seen = device::visible(query, device::key_doc(params.mask, kv_begin + column), kv_begin + column);
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
  write_pair_state(params, any_visible, all_visible);
}

//! Length of [lo, hi) ∩ [begin, end).
__device__ __forceinline__ int overlap(int lo, int hi, int begin, int end) { return max(0, min(hi, end) - max(lo, begin)); }

//! First position in [0, n) whose document is >= doc (doc_id non-decreasing).
__device__ int first_position_of_at_least(const int32_t* doc_id, int n, int doc) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (__ldg(doc_id + mid) < doc) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

//! Thread per query row: its visible keys as (context lo, hi) restricted to its document, and
//! (band lo, hi); visible(row, kv) == kv in either interval (mask_device.cuh's predicate).
__global__ void row_spans_kernel(const __grid_constant__ BlockMaskBuildParams params) {
  const int q = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (q >= params.mask.q_len) return;
  const device::QueryMask row = device::query_mask(params.mask, q);
  int lo = row.ctx_lo, hi = row.ctx_hi;
  if (row.doc >= 0 && lo < hi) {
    // doc_id covers the context (dflash) or the KV positions (document_causal).
    const int n = params.mask.kind == MaskCode::dflash ? params.mask.context : params.mask.kv_len;
    lo = max(lo, first_position_of_at_least(params.mask.doc_id, n, row.doc));
    hi = min(hi, first_position_of_at_least(params.mask.doc_id, n, row.doc + 1));
  }
  params.row_spans[q] = make_int4(lo, max(lo, hi), row.band_lo, row.band_hi);
}

//! One CTA per (q block, kv block) pair from the rows' spans: visible keys of a row in the pair =
//! |context ∩ pair| + |band ∩ pair| - |context ∩ band ∩ pair|.
__global__ void __launch_bounds__(kClassifyThreads) classify_spans_kernel(const __grid_constant__ BlockMaskBuildParams params) {
  const PairRange pair = pair_range(params);
  const int kv_begin = pair.kv_begin, kv_end = pair.kv_begin + pair.columns;
  bool any_visible = false;
  bool all_visible = true;
  for (int row = static_cast<int>(threadIdx.x); row < pair.rows; row += static_cast<int>(blockDim.x)) {
    const int4 span = params.row_spans[pair.q_begin + row];
    const int both_lo = max(span.x, span.z), both_hi = min(span.y, span.w);
    const int visible = overlap(span.x, span.y, kv_begin, kv_end) + overlap(span.z, span.w, kv_begin, kv_end) -
                        overlap(both_lo, both_hi, kv_begin, kv_end);
    any_visible |= visible > 0;
    all_visible &= visible == pair.columns;
  }
  write_pair_state(params, any_visible, all_visible);
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
  if (params.docs_contiguous) {
    constexpr int kRowThreads = 256;
    row_spans_kernel<<<(params.mask.q_len + kRowThreads - 1) / kRowThreads, kRowThreads, 0, stream>>>(params);
    HARNESS_CUDA_LAUNCH_CHECK("row_spans_kernel");
    // Rows per pair are block_m (at most a few hundred): one warp per 32 rows, at least one warp.
    const int threads = std::min(kClassifyThreads, std::max(32, (params.block_m + 31) / 32 * 32));
    classify_spans_kernel<<<pairs, threads, 0, stream>>>(params);
    HARNESS_CUDA_LAUNCH_CHECK("classify_spans_kernel");
  } else {
    classify_pairs_kernel<<<pairs, kClassifyThreads, 0, stream>>>(params);
    HARNESS_CUDA_LAUNCH_CHECK("classify_pairs_kernel");
  }
  const unsigned lines = static_cast<unsigned>(params.num_q_blocks) + static_cast<unsigned>(params.num_kv_blocks);
  build_lists_kernel<<<(lines + kListThreads - 1) / kListThreads, kListThreads, 0, stream>>>(params);
  HARNESS_CUDA_LAUNCH_CHECK("build_lists_kernel");
}

}  // namespace harness::kernels::cuda
