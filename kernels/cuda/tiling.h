#pragma once
// How the CUDA fused kernels tile a problem and lay out their device scratch, written once: the
// launcher (attention_launch.cu) sizes tiles and scratch with these functions, and the memory
// model (experiments/memory_model.cpp) predicts the same bytes by calling the same functions.
// Host-only constexpr over plain integers: no CUDA header, so torch-free code without a CUDA
// toolkit can include it.

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/attention_config.h"

namespace harness::kernels::cuda::tiling {

constexpr int64_t kScratchAlign = 256;     //!< every scratch part starts 256-byte aligned
constexpr int64_t kQueryRowPad = 128;      //!< query rows padded to a multiple of every tiling's block_m
constexpr int64_t kWorkItemBytes = 8;      //!< a WorkItem (attention_params.h): two int32
constexpr int64_t kRowStatBytes = 8;       //!< per q row (lse·log2e, delta) as float2
constexpr int64_t kQueryMaskRowBytes = 32; //!< device::QueryMaskRow (mask_device.cuh asserts it)

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
constexpr int64_t align_scratch(int64_t bytes) { return ceil_div(bytes, kScratchAlign) * kScratchAlign; }
//! Query rows padded to kQueryRowPad, so padded tile rows index real (sees-nothing) row entries.
constexpr int64_t padded_q_len(int64_t q_len) { return ceil_div(q_len, kQueryRowPad) * kQueryRowPad; }

//! How one kernel tiles the queries: `rows` MMA rows per CTA made of `heads_packed` query heads
//! of one GQA group times `block_m` positions each, and `block_n` keys per kv tile.
struct Tile {
  int64_t rows = 0;
  int64_t heads_packed = 1;
  int64_t block_m = 0;
  int64_t block_n = 0;
};

//! Packs as many query heads of one GQA group into a tile of `rows` rows as divide the group
//! (a power of two), down to 16 positions per head (one MMA row block). The heads of a group read
//! the same K/V, so packing them keeps the K/V reuse of a `rows`-row tile while each head covers
//! only rows / heads_packed positions: with the dflash mask that is one or two draft blocks
//! instead of eight, so far fewer kv blocks are visited for nothing.
constexpr Tile packed_tile(int64_t heads, int64_t kv_heads, int64_t rows, int64_t block_n) {
  const int64_t group = heads / kv_heads;
  const int64_t heads_packed = std::min(group & -group, rows / 16);
  return Tile{rows, heads_packed, rows / heads_packed, block_n};
}
constexpr Tile fwd_tile(int64_t heads, int64_t kv_heads, FwdKernel kernel) {
  const FwdKernelTiling tiling = fwd_kernel_tiling(kernel);
  return packed_tile(heads, kv_heads, tiling.rows, tiling.block_n);
}
//! The backward's tilings at a q·k head dim (real or padded): 128 dQ rows and 128-key dK/dV tiles
//! up to 128, 64 and 64 above it, where the Hopper backward splits columns (attention_config.h).
constexpr Tile bwd_dq_tile(int64_t heads, int64_t kv_heads, int64_t head_dim) {
  return packed_tile(heads, kv_heads, bwd_dq_rows(static_cast<int>(head_dim)), kBwdDqBlockN);
}
constexpr Tile bwd_dkdv_tile(int64_t heads, int64_t kv_heads, int64_t head_dim) {
  return packed_tile(heads, kv_heads, kBwdDkdvRows, bwd_dkdv_keys(static_cast<int>(head_dim)));
}

//! CTAs of a forward launch: q block x head pack x batch.
constexpr int64_t fwd_ctas(int64_t batch, int64_t heads, int64_t kv_heads, int64_t num_q_blocks, FwdKernel kernel) {
  return num_q_blocks * (heads / fwd_tile(heads, kv_heads, kernel).heads_packed) * batch;
}
//! Partial kv blocks per q block whose mask bits the table holds (mask_bits.cuh): the first
//! kMaskBitSlots of a q block's partial list; a q block with more evaluates the rest per score.
constexpr int64_t kMaskBitSlots = 4;
//! 64-bit words of a row bit table (the forward's format: mask_bits.cuh) at a tiling.
constexpr int64_t mask_bit_words(int64_t num_q_blocks, int64_t block_m, int64_t block_n) {
  return num_q_blocks * kMaskBitSlots * block_m * (block_n / 64);
}
//! Forward mask bit table (kernels with fwd_kernel_reads_mask_bits): per q block, slot and query
//! position of the block, block_n / 64 words of 64 bits, bit c of word w = key 64 w + c of the
//! slot's kv block visible.
constexpr int64_t fwd_mask_bits_bytes(int64_t heads, int64_t kv_heads, int64_t num_q_blocks, FwdKernel kernel) {
  if (!fwd_kernel_reads_mask_bits(kernel)) return 0;
  const Tile tile = fwd_tile(heads, kv_heads, kernel);
  return mask_bit_words(num_q_blocks, tile.block_m, tile.block_n) * 8;
}
//! Offset of the mask bit table: after the schedule and the counter's slot.
constexpr int64_t fwd_mask_bits_offset(int64_t batch, int64_t heads, int64_t kv_heads, int64_t num_q_blocks, FwdKernel kernel) {
  return align_scratch(fwd_ctas(batch, heads, kv_heads, num_q_blocks, kernel) * kWorkItemBytes) + kScratchAlign;
}
//! Forward scratch: the longest-first schedule, one WorkItem per work item (a CTA's, unless the
//! CTAs are persistent), then the persistent CTAs' work item counter (one aligned slot), then the
//! mask bit table of the kernels that read one.
constexpr int64_t fwd_scratch_bytes(int64_t batch, int64_t heads, int64_t kv_heads, int64_t num_q_blocks,
                                    FwdKernel kernel) {
  return fwd_mask_bits_offset(batch, heads, kv_heads, num_q_blocks, kernel) +
         align_scratch(fwd_mask_bits_bytes(heads, kv_heads, num_q_blocks, kernel));
}

//! Partial q blocks per kv block whose mask bits the backward's table holds (mask_bits.cuh):
//! the first kBwdMaskBitSlots of a kv block's partial list; the rest are evaluated per score.
constexpr int64_t kBwdMaskBitSlots = 16;
//! The backward's key bit table: per dK/dV kv block, slot and key of the block (block_n keys),
//! block_m bits (one per query position of the slot's q block: 2, 4 or 8 bytes).
constexpr int64_t bwd_key_bits_bytes(int64_t dkdv_num_kv_blocks, int64_t block_m, int64_t block_n) {
  return dkdv_num_kv_blocks * kBwdMaskBitSlots * block_n * (block_m / 8);
}

//! wgmma_atomic's dK/dV CTAs per kv block: a kv block's steps run over every head pack of its GQA
//! group, so with few kv heads there are few dK/dV CTAs and the costliest kv blocks (a dflash
//! document's first, seen by every anchor of the document) dominate the launch: dflash-512 with one
//! kv head ran 128 CTAs on 132 SMs, the longest about 3x the mean (H200). Below
//! kMinAtomicDkdvCtas CTAs the head packs are split over 2, 4, ... CTAs (as long as the split
//! divides them); the CTAs of a kv block add their dK/dV in fp32 (bulk reduce-add into an
//! accumulator, converted with dQ), so dK and dV are then summed in no fixed order either. The
//! same count for every kernel, so that the schedule buffers (kept per kernel, sized alike) hold
//! the split launch.
constexpr int64_t kMinAtomicDkdvCtas = 512;
constexpr int64_t bwd_atomic_dkdv_splits(int64_t batch, int64_t heads, int64_t kv_heads, int64_t dkdv_num_kv_blocks) {
  const int64_t packs = (heads / kv_heads) / packed_tile(heads, kv_heads, kBwdDkdvRows, 128).heads_packed;
  const int64_t ctas = dkdv_num_kv_blocks * kv_heads * batch;
  int64_t splits = 1;
  while (ctas > 0 && ctas * splits < kMinAtomicDkdvCtas && packs % (2 * splits) == 0) splits *= 2;
  return splits;
}

//! Backward scratch, in order: per-(batch, head, padded q row) statistics, per padded q row mask
//! rows, then the merged schedule (dK/dV CTAs first, then dQ CTAs), the key bit table and the row
//! bit table (all three kept with the mask when the caller keeps schedules: `kept_bytes` from
//! `schedule` on), then for wgmma_atomic (`atomic`) its fp32 dQ accumulator [B, H, q_pad, D] (D the
//! head dim padded to 64) and, when its dK/dV CTAs are split (bwd_atomic_dkdv_splits), the fp32 dK
//! and dV accumulators [2][B, KVH, kv blocks * 128, D]. Offsets are from the start.
struct BwdScratch {
  int64_t row_stats = 0;  //!< offset of the float2 row statistics
  int64_t mask_rows = 0;  //!< offset of the QueryMaskRows
  int64_t schedule = 0;   //!< offset of the WorkItems
  int64_t key_bits = 0;   //!< offset of the key bit table
  int64_t row_bits = 0;   //!< offset of the dQ tiles' row bit table (the forward's format at the dQ tiling)
  int64_t kept_bytes = 0; //!< schedule and key bit table: what a kept schedule holds
  int64_t dq_accum = 0;        //!< offset of the fp32 dQ accumulator (wgmma_atomic)
  int64_t dq_accum_bytes = 0;  //!< its size; 0 for the deterministic kernels
  int64_t dkdv_accum = 0;        //!< offset of the fp32 dK, dV accumulators (wgmma_atomic, split)
  int64_t dkdv_accum_bytes = 0;  //!< their size; 0 unless wgmma_atomic splits its kv blocks
  int64_t bytes = 0;      //!< total
  int64_t dkdv_ctas = 0;  //!< one per (kv block, kv head, batch)
  int64_t dq_ctas = 0;
  int64_t dkdv_splits = 1;  //!< wgmma_atomic's CTAs per dK/dV CTA above (1 for the other kernels)
};
//! `head_dim`: q·k's (real or padded; it sets the tilings and the accumulators' rows).
constexpr BwdScratch bwd_scratch(int64_t batch, int64_t heads, int64_t kv_heads, int64_t q_len, int64_t head_dim,
                                 int64_t dq_num_q_blocks, int64_t dkdv_num_kv_blocks, bool atomic) {
  const int64_t q_pad = padded_q_len(q_len);
  const int64_t dq_accum_head_dim = atomic ? padded_head_dim(static_cast<int>(head_dim)) : 0;
  const Tile dq_tile = bwd_dq_tile(heads, kv_heads, head_dim), dkdv_tile = bwd_dkdv_tile(heads, kv_heads, head_dim);
  BwdScratch layout;
  layout.dkdv_ctas = dkdv_num_kv_blocks * kv_heads * batch;
  layout.dq_ctas = dq_num_q_blocks * (heads / dq_tile.heads_packed) * batch;
  layout.row_stats = 0;
  layout.mask_rows = align_scratch(batch * heads * q_pad * kRowStatBytes);
  layout.schedule = layout.mask_rows + align_scratch(q_pad * kQueryMaskRowBytes);
  const int64_t splits = bwd_atomic_dkdv_splits(batch, heads, kv_heads, dkdv_num_kv_blocks);
  layout.dkdv_splits = dq_accum_head_dim > 0 ? splits : 1;
  // Room for the merged schedule and for the atomic kernel's split one, whichever is longer.
  const int64_t schedule_items = std::max(layout.dkdv_ctas + layout.dq_ctas, layout.dkdv_ctas * splits);
  layout.key_bits = layout.schedule + align_scratch(schedule_items * kWorkItemBytes);
  layout.row_bits =
      layout.key_bits + align_scratch(bwd_key_bits_bytes(dkdv_num_kv_blocks, dkdv_tile.block_m, dkdv_tile.block_n));
  layout.dq_accum = layout.row_bits + align_scratch(mask_bit_words(dq_num_q_blocks, dq_tile.block_m, dq_tile.block_n) * 8);
  layout.kept_bytes = layout.dq_accum - layout.schedule;
  layout.dq_accum_bytes = batch * heads * q_pad * dq_accum_head_dim * 4;
  layout.dkdv_accum = layout.dq_accum + align_scratch(layout.dq_accum_bytes);
  layout.dkdv_accum_bytes =
      layout.dkdv_splits > 1 ? 2 * batch * kv_heads * dkdv_num_kv_blocks * dkdv_tile.block_n * dq_accum_head_dim * 4 : 0;
  layout.bytes = layout.dkdv_accum + align_scratch(layout.dkdv_accum_bytes);
  return layout;
}

}  // namespace harness::kernels::cuda::tiling
