#pragma once
// LibTorch boundary of the GPU BlockMask builder (kernels in block_mask_build.cu).

#include <ATen/ATen.h>

#include <cstdint>

#include "kernels/block_mask.h"
#include "kernels/mask_desc.h"

namespace harness::kernels {

//! Builds the BlockMask of `mask` on the CUDA `device`, tensor for tensor equal to
//! build_block_mask(mask, block_m, block_n) (same shapes, int32, ascending lists, zero tails, same
//! partial/full classification). anchors_dev, doc_id_dev and bits_dev are the mask's arrays as int32
//! on `device` (MaskContext::anchors / doc_id / bits). Runs on the current stream of `device`,
//! asynchronously.
//! Throws std::invalid_argument for block sizes < 1 and c10::Error for misplaced inputs.
BlockMask build_block_mask_cuda(const ResolvedMask& mask, int64_t block_m, int64_t block_n, const at::Device& device,
                                const at::Tensor& anchors_dev, const at::Tensor& doc_id_dev, const at::Tensor& bits_dev);

}  // namespace harness::kernels
