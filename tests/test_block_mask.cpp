// BlockMask: every block classification checked against ResolvedMask::visible, element by
// element, on awkward sizes (context 1000, unequal documents, lengths not multiples of the block).

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/block_mask.h"
#include "kernels/cuda/tiling.h"
#include "tests/catch.h"
#include "tests/mask_cases.h"

using namespace harness::kernels;

namespace {

using harness::test::NamedMask;

// Every mask kind at context 1000 with `anchors` draft blocks of 16 (3 anchors: Q 48, KV 1048),
// unequal documents.
std::vector<NamedMask> awkward_masks(int64_t anchors) {
  AttentionGeometry geometry;
  geometry.anchors = anchors;
  geometry.block_size = 16;
  geometry.context = 1000;
  return harness::test::every_mask_kind(geometry, {100, 650, 250});
}

std::vector<int32_t> row_of(const at::Tensor& num_blocks, const at::Tensor& indices, int64_t row) {
  const int32_t count = num_blocks[0][0][row].item<int32_t>();
  std::vector<int32_t> out;
  for (int32_t i = 0; i < count; ++i) out.push_back(indices[0][0][row][i].item<int32_t>());
  return out;
}

// Visible element count of one block and its in-range size.
std::pair<int64_t, int64_t> block_counts(const at::Tensor& dense, const BlockMask& bm, int64_t q_block, int64_t kv_block) {
  const int64_t q0 = q_block * bm.block_m, kv0 = kv_block * bm.block_n;
  const at::Tensor block = dense.slice(0, q0, std::min(q0 + bm.block_m, bm.q_len)).slice(1, kv0, std::min(kv0 + bm.block_n, bm.kv_len));
  return {block.sum().item<int64_t>(), block.numel()};
}

void check_block_mask(const ResolvedMask& mask, int64_t block_m, int64_t block_n) {
  const BlockMask bm = build_block_mask(mask, block_m, block_n);
  const at::Tensor dense = dense_mask(mask);
  REQUIRE(dense.sizes() == at::IntArrayRef({mask.q_len, mask.kv_len}));
  REQUIRE(bm.num_q_blocks == (mask.q_len + block_m - 1) / block_m);
  REQUIRE(bm.num_kv_blocks == (mask.kv_len + block_n - 1) / block_n);
  for (const at::Tensor* t : {&bm.kv_num_blocks, &bm.kv_indices, &bm.full_kv_num_blocks, &bm.full_kv_indices, &bm.q_num_blocks,
                              &bm.q_indices, &bm.full_q_num_blocks, &bm.full_q_indices}) {
    REQUIRE(t->scalar_type() == at::kInt);
    REQUIRE(t->device().is_cpu());
  }

  // dense_mask agrees with visible() everywhere.
  const bool* dense_data = dense.data_ptr<bool>();
  for (int64_t q = 0; q < mask.q_len; ++q) {
    for (int64_t kv = 0; kv < mask.kv_len; ++kv) {
      if (dense_data[q * mask.kv_len + kv] != mask.visible(q, kv)) FAIL("dense_mask differs from visible at q " << q << " kv " << kv);
    }
  }

  // Reconstruct the dense mask from the BlockMask: full -> true, partial -> visible(), unlisted -> false.
  at::Tensor rebuilt = at::zeros({mask.q_len, mask.kv_len}, at::kBool);
  bool* rebuilt_data = rebuilt.data_ptr<bool>();
  std::vector<std::vector<char>> kind(bm.num_q_blocks, std::vector<char>(bm.num_kv_blocks, 'e'));
  int64_t partial_pairs = 0, full_pairs = 0;
  for (int64_t q_block = 0; q_block < bm.num_q_blocks; ++q_block) {
    const auto partial = row_of(bm.kv_num_blocks, bm.kv_indices, q_block);
    const auto full = row_of(bm.full_kv_num_blocks, bm.full_kv_indices, q_block);
    REQUIRE(std::is_sorted(partial.begin(), partial.end()));
    REQUIRE(std::adjacent_find(partial.begin(), partial.end()) == partial.end());
    REQUIRE(std::is_sorted(full.begin(), full.end()));
    REQUIRE(std::adjacent_find(full.begin(), full.end()) == full.end());
    partial_pairs += static_cast<int64_t>(partial.size());
    full_pairs += static_cast<int64_t>(full.size());
    for (int32_t kv_block : partial) {
      REQUIRE(kind[q_block][kv_block] == 'e');
      kind[q_block][kv_block] = 'p';
    }
    for (int32_t kv_block : full) {
      REQUIRE(kind[q_block][kv_block] == 'e');  // never listed twice
      kind[q_block][kv_block] = 'f';
    }
    for (int64_t kv_block = 0; kv_block < bm.num_kv_blocks; ++kv_block) {
      const auto [visible, elements] = block_counts(dense, bm, q_block, kv_block);
      INFO("q block " << q_block << " kv block " << kv_block << ": " << visible << " of " << elements << " visible");
      switch (kind[q_block][kv_block]) {
        case 'e': REQUIRE(visible == 0); break;
        case 'f': REQUIRE(visible == elements); break;
        default: REQUIRE(visible > 0); REQUIRE(visible < elements); break;
      }
      const int64_t q0 = q_block * block_m, kv0 = kv_block * block_n;
      for (int64_t q = q0; q < std::min(q0 + block_m, mask.q_len); ++q) {
        for (int64_t kv = kv0; kv < std::min(kv0 + block_n, mask.kv_len); ++kv) {
          const char k = kind[q_block][kv_block];
          if (k == 'f' || (k == 'p' && mask.visible(q, kv))) rebuilt_data[q * mask.kv_len + kv] = true;
        }
      }
    }
  }
  REQUIRE(at::equal(rebuilt, dense));
  REQUIRE(bm.partial_pairs() == partial_pairs);
  REQUIRE(bm.full_pairs() == full_pairs);

  // Transposed lists are the exact transpose.
  for (int64_t kv_block = 0; kv_block < bm.num_kv_blocks; ++kv_block) {
    std::vector<int32_t> partial, full;
    for (int64_t q_block = 0; q_block < bm.num_q_blocks; ++q_block) {
      if (kind[q_block][kv_block] == 'p') partial.push_back(static_cast<int32_t>(q_block));
      if (kind[q_block][kv_block] == 'f') full.push_back(static_cast<int32_t>(q_block));
    }
    REQUIRE(row_of(bm.q_num_blocks, bm.q_indices, kv_block) == partial);
    REQUIRE(row_of(bm.full_q_num_blocks, bm.full_q_indices, kv_block) == full);
  }
}

}  // namespace

