#pragma once
// Backward kernels, mma.sync generation (device code only). Three launches, no atomics:
//   prep:     bwd_prep_kernel.cuh: per query row (lse * log2e, delta) and mask rows.
//   schedule: tile_scheduler.cuh ranks the dK/dV and dQ work items longest first.
//   main:     one launch whose CTAs are either
//     dK/dV:  one kv block of one kv head; K and V stay resident while the CTA loops over every
//             query head of its GQA group and every q block its kv block lists, with the transposed
//             formulation S^T = K Q^T so that P^T and dS^T come out of the MMA already as the A
//             operand of dV += P^T dO and dK += dS^T Q (no shared-memory transpose); or
//     dQ:     one q block of one head pack, like the forward: recomputes P from the LSE and
//             accumulates dQ = dS K over the kv blocks of its q block.
//   Merging them lets the short CTAs of one kind fill the tail of the other.
// Each output element is summed by one thread in a fixed order, so results are bitwise
// reproducible and `deterministic` costs nothing.

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/attention_config.h"
#include "kernels/cuda/attention_params.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/fwd_kernel.cuh"
#include "kernels/cuda/kernel_common.cuh"
#include "kernels/cuda/mask_device.cuh"
#include "kernels/cuda/tile_math.cuh"

namespace harness::kernels::cuda::device {

//! cp.async of the Q and dO tiles of one packed q block (rows past q_len zero-filled).
template <int kBlockM, int kHeadDim, int kThreads>
__device__ __forceinline__ void load_q_do_tiles_async(uint32_t s_q, uint32_t s_do, const BwdParams& p,
                                                      const PackedRows& rows, int batch, int q_len) {
  load_tile_async<kBlockM, kHeadDim, kThreads>(s_q, p.q.data, [&](int row) -> const __nv_bfloat16* {
    const int q = rows.query(row);
    return q < q_len ? row_pointer(p.q, batch, rows.head(row), q) : nullptr;
  });
  load_tile_async<kBlockM, kHeadDim, kThreads>(s_do, p.dout.data, [&](int row) -> const __nv_bfloat16* {
    const int q = rows.query(row);
    return q < q_len ? row_pointer(p.dout, batch, rows.head(row), q) : nullptr;
  });
}

//! dK/dV of one kv block of one kv head (see the file comment).
template <class Cfg>
__device__ __forceinline__ void bwd_dkdv_tile(const BwdParams& p, const BwdScratch& scratch, unsigned char* smem,
                                              int kv_block, int kv_head, int batch) {
  constexpr int kHeadDim = Cfg::kHeadDim, kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN;
  constexpr int kThreads = Cfg::kThreads, kStages = Cfg::kStages;
  using QTile = SmemTile<kBlockM, kHeadDim>;   // Q (and dO) rows
  using KvTile = SmemTile<kBlockN, kHeadDim>;  // K (and V) rows
  static_assert(kThreads >= kBlockM / 2 + 2 * kBlockM, "one thread per 16-byte chunk of row info");

  const uint32_t s_k = smem_address(smem);
  const uint32_t s_v = s_k + KvTile::kBytes;
  const uint32_t s_q = s_v + KvTile::kBytes;            // kStages Q tiles
  const uint32_t s_do = s_q + kStages * QTile::kBytes;  // kStages dO tiles
  // Per stage and q row: (lse2, delta) and the row's mask predicate, copied like the tiles.
  unsigned char* row_info = smem + 2 * KvTile::kBytes + 2 * kStages * QTile::kBytes;
  float2* s_stats = reinterpret_cast<float2*>(row_info);  // [kStages][kBlockM]
  QueryMaskRow* s_masks = reinterpret_cast<QueryMaskRow*>(row_info + kStages * kBlockM * sizeof(float2));

  const BlockListParams& blocks = p.dkdv_blocks;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int kv0 = kv_block * kBlockN;
  const int kv_len = p.shape.kv_len;
  const int q_len = p.shape.q_len;
  const int block_m_shift = __ffs(blocks.block_m) - 1;
  const int heads_packed = kBlockM / blocks.block_m;
  const int group = p.shape.heads / p.shape.kv_heads;

  load_tile_async<kBlockN, kHeadDim, kThreads>(s_k, p.k.data, [&](int row) -> const __nv_bfloat16* {
    return kv0 + row < kv_len ? row_pointer(p.k, batch, kv_head, kv0 + row) : nullptr;
  });
  load_tile_async<kBlockN, kHeadDim, kThreads>(s_v, p.v.data, [&](int row) -> const __nv_bfloat16* {
    return kv0 + row < kv_len ? row_pointer(p.v, batch, kv_head, kv0 + row) : nullptr;
  });
  cp_async_commit();

  const VisitList q_list = q_blocks_of(blocks, kv_block);
  const int num_partial = q_list.num_partial, num_q_blocks = q_list.count;
  // Steps run over (head pack, q block): every query head of the group, so dK/dV end complete.
  const int num_steps = (group / heads_packed) * num_q_blocks;
  auto q_block_at = [&](int step) { return step >= num_steps ? 0 : q_list.at(step % num_q_blocks); };
  auto load_q = [&](int step, int q_block, int stage) {
    const PackedRows rows{block_m_shift, kv_head * group + (step / num_q_blocks) * heads_packed, q_block * blocks.block_m};
    const uint32_t offset = static_cast<uint32_t>(stage * QTile::kBytes);
    load_tile_async<kBlockM, kHeadDim, kThreads>(s_q + offset, p.q.data, [&](int row) -> const __nv_bfloat16* {
      const int q = rows.query(row);
      return q < q_len ? row_pointer(p.q, batch, rows.head(row), q) : nullptr;
    });
    load_tile_async<kBlockM, kHeadDim, kThreads>(s_do + offset, p.dout.data, [&](int row) -> const __nv_bfloat16* {
      const int q = rows.query(row);
      return q < q_len ? row_pointer(p.dout, batch, rows.head(row), q) : nullptr;
    });
    // Row info: threads [0, kBlockM/2) copy (lse2, delta) pairs of two rows (rows 2c, 2c+1 are one
    // head, consecutive q), the next 2*kBlockM threads the two halves of each row's mask.
    const int t = static_cast<int>(threadIdx.x);
    if (t < kBlockM / 2) {
      const int row = 2 * t;
      const float2* source = scratch.row_stats +
                             (static_cast<int64_t>(batch) * p.shape.heads + rows.head(row)) * scratch.q_pad + rows.query(row);
      cp_async_16(smem_address(s_stats + stage * kBlockM + row), source, true);
    } else if (t < kBlockM / 2 + 2 * kBlockM) {
      const int row = (t - kBlockM / 2) / 2;
      const int half = (t - kBlockM / 2) % 2;
      const unsigned char* source = reinterpret_cast<const unsigned char*>(scratch.mask_rows + rows.query(row)) + 16 * half;
      cp_async_16(smem_address(s_masks + stage * kBlockM + row) + 16 * half, source, true);
    }
  };
  // Ring of the next kStages steps' q block indices (see the forward).
  int upcoming[kStages];
#pragma unroll
  for (int i = 0; i < kStages; ++i) upcoming[i] = q_block_at(i);
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < num_steps) load_q(i, upcoming[i], i);
    cp_async_commit();
  }

  const int first_row = warp * 16;  // this warp's 16 keys within the kv block
  const int my_kv[2] = {kv0 + first_row + (lane >> 2), kv0 + first_row + (lane >> 2) + 8};
  const int32_t my_doc[2] = {key_doc(p.mask, my_kv[0]), key_doc(p.mask, my_kv[1])};
  const float scale_log2 = p.scale * kLog2e;
  float acc_dk[kHeadDim / 8][4] = {};
  float acc_dv[kHeadDim / 8][4] = {};

  for (int step = 0; step < num_steps; ++step) {
    const int fetched = q_block_at(step + kStages);
    cp_async_wait<kStages - 2>();
    __syncthreads();  // this step's tiles are in; every warp is past step - 1, whose stage is refilled
    if (step + kStages - 1 < num_steps) load_q(step + kStages - 1, upcoming[kStages - 1], (step + kStages - 1) % kStages);
    cp_async_commit();
    const int stage = step % kStages;

    const uint32_t s_q_stage = s_q + static_cast<uint32_t>(stage * QTile::kBytes);
    const uint32_t s_do_stage = s_do + static_cast<uint32_t>(stage * QTile::kBytes);
    const float2* stats = s_stats + stage * kBlockM;
    const QueryMaskRow* masks = s_masks + stage * kBlockM;

    // S^T: 16 keys x kBlockM queries for this warp.
    float st[kBlockM / 8][4] = {};
    gemm_rows_by_rows<kHeadDim, kBlockM / 8, Cfg::kElement>(st, s_k, first_row, s_q_stage, 0);
    if (step % num_q_blocks < num_partial) mask_scores_transposed<kBlockM>(st, masks, kBlockM - 1, my_doc, my_kv);
    // P^T, then dV += P^T dO with P^T as the bf16 A fragments the MMA takes; dS^T below is computed
    // from P^T in fp32.
    probabilities_transposed<kBlockM>(st, stats, scale_log2);
    uint32_t pt[kBlockM / 16][4];
    to_a_fragments<kBlockM / 16, Cfg::kElement>(pt, st);
    gemm_frags_by_tile<kHeadDim, kBlockM / 16, Cfg::kElement>(acc_dv, pt, s_do_stage, 0);
    // dP^T = V dO^T, dS^T = P^T (dP^T - delta), dK += dS^T Q.
    float dpt[kBlockM / 8][4] = {};
    gemm_rows_by_rows<kHeadDim, kBlockM / 8, Cfg::kElement>(dpt, s_v, first_row, s_do_stage, 0);
    score_gradients_transposed<kBlockM>(dpt, st, stats);
    gemm_regs_by_tile<kHeadDim, kBlockM / 16, Cfg::kElement>(acc_dk, dpt, s_q_stage, 0);
#pragma unroll
    for (int i = 0; i < kStages - 1; ++i) upcoming[i] = upcoming[i + 1];
    upcoming[kStages - 1] = fetched;
  }
  cp_async_wait<0>();
  __syncthreads();
  accumulator_to_smem<kHeadDim, Cfg::kElement>(s_k, first_row, acc_dk, p.scale, p.scale);
  store_warp_rows<kHeadDim>(s_k, first_row, [&](int row) -> __nv_bfloat16* {
    return kv0 + row < kv_len ? const_cast<__nv_bfloat16*>(row_pointer(p.dk, batch, kv_head, kv0 + row)) : nullptr;
  });
  accumulator_to_smem<kHeadDim, Cfg::kElement>(s_v, first_row, acc_dv, 1.f, 1.f);
  store_warp_rows<kHeadDim>(s_v, first_row, [&](int row) -> __nv_bfloat16* {
    return kv0 + row < kv_len ? const_cast<__nv_bfloat16*>(row_pointer(p.dv, batch, kv_head, kv0 + row)) : nullptr;
  });
}

