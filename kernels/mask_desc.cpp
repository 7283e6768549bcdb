#include "kernels/mask_desc.h"

#include <algorithm>
#include <bit>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>

namespace harness::kernels {

namespace {

// Name tables: one place for the spec spelling of each enumerator.
constexpr std::pair<MaskKind, std::string_view> kMaskKindNames[] = {
    {MaskKind::dflash, "dflash"},
    {MaskKind::causal, "causal"},
    {MaskKind::document_causal, "document_causal"},
    {MaskKind::sliding_window, "sliding_window"},
    {MaskKind::full, "full"},
    {MaskKind::blockmask, "blockmask"},
};
constexpr std::pair<ContextRule, std::string_view> kContextRuleNames[] = {
    {ContextRule::before_anchor, "before_anchor"},
    {ContextRule::through_anchor, "through_anchor"},
};
constexpr std::pair<InBlock, std::string_view> kInBlockNames[] = {
    {InBlock::bidirectional, "bidirectional"},
    {InBlock::causal, "causal"},
};

template <typename Enum, std::size_t N>
std::optional<Enum> parse_name(const std::pair<Enum, std::string_view> (&table)[N], std::string_view name) {
  for (const auto& [value, spelling] : table) {
    if (spelling == name) return value;
  }
  return std::nullopt;
}

template <typename Enum, std::size_t N>
std::string_view name_of(const std::pair<Enum, std::string_view> (&table)[N], Enum value) {
  for (const auto& [candidate, spelling] : table) {
    if (candidate == value) return spelling;
  }
  return "unknown";
}

[[noreturn]] void invalid(const std::string& what) { throw std::invalid_argument(what); }

// The per-row predicates. Each is built once per query row (hoisting what depends on q only) and
// then evaluated per key; ResolvedMask::visible and visible_row both go through them, so there is
// exactly one definition of every mask.
struct FullRow {
  bool operator()(int64_t) const { return true; }
};

struct DflashRow {
  int64_t context;
  int64_t context_end;   // keys kv < context_end of the context part may be visible ...
  const int32_t* doc_id; // ... when they lie in the anchor's document
  int32_t anchor_doc;
  int64_t draft_begin;   // absolute KV range of the query's own draft block that it sees
  int64_t draft_end;
  DflashRow(const ResolvedMask& m, int64_t q)
      : context(m.context), doc_id(m.doc_id.data()) {
    const int64_t block = q / m.block_size;
    const int64_t anchor = m.anchors[static_cast<std::size_t>(block)];
    context_end = m.context_rule == ContextRule::through_anchor ? anchor + 1 : anchor;
    anchor_doc = m.doc_id[static_cast<std::size_t>(anchor)];
    draft_begin = m.context + block * m.block_size;
    draft_end = m.in_block == InBlock::causal ? m.context + q + 1 : draft_begin + m.block_size;
  }
  bool operator()(int64_t kv) const {
    if (kv < context) return kv < context_end && doc_id[kv] == anchor_doc;
    return kv >= draft_begin && kv < draft_end;
  }
};

struct CausalRow {
  int64_t q_abs;
  CausalRow(const ResolvedMask& m, int64_t q) : q_abs(m.q_abs(q)) {}
  bool operator()(int64_t kv) const { return kv <= q_abs; }
};

struct DocumentCausalRow {
  int64_t q_abs;
  const int32_t* doc_id;
  int32_t query_doc;
  DocumentCausalRow(const ResolvedMask& m, int64_t q)
      : q_abs(m.q_abs(q)), doc_id(m.doc_id.data()),
        // A query before the KV sequence (only in hand-built masks with q_len > kv_len) sees nothing.
        query_doc(q_abs >= 0 ? m.doc_id[static_cast<std::size_t>(q_abs)] : -1) {}
  bool operator()(int64_t kv) const { return kv <= q_abs && doc_id[kv] == query_doc; }
};

struct SlidingWindowRow {
  int64_t q_abs;
  int64_t window;
  SlidingWindowRow(const ResolvedMask& m, int64_t q) : q_abs(m.q_abs(q)), window(m.window) {}
  bool operator()(int64_t kv) const { return kv <= q_abs && kv > q_abs - window; }
};

// blockmask: one bit per key of the query's row.
struct BitmapRow {
  const uint32_t* words;
  BitmapRow(const ResolvedMask& m, int64_t q) : words(m.bit_row(q)) {}
  bool operator()(int64_t kv) const { return (words[kv >> 5] >> (kv & 31)) & 1u; }
};

template <typename Row>
void fill_row(const Row& row, int64_t kv_begin, int64_t kv_end, bool* out) {
  for (int64_t kv = kv_begin; kv < kv_end; ++kv) out[kv - kv_begin] = row(kv);
}

std::string describe_documents(const MaskDesc& desc) {
  if (desc.doc_lengths.empty()) return std::to_string(desc.documents) + " equal documents";
  std::string text = "doc_lengths [";
  for (std::size_t i = 0; i < desc.doc_lengths.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(desc.doc_lengths[i]);
  }
  return text + "]";
}

// Uniform integer in [0, bound) from raw 64-bit outputs by rejection: the same sequence on every
// standard library, unlike std::uniform_int_distribution whose algorithm is unspecified.
uint64_t bounded_draw(std::mt19937_64& rng, uint64_t bound) {
  // Accepting only x >= 2^64 mod bound leaves a multiple of bound values, so x % bound is unbiased.
  const uint64_t reject_below = (0 - bound) % bound;
  uint64_t x = rng();
  while (x < reject_below) x = rng();
  return x % bound;
}

}  // namespace

std::optional<MaskKind> parse_mask_kind(std::string_view name) { return parse_name(kMaskKindNames, name); }
std::string_view mask_kind_name(MaskKind kind) { return name_of(kMaskKindNames, kind); }
std::optional<ContextRule> parse_context_rule(std::string_view name) { return parse_name(kContextRuleNames, name); }
std::string_view context_rule_name(ContextRule rule) { return name_of(kContextRuleNames, rule); }
std::optional<InBlock> parse_in_block(std::string_view name) { return parse_name(kInBlockNames, name); }
std::string_view in_block_name(InBlock in_block) { return name_of(kInBlockNames, in_block); }

std::vector<int64_t> document_lengths(const MaskDesc& desc, int64_t length) {
  if (length < 0) invalid("document split: negative length " + std::to_string(length));
  if (!desc.doc_lengths.empty()) {
    int64_t sum = 0;
    for (std::size_t i = 0; i < desc.doc_lengths.size(); ++i) {
      if (desc.doc_lengths[i] < 1) {
        invalid("doc_lengths[" + std::to_string(i) + "] = " + std::to_string(desc.doc_lengths[i]) +
                ": every document needs at least one position");
      }
      sum += desc.doc_lengths[i];
    }
    if (sum != length) {
      invalid(describe_documents(desc) + " sum to " + std::to_string(sum) + " but the mask splits " +
              std::to_string(length) + " positions (" +
              (desc.kind == MaskKind::dflash ? "the context" : "the KV sequence") + ")");
    }
    return desc.doc_lengths;
  }
  if (desc.documents < 1) invalid("documents must be >= 1 (got " + std::to_string(desc.documents) + ")");
  if (length == 0 && desc.documents == 1) return {0};
  if (desc.documents > length) {
    invalid(std::to_string(desc.documents) + " documents do not fit " + std::to_string(length) +
            " positions: every document needs at least one");
  }
  std::vector<int64_t> lengths(static_cast<std::size_t>(desc.documents), length / desc.documents);
  lengths.back() += length % desc.documents;
  return lengths;
}

int64_t count_valid_anchor_positions(const MaskDesc& desc, int64_t context, int64_t block_size) {
  int64_t count = 0;
  for (int64_t doc_length : document_lengths(desc, context)) count += std::max<int64_t>(0, doc_length - block_size);
  return count;
}

bool ResolvedMask::visible(int64_t q, int64_t kv) const {
  switch (kind) {
    case MaskKind::full: return FullRow{}(kv);
    case MaskKind::dflash: return DflashRow(*this, q)(kv);
    case MaskKind::causal: return CausalRow(*this, q)(kv);
    case MaskKind::document_causal: return DocumentCausalRow(*this, q)(kv);
    case MaskKind::sliding_window: return SlidingWindowRow(*this, q)(kv);
    case MaskKind::blockmask: return BitmapRow(*this, q)(kv);
  }
  throw std::logic_error("ResolvedMask::visible: unknown mask kind");
}

void ResolvedMask::visible_row(int64_t q, int64_t kv_begin, int64_t kv_end, bool* out) const {
  switch (kind) {
    case MaskKind::full: return fill_row(FullRow{}, kv_begin, kv_end, out);
    case MaskKind::dflash: return fill_row(DflashRow(*this, q), kv_begin, kv_end, out);
    case MaskKind::causal: return fill_row(CausalRow(*this, q), kv_begin, kv_end, out);
    case MaskKind::document_causal: return fill_row(DocumentCausalRow(*this, q), kv_begin, kv_end, out);
    case MaskKind::sliding_window: return fill_row(SlidingWindowRow(*this, q), kv_begin, kv_end, out);
    case MaskKind::blockmask: return fill_row(BitmapRow(*this, q), kv_begin, kv_end, out);
  }
  throw std::logic_error("ResolvedMask::visible_row: unknown mask kind");
}

ResolvedMask ResolvedMask::slice(int64_t batch, int64_t head) const {
  ResolvedMask one = *this;
  if (!sliced()) return one;
  const int64_t index = (batch % bit_batch) * bit_heads + head % bit_heads;
  one.bit_offset = bit_offset + index * q_len * bit_words;
  one.bit_batch = 1;
  one.bit_heads = 1;
  return one;
}

ResolvedMask blockmask_mask(int64_t q_len, int64_t kv_len, std::vector<uint32_t> bits, int64_t bit_batch,
                            int64_t bit_heads) {
  const std::string where = "mask blockmask: ";
  if (q_len < 1 || kv_len < 1)
    invalid(where + "Q_LEN and KV_LEN must be >= 1 (got " + std::to_string(q_len) + ", " + std::to_string(kv_len) + ")");
  if (bit_batch < 1 || bit_heads < 1)
    invalid(where + "slice counts must be >= 1 (got batch " + std::to_string(bit_batch) + ", heads " +
            std::to_string(bit_heads) + ")");
  const int64_t words = blockmask_words(kv_len);
  const int64_t expected = bit_batch * bit_heads * q_len * words;
  if (static_cast<int64_t>(bits.size()) != expected)
    invalid(where + std::to_string(bits.size()) + " words, but " + std::to_string(bit_batch) + " x " +
            std::to_string(bit_heads) + " slices of Q_LEN " + std::to_string(q_len) + " rows of ceil(KV_LEN " +
            std::to_string(kv_len) + " / 32) = " + std::to_string(words) + " words need " + std::to_string(expected));
  // Keys past kv_len are never visible: the last word of every row keeps its first kv_len % 32 bits.
  if (const int64_t used = kv_len % 32; used != 0) {
    const uint32_t keep = (uint32_t{1} << used) - 1;
    for (std::size_t word = static_cast<std::size_t>(words - 1); word < bits.size(); word += static_cast<std::size_t>(words))
      bits[word] &= keep;
  }
  ResolvedMask mask;
  mask.kind = MaskKind::blockmask;
  mask.q_len = q_len;
  mask.kv_len = kv_len;
  mask.bit_words = words;
  mask.bit_batch = bit_batch;
  mask.bit_heads = bit_heads;
  mask.bits = std::make_shared<const std::vector<uint32_t>>(std::move(bits));
  return mask;
}

ResolvedMask resolve_mask(const MaskDesc& desc, const AttentionGeometry& geometry) {
  const std::string where = "mask " + std::string(mask_kind_name(desc.kind)) + ": ";
  if (desc.kind == MaskKind::blockmask)
    invalid(where + "its bits are data, not drawn from a description: load them from its file or capsule "
                    "(blockmask_mask)");
  if (geometry.block_size < 1) invalid(where + "block_size must be >= 1 (got " + std::to_string(geometry.block_size) + ")");
  if (geometry.anchors < 1) invalid(where + "anchors must be >= 1 (got " + std::to_string(geometry.anchors) + ")");
  if (geometry.context < 0) invalid(where + "context must be >= 0 (got " + std::to_string(geometry.context) + ")");

  ResolvedMask mask;
  mask.kind = desc.kind;
  mask.context_rule = desc.context_rule;
  mask.in_block = desc.in_block;
  mask.q_len = geometry.q_len();
  mask.kv_len = geometry.kv_len();
  mask.context = geometry.context;
  mask.block_size = geometry.block_size;
  mask.window = desc.window;

  // dflash documents split the context; every other kind splits the whole KV sequence.
  const int64_t split_length = desc.kind == MaskKind::dflash ? geometry.context : mask.kv_len;
  std::vector<int64_t> lengths;
  try {
    lengths = document_lengths(desc, split_length);
  } catch (const std::invalid_argument& error) {
    invalid(where + error.what());
  }
  mask.doc_id.reserve(static_cast<std::size_t>(split_length));
  for (std::size_t doc = 0; doc < lengths.size(); ++doc) {
    mask.doc_id.insert(mask.doc_id.end(), static_cast<std::size_t>(lengths[doc]), static_cast<int32_t>(doc));
  }

  if (desc.kind == MaskKind::sliding_window && desc.window < 1) {
    invalid(where + "window must be >= 1 (got " + std::to_string(desc.window) + "; window 1 sees only the query itself)");
  }

  if (desc.kind == MaskKind::dflash) {
    // Valid anchors of a document [start, start + L): start + 1 <= a <= start + L - block_size.
    std::vector<int64_t> valid;
    int64_t start = 0;
    for (int64_t doc_length : lengths) {
      for (int64_t a = start + 1; a <= start + doc_length - geometry.block_size; ++a) valid.push_back(a);
      start += doc_length;
    }
    const auto valid_count = static_cast<int64_t>(valid.size());
    if (geometry.anchors > valid_count) {
      invalid(where + std::to_string(geometry.anchors) + " anchors do not fit: only " + std::to_string(valid_count) +
              " valid anchor positions in a context of " + std::to_string(geometry.context) + " split into " +
              describe_documents(desc) + " with block_size " + std::to_string(geometry.block_size) +
              " (each document of length L offers L - block_size)");
    }
    // Partial Fisher-Yates: the first `anchors` slots become a uniform sample without replacement.
    std::mt19937_64 rng(desc.seed);
    for (int64_t i = 0; i < geometry.anchors; ++i) {
      const auto pick = i + static_cast<int64_t>(bounded_draw(rng, static_cast<uint64_t>(valid_count - i)));
      std::swap(valid[static_cast<std::size_t>(i)], valid[static_cast<std::size_t>(pick)]);
    }
    mask.anchors.assign(valid.begin(), valid.begin() + geometry.anchors);
    std::sort(mask.anchors.begin(), mask.anchors.end());
  }
  return mask;
}

int64_t count_visible_pairs(const ResolvedMask& mask) {
  if (mask.kind == MaskKind::blockmask) {
    // Bits past kv_len are 0 (blockmask_mask), so every set bit of every slice is a visible pair.
    const auto begin = mask.bits->begin() + mask.bit_offset;
    const int64_t slices = mask.bit_batch * mask.bit_heads;
    int64_t count = 0;
    for (auto word = begin; word != begin + slices * mask.q_len * mask.bit_words; ++word) count += std::popcount(*word);
    return count / slices;
  }
  const auto row = std::make_unique<bool[]>(static_cast<std::size_t>(mask.kv_len));
  int64_t count = 0;
  for (int64_t q = 0; q < mask.q_len; ++q) {
    mask.visible_row(q, 0, mask.kv_len, row.get());
    count += std::count(row.get(), row.get() + mask.kv_len, true);
  }
  return count;
}

}  // namespace harness::kernels
