#pragma once
// BlockMask in the FlexAttention layout, built from a ResolvedMask (never from a closure).
// The mask does not depend on batch or head, so every tensor has B = H = 1 and broadcasts.

#include <ATen/ATen.h>

#include <cstdint>

#include "kernels/mask_desc.h"

namespace harness::kernels {

//! Per q block: the kv blocks that are partly visible (mask evaluated per element) and those
//! that are fully visible (no mask work); per kv block the transposed lists for the dK/dV pass.
//! Empty blocks are in no list. All index tensors are int32 and ascending within a row.
struct BlockMask {
  int64_t q_len = 0;
  int64_t kv_len = 0;
  int64_t block_m = 128;  //!< query rows per block
  int64_t block_n = 128;  //!< key columns per block
  int64_t num_q_blocks = 0;
  int64_t num_kv_blocks = 0;
  at::Tensor kv_num_blocks;       //!< [1, 1, num_q_blocks]
  at::Tensor kv_indices;          //!< [1, 1, num_q_blocks, num_kv_blocks], first kv_num_blocks valid
  at::Tensor full_kv_num_blocks;  //!< [1, 1, num_q_blocks]
  at::Tensor full_kv_indices;     //!< [1, 1, num_q_blocks, num_kv_blocks]
  at::Tensor q_num_blocks;        //!< [1, 1, num_kv_blocks]
  at::Tensor q_indices;           //!< [1, 1, num_kv_blocks, num_q_blocks]
  at::Tensor full_q_num_blocks;   //!< [1, 1, num_kv_blocks]
  at::Tensor full_q_indices;      //!< [1, 1, num_kv_blocks, num_q_blocks]

  //! Copy of every tensor on `device`.
  BlockMask to(const at::Device& device) const;
  //! Number of partial and full (q block, kv block) pairs.
  int64_t partial_pairs() const;
  int64_t full_pairs() const;
};

//! A BlockMask with only its geometry set (lengths, block sizes, block counts) and no lists:
//! what both builders start from. Throws std::invalid_argument naming `who` for a block size < 1.
BlockMask block_mask_geometry(const ResolvedMask& mask, int64_t block_m, int64_t block_n, const char* who);

//! Builds the BlockMask of `mask` with the given block sizes (each > 0; lengths need not be
//! multiples). Tensors are created on the CPU; use .to() for a device copy.
BlockMask build_block_mask(const ResolvedMask& mask, int64_t block_m = 128, int64_t block_n = 128);

//! Dense [q_len, kv_len] boolean mask, for the dense reference and for tests.
at::Tensor dense_mask(const ResolvedMask& mask, const at::Device& device = at::kCPU);

}  // namespace harness::kernels