//! dQ of one q block of one head pack (see the file comment).
template <class Cfg>
__device__ __forceinline__ void bwd_dq_tile(const BwdParams& p, const BwdScratch& scratch, unsigned char* smem, int q_block,
                                            int pack, int batch) {
  constexpr int kHeadDim = Cfg::kHeadDim, kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN;
  constexpr int kThreads = Cfg::kThreads, kStages = Cfg::kStages;
  using QTile = SmemTile<kBlockM, kHeadDim>;   // Q (and dO) rows
  using KvTile = SmemTile<kBlockN, kHeadDim>;  // K (and V) rows

  const uint32_t s_q = smem_address(smem);
  const uint32_t s_do = s_q + QTile::kBytes;
  const uint32_t s_k = s_do + QTile::kBytes;  // kStages K tiles, then kStages V tiles
  const uint32_t s_v = s_k + kStages * KvTile::kBytes;

  const BlockListParams& blocks = p.dq_blocks;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int heads_packed = kBlockM / blocks.block_m;
  const PackedRows rows{__ffs(blocks.block_m) - 1, pack * heads_packed, q_block * blocks.block_m};
  const int kv_head = rows.head0 / (p.shape.heads / p.shape.kv_heads);
  const int q_len = p.shape.q_len;
  const int kv_len = p.shape.kv_len;

  load_q_do_tiles_async<kBlockM, kHeadDim, kThreads>(s_q, s_do, p, rows, batch, q_len);
  cp_async_commit();

  const VisitList kv_list = kv_blocks_of(blocks, q_block);
  const int num_partial = kv_list.num_partial, num_blocks = kv_list.count;
  const KvStream<kBlockN, kHeadDim, kThreads, kStages, KvTile::kBytes> kv{kv_list, s_k, s_v, p.k, p.v, batch, kv_head, kv_len};
  BlockRing<kStages> ring;
  ring.start(num_blocks, kv, kv);

  const int first_row = warp * 16;
  const int my_row[2] = {first_row + (lane >> 2), first_row + (lane >> 2) + 8};
  QueryMask row_mask[2];
  float row_lse2[2];
  float row_delta[2];
  load_row_info(p, scratch, rows, batch, my_row, row_mask, row_lse2, row_delta);
  const float scale_log2 = p.scale * kLog2e;

  float acc_dq[kHeadDim / 8][4] = {};
  for (int step = 0; step < num_blocks; ++step) {
    const int fetched = ring.begin_step(step, num_blocks, kv, kv);

    const int stage = step % kStages;
    float s[kBlockN / 8][4] = {};
    kv.template scores<Cfg::kElement>(s, s_q, first_row, stage, step, num_partial, ring.current(), row_mask, p.mask);
    const uint32_t s_k_stage = s_k + static_cast<uint32_t>(stage * KvTile::kBytes);
    const uint32_t s_v_stage = s_v + static_cast<uint32_t>(stage * KvTile::kBytes);
    probabilities<kBlockN>(s, row_lse2, scale_log2);
    float dp[kBlockN / 8][4] = {};
    gemm_rows_by_rows<kHeadDim, kBlockN / 8, Cfg::kElement>(dp, s_do, first_row, s_v_stage, 0);
    score_gradients<kBlockN>(s, dp, row_delta);
    gemm_regs_by_tile<kHeadDim, kBlockN / 16, Cfg::kElement>(acc_dq, s, s_k_stage, 0);
    ring.advance(fetched);
  }
  cp_async_wait<0>();
  __syncthreads();
  accumulator_to_smem<kHeadDim, Cfg::kElement>(s_q, first_row, acc_dq, p.scale, p.scale);
  store_warp_rows<kHeadDim>(s_q, first_row, [&](int row) -> __nv_bfloat16* {
    const int q = rows.query(row);
    return q < q_len ? const_cast<__nv_bfloat16*>(row_pointer(p.dq, batch, rows.head(row), q)) : nullptr;
  });
}

