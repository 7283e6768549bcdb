#pragma once
// Helpers shared by the LibTorch-facing files of kernels/cuda (fused_attention_cuda.cpp,
// block_mask_cuda.cpp): translating the torch-side mask description (ResolvedMask -> MaskParams,
// in one place) and index sizes into the plain types the kernels take.

#include <ATen/core/Tensor.h>
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
    case MaskKind::blockmask: return MaskCode::blockmask;
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

//! The kernels' description of a resolved mask, reading the mask's device arrays `anchors`,
//! `doc_id` and `bits` (contiguous int32 on the kernels' device; empty where the kind needs none:
//! MaskContext::anchors, doc_id, bits). Checks that a dflash mask has an anchor per draft block and
//! a document id per context position, a document_causal mask a document id per KV position, and a
//! blockmask one slice of bits; `who` names the caller in the error.
inline MaskParams mask_params(const ResolvedMask& mask, const at::Tensor& anchors, const at::Tensor& doc_id,
                              const at::Tensor& bits, const char* who) {
  TORCH_CHECK(mask.kind != MaskKind::dflash ||
                  (anchors.numel() * mask.block_size >= mask.q_len && doc_id.numel() >= mask.context),
              who, ": the dflash mask needs an anchor per draft block and a document id per context position");
  TORCH_CHECK(mask.kind != MaskKind::document_causal || doc_id.numel() >= mask.kv_len, who,
              ": the document_causal mask needs a document id per KV position");
  TORCH_CHECK(mask.kind != MaskKind::blockmask || (!mask.sliced() && bits.numel() == mask.q_len * mask.bit_words), who,
              ": the blockmask needs one slice of bits, Q_LEN x ceil(KV_LEN / 32) words (a sliced mask runs per slice)");
  MaskParams params;
  params.kind = mask_code(mask.kind);
  params.through_anchor = mask.context_rule == ContextRule::through_anchor;
  params.in_block_causal = mask.in_block == InBlock::causal;
  params.q_len = to_int32(mask.q_len, who, "q_len");
  params.kv_len = to_int32(mask.kv_len, who, "kv_len");
  params.context = to_int32(mask.context, who, "context");
  params.block_size = to_int32(mask.block_size, who, "block_size");
  params.window = to_int32(mask.window, who, "window");
  params.anchors = anchors.numel() ? anchors.data_ptr<int32_t>() : nullptr;
  params.doc_id = doc_id.numel() ? doc_id.data_ptr<int32_t>() : nullptr;
  params.bits = bits.numel() ? reinterpret_cast<const uint32_t*>(bits.data_ptr<int32_t>()) : nullptr;
  params.bit_words = to_int32(mask.bit_words, who, "bit_words");
  return params;
}

}  // namespace harness::kernels::cuda
