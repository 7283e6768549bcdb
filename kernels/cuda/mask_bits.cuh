#pragma once
// The forward's partial blocks as bits (device code only). An overlapped forward's masked step
// used to evaluate the mask per score (mask_device.cuh: its keys' documents loaded, then ranges
// and a document compared for each of its 32 or 64 scores), about 560 instructions per thread
// and step beside an unmasked step's 300 (H200, session 14, Nsight Compute source counters,
// dflash 512 anchors). The mask of a partial block does not depend on the head, the batch or the
// data, so one small kernel evaluates it once per query position and kept schedule, and the
// forward reads each row's 64-key word instead:
//   table[q_block][slot][position][word], slot < tiling::kMaskBitSlots of the q block's partial
//   list (its first slots: the list's order is the BlockMask's), word w of 64 bits for keys
//   kv_block * block_n + 64 w + c.
// A consumer thread holds two rows (r and r + 8 of its warp's 16) and, of each n8 chunk j of the
// tile, columns 8 j + 2 (lane % 4) + {0, 1}. keep_bit(j, e) numbers its scores within one 64-bit
// word: (M >> 2 (lane % 4)) & 0x0303... puts a row's two columns of chunk j at bits 8 j, 8 j + 1;
// the second row goes 2 above, the second 64-key word (128-key tiles) 4 above.

#include <cstdint>

#include "kernels/cuda/attention_params.h"
#include "kernels/cuda/mask_device.cuh"
#include "kernels/cuda/tiling.h"

namespace harness::kernels::cuda::device {

//! Bit of score (chunk j, element e: rows e / 2, column e % 2) in a thread's keep word.
__host__ __device__ constexpr int keep_bit(int j, int e) { return 8 * (j & 7) + 4 * (j >> 3) + e; }

//! One thread per (q block, slot, position, word) entry of the table; slots past the q block's
//! partial count are not written (never read). Every mask family, documents included, through
//! the same predicate as mask_scores.
__global__ void build_fwd_mask_bits_kernel(const MaskParams mask, const BlockListParams blocks, uint64_t* __restrict__ bits) {
  const int words = blocks.block_n / 64;
  const int64_t per_slot = static_cast<int64_t>(blocks.block_m) * words;
  const int64_t per_block = tiling::kMaskBitSlots * per_slot;
  const int64_t total = per_block * blocks.num_q_blocks;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int q_block = static_cast<int>(i / per_block);
    const int slot = static_cast<int>(i % per_block / per_slot);
    if (slot >= __ldg(blocks.kv_num_blocks + q_block)) continue;
    const int position = static_cast<int>(i % per_slot / words);
    const int word = static_cast<int>(i % words);
    const int kv0 = __ldg(blocks.kv_indices + static_cast<int64_t>(q_block) * blocks.num_kv_blocks + slot) * blocks.block_n + 64 * word;
    const QueryMask row = query_mask(mask, q_block * blocks.block_m + position);
    uint64_t keep = 0;
    for (int c = 0; c < 64; ++c) {
      if (visible(row, key_doc(mask, kv0 + c), kv0 + c)) keep |= uint64_t{1} << c;
    }
    bits[i] = keep;
  }
}

//! This thread's keep word of a partial block from its two rows' entries (`row0`, `row1`: the
//! slot's words of the row's position).
template <int kBlockN>
__device__ __forceinline__ uint64_t keep_bits_from_table(const uint64_t* row0, const uint64_t* row1) {
  static_assert(kBlockN == 64 || kBlockN == 128, "one or two words per row");
  constexpr uint64_t kPairs = 0x0303030303030303ull;
  const int shift = 2 * (static_cast<int>(threadIdx.x) & 3);
  uint64_t keep = 0;
#pragma unroll
  for (int w = 0; w < kBlockN / 64; ++w) {
    const uint64_t a = (__ldg(row0 + w) >> shift) & kPairs;
    const uint64_t b = (__ldg(row1 + w) >> shift) & kPairs;
    keep |= (a | (b << 2)) << (4 * w);
  }
  return keep;
}

}  // namespace harness::kernels::cuda::device
