#pragma once
// Backward for Hopper (device code only): the merged dK/dV + dQ launch of bwd_kernels.cuh, each
// tile kind rebuilt on TMA + wgmma with one producer and two consumer warpgroups (the structure of
// fwd_wgmma_kernel.cuh). No atomics: every output element is summed by one thread in a fixed
// order, so the backward stays bitwise deterministic. It reads the prep kernel's per-row
// (lse * log2e, delta) and per-position mask rows (bwd_kernels.cuh).
//
//   dK/dV tile: 128 keys of one kv head (consumer c owns keys 64c..64c+63); K and V resident; the
//     producer streams (Q, row info) and dO of every listed q block of every head pack of the GQA
//     group. Per step, with the transposed formulation (keys are the M dimension):
//       S^T = K Q^T (smem x smem), P^T = 2^(S^T scale log2e - lse2), dV += P^T dO (P^T from registers),
//       dP^T = V dO^T, dS^T = P^T (dP^T - delta), dK += dS^T Q (dS^T from registers).
//   dQ tile: 128 query rows of one head pack (consumer c owns rows 64c..), Q and dO resident; the
//     producer streams K and V of every listed kv block:
//       S = Q K^T, dP = dO V^T, dS = P (dP - delta), dQ += dS K.
// Every product's B operand is a TMA-loaded tile read K-major (S, dP) or N-major (dV, dK, dQ).

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/attention_config.h"
#include "kernels/cuda/attention_params.h"
#include "kernels/cuda/bwd_prep_kernel.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/hopper_utils.cuh"
#include "kernels/cuda/kernel_common.cuh"
#include "kernels/cuda/mask_bits.cuh"
#include "kernels/cuda/mask_device.cuh"
#include "kernels/cuda/tile_math.cuh"
#include "kernels/cuda/tile_scheduler.cuh"
#include "kernels/cuda/wgmma_ops.cuh"
#include "kernels/cuda/wgmma_tiles.cuh"

