#pragma once
// What every kernel of this folder, of either generation (mma.sync and TMA + wgmma), shares on the
// device: which (head, query position) a row of a packed tile is, the block lists a CTA visits, row
// addresses, the backward's scratch and per-row statistics, and the forward's LSE. Device code
// only; the work items themselves come from tile_scheduler.cuh.

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/attention_params.h"
#include "kernels/cuda/mask_device.cuh"
#include "kernels/cuda/tile_math.cuh"

namespace harness::kernels::cuda::device {

//! Which (head, query position) each MMA row of a packed tile is: rows [j*block_m, (j+1)*block_m)
//! are head head0 + j. block_m is a power of two (checked by the launcher), so these are shifts.
struct PackedRows {
  int block_m_shift;
  int head0;
  int q0;
  __device__ __forceinline__ int head(int row) const { return head0 + (row >> block_m_shift); }
  __device__ __forceinline__ int query(int row) const { return q0 + (row & ((1 << block_m_shift) - 1)); }
};

//! The blocks one CTA visits, in order: the partial ones (mask evaluated per element), then the
//! full ones (no mask work), from one row (kv blocks of a q block) or one column (q blocks of a kv
//! block) of a BlockMask.
struct VisitList {
  int num_partial;
  int count;
  const int32_t* partial;
  const int32_t* full;
  //! The block of visit `step`; 0 past the end (callers prefetch one or more steps ahead).
  __device__ __forceinline__ int at(int step) const {
    return step >= count ? 0 : step < num_partial ? __ldg(partial + step) : __ldg(full + step - num_partial);
  }
};
//! The kv list of a q block whose counts are known (read once by another thread and handed over).
__device__ __forceinline__ VisitList kv_blocks_of(const BlockListParams& b, int q_block, int num_partial, int count) {
  const int64_t row = static_cast<int64_t>(q_block) * b.num_kv_blocks;
  return {num_partial, count, b.kv_indices + row, b.full_kv_indices + row};
}
__device__ __forceinline__ VisitList kv_blocks_of(const BlockListParams& b, int q_block) {
  const int partial = __ldg(b.kv_num_blocks + q_block);
  return kv_blocks_of(b, q_block, partial, partial + __ldg(b.full_kv_num_blocks + q_block));
}
__device__ __forceinline__ VisitList q_blocks_of(const BlockListParams& b, int kv_block) {
  const int partial = __ldg(b.q_num_blocks + kv_block);
  const int64_t column = static_cast<int64_t>(kv_block) * b.num_q_blocks;
  return {partial, partial + __ldg(b.full_q_num_blocks + kv_block), b.q_indices + column, b.full_q_indices + column};
}

//! End of the forward for this thread's two rows: quad-reduces the row sums, writes each real
//! row's LSE, and gives 1 / sum (0 for a row that saw nothing) to normalize O with.
__device__ __forceinline__ void finish_rows(const FwdParams& p, const PackedRows& rows, int batch, const int (&my_row)[2],
                                            const float (&row_max)[2], const float (&row_sum)[2], float scale_log2,
                                            float (&inv_sum)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float sum = quad_sum(row_sum[i]);
    inv_sum[i] = sum > 0.f ? 1.f / sum : 0.f;
    const int q = rows.query(my_row[i]);
    if ((threadIdx.x & 3) == 0 && q < p.shape.q_len) {
      p.lse[(static_cast<int64_t>(batch) * p.shape.heads + rows.head(my_row[i])) * p.shape.q_len + q] =
          row_lse(row_max[i], sum, scale_log2);
    }
  }
}

//! The v head dim of a problem (o's and dO's, dV's); AttentionShape::v_head_dim 0 means q·k's.
__device__ __forceinline__ int value_head_dim(const AttentionShape& s) { return s.v_head_dim > 0 ? s.v_head_dim : s.head_dim; }

__device__ __forceinline__ const __nv_bfloat16* row_pointer(const TensorRef& t, int batch, int head, int row) {
  return static_cast<const __nv_bfloat16*>(t.data) + batch * t.stride_batch + head * t.stride_head +
         static_cast<int64_t>(row) * t.stride_row;
}

//! Where the backward's internal buffers live inside BwdParams::scratch (see the launcher).
struct BwdScratch {
  float2* row_stats = nullptr;          //!< [B, H, q_pad]: (lse * log2e, delta)
  QueryMaskRow* mask_rows = nullptr;    //!< [q_pad]
  WorkItem* schedule = nullptr;         //!< one per CTA of the main launch
  unsigned char* key_bits = nullptr;    //!< the dK/dV partial steps' mask bits (mask_bits.cuh)
  uint64_t* row_bits = nullptr;         //!< the dQ partial steps' mask bits (the forward's format)
  int32_t q_pad = 0;                    //!< q_len rounded up to 128 (every tiling's padded rows)
  float* dq_accum = nullptr;            //!< wgmma_atomic only: [B, H, q_pad, D] fp32 dQ sums (unscaled)
  //! wgmma_atomic with split kv blocks only (tiling::bwd_atomic_dkdv_splits): [2][B, KVH, kv_pad, D]
  //! fp32 dK (unscaled), then dV sums; null otherwise.
  float* dkdv_accum = nullptr;
  int32_t kv_pad = 0;        //!< rows of one (batch, kv head) in dkdv_accum: kv blocks * 128
  int32_t dkdv_splits = 1;   //!< wgmma_atomic's CTAs per (kv block, kv head, batch)
};

//! wgmma_atomic's fp32 dV accumulator (split kv blocks): after dK's [B, KVH, kv_pad, D] floats.
__device__ __forceinline__ float* dv_accumulator(const BwdParams& p, const BwdScratch& scratch, int head_dim) {
  return scratch.dkdv_accum + static_cast<int64_t>(p.shape.batch) * p.shape.kv_heads * scratch.kv_pad * head_dim;
}

//! log2-scaled LSE for recomputing P = 2^(S*scale*log2e - lse2). Rows that saw nothing have
//! lse = -inf; mapping them to +inf makes every recomputed P exactly 0 (finite gradients, no NaN).
__device__ __forceinline__ float lse_log2(float lse) { return lse == -INFINITY ? INFINITY : lse * kLog2e; }

//! A dQ tile's row info for this thread's two rows (from the prep kernel): mask, lse2, delta.
//! The (lse2, delta) part alone (a dQ CTA's next head pack: the same queries, so the same masks).
__device__ __forceinline__ void load_row_stats(const BwdParams& p, const BwdScratch& scratch, const PackedRows& rows, int batch,
                                               const int (&my_row)[2], float (&row_lse2)[2], float (&row_delta)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int q = rows.query(my_row[i]);  // < q_pad: padded rows have "nothing visible" entries
    const float2 stats =
        scratch.row_stats[(static_cast<int64_t>(batch) * p.shape.heads + rows.head(my_row[i])) * scratch.q_pad + q];
    row_lse2[i] = stats.x;
    row_delta[i] = stats.y;
  }
}
__device__ __forceinline__ void load_row_info(const BwdParams& p, const BwdScratch& scratch, const PackedRows& rows, int batch,
                                              const int (&my_row)[2], QueryMask (&row_mask)[2], float (&row_lse2)[2],
                                              float (&row_delta)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) row_mask[i] = scratch.mask_rows[rows.query(my_row[i])].mask;
  load_row_stats(p, scratch, rows, batch, my_row, row_lse2, row_delta);
}

}  // namespace harness::kernels::cuda::device
