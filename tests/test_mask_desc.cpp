// Mask descriptions: parsing, document splits, anchor sampling and the visible() predicate on
// hand-checked small cases. Torch-free.

#include <algorithm>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>

#include "kernels/mask_desc.h"
#include "tests/catch.h"

using namespace harness::kernels;

namespace {

AttentionGeometry geometry(int64_t anchors, int64_t block_size, int64_t context) {
  AttentionGeometry g;
  g.anchors = anchors;
  g.block_size = block_size;
  g.context = context;
  return g;
}

// Catches the std::invalid_argument of `action` and returns its message ("" if none was thrown).
template <typename Action>
std::string invalid_message(Action&& action) {
  try {
    action();
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("mask kind, context rule and in-block names round-trip", "[mask]") {
  for (auto kind : {MaskKind::dflash, MaskKind::causal, MaskKind::document_causal, MaskKind::sliding_window, MaskKind::full}) {
    REQUIRE(parse_mask_kind(mask_kind_name(kind)) == kind);
  }
  for (auto rule : {ContextRule::before_anchor, ContextRule::through_anchor}) {
    REQUIRE(parse_context_rule(context_rule_name(rule)) == rule);
  }
  for (auto in_block : {InBlock::bidirectional, InBlock::causal}) REQUIRE(parse_in_block(in_block_name(in_block)) == in_block);
  CHECK(mask_kind_name(MaskKind::document_causal) == "document_causal");
  CHECK_FALSE(parse_mask_kind("Causal").has_value());
  CHECK_FALSE(parse_context_rule("after_anchor").has_value());
  CHECK_FALSE(parse_in_block("").has_value());
}

TEST_CASE("document lengths: equal split, remainder to the last, explicit lengths", "[mask]") {
  MaskDesc desc;
  desc.documents = 3;
  CHECK(document_lengths(desc, 1000) == std::vector<int64_t>{333, 333, 334});
  desc.documents = 1;
  CHECK(document_lengths(desc, 7) == std::vector<int64_t>{7});
  desc.doc_lengths = {100, 650, 250};
  CHECK(document_lengths(desc, 1000) == std::vector<int64_t>{100, 650, 250});
  CHECK(contains(invalid_message([&] { document_lengths(desc, 999); }), "sum to 1000"));
  desc.doc_lengths = {100, 0, 900};
  CHECK(contains(invalid_message([&] { document_lengths(desc, 1000); }), "doc_lengths[1] = 0"));
  desc.doc_lengths.clear();
  desc.documents = 0;
  CHECK(contains(invalid_message([&] { document_lengths(desc, 1000); }), "documents must be >= 1"));
  desc.documents = 5;
  CHECK(contains(invalid_message([&] { document_lengths(desc, 4); }), "5 documents do not fit 4 positions"));
}

TEST_CASE("valid anchor positions: L - block_size per document", "[mask]") {
  MaskDesc desc;
  desc.kind = MaskKind::dflash;
  desc.doc_lengths = {100, 650, 250};
  CHECK(count_valid_anchor_positions(desc, 1000, 16) == (100 - 16) + (650 - 16) + (250 - 16));
  desc.doc_lengths = {10, 990};
  CHECK(count_valid_anchor_positions(desc, 1000, 16) == 990 - 16);  // the short document offers none
}

TEST_CASE("dflash anchors: valid, distinct, sorted, deterministic per seed", "[mask]") {
  MaskDesc desc;
  desc.kind = MaskKind::dflash;
  desc.doc_lengths = {100, 650, 250};
  desc.seed = 7;
  const auto g = geometry(40, 16, 1000);
  const ResolvedMask mask = resolve_mask(desc, g);
  REQUIRE(mask.anchors.size() == 40);
  REQUIRE(std::is_sorted(mask.anchors.begin(), mask.anchors.end()));
  REQUIRE(std::set<int64_t>(mask.anchors.begin(), mask.anchors.end()).size() == 40);
  // Valid: start + 1 <= a <= start + L - 16 within its document.
  const int64_t starts[] = {0, 100, 750};
  const int64_t lengths[] = {100, 650, 250};
  for (int64_t anchor : mask.anchors) {
    bool inside = false;
    for (int d = 0; d < 3; ++d) inside |= anchor >= starts[d] + 1 && anchor <= starts[d] + lengths[d] - 16;
    INFO("anchor " << anchor);
    CHECK(inside);
  }
  CHECK(resolve_mask(desc, g).anchors == mask.anchors);
  desc.seed = 8;
  CHECK(resolve_mask(desc, g).anchors != mask.anchors);

  SECTION("every valid position taken when anchors == valid positions") {
    desc.doc_lengths = {20, 30};  // 4 + 14 valid positions
    const ResolvedMask all = resolve_mask(desc, geometry(18, 16, 50));
    std::vector<int64_t> expected;
    for (int64_t a = 1; a <= 4; ++a) expected.push_back(a);
    for (int64_t a = 21; a <= 34; ++a) expected.push_back(a);
    CHECK(all.anchors == expected);
  }
  SECTION("draws are spread over the documents, not the first positions") {
    desc.doc_lengths.clear();
    desc.documents = 1;
    const ResolvedMask spread = resolve_mask(desc, geometry(8, 16, 10000));
    CHECK(spread.anchors.back() > 5000);  // 8 uniform draws all below 5000: probability 2^-8
  }
}

TEST_CASE("dflash anchors are pinned for a seed", "[mask]") {
  // Recorded once (GCC 12, libstdc++). mt19937_64's outputs are fixed by the standard and the
  // bounded draw is our own, so any platform or library giving other anchors is a bug: recorded
  // runs and replays depend on the same seed giving the same mask everywhere.
  MaskDesc desc;
  desc.kind = MaskKind::dflash;
  desc.doc_lengths = {100, 650, 250};
  desc.seed = 42;
  CHECK(resolve_mask(desc, geometry(6, 16, 1000)).anchors == std::vector<int64_t>{62, 182, 415, 590, 619, 642});
}

TEST_CASE("dflash visible: context before/through the anchor, documents, own block", "[mask]") {
  // Hand-built: context 10 in documents [0,4) [4,10); two draft blocks of 3 with anchors 2 and 7.
  ResolvedMask mask;
  mask.kind = MaskKind::dflash;
  mask.context = 10;
  mask.block_size = 3;
  mask.q_len = 6;
  mask.kv_len = 16;
  mask.anchors = {2, 7};
  mask.doc_id = {0, 0, 0, 0, 1, 1, 1, 1, 1, 1};

  SECTION("before_anchor, bidirectional") {
    // Query 1 (block 0, anchor 2): context 0, 1; draft block 0 = kv 10..12.
    for (int64_t kv = 0; kv < 16; ++kv) {
      INFO("kv " << kv);
      CHECK(mask.visible(1, kv) == (kv == 0 || kv == 1 || (kv >= 10 && kv <= 12)));
    }
    // Query 4 (block 1, anchor 7, document 1): context 4, 5, 6 only; draft block 1 = kv 13..15.
    for (int64_t kv = 0; kv < 16; ++kv) {
      INFO("kv " << kv);
      CHECK(mask.visible(4, kv) == ((kv >= 4 && kv <= 6) || (kv >= 13 && kv <= 15)));
    }
  }
  SECTION("through_anchor sees the anchor itself") {
    mask.context_rule = ContextRule::through_anchor;
    CHECK(mask.visible(0, 2));
    CHECK_FALSE(mask.visible(0, 3));
    CHECK(mask.visible(5, 7));
    CHECK_FALSE(mask.visible(5, 8));
    CHECK_FALSE(mask.visible(5, 3));  // other document
  }
  SECTION("in-block causal") {
    mask.in_block = InBlock::causal;
    // Query 4 is position 1 of block 1 (kv 13..15): sees 13 and 14, not 15.
    CHECK(mask.visible(4, 13));
    CHECK(mask.visible(4, 14));
    CHECK_FALSE(mask.visible(4, 15));
    CHECK(mask.visible(3, 13));
    CHECK_FALSE(mask.visible(3, 14));
    CHECK_FALSE(mask.visible(4, 12));  // another block
  }
}

TEST_CASE("causal, document_causal and sliding_window are bottom-right aligned", "[mask]") {
  // q_len 4, kv_len 10: query q sits at absolute position q + 6.
  ResolvedMask mask;
  mask.q_len = 4;
  mask.kv_len = 10;
  mask.doc_id = {0, 0, 0, 0, 0, 0, 0, 1, 1, 1};  // documents [0,7) [7,10)

  SECTION("causal") {
    mask.kind = MaskKind::causal;
    CHECK(mask.q_abs(0) == 6);
    CHECK(mask.visible(0, 6));
    CHECK_FALSE(mask.visible(0, 7));
    CHECK(mask.visible(3, 9));
    CHECK(mask.visible(0, 0));
  }
  SECTION("document_causal") {
    mask.kind = MaskKind::document_causal;
    CHECK(mask.visible(0, 0));        // query at 6, document 0
    CHECK(mask.visible(0, 6));
    CHECK_FALSE(mask.visible(1, 6));  // query at 7 starts document 1
    CHECK(mask.visible(1, 7));
    CHECK(mask.visible(3, 7));
    CHECK_FALSE(mask.visible(3, 0));
  }
  SECTION("sliding_window counts the query itself") {
    mask.kind = MaskKind::sliding_window;
    mask.window = 3;
    for (int64_t kv = 0; kv < 10; ++kv) {
      INFO("kv " << kv);
      CHECK(mask.visible(2, kv) == (kv >= 6 && kv <= 8));  // query at 8
    }
    mask.window = 1;
    CHECK(mask.visible(2, 8));
    CHECK_FALSE(mask.visible(2, 7));
  }
  SECTION("full") {
    mask.kind = MaskKind::full;
    CHECK(mask.visible(0, 9));
    CHECK(mask.visible(3, 0));
  }
}

TEST_CASE("visible_row and count_visible_pairs agree with visible", "[mask]") {
  for (auto kind : {MaskKind::dflash, MaskKind::causal, MaskKind::document_causal, MaskKind::sliding_window, MaskKind::full}) {
    MaskDesc desc;
    desc.kind = kind;
    desc.window = 37;
    desc.seed = 3;
    desc.documents = 3;
    const ResolvedMask mask = resolve_mask(desc, geometry(5, 16, 300));
    int64_t count = 0;
    const auto row = std::make_unique<bool[]>(static_cast<std::size_t>(mask.kv_len));
    for (int64_t q = 0; q < mask.q_len; ++q) {
      mask.visible_row(q, 5, mask.kv_len, row.get());
      for (int64_t kv = 0; kv < mask.kv_len; ++kv) {
        const bool visible = mask.visible(q, kv);
        count += visible;
        if (kv >= 5 && row[kv - 5] != visible) FAIL("visible_row differs at q " << q << " kv " << kv);
      }
    }
    INFO("kind " << mask_kind_name(kind));
    CHECK(count_visible_pairs(mask) == count);
    CHECK(count > 0);
  }
  SECTION("closed forms") {
    MaskDesc desc;
    desc.kind = MaskKind::full;
    const auto g = geometry(2, 16, 100);  // Q 32, KV 132
    CHECK(count_visible_pairs(resolve_mask(desc, g)) == 32 * 132);
    desc.kind = MaskKind::causal;
    int64_t causal = 0;
    for (int64_t q = 0; q < 32; ++q) causal += q + 100 + 1;
    CHECK(count_visible_pairs(resolve_mask(desc, g)) == causal);
  }
}

TEST_CASE("resolve_mask: other kinds split the KV sequence into documents", "[mask]") {
  MaskDesc desc;
  desc.kind = MaskKind::document_causal;
  desc.doc_lengths = {50, 82};
  const ResolvedMask mask = resolve_mask(desc, geometry(2, 16, 100));
  REQUIRE(mask.doc_id.size() == 132);
  CHECK(mask.doc_id[49] == 0);
  CHECK(mask.doc_id[50] == 1);
  CHECK(mask.anchors.empty());
  desc.doc_lengths = {50, 50};  // the context only: wrong for document_causal
  CHECK(contains(invalid_message([&] { resolve_mask(desc, geometry(2, 16, 100)); }), "KV sequence"));
}

TEST_CASE("resolve_mask rejects descriptions that cannot fit, naming the problem", "[mask]") {
  MaskDesc desc;
  desc.kind = MaskKind::dflash;
  desc.documents = 4;
  const std::string too_many = invalid_message([&] { resolve_mask(desc, geometry(500, 16, 512)); });
  CHECK(contains(too_many, "500 anchors do not fit"));
  CHECK(contains(too_many, "only 448 valid anchor positions"));

  desc.doc_lengths = {100, 200};
  CHECK(contains(invalid_message([&] { resolve_mask(desc, geometry(4, 16, 512)); }), "sum to 300"));
  desc.doc_lengths.clear();

  desc.kind = MaskKind::sliding_window;
  desc.window = 0;
  CHECK(contains(invalid_message([&] { resolve_mask(desc, geometry(4, 16, 512)); }), "window must be >= 1"));

  desc.kind = MaskKind::causal;
  CHECK(contains(invalid_message([&] { resolve_mask(desc, geometry(0, 16, 512)); }), "anchors must be >= 1"));
  CHECK(contains(invalid_message([&] { resolve_mask(desc, geometry(4, 0, 512)); }), "block_size must be >= 1"));
  CHECK(contains(invalid_message([&] { resolve_mask(desc, geometry(4, 16, -1)); }), "context must be >= 0"));
}