namespace harness::kernels::cuda::device {

//! Tensor maps of the backward (see fwd_wgmma_kernel.cuh for the format): the q-side maps exist
//! twice because the dK/dV steps (64 rows) and the dQ tiles (128 rows) pack different boxes.
struct BwdTensorMaps {
  CUtensorMap q_dkdv, dout_dkdv;  //!< boxes of the dK/dV step's 64 packed rows
  CUtensorMap k_dkdv, v_dkdv;     //!< boxes of 128 keys (the dK/dV tile)
  CUtensorMap dk, dv;             //!< boxes of 64 keys (one consumer's rows)
  CUtensorMap q_dq, dout_dq;      //!< boxes of the dQ tile's 128 packed rows
  CUtensorMap k_dq, v_dq;         //!< boxes of the dQ step's kBlockN keys
  CUtensorMap dq;                 //!< boxes of one consumer's 64 rows
};

// ---- dK / dV ------------------------------------------------------------------------------------

template <class Cfg>
__device__ __forceinline__ void bwd_dkdv_wgmma_tile(const BwdParams& p, const BwdTensorMaps& maps, const BwdScratch& scratch,
                                                    uint32_t smem, int kv_block, int kv_head, int batch) {
  constexpr int kHeadDim = Cfg::kHeadDim;
  constexpr int kStages = Cfg::kStages;
  constexpr int kHalves = kHeadDim / 64;
  constexpr int kKeys = Cfg::kDkdvKeys;  // 128
  constexpr int kRows = Cfg::kDkdvRows;  // 64 query rows per step
  // Shared memory: K, V resident; per stage Q, dO, (lse2, delta) rows and mask rows.
  const uint32_t s_k = smem;
  const uint32_t s_v = s_k + Cfg::kDkdvKvBytes;
  const uint32_t s_q = s_v + Cfg::kDkdvKvBytes;                // kStages Q tiles
  const uint32_t s_do = s_q + kStages * Cfg::kDkdvQBytes;      // kStages dO tiles
  const uint32_t s_stats = s_do + kStages * Cfg::kDkdvQBytes;  // kStages x kRows float2
  const uint32_t s_masks = s_stats + kStages * kRows * 8;      // kStages x kRows QueryMaskRow
  const uint32_t s_bits = s_masks + kStages * kRows * 32;      // kStages x kKeys mask bit entries
  const BwdBarriers<kStages> bar{s_bits + kStages * kKeys * 8};

  const BlockListParams& blocks = p.dkdv_blocks;
  const int block_m = blocks.block_m;
  const int heads_packed = kRows / block_m;
  const int group = p.shape.heads / p.shape.kv_heads;
  const VisitList q_list = q_blocks_of(blocks, kv_block);
  const int num_partial = q_list.num_partial, num_q_blocks = q_list.count;
  // Steps run over (head pack, q block): every query head of the group, so dK/dV end complete.
  const int num_steps = (group / heads_packed) * num_q_blocks;
  auto q_block_at = [&](int step) { return step >= num_steps ? 0 : q_list.at(step % num_q_blocks); };
  const int kv0 = kv_block * kKeys;

  const int warpgroup = static_cast<int>(threadIdx.x) / 128;
  if (warpgroup == 0) {
    warpgroup_registers_decrease<Cfg::kProducerRegisters>();
    if (threadIdx.x != 0) return;
    mbarrier_arrive_expect_tx(bar.resident(), 2 * Cfg::kDkdvKvBytes);
#pragma unroll
    for (int half = 0; half < kHalves; ++half) {
      tma_load_4d(s_k + half * kKeys * 128, &maps.k_dkdv, bar.resident(), half * 64, kv0, kv_head, batch);
      tma_load_4d(s_v + half * kKeys * 128, &maps.v_dkdv, bar.resident(), half * 64, kv0, kv_head, batch);
    }
    int q_block = q_block_at(0);
    for (int step = 0; step < num_steps; ++step) {
      const int next = q_block_at(step + 1);
      const int stage = step % kStages;
      const int head0 = kv_head * group + (step / num_q_blocks) * heads_packed;
      const int q0 = q_block * block_m;
      mbarrier_wait(bar.empty(stage), ((step / kStages) & 1) ^ 1);
      const uint32_t q_stage = s_q + stage * Cfg::kDkdvQBytes;
      const uint32_t do_stage = s_do + stage * Cfg::kDkdvQBytes;
      // First: Q, the rows' (lse2, delta) (block_m per head, contiguous) and the positions' mask rows.
      // A partial step within the table's slots also copies its keys' mask bits.
      const int slot = step % num_q_blocks;
      const bool bits = slot < num_partial && slot < tiling::kBwdMaskBitSlots;
      const int bits_bytes = kKeys * (block_m / 8);
      mbarrier_arrive_expect_tx(bar.first(stage), Cfg::kDkdvQBytes + kRows * 8 + block_m * 32 + (bits ? bits_bytes : 0));
#pragma unroll
      for (int half = 0; half < kHalves; ++half) {
        tma_load_4d(q_stage + half * kRows * 128, &maps.q_dkdv, bar.first(stage), half * 64, q0, head0, batch);
      }
      for (int h = 0; h < heads_packed; ++h) {
        bulk_load(s_stats + stage * kRows * 8 + h * block_m * 8,
                  scratch.row_stats + (static_cast<int64_t>(batch) * p.shape.heads + head0 + h) * scratch.q_pad + q0,
                  block_m * 8, bar.first(stage));
      }
      bulk_load(s_masks + stage * kRows * 32, scratch.mask_rows + q0, block_m * 32, bar.first(stage));
      if (bits) {
        bulk_load(s_bits + stage * kKeys * 8,
                  scratch.key_bits + (static_cast<int64_t>(kv_block) * tiling::kBwdMaskBitSlots + slot) * bits_bytes,
                  bits_bytes, bar.first(stage));
      }
      // Second: dO.
      mbarrier_arrive_expect_tx(bar.second(stage), Cfg::kDkdvQBytes);
#pragma unroll
      for (int half = 0; half < kHalves; ++half) {
        tma_load_4d(do_stage + half * kRows * 128, &maps.dout_dkdv, bar.second(stage), half * 64, q0, head0, batch);
      }
      q_block = next;
    }
    return;
  }

  warpgroup_registers_increase<Cfg::kConsumerRegisters>();
  const int consumer = warpgroup - 1;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int first_key = consumer * 64 + ((static_cast<int>(threadIdx.x) >> 5) & 3) * 16;
  const int my_kv[2] = {kv0 + first_key + (lane >> 2), kv0 + first_key + (lane >> 2) + 8};
  const int32_t my_doc[2] = {key_doc(p.mask, my_kv[0]), key_doc(p.mask, my_kv[1])};
  const float scale_log2 = p.scale * kLog2e;
  const uint32_t k_rows = s_k + consumer * 64 * 128;
  const uint32_t v_rows = s_v + consumer * 64 * 128;

  float acc_dk[kHeadDim / 8][4] = {};
  float acc_dv[kHeadDim / 8][4] = {};
  mbarrier_wait(bar.resident(), 0);
  for (int step = 0; step < num_steps; ++step) {
    const int stage = step % kStages;
    const uint32_t parity = (step / kStages) & 1;
    const uint32_t q_stage = s_q + stage * Cfg::kDkdvQBytes;
    const uint32_t do_stage = s_do + stage * Cfg::kDkdvQBytes;
    const float2* stats = reinterpret_cast<const float2*>(__cvta_shared_to_generic(s_stats + stage * kRows * 8));
    const QueryMaskRow* masks = reinterpret_cast<const QueryMaskRow*>(__cvta_shared_to_generic(s_masks + stage * kRows * 32));

    // S^T (this consumer's 64 keys x 64 query rows) and dP^T = V dO^T, issued back to back: dP^T
    // needs no P, so it runs while this consumer masks S^T and computes P^T.
    float st[kRows / 8][4];
    float dpt[kRows / 8][4];
    mbarrier_wait(bar.first(stage), parity);
    mbarrier_wait(bar.second(stage), parity);
    wgmma_fence();
    keys_times_rows<kHeadDim, kKeys, kRows>(st, k_rows, q_stage);
    wgmma_commit();
    keys_times_rows<kHeadDim, kKeys, kRows>(dpt, v_rows, do_stage);
    wgmma_commit();
    wgmma_wait<1>();  // S^T is in; dP^T runs on
    fence_registers(st);
    // Mask rows are per query position: column c (head c / block_m) reads position c % block_m.
    if (const int slot = step % num_q_blocks; slot < num_partial) {
      mask_partial_step_transposed<kRows>(st, slot, s_bits + stage * kKeys * 8, masks, block_m, my_doc, my_kv, kv0);
    }
    // P^T, kept as the bf16 A fragments of dV += P^T dO (dS^T below uses the same rounded values).
    probabilities_transposed<kRows>(st, stats, scale_log2);
    uint32_t pt[kRows / 16][4];
    to_a_fragments<kRows / 16>(pt, st);

    // dV += P^T dO, issued behind dP^T; dS^T is computed while it runs.
    fence_registers(acc_dv);
    wgmma_fence();
    fragments_times_rows<kHeadDim, kRows>(acc_dv, pt, do_stage);
    wgmma_commit();
    wgmma_wait<1>();  // dP^T is in; dV runs on
    fence_registers(dpt);

    // dS^T = P^T (dP^T - delta), then dK += dS^T Q.
    score_gradients_transposed<kRows>(dpt, pt, stats);
    uint32_t dst[kRows / 16][4];
    to_a_fragments<kRows / 16>(dst, dpt);
    fence_registers(acc_dk);
    wgmma_fence();
    fragments_times_rows<kHeadDim, kRows>(acc_dk, dst, q_stage);
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(acc_dv);
    fence_registers(acc_dk);
    mbarrier_arrive(bar.empty(stage));
  }

  // Epilogue: this consumer's 64 keys of dK (scaled) and dV, through its own rows of K and V.
  named_barrier_sync(1 + consumer, 128);
  store_consumer_rows<kHeadDim>(acc_dk, p.scale, s_k, kKeys, consumer * 64, consumer, &maps.dk, kv0 + consumer * 64, kv_head,
                                batch);
  store_consumer_rows<kHeadDim>(acc_dv, 1.f, s_v, kKeys, consumer * 64, consumer, &maps.dv, kv0 + consumer * 64, kv_head,
                                batch);
}

// ---- dQ -----------------------------------------------------------------------------------------

//! dQ of one q block for `tiles` (1 or 2) head packs, one after the other: pack `pack`, then
//! pack + 1. Each has its own Q and dO buffers, and the second's are loaded while the first runs,
//! so a CTA pays the wait for a tile's resident rows (and the row info's loads) once for both
//! (session 19: the dQ tiles of sliding_window-8k are ~17 steps each, and that wait was a tenth of
//! them). The K/V stage ring runs on across the two.
template <class Cfg>
__device__ __forceinline__ void bwd_dq_wgmma_tile(const BwdParams& p, const BwdTensorMaps& maps, const BwdScratch& scratch,
                                                  uint32_t smem, int q_block, int pack, int tiles, int batch) {
  constexpr int kHeadDim = Cfg::kHeadDim;
  constexpr int kStages = Cfg::kStages;
  constexpr int kHalves = kHeadDim / 64;
  constexpr int kRows = Cfg::kDqRows;      // 128
  constexpr int kBlockN = Cfg::kDqBlockN;  // keys per step
  static_assert(Cfg::kDqTiles == 2, "two Q/dO buffers");
  auto s_q = [&](int tile) { return smem + tile * 2 * Cfg::kDqQBytes; };
  auto s_do = [&](int tile) { return smem + tile * 2 * Cfg::kDqQBytes + Cfg::kDqQBytes; };
  const uint32_t s_k = smem + Cfg::kDqTiles * 2 * Cfg::kDqQBytes;  // kStages K tiles
  const uint32_t s_v = s_k + kStages * Cfg::kDqKvBytes;            // kStages V tiles
  const BwdBarriers<kStages> bar{s_v + kStages * Cfg::kDqKvBytes};
  // The second tile's resident rows: the barrier after the stage ring's.
  auto resident = [&](int tile) { return tile == 0 ? bar.resident() : bar.base + 8u * (1 + 3 * kStages); };

  const BlockListParams& blocks = p.dq_blocks;
  const int block_m = blocks.block_m;
  const int heads_packed = kRows / block_m;
  const int group = p.shape.heads / p.shape.kv_heads;
  auto rows_of = [&](int tile) { return PackedRows{__ffs(block_m) - 1, (pack + tile) * heads_packed, q_block * block_m}; };
  const VisitList kv_list = kv_blocks_of(blocks, q_block);
  const int num_partial = kv_list.num_partial, num_blocks = kv_list.count;
  auto kv_block_at = [&](int step) { return kv_list.at(step); };

  const int warpgroup = static_cast<int>(threadIdx.x) / 128;
  if (warpgroup == 0) {
    warpgroup_registers_decrease<Cfg::kProducerRegisters>();
    if (threadIdx.x != 0) return;
    auto load_resident = [&](int tile) {
      const PackedRows rows = rows_of(tile);
      mbarrier_arrive_expect_tx(resident(tile), 2 * Cfg::kDqQBytes);
#pragma unroll
      for (int half = 0; half < kHalves; ++half) {
        tma_load_4d(s_q(tile) + half * kRows * 128, &maps.q_dq, resident(tile), half * 64, rows.q0, rows.head0, batch);
        tma_load_4d(s_do(tile) + half * kRows * 128, &maps.dout_dq, resident(tile), half * 64, rows.q0, rows.head0, batch);
      }
    };
    load_resident(0);
    int ring = 0;  // steps issued over both tiles: the stage ring's position
    for (int tile = 0; tile < tiles; ++tile) {
      const int kv_head = rows_of(tile).head0 / group;
      int kv_block = kv_block_at(0);
      for (int step = 0; step < num_blocks; ++step, ++ring) {
        const int next = kv_block_at(step + 1);
        const int stage = ring % kStages;
        mbarrier_wait(bar.empty(stage), ((ring / kStages) & 1) ^ 1);
        mbarrier_arrive_expect_tx(bar.first(stage), Cfg::kDqKvBytes);
#pragma unroll
        for (int half = 0; half < kHalves; ++half) {
          tma_load_4d(s_k + stage * Cfg::kDqKvBytes + half * kBlockN * 128, &maps.k_dq, bar.first(stage), half * 64,
                      kv_block * kBlockN, kv_head, batch);
        }
        mbarrier_arrive_expect_tx(bar.second(stage), Cfg::kDqKvBytes);
#pragma unroll
        for (int half = 0; half < kHalves; ++half) {
          tma_load_4d(s_v + stage * Cfg::kDqKvBytes + half * kBlockN * 128, &maps.v_dq, bar.second(stage), half * 64,
                      kv_block * kBlockN, kv_head, batch);
        }
        // The second tile's Q and dO go out behind the first step's K and V.
        if (tile == 0 && step == 0 && tiles == 2) load_resident(1);
        kv_block = next;
      }
      if (tile == 0 && num_blocks == 0 && tiles == 2) load_resident(1);
    }
    return;
  }

  warpgroup_registers_increase<Cfg::kConsumerRegisters>();
  const int consumer = warpgroup - 1;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int first_row = consumer * 64 + ((static_cast<int>(threadIdx.x) >> 5) & 3) * 16;
  const int my_row[2] = {first_row + (lane >> 2), first_row + (lane >> 2) + 8};
  QueryMask row_mask[2];
  float row_lse2[2];
  float row_delta[2];
  load_row_info(p, scratch, rows_of(0), batch, my_row, row_mask, row_lse2, row_delta);
  // The second tile's rows are the same queries of the next head pack: same mask rows, their own
  // (lse2, delta), loaded now with the first tile's.
  float next_lse2[2] = {0.f, 0.f};
  float next_delta[2] = {0.f, 0.f};
  if (tiles == 2) load_row_stats(p, scratch, rows_of(1), batch, my_row, next_lse2, next_delta);
  const float scale_log2 = p.scale * kLog2e;
  const int kv_len = p.shape.kv_len;
  // The first partial steps' mask bits (mask_bits.cuh, the forward's table at this tiling), loaded
  // before the step's products are issued and applied once S is in.
  static_assert(kBlockN == 64, "one table word per row and step");
  const uint64_t* table_row[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    table_row[i] = scratch.row_bits + static_cast<int64_t>(q_block) * tiling::kMaskBitSlots * block_m + (my_row[i] & (block_m - 1));
  }

  int ring = 0;
  for (int tile = 0; tile < tiles; ++tile) {
    const uint32_t q_rows = s_q(tile) + consumer * 64 * 128;
    const uint32_t do_rows = s_do(tile) + consumer * 64 * 128;
    if (tile == 1) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        row_lse2[i] = next_lse2[i];
        row_delta[i] = next_delta[i];
      }
    }
    float acc_dq[kHeadDim / 8][4] = {};
    int kv_block = kv_block_at(0);
    mbarrier_wait(resident(tile), 0);
    for (int step = 0; step < num_blocks; ++step, ++ring) {
      const int next = kv_block_at(step + 1);
      const int stage = ring % kStages;
      const uint32_t parity = (ring / kStages) & 1;
      const uint32_t k_stage = s_k + stage * Cfg::kDqKvBytes;
      const uint32_t v_stage = s_v + stage * Cfg::kDqKvBytes;

      // S = Q K^T and dP = dO V^T, issued together.
      float s[kBlockN / 8][4];
      float dp[kBlockN / 8][4];
      const bool table = step < num_partial && step < tiling::kMaskBitSlots;
      uint64_t keep = 0;
      if (table) keep = keep_bits_from_table<kBlockN>(table_row[0] + step * block_m, table_row[1] + step * block_m);
      mbarrier_wait(bar.first(stage), parity);
      wgmma_fence();
      keys_times_rows<kHeadDim, kRows, kBlockN>(s, q_rows, k_stage);
      wgmma_commit();
      mbarrier_wait(bar.second(stage), parity);
      keys_times_rows<kHeadDim, kRows, kBlockN>(dp, do_rows, v_stage);
      wgmma_commit();
      wgmma_wait<1>();  // S is in; dP may still run
      fence_registers(s);
      const int kv0 = kv_block * kBlockN;
      if (table) {
        apply_keep_bits<kBlockN>(s, keep);
      } else if (step < num_partial || kv0 + kBlockN > kv_len) {
        mask_scores<kBlockN>(s, row_mask, p.mask, kv0);
      }
      probabilities<kBlockN>(s, row_lse2, scale_log2);
      wgmma_wait<0>();
      fence_registers(dp);
      score_gradients<kBlockN>(s, dp, row_delta);
      uint32_t ds[kBlockN / 16][4];
      to_a_fragments<kBlockN / 16>(ds, s);
      fence_registers(acc_dq);
      wgmma_fence();
      fragments_times_rows<kHeadDim, kBlockN>(acc_dq, ds, k_stage);
      wgmma_commit();
      wgmma_wait<0>();
      fence_registers(acc_dq);
      mbarrier_arrive(bar.empty(stage));
      kv_block = next;
    }

