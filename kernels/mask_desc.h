#pragma once
// Mask descriptions: what a query may see, as data rather than a closure, so that the same
// description drives the BlockMask builder, the dense boolean mask, the CPU fused kernel's
// partial blocks and the CUDA kernels. Torch-free: spec validation uses it too.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace harness::kernels {

//! The mask families the harness knows.
enum class MaskKind { dflash, causal, document_causal, sliding_window, full };
//! dflash: does a draft block see its anchor itself (through_anchor, kv <= anchor) or only before it?
enum class ContextRule { before_anchor, through_anchor };
//! dflash: inside its own draft block, does a query see every position or only earlier ones?
enum class InBlock { bidirectional, causal };

//! Parses "dflash", "causal", "document_causal", "sliding_window", "full"; nullopt when unknown.
std::optional<MaskKind> parse_mask_kind(std::string_view name);
//! The spec name of a mask kind.
std::string_view mask_kind_name(MaskKind kind);
std::optional<ContextRule> parse_context_rule(std::string_view name);
std::string_view context_rule_name(ContextRule rule);
std::optional<InBlock> parse_in_block(std::string_view name);
std::string_view in_block_name(InBlock in_block);

//! Sequence geometry of one attention step. Q_LEN = anchors*block_size, KV_LEN = context + Q_LEN.
struct AttentionGeometry {
  int64_t batch = 1;
  int64_t heads = 1;
  int64_t kv_heads = 1;
  int64_t head_dim = 64;
  int64_t anchors = 1;
  int64_t block_size = 16;
  int64_t context = 0;
  int64_t q_len() const { return anchors * block_size; }
  int64_t kv_len() const { return context + q_len(); }
};

//! A mask as the spec describes it.
//! - dflash: KV = [context | draft block 0 | ... | draft block N-1], Q = [block 0 | ... ].
//!   A query of block i sees context positions kv < anchor_i (kv <= anchor_i with
//!   through_anchor) inside anchor_i's document, and its own draft block (all of it, or
//!   positions <= its own with in_block causal). Documents split the context.
//! - causal / document_causal / sliding_window: queries are the last Q_LEN positions of the
//!   KV sequence (query q sits at absolute position q + KV_LEN - Q_LEN, bottom-right aligned);
//!   documents split the whole KV sequence; the window counts positions back from the query,
//!   itself included (window 1 sees only itself).
//! - full: everything visible.
struct MaskDesc {
  MaskKind kind = MaskKind::full;
  ContextRule context_rule = ContextRule::before_anchor;
  InBlock in_block = InBlock::bidirectional;
  int64_t documents = 1;             //!< equal split (the remainder goes to the last document)
  std::vector<int64_t> doc_lengths;  //!< explicit lengths; when set they must sum to the split length
  int64_t window = 0;                //!< sliding_window only
  uint64_t seed = 0;                 //!< dflash anchor sampling
};

//! Lengths of the documents the mask splits `length` positions into (documents or doc_lengths).
std::vector<int64_t> document_lengths(const MaskDesc& desc, int64_t length);

//! Number of positions a dflash anchor may take: in each document of length L the anchors
//! a with doc_start + 1 <= a <= doc_end - block_size (at least one earlier token to see and a
//! whole draft block of tokens after it), so max(0, L - block_size) per document.
int64_t count_valid_anchor_positions(const MaskDesc& desc, int64_t context, int64_t block_size);

//! A mask with every random choice made: what the per-element predicate needs, as plain arrays
//! that copy to the GPU as they are.
struct ResolvedMask {
  MaskKind kind = MaskKind::full;
  ContextRule context_rule = ContextRule::before_anchor;
  InBlock in_block = InBlock::bidirectional;
  int64_t q_len = 0;
  int64_t kv_len = 0;
  int64_t context = 0;       //!< dflash: length of the context part of KV
  int64_t block_size = 1;    //!< dflash: draft block length
  int64_t window = 0;
  std::vector<int64_t> anchors;  //!< dflash: anchor position of each draft block, ascending
  std::vector<int32_t> doc_id;   //!< document of each position: context (dflash) or KV (others)

  //! Absolute KV-axis position of query q for the non-dflash masks.
  int64_t q_abs(int64_t q) const { return q + kv_len - q_len; }
  //! Whether query q sees key kv. The one definition every other form is checked against.
  bool visible(int64_t q, int64_t kv) const;
  //! visible(q, kv) for kv in [kv_begin, kv_end) into out[kv - kv_begin]: the same predicate
  //! with the per-row work hoisted, for the BlockMask builder, dense masks and mask tiles.
  void visible_row(int64_t q, int64_t kv_begin, int64_t kv_end, bool* out) const;
};

//! Resolves a description for a geometry: draws the dflash anchors without replacement from
//! the valid positions (seeded, identical on every platform), assigns documents.
//! Throws std::invalid_argument naming the problem when the description cannot fit the geometry.
ResolvedMask resolve_mask(const MaskDesc& desc, const AttentionGeometry& geometry);

//! Number of visible (q, kv) pairs, for FLOP counts and sparsity reports.
int64_t count_visible_pairs(const ResolvedMask& mask);

}  // namespace harness::kernels
