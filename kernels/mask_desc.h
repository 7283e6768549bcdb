#pragma once
// Mask descriptions: what a query may see, as data rather than a closure, so that the same
// description drives the BlockMask builder, the dense boolean mask, the CPU fused kernel's
// partial blocks and the CUDA kernels. Torch-free: spec validation uses it too.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace harness::kernels {

//! The mask families the harness knows. blockmask: any mask, given as its bits (a FlexAttention
//! BlockMask evaluated once: kernels/README.md, "Any mask").
enum class MaskKind { dflash, causal, document_causal, sliding_window, full, blockmask };
//! dflash: does a draft block see its anchor itself (through_anchor, kv <= anchor) or only before it?
enum class ContextRule { before_anchor, through_anchor };
//! dflash: inside its own draft block, does a query see every position or only earlier ones?
enum class InBlock { bidirectional, causal };

//! Parses "dflash", "causal", "document_causal", "sliding_window", "full", "blockmask"; nullopt when unknown.
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
  int64_t v_head_dim = 0;  //!< head dim of v (and of the output); 0 means head_dim
  int64_t anchors = 1;
  int64_t block_size = 16;
  int64_t context = 0;
  int64_t q_len() const { return anchors * block_size; }
  int64_t kv_len() const { return context + q_len(); }
  int64_t value_head_dim() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
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
//! - blockmask: the bits of any mask, [slices][Q_LEN][ceil(KV_LEN / 32)] uint32 words, read from
//!   `file` (a safetensors file: replay/README.md) or, with `in_capsule`, from the step capsule
//!   being replayed. resolve_mask cannot draw them: see blockmask_mask.
struct MaskDesc {
  MaskKind kind = MaskKind::full;
  ContextRule context_rule = ContextRule::before_anchor;
  InBlock in_block = InBlock::bidirectional;
  int64_t documents = 1;             //!< equal split (the remainder goes to the last document)
  std::vector<int64_t> doc_lengths;  //!< explicit lengths; when set they must sum to the split length
  int64_t window = 0;                //!< sliding_window only
  uint64_t seed = 0;                 //!< dflash anchor sampling
  std::string file;                  //!< blockmask: the file holding its bits (absolute once validated)
  bool in_capsule = false;           //!< blockmask: the bits travel in the replayed capsule
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
  //! blockmask: the visibility bits, shared (copies of the mask are cheap). Bit kv % 32 of word
  //! kv / 32 of row q says whether q sees kv; words [slice][q][bit_words], bits past kv_len 0.
  //! A slice is one (batch, head) pattern: bit_batch x bit_heads slices, each 1 (the pattern
  //! broadcasts over the call's batch or heads) or the call's batch size or head count.
  std::shared_ptr<const std::vector<uint32_t>> bits;
  int64_t bit_words = 0;    //!< words per row: ceil(kv_len / 32)
  int64_t bit_batch = 1;    //!< slices along the batch
  int64_t bit_heads = 1;    //!< slices along the (query) heads
  int64_t bit_offset = 0;   //!< first word of the slice visible() reads (slice 0 unless sliced())

  //! Absolute KV-axis position of query q for the non-dflash masks.
  int64_t q_abs(int64_t q) const { return q + kv_len - q_len; }
  //! Whether query q sees key kv. The one definition every other form is checked against.
  bool visible(int64_t q, int64_t kv) const;
  //! visible(q, kv) for kv in [kv_begin, kv_end) into out[kv - kv_begin]: the same predicate
  //! with the per-row work hoisted, for the BlockMask builder, dense masks and mask tiles.
  void visible_row(int64_t q, int64_t kv_begin, int64_t kv_end, bool* out) const;
  //! Whether the mask differs between batch elements or heads (a blockmask with several slices):
  //! visible() then answers for slice 0 only, and attention runs one call per slice.
  bool sliced() const { return bit_batch * bit_heads > 1; }
  //! The single-slice mask of batch element `batch` and query head `head` (each taken modulo the
  //! slice counts, so a pattern that broadcasts answers for every index). Shares the bits.
  ResolvedMask slice(int64_t batch, int64_t head) const;
  //! The words of row q of the slice visible() reads (blockmask only).
  const uint32_t* bit_row(int64_t q) const { return bits->data() + bit_offset + q * bit_words; }
};

//! Resolves a description for a geometry: draws the dflash anchors without replacement from
//! the valid positions (seeded, identical on every platform), assigns documents.
//! Throws std::invalid_argument naming the problem when the description cannot fit the geometry.
ResolvedMask resolve_mask(const MaskDesc& desc, const AttentionGeometry& geometry);

//! A blockmask from its bits: `bits` holds bit_batch x bit_heads slices of q_len rows of
//! ceil(kv_len / 32) words (MaskDesc's blockmask layout). Bits past kv_len are cleared. Throws
//! std::invalid_argument naming the problem when the sizes do not fit.
ResolvedMask blockmask_mask(int64_t q_len, int64_t kv_len, std::vector<uint32_t> bits, int64_t bit_batch = 1,
                            int64_t bit_heads = 1);

//! Words per row of a blockmask over kv_len keys.
inline int64_t blockmask_words(int64_t kv_len) { return (kv_len + 31) / 32; }

//! Number of visible (q, kv) pairs, for FLOP counts and sparsity reports (a sliced blockmask:
//! the mean over its slices, rounded down).
int64_t count_visible_pairs(const ResolvedMask& mask);

}  // namespace harness::kernels