TEST_CASE("BlockMask matches visible() element by element on awkward sizes", "[blockmask]") {
  const std::pair<int64_t, int64_t> block_sizes[] = {{16, 16}, {128, 128}, {64, 64}, {32, 48}, {48, 100}};
  for (int64_t anchors : {3, 13}) {  // Q 48 and 208: neither a multiple of 128 or 64
    for (const auto& [name, mask] : awkward_masks(anchors)) {
      for (const auto& [block_m, block_n] : block_sizes) {
        INFO(name << ", anchors " << anchors << ", block_m " << block_m << " block_n " << block_n);
        check_block_mask(mask, block_m, block_n);
      }
    }
  }
}

TEST_CASE("BlockMask has all three kinds of block where the mask has them", "[blockmask]") {
  // The check above would pass vacuously if everything were partial; make sure it is not.
  const auto masks = awkward_masks(13);
  const BlockMask causal = build_block_mask(masks[2].mask, 16, 16);
  CHECK(causal.full_pairs() > 0);
  CHECK(causal.partial_pairs() > 0);
  CHECK(causal.full_pairs() + causal.partial_pairs() < causal.num_q_blocks * causal.num_kv_blocks);
  const BlockMask dflash = build_block_mask(masks[0].mask, 16, 16);
  CHECK(dflash.full_pairs() > 0);  // the 16 x 16 draft blocks are full blocks
  CHECK(dflash.partial_pairs() > 0);
  const BlockMask full = build_block_mask(masks[5].mask, 64, 64);
  CHECK(full.partial_pairs() == 0);
  CHECK(full.full_pairs() == full.num_q_blocks * full.num_kv_blocks);
}

TEST_CASE("BlockMask at the real dims agrees with the dense mask", "[blockmask]") {
  // 128 anchors of 16, context 8192: Q 2048, KV 10240, 4 documents.
  AttentionGeometry geometry;
  geometry.anchors = 128;
  geometry.context = 8192;
  MaskDesc desc;
  desc.kind = MaskKind::dflash;
  desc.documents = 4;
  const ResolvedMask mask = resolve_mask(desc, geometry);
  const BlockMask bm = build_block_mask(mask, 128, 128);
  const at::Tensor dense = dense_mask(mask);
  // Per block visible counts from the dense mask, by pooling: [16, 80] blocks.
  const at::Tensor counts = dense.to(at::kInt).view({16, 128, 80, 128}).sum({1, 3});
  at::Tensor expected_kind = at::zeros({16, 80}, at::kInt);  // 0 empty, 1 partial, 2 full
  expected_kind.masked_fill_(counts > 0, 1).masked_fill_(counts == 128 * 128, 2);
  at::Tensor got_kind = at::zeros({16, 80}, at::kInt);
  for (int64_t q_block = 0; q_block < 16; ++q_block) {
    for (int32_t kv_block : row_of(bm.kv_num_blocks, bm.kv_indices, q_block)) got_kind[q_block][kv_block] = 1;
    for (int32_t kv_block : row_of(bm.full_kv_num_blocks, bm.full_kv_indices, q_block)) got_kind[q_block][kv_block] = 2;
  }
  REQUIRE(at::equal(got_kind, expected_kind));
  CHECK(count_visible_pairs(mask) == dense.sum().item<int64_t>());
}

