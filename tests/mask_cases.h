#pragma once
// Test inputs shared by the BlockMask and attention tests: every mask kind for a geometry (the
// blockmask kind with three masks no named kind expresses), one mask from a few numbers.

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/mask_desc.h"

namespace harness::test {

//! A resolved mask with a readable name for test messages.
struct NamedMask {
  std::string name;
  kernels::ResolvedMask mask;
};

//! A blockmask from a predicate visible(slice, q, kv): `slices` patterns of q_len x kv_len bits
//! (bit_batch = slices when `per_batch`, else bit_heads = slices).
template <typename Visible>
kernels::ResolvedMask bits_of(int64_t q_len, int64_t kv_len, Visible visible, int64_t slices = 1, bool per_batch = true) {
  const int64_t words = kernels::blockmask_words(kv_len);
  std::vector<uint32_t> bits(static_cast<size_t>(slices * q_len * words), 0);
  for (int64_t slice = 0; slice < slices; ++slice)
    for (int64_t q = 0; q < q_len; ++q)
      for (int64_t kv = 0; kv < kv_len; ++kv)
        if (visible(slice, q, kv)) bits[static_cast<size_t>((slice * q_len + q) * words + kv / 32)] |= uint32_t{1} << (kv % 32);
  return kernels::blockmask_mask(q_len, kv_len, std::move(bits), per_batch ? slices : 1, per_batch ? 1 : slices);
}

//! Masks no named kind expresses, as blockmasks (queries bottom-right aligned like the named kinds):
//!  - prefix-LM: the first `prefix` keys bidirectional, causal after;
//!  - dilated sliding window: causal, keys within window * dilation of the query and a multiple
//!    of `dilation` back from it;
//!  - tree: speculative decoding, a context seen by every node, then a root and 4 branches of
//!    chains; a node sees its ancestors and itself (the draft tree is the last Q_LEN keys).
inline kernels::ResolvedMask prefix_lm_mask(int64_t q_len, int64_t kv_len, int64_t prefix) {
  return bits_of(q_len, kv_len, [&](int64_t, int64_t q, int64_t kv) { return kv < prefix || kv <= q + kv_len - q_len; });
}
inline kernels::ResolvedMask dilated_window_mask(int64_t q_len, int64_t kv_len, int64_t window, int64_t dilation) {
  return bits_of(q_len, kv_len, [&](int64_t, int64_t q, int64_t kv) {
    const int64_t back = q + kv_len - q_len - kv;
    return back >= 0 && back < window * dilation && back % dilation == 0;
  });
}
//! Branch of tree node n (0 = root, then 4 chains node by node: node n > 0 is in branch (n-1) % 4).
inline kernels::ResolvedMask tree_mask(int64_t q_len, int64_t kv_len) {
  const int64_t context = kv_len - q_len;
  return bits_of(q_len, kv_len, [&](int64_t, int64_t q, int64_t kv) {
    if (kv < context) return true;
    const int64_t node = kv - context;
    // Ancestors of q: the root and the earlier nodes of q's branch (same (n-1) % 4).
    return node == q || node == 0 || (node < q && q > 0 && (node - 1) % 4 == (q - 1) % 4);
  });
}

//! Every mask kind (both dflash rules) for `geometry`; dflash and document_causal split the context
//! into `doc_lengths` (document_causal's last document also takes the queries).
inline std::vector<NamedMask> every_mask_kind(const kernels::AttentionGeometry& geometry,
                                              const std::vector<int64_t>& doc_lengths) {
  using namespace kernels;
  std::vector<NamedMask> masks;
  const auto add = [&](const std::string& name, const MaskDesc& desc) {
    masks.push_back({name, resolve_mask(desc, geometry)});
  };
  MaskDesc dflash;
  dflash.kind = MaskKind::dflash;
  dflash.doc_lengths = doc_lengths;
  dflash.seed = 11;
  add("dflash before_anchor bidirectional", dflash);
  dflash.context_rule = ContextRule::through_anchor;
  dflash.in_block = InBlock::causal;
  add("dflash through_anchor causal", dflash);
  MaskDesc other;
  other.kind = MaskKind::causal;
  add("causal", other);
  other.kind = MaskKind::document_causal;
  other.doc_lengths = doc_lengths;
  other.doc_lengths.back() += geometry.q_len();
  add("document_causal", other);
  other.doc_lengths.clear();
  other.kind = MaskKind::sliding_window;
  other.window = 100;
  add("sliding_window", other);
  other.kind = MaskKind::full;
  add("full", other);
  const int64_t q_len = geometry.q_len(), kv_len = geometry.kv_len();
  masks.push_back({"blockmask prefix-LM", prefix_lm_mask(q_len, kv_len, kv_len / 3)});
  masks.push_back({"blockmask dilated sliding window", dilated_window_mask(q_len, kv_len, 40, 3)});
  masks.push_back({"blockmask tree, 4 branches", tree_mask(q_len, kv_len)});
  return masks;
}

//! The mask of `kind` on a geometry given by its head counts, anchors and context (the rest at
//! AttentionGeometry's defaults), the KV split into `documents` equal documents.
inline kernels::ResolvedMask mask_of(kernels::MaskKind kind, int64_t heads, int64_t kv_heads, int64_t anchors,
                                     int64_t context, int64_t documents = 1) {
  kernels::AttentionGeometry geometry;
  geometry.heads = heads;
  geometry.kv_heads = kv_heads;
  geometry.anchors = anchors;
  geometry.context = context;
  kernels::MaskDesc desc;
  desc.kind = kind;
  desc.documents = documents;
  return kernels::resolve_mask(desc, geometry);
}

}  // namespace harness::test
