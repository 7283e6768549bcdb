#pragma once
// The forward's partial blocks as bits (device code only). Evaluating the mask per score in an
// overlapped forward's masked step (mask_device.cuh: its keys' documents loaded, then ranges and
// a document compared for each of its 32 or 64 scores) takes about 560 instructions per thread
// and step beside an unmasked step's 300 (H200, Nsight Compute source counters, dflash 512
// anchors). The mask of a partial block does not depend on the head, the batch or the
// data, so one small kernel evaluates it once per query position and kept schedule, and the
// forward reads each row's 64-key word instead:
//   table[q_block][slot][position][word], slot < tiling::kMaskBitSlots of the q block's partial
//   list (its first slots: the list's order is the BlockMask's), word w of 64 bits for keys
//   kv_block * block_n + 64 w + c.
// The backward's dK/dV kernels (wgmma, wgmma_atomic) do the same for their transposed tiles (keys
// as rows, a step's 64 query rows as columns):
//   key_bits[kv_block][slot][key], slot < tiling::kBwdMaskBitSlots of the kv block's partial q
//   list, block_m bits (2, 4 or 8 bytes): bit p = position p of the slot's q block sees the key;
// the producer copies a partial step's entries (a tile's 128 or 64 keys) into shared memory with
// its Q, and a consumer repeats a key's entry across the step's 64 columns (column c is position
// c % block_m: the packed heads share the mask).
// A consumer thread holds two rows (r and r + 8 of its warp's 16) and, of each n8 chunk j of the
// tile, columns 8 j + 2 (lane % 4) + {0, 1}. keep_bit(j, e) numbers its scores within one 64-bit
// word: (M >> 2 (lane % 4)) & 0x0303... puts a row's two columns of chunk j at bits 8 j, 8 j + 1;
// the second row goes 2 above, the second 64-key word (128-key tiles) 4 above.

#include <cstdint>

#include "kernels/cuda/attention_params.h"
#include "kernels/cuda/mask_device.cuh"
#include "kernels/cuda/tile_math.cuh"
#include "kernels/cuda/tiling.h"

namespace harness::kernels::cuda::device {

//! Bit of score (chunk j, element e: rows e / 2, column e % 2) in a thread's keep word.
__host__ __device__ constexpr int keep_bit(int j, int e) { return 8 * (j & 7) + 4 * (j >> 3) + e; }

//! The tables' kernels (mask_bits.cu): one thread per entry, every mask family, documents
//! included, through the same predicate as mask_scores; slots past a block's partial count are not
//! written (never read).
__global__ void build_fwd_mask_bits_kernel(const MaskParams mask, const BlockListParams blocks, uint64_t* __restrict__ bits);
__global__ void build_bwd_key_bits_kernel(const MaskParams mask, const BlockListParams blocks, unsigned char* __restrict__ bits);

//! Key `key`'s entry of a step's 128 or 64 (in shared memory, block_m / 8 bytes each) repeated over
//! the step's 64 columns: bit c = position c % block_m. Reads the aligned 8 bytes that hold it.
__device__ __forceinline__ uint64_t key_columns(const unsigned char* entries, int key, int block_m) {
  const int byte = key * (block_m >> 3);
  uint64_t w = *reinterpret_cast<const uint64_t*>(entries + (byte & ~7)) >> ((byte & 7) * 8);
  if (block_m < 64) w &= (uint64_t{1} << block_m) - 1;
  if (block_m == 16) w |= w << 16;
  if (block_m <= 32) w |= w << 32;
  return w;
}

//! This thread's keep word from its two rows' words (bit c = column c of the tile's first 64).
__device__ __forceinline__ uint64_t keep_bits_of_words(uint64_t row0, uint64_t row1) {
  constexpr uint64_t kPairs = 0x0303030303030303ull;
  const int shift = 2 * (static_cast<int>(threadIdx.x) & 3);
  return ((row0 >> shift) & kPairs) | (((row1 >> shift) & kPairs) << 2);
}

//! This thread's keep word of a partial block from its two rows' entries (`row0`, `row1`: the
//! slot's words of the row's position).
template <int kBlockN>
__device__ __forceinline__ uint64_t keep_bits_from_table(const uint64_t* row0, const uint64_t* row1) {
  static_assert(kBlockN == 64 || kBlockN == 128, "one or two words per row");
  uint64_t keep = 0;
#pragma unroll
  for (int w = 0; w < kBlockN / 64; ++w) keep |= keep_bits_of_words(__ldg(row0 + w), __ldg(row1 + w)) << (4 * w);
  return keep;
}

//! This thread's keep word of a generic mask's tile of kBlockN keys at kv0 (a multiple of 64),
//! read from the mask's own bits (QueryMask rows of kind kBitmapRow: bit kv % 32 of word kv / 32,
//! so words kv0 / 32 + 2 w and + 1 are the table's word w) instead of one load per score. A row
//! without bits (past q_len) and words past the row's end read as 0.
template <int kBlockN>
__device__ __forceinline__ uint64_t keep_bits_from_bitmap(const QueryMask (&row)[2], int bit_words, int kv0) {
  static_assert(kBlockN == 64 || kBlockN == 128, "one or two words per row");
  uint64_t keep = 0;
#pragma unroll
  for (int w = 0; w < kBlockN / 64; ++w) {
    uint64_t word[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const bool has_bits = row[i].doc == kBitmapRow;
      const int lo = (kv0 >> 5) + 2 * w;
      const uint32_t low = has_bits && lo < bit_words ? __ldg(bitmap_words(row[i]) + lo) : 0u;
      const uint32_t high = has_bits && lo + 1 < bit_words ? __ldg(bitmap_words(row[i]) + lo + 1) : 0u;
      word[i] = low | (uint64_t{high} << 32);
    }
    keep |= keep_bits_of_words(word[0], word[1]) << (4 * w);
  }
  return keep;
}

//! -inf where the keep word's bit is clear.
template <int kCols>
__device__ __forceinline__ void apply_keep_bits(float (&s)[kCols / 8][4], uint64_t keep) {
  static_assert(kCols / 2 <= 64, "one bit per score of this thread");
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = (keep >> keep_bit(j, e)) & 1 ? s[j][e] : -INFINITY;
  }
}

//! The mask of a partial dK/dV step (partial slot `slot` of the kv block's list) on S^T: from the
//! table's entries the producer copied to `s_entries` when the slot is within the table, else per
//! score from the positions' mask rows.
template <int kRows>
__device__ __forceinline__ void mask_partial_step_transposed(float (&st)[kRows / 8][4], int slot, uint32_t s_entries,
                                                             const QueryMaskRow* masks, int block_m, const int32_t (&my_doc)[2],
                                                             const int (&my_kv)[2], int kv0) {
  if (slot < tiling::kBwdMaskBitSlots) {
    const auto* entries = reinterpret_cast<const unsigned char*>(__cvta_shared_to_generic(s_entries));
    apply_keep_bits<kRows>(st, keep_bits_of_words(key_columns(entries, my_kv[0] - kv0, block_m),
                                                  key_columns(entries, my_kv[1] - kv0, block_m)));
  } else {
    mask_scores_transposed<kRows>(st, masks, block_m - 1, my_doc, my_kv);
  }
}

}  // namespace harness::kernels::cuda::device
