#pragma once
// Test inputs shared by the BlockMask and attention tests: every mask kind for a geometry, and
// the skip used by [cuda] tests on machines without a GPU.

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

}  // namespace harness::test