TEST_CASE("BlockMask::to copies every list, bad block sizes are rejected", "[blockmask]") {
  const auto masks = awkward_masks(3);
  const BlockMask bm = build_block_mask(masks[0].mask, 16, 64);
  const BlockMask copy = bm.to(at::kCPU);
  CHECK(at::equal(copy.kv_indices, bm.kv_indices));
  CHECK(at::equal(copy.full_q_indices, bm.full_q_indices));
  CHECK(copy.block_n == 64);
  std::string message;
  try {
    build_block_mask(masks[0].mask, 0, 64);
  } catch (const std::invalid_argument& error) {
    message = error.what();
  }
  CHECK(message.find("block sizes must be >= 1") != std::string::npos);
}

// The premises of the [cuda] cases that check the kernels' fallback past the mask bit tables
// (two dflash cases of tests/test_attention_cuda.cpp, and the tree BlockMask of
// tests/python/test_attention_cuda.py): their BlockMasks, at the kernels' tilings, have lists
// longer than the tables' slots. Checked here, on the CPU, so that a case cannot silently stop
// covering the fallback (a dK/dV case whose second document starts on a block edge has at most 11
// of 16; the C++ tree case, 257 queries, has at most 3 partial blocks per 32-query forward tile).
TEST_CASE("the mask bit tables' fallback cases have lists longer than the tables", "[blockmask]") {
  namespace tiling = harness::kernels::cuda::tiling;
  auto dflash_mask = [](int64_t anchors, int64_t context, int64_t documents, std::vector<int64_t> lengths) {
    AttentionGeometry geometry;
    geometry.anchors = anchors;
    geometry.block_size = 16;
    geometry.context = context;
    MaskDesc desc;
    desc.kind = MaskKind::dflash;
    desc.documents = documents;
    desc.doc_lengths = std::move(lengths);
    desc.seed = 7;
    return resolve_mask(desc, geometry);
  };
  auto most = [](const at::Tensor& counts) { return counts.max().item<int64_t>(); };
  // The longest partial list of a q block at the overlapped forwards' tilings, and of a kv block at
  // the dK/dV tiling, for `heads` on `kv_heads`.
  auto past_forward_table = [&](const ResolvedMask& mask, int64_t heads, int64_t kv_heads, const std::string& label) {
    for (const auto kernel : {harness::kernels::cuda::FwdKernel::wgmma_m64_n64_overlap,
                              harness::kernels::cuda::FwdKernel::wgmma_m128_n128_pingpong}) {
      const tiling::Tile tile = tiling::fwd_tile(heads, kv_heads, kernel);
      INFO(label << ", tile " << tile.block_m << "x" << tile.block_n);
      CHECK(most(build_block_mask(mask, tile.block_m, tile.block_n).kv_num_blocks) > tiling::kMaskBitSlots);
    }
  };
  auto past_dkdv_table = [&](const ResolvedMask& mask, int64_t heads, int64_t kv_heads) {
    const tiling::Tile tile = tiling::bwd_dkdv_tile(heads, kv_heads, 128);
    CHECK(most(build_block_mask(mask, tile.block_m, tile.block_n).q_num_blocks) > tiling::kBwdMaskBitSlots);
  };
  // Forward: one query head per kv head.
  for (const int64_t context : {1664, 1500})
    past_forward_table(dflash_mask(24, context, 5, {}), 4, 4, "context " + std::to_string(context));
  // dK/dV: 8 heads on 2 kv heads, the second document starting mid-block.
  past_dkdv_table(dflash_mask(96, 2048, 2, {1000, 1048}), 8, 2);
  // A generic mask past the tables (its partial tiles read from its own bit rows): the Python
  // test's tree (test_a_block_mask_matches_compiled_flex_attention: 1000 queries, 2000 keys, 8
  // heads on 2 kv heads, hd 64 and 128), the same mask as tree_mask(1000, 2000).
  const ResolvedMask tree = harness::test::tree_mask(1000, 2000);
  past_forward_table(tree, 8, 2, "tree");
  past_dkdv_table(tree, 8, 2);
}

