// The partial blocks' bit tables (mask_bits.cuh describes them): their kernels and launches.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/mask_bits.cuh"
#include "kernels/cuda/mask_device.cuh"
#include "kernels/cuda/tiling.h"

namespace harness::kernels::cuda {
namespace device {

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

//! One thread per (kv block, slot, key) entry of the backward's table; slots past the kv block's
//! partial count are not written (never read).
__global__ void build_bwd_key_bits_kernel(const MaskParams mask, const BlockListParams blocks, unsigned char* __restrict__ bits) {
  const int64_t per_block = tiling::kBwdMaskBitSlots * blocks.block_n;
  const int64_t total = per_block * blocks.num_kv_blocks;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int kv_block = static_cast<int>(i / per_block);
    const int slot = static_cast<int>(i % per_block / blocks.block_n);
    if (slot >= __ldg(blocks.q_num_blocks + kv_block)) continue;
    const int q_block = __ldg(blocks.q_indices + static_cast<int64_t>(kv_block) * blocks.num_q_blocks + slot);
    const int kv = kv_block * blocks.block_n + static_cast<int>(i % blocks.block_n);
    const int32_t doc = key_doc(mask, kv);
    uint64_t sees = 0;  // bit p: position p of the q block (block_m is 16, 32 or 64)
    for (int position = 0; position < blocks.block_m && position < 64; ++position) {
      if (visible(query_mask(mask, q_block * blocks.block_m + position), doc, kv)) sees |= uint64_t{1} << position;
    }
    unsigned char* entry = bits + i * (blocks.block_m / 8);
    if (blocks.block_m == 16) {
      *reinterpret_cast<uint16_t*>(entry) = static_cast<uint16_t>(sees);
    } else if (blocks.block_m == 32) {
      *reinterpret_cast<uint32_t*>(entry) = static_cast<uint32_t>(sees);
    } else {
      *reinterpret_cast<uint64_t*>(entry) = sees;
    }
  }
}

}  // namespace device

namespace launch {
namespace {

//! Launches one of the table kernels: one thread per entry, grid-strided past 4096 CTAs.
template <typename Bits>
void launch_table(void (*kernel)(MaskParams, BlockListParams, Bits*), const char* name, int64_t entries,
                  const MaskParams& mask, const BlockListParams& blocks, Bits* bits, cudaStream_t stream) {
  constexpr int kThreads = 256;
  launch_kernel(kernel, name, std::min<int64_t>(tiling::ceil_div(entries, kThreads), 4096), kThreads, 0, stream, mask, blocks,
                bits);
}

}  // namespace

void launch_row_bits(const MaskParams& mask, const BlockListParams& blocks, uint64_t* bits, cudaStream_t stream) {
  launch_table(device::build_fwd_mask_bits_kernel, "build_fwd_mask_bits_kernel",
               tiling::mask_bit_words(blocks.num_q_blocks, blocks.block_m, blocks.block_n), mask, blocks, bits, stream);
}

void launch_key_bits(const MaskParams& mask, const BlockListParams& blocks, unsigned char* bits, cudaStream_t stream) {
  launch_table(device::build_bwd_key_bits_kernel, "build_bwd_key_bits_kernel",
               blocks.num_kv_blocks * tiling::kBwdMaskBitSlots * blocks.block_n, mask, blocks, bits, stream);
}

}  // namespace launch
}  // namespace harness::kernels::cuda
