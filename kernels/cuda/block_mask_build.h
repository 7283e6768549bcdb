#pragma once
// Plain parameters and launcher of the GPU BlockMask builder (block_mask_build.cu): no LibTorch,
// so the kernels build in the same object library as the attention kernels.
// block_mask_cuda.cpp is the LibTorch boundary that allocates the outputs and fills this struct.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/attention_params.h"

namespace harness::kernels::cuda {

//! One BlockMask build (FlexAttention layout, B = H = 1): the mask, the tiling, a scratch byte per
//! (q block, kv block) pair and the eight int32 output arrays, every entry of which is written
//! (unused list tails get 0, as on the CPU).
struct BlockMaskBuildParams {
  MaskParams mask;
  int32_t block_m = 0;
  int32_t block_n = 0;
  int32_t num_q_blocks = 0;
  int32_t num_kv_blocks = 0;
  uint8_t* pair_states = nullptr;          //!< scratch [num_q_blocks * num_kv_blocks]
  //! Scratch [q_len] of int4 (context lo, hi, band lo, hi): each query's visible keys as two
  //! intervals, used when `docs_contiguous` (then every pair is classified from its rows' spans).
  int4* row_spans = nullptr;
  //! Whether doc_id is non-decreasing, so each document is one contiguous span of positions and a
  //! row's document-restricted context is an interval. Otherwise every element is evaluated.
  bool docs_contiguous = false;
  int32_t* kv_num_blocks = nullptr;        //!< [num_q_blocks]
  int32_t* kv_indices = nullptr;           //!< [num_q_blocks, num_kv_blocks]
  int32_t* full_kv_num_blocks = nullptr;   //!< [num_q_blocks]
  int32_t* full_kv_indices = nullptr;      //!< [num_q_blocks, num_kv_blocks]
  int32_t* q_num_blocks = nullptr;         //!< [num_kv_blocks]
  int32_t* q_indices = nullptr;            //!< [num_kv_blocks, num_q_blocks]
  int32_t* full_q_num_blocks = nullptr;    //!< [num_kv_blocks]
  int32_t* full_q_indices = nullptr;       //!< [num_kv_blocks, num_q_blocks]
};

//! Launches the classification and list kernels on `stream` (nothing when either block count is 0).
//! Expects num_q_blocks * num_kv_blocks < 2^31. Throws CudaError when a launch fails.
void run_block_mask_build(const BlockMaskBuildParams& params, cudaStream_t stream);

}  // namespace harness::kernels::cuda
