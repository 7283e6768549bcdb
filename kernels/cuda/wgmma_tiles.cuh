#pragma once
// Operand tiles of the Hopper kernels (device code only): the products every wgmma kernel issues
// on 128-byte-swizzled shared-memory tiles (hopper_utils.cuh), the bulk copies and reductions
// between shared and global memory, the stage barriers of a TMA ring, and the stores of a
// consumer warpgroup's accumulator (bf16 by TMA, fp32 into a chunk-swizzled tile).

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/hopper_utils.cuh"
#include "kernels/cuda/wgmma_ops.cuh"

namespace harness::kernels::cuda::device {

//! Bulk (non-tensor) global -> shared copy of `bytes` (multiple of 16, both ends 16-byte aligned).
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

//! The barriers of either tile kind: one for the resident tiles, two "full" per stage (the
//! stage's two operands arrive separately) and one "empty" per stage.
template <int kStages>
struct BwdBarriers {
  uint32_t base;
  __device__ __forceinline__ uint32_t resident() const { return base; }
  __device__ __forceinline__ uint32_t first(int stage) const { return base + 8u * (1 + stage); }
  __device__ __forceinline__ uint32_t second(int stage) const { return base + 8u * (1 + kStages + stage); }
  __device__ __forceinline__ uint32_t empty(int stage) const { return base + 8u * (1 + 2 * kStages + stage); }
};

//! The descriptor of an operand's slice `offset` bytes past `base` (1024-byte swizzle stride,
//! `leading` bytes between its 64-column blocks): advanced from `base_desc`, the descriptor of
//! `base`, with kAdvance, else built from the slice's address.
template <bool kAdvance>
__device__ __forceinline__ uint64_t slice_descriptor(uint64_t base_desc, uint32_t base, uint32_t offset, uint32_t leading) {
  if constexpr (kAdvance) {
    return smem_descriptor_advance(base_desc, offset);
  } else {
    return smem_descriptor(base + offset, leading, 1024);
  }
}

//! acc (64 key rows x kRows) = X Y^T, issued (not committed): X = 64 resident rows (K or V) at
//! `keys` within a tile of kKeys rows, Y = kRows staged rows (Q or dO) at `rows`; both stored as
//! 64-column blocks of 128-byte swizzled rows, the blocks kKeys (kRows) rows apart, summed over
//! their first kSumDim columns (HeadDims::kSumDim). The dQ tile uses it the other way round: X = a
//! consumer's 64 Q (dO) rows, Y = a stage's keys (S, dP).
//! kAdvance: build each operand's descriptor once and advance it per k-slice (4 uniform
//! instructions a wgmma instead of 10), else build each slice's from its address. The two give the
//! same products; which schedules better is measured per kernel (the atomic step loop builds).
template <int kSumDim, int kKeys, int kRows, ElementType kElement, bool kAdvance = true>
__device__ __forceinline__ void keys_times_rows(float (&acc)[kRows / 8][4], uint32_t keys, uint32_t rows) {
  const uint64_t keys_desc = smem_descriptor(keys, 16, 1024);
  const uint64_t rows_desc = smem_descriptor(rows, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < kSumDim / 16; ++kk) {
    const uint32_t keys_offset = (kk / 4) * kKeys * 128 + (kk % 4) * 32;
    const uint32_t rows_offset = (kk / 4) * kRows * 128 + (kk % 4) * 32;
    wgmma_ss<kRows, false, kElement>(acc, slice_descriptor<kAdvance>(keys_desc, keys, keys_offset, 16),
                                     slice_descriptor<kAdvance>(rows_desc, rows, rows_offset, 16), kk > 0);
  }
}

//! acc (64 rows x kColumns) += A B, issued (not committed): A = the kRows columns of register
//! fragments `a` (P^T, dS^T or dS), B = kRows staged rows at `rows` (dO, Q or K: kColumns wide from
//! `rows`, N-major, the 64-column blocks kRows rows apart). kAdvance as keys_times_rows'.
template <int kColumns, int kRows, ElementType kElement, bool kAdvance = true>
__device__ __forceinline__ void fragments_times_rows(float (&acc)[kColumns / 8][4], const uint32_t (&a)[kRows / 16][4],
                                                     uint32_t rows) {
  const uint64_t rows_desc = smem_descriptor(rows, kRows * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < kRows / 16; ++kk) {
    wgmma_rs<kColumns, true, kElement>(acc, a[kk], slice_descriptor<kAdvance>(rows_desc, rows, kk * 16 * 128, kRows * 128),
                                       true);
  }
}

//! Stores a consumer's fp32 accumulator (64 rows x kColumns, times `factor`) in the element type
//! into rows row0.. of a swizzled tile of `tile_rows` rows (see hopper_utils.cuh), then one thread
//! of the warpgroup TMA-stores those 64 rows at (column col0, row coordinate, head, batch) of `map`
//! (col0: where the tile's first 64-column block goes in the tensor).
template <int kColumns, ElementType kElement>
__device__ __forceinline__ void store_consumer_rows(const float (&acc)[kColumns / 8][4], float factor, uint32_t tile,
                                                    int tile_rows, int row0, int consumer, const CUtensorMap* map,
                                                    int row_coord, int head_coord, int batch, bool wait_read = true,
                                                    int col0 = 0) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int first = row0 + ((static_cast<int>(threadIdx.x) >> 5) & 3) * 16 + (lane >> 2);
#pragma unroll
  for (int j = 0; j < kColumns / 8; ++j) {
    const int col = j * 8 + (lane & 3) * 2;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t packed = pack2<kElement>(acc[j][2 * i] * factor, acc[j][2 * i + 1] * factor);
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(tile + swizzled_offset(tile_rows, first + 8 * i, col)), "r"(packed)
                   : "memory");
    }
  }
  fence_async_shared();
  named_barrier_sync(1 + consumer, 128);
  if ((threadIdx.x & 127) == 0) {
#pragma unroll
    for (int half = 0; half < kColumns / 64; ++half) {
      tma_store_4d(map, tile + half * tile_rows * 128 + row0 * 128, col0 + half * 64, row_coord, head_coord, batch);
    }
    tma_store_commit();
    // Before the CTA may exit or the rows be written again. A caller that does neither may skip
    // it: a later wait covers every store this thread committed.
    if (wait_read) tma_store_wait_read();
  }
}

