#pragma once
// The mask predicate on the device. It mirrors ResolvedMask::visible (kernels/mask_desc.h and the
// per-row predicates in mask_desc.cpp) exactly:
//   dflash (query q in draft block i = q / block_size, anchor a = anchors[i]):
//     kv < context:  kv < a (kv <= a with through_anchor) and doc_id[kv] == doc_id[a]
//     kv >= context: context + i*block_size <= kv < context + (i+1)*block_size
//                    (in_block causal: kv <= context + q)
//   causal:          kv <= q_abs, q_abs = q + kv_len - q_len
//   document_causal: kv <= q_abs and doc_id[kv] == doc_id[q_abs] (q_abs < 0 sees nothing)
//   sliding_window:  q_abs - window < kv <= q_abs
//   full:            every kv < kv_len
//   blockmask:       bit kv % 32 of word kv / 32 of query q's row of bits, kv < kv_len
// Every kind fits one shape, hoisted per query row: a context range [ctx_lo, ctx_hi) optionally
// restricted to one document, or a band [band_lo, band_hi). Only partial blocks (and the ragged
// last kv block) evaluate it; full blocks skip it.

#include <cstdint>

#include "kernels/cuda/attention_params.h"

namespace harness::kernels::cuda::device {

//! What one query row sees, hoisted out of the per-key test.
struct QueryMask {
  int32_t ctx_lo;
  int32_t ctx_hi;
  int32_t doc;  //!< -1: no document restriction on the context range
  int32_t band_lo;
  int32_t band_hi;
};

//! QueryMask::doc of a blockmask row. Such a row has no band: band_lo and band_hi hold the low and
//! high 32 bits of its words' address instead, and [ctx_lo, ctx_hi) = [0, kv_len) bounds the keys
//! it may read. The named kinds never have a document below -1; the row keeps its 20 bytes, so the
//! kernels that hold two rows per thread need no register more for any mask.
constexpr int32_t kBitmapRow = -2;

//! The bits of a blockmask row (QueryMask::doc == kBitmapRow).
__device__ __forceinline__ const uint32_t* bitmap_words(const QueryMask& row) {
  return reinterpret_cast<const uint32_t*>((static_cast<uint64_t>(static_cast<uint32_t>(row.band_hi)) << 32) |
                                           static_cast<uint32_t>(row.band_lo));
}

//! QueryMask padded to 32 bytes: the backward prep kernel writes one per query position and the
//! dK/dV kernel copies them with 16-byte cp.async.
struct alignas(16) QueryMaskRow {
  QueryMask mask;
  int32_t unused[3];
};
static_assert(sizeof(QueryMaskRow) == 32, "two 16-byte chunks per row");

//! The row predicate of query q; rows past q_len (tile padding) see nothing.
__device__ __forceinline__ QueryMask query_mask(const MaskParams& mask, int q) {
  QueryMask row{0, 0, -1, 0, 0};
  if (q >= mask.q_len) return row;
  const int q_abs = q + mask.kv_len - mask.q_len;
  switch (mask.kind) {
    case MaskCode::dflash: {
      const int block = q / mask.block_size;
      const int anchor = __ldg(mask.anchors + block);
      row.ctx_hi = min(anchor + mask.through_anchor, mask.context);
      row.doc = __ldg(mask.doc_id + anchor);
      row.band_lo = mask.context + block * mask.block_size;
      row.band_hi = mask.in_block_causal ? mask.context + q + 1 : row.band_lo + mask.block_size;
      break;
    }
    case MaskCode::causal:
      row.ctx_hi = max(q_abs + 1, 0);
      break;
    case MaskCode::document_causal:
      if (q_abs >= 0) {
        row.ctx_hi = q_abs + 1;
        row.doc = __ldg(mask.doc_id + q_abs);
      }
      break;
    case MaskCode::sliding_window:
      row.ctx_lo = max(q_abs - mask.window + 1, 0);
      row.ctx_hi = max(q_abs + 1, 0);
      break;
    case MaskCode::full:
      row.ctx_hi = mask.kv_len;
      break;
    case MaskCode::blockmask: {
      const auto words = reinterpret_cast<uint64_t>(mask.bits + static_cast<int64_t>(q) * mask.bit_words);
      row.ctx_hi = mask.kv_len;
      row.doc = kBitmapRow;
      row.band_lo = static_cast<int32_t>(static_cast<uint32_t>(words));
      row.band_hi = static_cast<int32_t>(static_cast<uint32_t>(words >> 32));
      break;
    }
  }
  return row;
}

//! The document of key kv, read once per key instead of once per (row, key) pair: -1 where the
//! mask has no documents or kv is past doc_id's length (every visibility test then fails or never
//! asks: a row restricted to a document has doc >= 0 and a context range inside doc_id's length).
__device__ __forceinline__ int32_t key_doc(const MaskParams& mask, int kv) {
  const int32_t length = mask.kind == MaskCode::dflash            ? mask.context
                         : mask.kind == MaskCode::document_causal ? mask.kv_len
                                                                  : 0;
  return kv >= 0 && kv < length ? __ldg(mask.doc_id + kv) : -1;
}

//! Whether a named kind's row sees key kv of document kv_doc (key_doc; kv >= kv_len is never
//! visible: every range ends by kv_len). Bitwise & and |, not && and ||: with the row in shared
//! memory (the backward's mask rows), short-circuit tests became a branch per score, each waiting on
//! its own shared-memory load (ptxas kept the evaluation order); this way every field is loaded up
//! front.
__device__ __forceinline__ bool visible_named(const QueryMask& row, int32_t kv_doc, int kv) {
  const bool in_context = (kv >= row.ctx_lo) & (kv < row.ctx_hi) & ((row.doc < 0) | (kv_doc == row.doc));
  return in_context | ((kv >= row.band_lo) & (kv < row.band_hi));
}

//! Either, by the row's kind (for code that evaluates a mask once: the bit tables' kernels, and the
//! forward's keep bits of a named mask past the table). The score loops of tile_math.cuh decide
//! the kind once per tile and call visible_named or read the blockmask rows' words: there a test
//! per score split the unrolled loops into a branch each (the non-overlapped forwards 5-14% slower
//! on dflash, H200). Written out rather than as a choice between the two calls: that form compiles
//! the overlapped forwards to other instructions (tests/kernel_sass_test.py --against) and has not
//! been timed on its own; this one is the code they were timed with.
__device__ __forceinline__ bool visible(const QueryMask& row, int32_t kv_doc, int kv) {
  const bool in_context = (kv >= row.ctx_lo) & (kv < row.ctx_hi) & ((row.doc < 0) | (kv_doc == row.doc));
  if (row.doc == kBitmapRow) return in_context && ((__ldg(bitmap_words(row) + (kv >> 5)) >> (kv & 31)) & 1u);
  return in_context | ((kv >= row.band_lo) & (kv < row.band_hi));
}

}  // namespace harness::kernels::cuda::device