//! The merged backward launch: CTA i runs the i-th item of the longest-first schedule, a dK/dV
//! tile (items below num_kv_blocks) or a dQ tile.
template <class DkdvCfg, class DqCfg>
__global__ void __launch_bounds__(DkdvCfg::kThreads, 1)
    attention_bwd_kernel(const __grid_constant__ BwdParams p, const BwdScratch scratch) {
  static_assert(DkdvCfg::kThreads == DqCfg::kThreads, "one block size for both tile kinds");
  extern __shared__ __align__(128) unsigned char smem[];
  const WorkItem work = scratch.schedule[blockIdx.x];
  const int num_kv_blocks = p.dkdv_blocks.num_kv_blocks;
  if (work.block < num_kv_blocks) {
    const DkdvWork dkdv = dkdv_work(work, p.shape.kv_heads, 1);
    bwd_dkdv_tile<DkdvCfg>(p, scratch, smem, dkdv.kv_block, dkdv.kv_head, dkdv.batch);
  } else {
    const DqWork dq = dq_work(work, num_kv_blocks, p.shape.heads / (DqCfg::kBlockM / p.dq_blocks.block_m));
    bwd_dq_tile<DqCfg>(p, scratch, smem, dq.q_block, dq.pack, dq.batch);
  }
}

}  // namespace harness::kernels::cuda::device