// ---- Split columns: a consumer's 64-column blocks --------------------------------------------------
// Above a head dim of 128 the backward's two consumers share a tile's rows and split its columns:
// consumer c keeps the 64-column blocks c, c + 2, ... (bwd_splits_columns, attention_config.h), in
// an accumulator of [blocks it keeps][8][4]; below, a consumer keeps all columns of its own rows,
// in [columns / 8][4]. These overloads take either.

//! Whether this consumer keeps block i of `blocks` (warpgroup-uniform: the products under it are
//! issued by the whole warpgroup or not at all).
__device__ __forceinline__ bool keeps_block(int consumer, int i, int blocks) { return consumer + 2 * i < blocks; }

//! fence_registers over an accumulator, whole or in column blocks.
template <int kN>
__device__ __forceinline__ void fence_accumulator(float (&acc)[kN][4]) {
  fence_registers(acc);
}
template <int kBlocks>
__device__ __forceinline__ void fence_accumulator(float (&acc)[kBlocks][8][4]) {
#pragma unroll
  for (int i = 0; i < kBlocks; ++i) fence_registers(acc[i]);
}

//! fragments_times_rows into an accumulator of kColumns, whole or, in column blocks, one N = 64
//! product per block this consumer keeps (`rows`: the operand tile, kRows rows a 64-column block).
template <int kColumns, int kRows, ElementType kElement, int kN>
__device__ __forceinline__ void fragments_times_columns(float (&acc)[kN][4], const uint32_t (&a)[kRows / 16][4], uint32_t rows,
                                                        int) {
  fragments_times_rows<kColumns, kRows, kElement>(acc, a, rows);
}
template <int kColumns, int kRows, ElementType kElement, int kBlocks>
__device__ __forceinline__ void fragments_times_columns(float (&acc)[kBlocks][8][4], const uint32_t (&a)[kRows / 16][4],
                                                        uint32_t rows, int consumer) {
#pragma unroll
  for (int i = 0; i < kBlocks; ++i) {
    if (keeps_block(consumer, i, kColumns / 64)) {
      fragments_times_rows<64, kRows, kElement>(acc[i], a, rows + (consumer + 2 * i) * kRows * 128);
    }
  }
}

