#pragma once
// Helpers shared by the LibTorch-facing files of kernels/cuda (fused_attention_cuda.cpp,
// block_mask_cuda.cpp): translating the torch-side mask description and index sizes into the
// plain types the kernels take.

#include <c10/util/Exception.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/cuda/attention_params.h"
#include "kernels/mask_desc.h"

namespace harness::kernels::cuda {

//! The kernels' code for a mask kind.
inline MaskCode mask_code(MaskKind kind) {
  switch (kind) {
    case MaskKind::dflash: return MaskCode::dflash;
    case MaskKind::causal: return MaskCode::causal;
    case MaskKind::document_causal: return MaskCode::document_causal;
    case MaskKind::sliding_window: return MaskCode::sliding_window;
    case MaskKind::full: return MaskCode::full;
  }
  throw std::logic_error("kernels/cuda: unknown mask kind");
}

//! `value` as the kernels' 32-bit index type; `who` and `what` name the caller and the quantity
//! in the error when it does not fit.
inline int32_t to_int32(int64_t value, const char* who, const char* what) {
  TORCH_CHECK(value >= 0 && value <= std::numeric_limits<int32_t>::max(), who, ": ", what, " = ", value,
              " does not fit the kernels' 32-bit indices");
  return static_cast<int32_t>(value);
}

}  // namespace harness::kernels::cuda
