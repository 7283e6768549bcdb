#pragma once
// Backward for Hopper (device code only), deterministic: the merged dK/dV + dQ launch of
// bwd_kernels.cuh, each tile kind on TMA + wgmma with one producer and two consumer warpgroups.
// No atomics: every output element is summed by one thread in a fixed order, so the backward stays
// bitwise deterministic. It reads the prep kernel's per-row (lse * log2e, delta) and per-position
// mask rows (bwd_prep_kernel.cuh).
//   dK/dV tile: the dK/dV mainloop (bwd_dkdv_mainloop.cuh) without dQ: 4 GEMMs per step.
//   dQ tile: 128 query rows of one head pack (consumer c owns rows 64c..), Q and dO resident; the
//     producer streams K and V of every listed kv block:
//       S = Q K^T, dP = dO V^T, dS = P (dP - delta), dQ += dS K (7 GEMMs per pair in all).
// Every product's B operand is a TMA-loaded tile read K-major (S, dP) or N-major (dV, dK, dQ).

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/attention_config.h"
#include "kernels/cuda/attention_params.h"
#include "kernels/cuda/bwd_dkdv_mainloop.cuh"
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

// ---- dK / dV ------------------------------------------------------------------------------------

//! dK and dV of one kv block of one kv head: the dK/dV mainloop (bwd_dkdv_mainloop.cuh) without
//! dQ, then the stores.
template <class Cfg>
__device__ __forceinline__ void bwd_dkdv_wgmma_tile(const BwdParams& p, const BwdTensorMaps& maps, const BwdScratch& scratch,
                                                    uint32_t smem, int kv_block, int kv_head, int batch) {
  using Mainloop = BwdDkdvMainloop<typename Cfg::Dkdv, Cfg::kElement, /*kAtomicDq=*/false, Cfg::kSumDim, Cfg::kSumDimV>;
  const Mainloop mainloop(smem);
  const DkdvSteps steps = Mainloop::steps(p, kv_block, kv_head, 0, 1);
  // With split columns the consumer index decides which products a warpgroup issues: broadcast
  // from lane 0 (warpgroup_index), ptxas knows those branches are uniform and does not serialize
  // the wgmma under them.
  const int warpgroup = Cfg::kSplitColumns ? warpgroup_index() : static_cast<int>(threadIdx.x) / 128;
  if (warpgroup == 0) {
    warpgroup_registers_decrease<Cfg::kProducerRegisters>();
    if (threadIdx.x != 0) return;
    return mainloop.load(p, maps, scratch, steps, kv_block, kv_head, batch);
  }
  warpgroup_registers_increase<Cfg::kConsumerRegisters>();
  const typename Mainloop::Thread thread = mainloop.thread(p, warpgroup - 1, steps.kv0);
  if constexpr (Cfg::kSplitColumns) {
    typename Mainloop::SplitDk acc_dk = {};
    typename Mainloop::SplitDv acc_dv = {};
    mainloop.run_deterministic(thread, steps, acc_dk, acc_dv);
    mainloop.store_split(p, maps, thread, steps, kv_head, batch, acc_dk, acc_dv);
  } else {
    float acc_dk[Cfg::kHeadDim / 8][4] = {};
    float acc_dv[Cfg::kHeadDimV / 8][4] = {};
    mainloop.run_deterministic(thread, steps, acc_dk, acc_dv);
    mainloop.store(p, maps, thread, steps, kv_head, batch, acc_dk, acc_dv);
  }
}

// ---- dQ -----------------------------------------------------------------------------------------