//! store_consumer_rows of the blocks this consumer keeps of a `blocks`-block accumulator, each
//! through its own block of a shared tile of `tile_rows` rows, to its columns of `map`. Both
//! consumers must be past every product that reads the tile.
template <int kBlocks, ElementType kElement>
__device__ __forceinline__ void store_kept_blocks(const float (&acc)[kBlocks][8][4], float factor, uint32_t tile, int tile_rows,
                                                  int blocks, int consumer, const CUtensorMap* map, int row_coord,
                                                  int head_coord, int batch) {
#pragma unroll
  for (int i = 0; i < kBlocks; ++i) {
    const int block = consumer + 2 * i;
    if (keeps_block(consumer, i, blocks)) {
      store_consumer_rows<64, kElement>(acc[i], factor, tile + block * tile_rows * 128, tile_rows, 0, consumer, map, row_coord,
                                        head_coord, batch, true, block * 64);
    }
  }
}

//! Byte offset of fp32 column `col` within row `row` of a dQ tile or accumulator (kHeadDim floats a
//! row): 16-byte chunk c of row r sits at chunk c ^ (2 (r % 4) + (r / 4) % 2). store_f32_rows' 64-bit
//! stores run as two phases of 16 lanes, each 4 rows x 2 adjacent chunks (2k, 2k + 1); the swizzle
//! puts those 4 rows' pairs on 4 different pairs of the 8 chunks a 128-byte bank line holds, so a
//! phase is one wavefront. (The plain c ^ (r % 8) puts rows r and r ^ 1 on the same pair, two
//! wavefronts a phase: Nsight Compute counted 9% excess shared wavefronts in the causal backward,
//! H200.) The reduction is elementwise and the convert kernel reads through this
//! function, so the accumulator carries the same swizzle.
__device__ __forceinline__ uint32_t dq_column_offset(int row, int col) {
  const int swizzle = ((row & 3) << 1) | ((row >> 2) & 1);
  return static_cast<uint32_t>((((col >> 2) ^ swizzle) << 4) + (col & 3) * 4);
}

//! Stores a warp's share of a consumer's fp32 accumulator (columns col0.. of its 16 rows from
//! `row`, as wgmma lays them out) into a chunk-swizzled tile of kHeadDim floats a row.
template <int kHeadDim, int kColumns>
__device__ __forceinline__ void store_f32_rows(uint32_t tile, const float (&acc)[kColumns / 8][4], int row, int col0, int lane) {
#pragma unroll
  for (int j = 0; j < kColumns / 8; ++j) {
    const int col = col0 + j * 8 + (lane & 3) * 2;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(tile + (row + 8 * i) * kHeadDim * 4 + dq_column_offset(row + 8 * i, col)),
                   "f"(acc[j][2 * i]), "f"(acc[j][2 * i + 1])
                   : "memory");
    }
  }
}

//! Adds `bytes` of fp32 from shared memory to global memory elementwise (asynchronous, in the
//! calling thread's bulk group).
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}
//! Waits until every committed bulk operation of this thread has finished reading shared memory.
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
//! Waits until every committed bulk operation of this thread has completed.
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

}  // namespace harness::kernels::cuda::device