    // The output goes out through this consumer's own Q rows of the tile (no product reads them
    // any more); the first tile's buffer is not reused, so only the last store is waited for.
    named_barrier_sync(1 + consumer, 128);
    const PackedRows rows = rows_of(tile);
    const int row0 = consumer * 64;
    store_consumer_rows<kHeadDim>(acc_dq, p.scale, s_q(tile), kRows, row0, consumer, &maps.dq, rows.query(row0),
                                  rows.head(row0), batch, /*wait_read=*/tile + 1 == tiles);
  }
}

//! The merged backward launch (see bwd_kernels.cuh): CTA i runs the i-th item of the
//! longest-first schedule, a dK/dV tile (items below num_kv_blocks) or a dQ tile.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    attention_bwd_wgmma_kernel(const __grid_constant__ BwdParams p, const __grid_constant__ BwdTensorMaps maps,
                               const BwdScratch scratch) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t smem = (smem_address(smem_raw) + 1023u) & ~1023u;
  const WorkItem work = scratch.schedule[blockIdx.x];
  const int num_kv_blocks = p.dkdv_blocks.num_kv_blocks;
  const bool dkdv = work.block < num_kv_blocks;
  // dQ tiles run in pairs of head packs where the packs are even (bwd_dq_wgmma_tile, dq_tiles_per_cta):
  // the CTA of an odd pack has nothing to do.
  const int num_packs = p.shape.heads / (Cfg::kDqRows / p.dq_blocks.block_m);
  const int dq_tiles = dq_tiles_per_cta(num_packs);
  if (!dkdv && dq_tiles == 2 && (work.copy % num_packs) % 2 == 1) return;
  const uint32_t bars = smem + (dkdv ? Cfg::kDkdvBarrierOffset : Cfg::kDqBarrierOffset);
  if (threadIdx.x == 0) {
    for (int i = 0; i < 1 + 2 * Cfg::kStages; ++i) mbarrier_init(bars + 8u * i, 1);  // resident, "full": the producer
    for (int stage = 0; stage < Cfg::kStages; ++stage) {
      mbarrier_init(bars + 8u * (1 + 2 * Cfg::kStages + stage), 2 * 128);  // "empty": every consumer thread
    }
    mbarrier_init(bars + 8u * (1 + 3 * Cfg::kStages), 1);  // the second dQ tile's resident rows
    fence_barrier_init();
  }
  __syncthreads();
  if (dkdv) {
    const DkdvWork tile = dkdv_work(work, p.shape.kv_heads, 1);
    bwd_dkdv_wgmma_tile<Cfg>(p, maps, scratch, smem, tile.kv_block, tile.kv_head, tile.batch);
  } else {
    const DqWork dq = dq_work(work, num_kv_blocks, num_packs);
    bwd_dq_wgmma_tile<Cfg>(p, maps, scratch, smem, dq.q_block, dq.pack, dq_tiles, dq.batch);
  }
}

}  // namespace harness::kernels::cuda::device