//! dQ of one q block for `tiles` (1 or 2) head packs, one after the other: pack `pack`, then
//! pack + 1. Each has its own Q and dO buffers, and the second's are loaded while the first runs,
//! so a CTA pays the wait for a tile's resident rows (and the row info's loads) once for both (the
//! dQ tiles of sliding_window-8k are ~17 steps each, and that wait was a tenth of them). The K/V
//! stage ring runs on across the two. With split columns (Cfg::kSplitColumns) the tile is 64 rows
//! that both consumers share: each computes S and dP in full and keeps its 64-column blocks of dQ.
template <class Cfg>
__device__ __forceinline__ void bwd_dq_wgmma_tile(const BwdParams& p, const BwdTensorMaps& maps, const BwdScratch& scratch,
                                                  uint32_t smem, int q_block, int pack, int tiles, int batch) {
  constexpr int kHeadDim = Cfg::kHeadDim;
  constexpr int kHeadDimV = Cfg::kHeadDimV;
  constexpr ElementType kElement = Cfg::kElement;
  constexpr int kStages = Cfg::kStages;
  constexpr int kHalves = kHeadDim / 64;
  constexpr int kHalvesV = kHeadDimV / 64;
  constexpr bool kSplit = Cfg::kSplitColumns;
  constexpr int kOwned = (kHalves + 1) / 2;  // dQ blocks a consumer keeps with split columns
  constexpr int kRows = Cfg::kDqRows;      // 128, or 64 with split columns
  constexpr int kBlockN = Cfg::kDqBlockN;  // keys per step
  auto s_q = [&](int tile) { return smem + tile * (Cfg::kDqQBytes + Cfg::kDqDoBytes); };
  auto s_do = [&](int tile) { return smem + tile * (Cfg::kDqQBytes + Cfg::kDqDoBytes) + Cfg::kDqQBytes; };
  const uint32_t s_k = smem + Cfg::kDqTiles * (Cfg::kDqQBytes + Cfg::kDqDoBytes);  // kStages K tiles
  const uint32_t s_v = s_k + kStages * Cfg::kDqKBytes;                             // kStages V tiles
  const BwdBarriers<kStages> bar{s_v + kStages * Cfg::kDqVBytes};
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

  // With split columns the consumer index decides which products a warpgroup issues: broadcast
  // from lane 0 (warpgroup_index), ptxas knows those branches are uniform and does not serialize
  // the wgmma under them.
  const int warpgroup = Cfg::kSplitColumns ? warpgroup_index() : static_cast<int>(threadIdx.x) / 128;
  if (warpgroup == 0) {
    warpgroup_registers_decrease<Cfg::kProducerRegisters>();
    if (threadIdx.x != 0) return;
    auto load_resident = [&](int tile) {
      const PackedRows rows = rows_of(tile);
      mbarrier_arrive_expect_tx(resident(tile), Cfg::kDqQBytes + Cfg::kDqDoBytes);
#pragma unroll
      for (int half = 0; half < kHalves; ++half) {
        tma_load_4d(s_q(tile) + half * kRows * 128, &maps.q_dq, resident(tile), half * 64, rows.q0, rows.head0, batch);
        if (half < kHalvesV) {
          tma_load_4d(s_do(tile) + half * kRows * 128, &maps.dout_dq, resident(tile), half * 64, rows.q0, rows.head0, batch);
        }
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
        mbarrier_arrive_expect_tx(bar.first(stage), Cfg::kDqKBytes);
#pragma unroll
        for (int half = 0; half < kHalves; ++half) {
          tma_load_4d(s_k + stage * Cfg::kDqKBytes + half * kBlockN * 128, &maps.k_dq, bar.first(stage), half * 64,
                      kv_block * kBlockN, kv_head, batch);
        }
        mbarrier_arrive_expect_tx(bar.second(stage), Cfg::kDqVBytes);
#pragma unroll
        for (int half = 0; half < kHalvesV; ++half) {
          tma_load_4d(s_v + stage * Cfg::kDqVBytes + half * kBlockN * 128, &maps.v_dq, bar.second(stage), half * 64,
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
  const int first_row = (kSplit ? 0 : consumer * 64) + ((static_cast<int>(threadIdx.x) >> 5) & 3) * 16;
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
    const uint32_t q_rows = s_q(tile) + (kSplit ? 0 : consumer * 64 * 128);
    const uint32_t do_rows = s_do(tile) + (kSplit ? 0 : consumer * 64 * 128);
    if (tile == 1) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        row_lse2[i] = next_lse2[i];
        row_delta[i] = next_delta[i];
      }
    }
    // dQ: this consumer's 64 rows x the head dim, or with split columns its blocks of the tile's rows.
    std::conditional_t<kSplit, float[kOwned][8][4], float[kHeadDim / 8][4]> acc_dq = {};
    int kv_block = kv_block_at(0);
    mbarrier_wait(resident(tile), 0);
    for (int step = 0; step < num_blocks; ++step, ++ring) {
      const int next = kv_block_at(step + 1);
      const int stage = ring % kStages;
      const uint32_t parity = (ring / kStages) & 1;
      const uint32_t k_stage = s_k + stage * Cfg::kDqKBytes;
      const uint32_t v_stage = s_v + stage * Cfg::kDqVBytes;

      // S = Q K^T and dP = dO V^T, issued together.
      float s[kBlockN / 8][4];
      float dp[kBlockN / 8][4];
      const bool table = step < num_partial && step < tiling::kMaskBitSlots;
      uint64_t keep = 0;
      if (table) keep = keep_bits_from_table<kBlockN>(table_row[0] + step * block_m, table_row[1] + step * block_m);
      mbarrier_wait(bar.first(stage), parity);
      wgmma_fence();
      keys_times_rows<Cfg::kSumDim, kRows, kBlockN, kElement>(s, q_rows, k_stage);
      wgmma_commit();
      mbarrier_wait(bar.second(stage), parity);
      keys_times_rows<Cfg::kSumDimV, kRows, kBlockN, kElement>(dp, do_rows, v_stage);
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
      to_a_fragments<kBlockN / 16, kElement>(ds, s);
      fence_accumulator(acc_dq);
      wgmma_fence();
      fragments_times_columns<kHeadDim, kBlockN, kElement>(acc_dq, ds, k_stage, consumer);
      wgmma_commit();
      wgmma_wait<0>();
      fence_accumulator(acc_dq);
      mbarrier_arrive(bar.empty(stage));
      kv_block = next;
    }

    // The output goes out through this consumer's own Q rows of the tile (no product reads them
    // any more); the first tile's buffer is not reused, so only the last store is waited for. With
    // split columns through its blocks of the shared rows, once both consumers are past their
    // products.
    const PackedRows rows = rows_of(tile);
    if constexpr (kSplit) {
      named_barrier_sync(kConsumersBarrier, 256);
      store_kept_blocks<kOwned, kElement>(acc_dq, p.scale, s_q(tile), kRows, kHalves, consumer, &maps.dq, rows.query(0),
                                          rows.head(0), batch);
    } else {
      named_barrier_sync(1 + consumer, 128);
      const int row0 = consumer * 64;
      store_consumer_rows<kHeadDim, kElement>(acc_dq, p.scale, s_q(tile), kRows, row0, consumer, &maps.dq, rows.query(row0),
                                              rows.head(row0), batch, /*wait_read=*/tile + 1 == tiles);
    }
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
  const int dq_tiles = Cfg::kDqTiles == 2 ? dq_tiles_per_cta(num_packs) : 1;
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