TEST_CASE("wgmma_atomic splits kv blocks over CTAs only where few dK/dV CTAs would run", "[blockmask]") {
  namespace tiling = harness::kernels::cuda::tiling;
  // Real dims: 32 heads on 8 kv heads pack a whole GQA group into one 64-row step (1 pack), so no
  // split whatever the CTA count; on one kv head the group is 8 packs, and 128 kv blocks (context
  // 8192 + 512 anchors x 16) are 128 CTAs: split 4 ways, to 512.
  CHECK(tiling::bwd_atomic_dkdv_splits(1, 32, 8, 128) == 1);
  CHECK(tiling::bwd_atomic_dkdv_splits(1, 32, 1, 128) == 4);
  CHECK(tiling::bwd_atomic_dkdv_splits(2, 32, 1, 128) == 2);
  CHECK(tiling::bwd_atomic_dkdv_splits(1, 32, 1, 512) == 1);
  CHECK(tiling::bwd_atomic_dkdv_splits(1, 32, 1, 3) == 8);  // never past the packs
  CHECK(tiling::bwd_atomic_dkdv_splits(1, 6, 2, 3) == 1);   // 3 heads per kv head: one pack
  CHECK(tiling::bwd_atomic_dkdv_splits(1, 32, 1, 0) == 1);
  // The split needs fp32 dK/dV accumulators [2][B, KVH, kv blocks * 128, D] in the atomic kernel's
  // scratch only, and room for its longer schedule in every kernel's (the kept buffers are sized
  // alike).
  const auto atomic = tiling::bwd_scratch(1, 32, 1, 8192, 128, 512, 128, true);
  const auto deterministic = tiling::bwd_scratch(1, 32, 1, 8192, 128, 512, 128, false);
  CHECK(atomic.dkdv_splits == 4);
  CHECK(deterministic.dkdv_splits == 1);
  CHECK(atomic.dkdv_accum_bytes == 2 * 128 * 128 * 128 * 4);
  CHECK(deterministic.dkdv_accum_bytes == 0);
  CHECK(atomic.dkdv_accum >= atomic.dq_accum + atomic.dq_accum_bytes);
  CHECK(atomic.bytes >= atomic.dkdv_accum + atomic.dkdv_accum_bytes);
  CHECK(atomic.kept_bytes == deterministic.kept_bytes);
  const auto tiny = tiling::bwd_scratch(1, 32, 1, 48, 128, 1, 3, true);  // 3 kv blocks x 8 splits > 3 + 4 dQ CTAs
  CHECK(tiny.key_bits - tiny.schedule >= tiny.dkdv_ctas * tiny.dkdv_splits * tiling::kWorkItemBytes);
}

TEST_CASE("the backward tiles split columns above head_dim 128", "[blockmask]") {
  namespace tiling = harness::kernels::cuda::tiling;
  // Up to 128 (96 rounds up to it): 128-key dK/dV tiles, 128-row dQ tiles; above it 64 and 64.
  for (const int64_t head_dim : {64, 96, 128}) {
    INFO("head_dim " << head_dim);
    CHECK(tiling::bwd_dkdv_tile(32, 8, head_dim).block_n == 128);
    CHECK(tiling::bwd_dq_tile(32, 8, head_dim).rows == 128);
  }
  for (const int64_t head_dim : {160, 192, 256}) {
    INFO("head_dim " << head_dim);
    const tiling::Tile dkdv = tiling::bwd_dkdv_tile(32, 8, head_dim), dq = tiling::bwd_dq_tile(32, 8, head_dim);
    CHECK(dkdv.block_n == 64);
    CHECK(dkdv.rows == 64);
    CHECK(dq.rows == 64);
    CHECK(dq.heads_packed * dq.block_m == 64);
  }
  // The key bit table has an entry per key of a tile: the same bytes for twice the 64-key tiles.
  const auto narrow = tiling::bwd_scratch(1, 32, 8, 2048, 256, 128, 64, false);
  const tiling::Tile narrow_tile = tiling::bwd_dkdv_tile(32, 8, 256);
  CHECK(narrow.row_bits - narrow.key_bits >= tiling::bwd_key_bits_bytes(64, narrow_tile.block_m, narrow_tile.block_n));
  CHECK(tiling::bwd_key_bits_bytes(32, 64, 128) == tiling::bwd_key_bits_bytes(64, 64, 64));
  CHECK(narrow.dq_ctas == 128 * 8);  // 64-row dQ tiles pack the group's 4 heads of 16 positions: 8 packs
}
