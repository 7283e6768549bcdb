#pragma once
// Test inputs shared by the BlockMask and attention tests: every mask kind for a geometry, one
// mask from a few numbers, and the skip used by [cuda] tests on machines without a GPU.

#include <string>
#include <vector>

#include "kernels/mask_desc.h"

namespace harness::test {

//! A resolved mask with a readable name for test messages.
struct NamedMask {
  std::string name;
  kernels::ResolvedMask mask;
};

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
