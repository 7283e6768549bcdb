// A captured mask's tables (block lists and partial blocks' bits) read back and matched to a named
// kind (replay/mask_fit.h): tables built here from a known mask must give that mask back, anchors and
// documents included; one flipped bit must make every kind fail, naming the element; tables that do
// not fit together are refused with the problem named. Torch-free.

#include <cstring>
#include <string>
#include <vector>

#include "kernels/mask_desc.h"
#include "replay/mask_fit.h"
#include "tests/catch.h"

using namespace harness;
using replay::RawTable;

namespace {

kernels::ResolvedMask resolved(kernels::MaskKind kind, int64_t anchors, int64_t block_size, int64_t context,
                               int64_t documents = 1, kernels::InBlock in_block = kernels::InBlock::bidirectional) {
  kernels::MaskDesc desc;
  desc.kind = kind;
  desc.documents = documents;
  desc.in_block = in_block;
  desc.seed = 7;
  kernels::AttentionGeometry geometry;
  geometry.anchors = anchors;
  geometry.block_size = block_size;
  geometry.context = context;
  return kernels::resolve_mask(desc, geometry);
}

RawTable int32_table(const std::vector<int32_t>& values, std::vector<int64_t> shape) {
  RawTable table{"int32", std::move(shape), std::string(values.size() * 4, '\0')};
  std::memcpy(table.bytes.data(), values.data(), table.bytes.size());
  return table;
}

// The tables python/harness/mask_tables.py writes for `mask`, in blocks of `block` x `block`.
std::vector<std::pair<std::string, RawTable>> tables_of(const kernels::ResolvedMask& mask, int64_t block) {
  const int64_t q_blocks = (mask.q_len + block - 1) / block, kv_blocks = (mask.kv_len + block - 1) / block;
  std::vector<int32_t> counts(static_cast<size_t>(q_blocks)), full_counts(static_cast<size_t>(q_blocks));
  std::vector<int32_t> indices(static_cast<size_t>(q_blocks * kv_blocks)), full_indices(indices.size());
  std::string bits;
  for (int64_t qb = 0; qb < q_blocks; ++qb)
    for (int64_t kb = 0; kb < kv_blocks; ++kb) {
      std::string block_bits(static_cast<size_t>(block * block), '\0');
      int64_t seen = 0, in_range = 0;
      for (int64_t r = 0; r < block; ++r)
        for (int64_t c = 0; c < block; ++c) {
          const int64_t q = qb * block + r, kv = kb * block + c;
          if (q >= mask.q_len || kv >= mask.kv_len) continue;
          ++in_range;
          if (mask.visible(q, kv)) {
            ++seen;
            block_bits[static_cast<size_t>(r * block + c)] = 1;
          }
        }
      const size_t row = static_cast<size_t>(qb);
      if (seen == in_range) {
        full_indices[row * static_cast<size_t>(kv_blocks) + static_cast<size_t>(full_counts[row]++)] = static_cast<int32_t>(kb);
      } else if (seen > 0) {
        indices[row * static_cast<size_t>(kv_blocks) + static_cast<size_t>(counts[row]++)] = static_cast<int32_t>(kb);
        bits += block_bits;
      }
    }
  const int64_t partial = static_cast<int64_t>(bits.size()) / (block * block);
  return {{"mask.kv_num_blocks", int32_table(counts, {1, 1, q_blocks})},
          {"mask.kv_indices", int32_table(indices, {1, 1, q_blocks, kv_blocks})},
          {"mask.full_kv_num_blocks", int32_table(full_counts, {1, 1, q_blocks})},
          {"mask.full_kv_indices", int32_table(full_indices, {1, 1, q_blocks, kv_blocks})},
          {"mask.partial_bits", RawTable{"bool", {partial, block, block}, bits}}};
}

replay::MaskTables read(const std::vector<std::pair<std::string, RawTable>>& raw, const kernels::ResolvedMask& mask,
                        int64_t block) {
  return replay::mask_tables_from_raw(raw, mask.q_len, mask.kv_len, nlohmann::json::array({block, block}), "step.safetensors");
}

std::string refusal(const std::vector<std::pair<std::string, RawTable>>& raw, const kernels::ResolvedMask& mask, int64_t block) {
  try {
    read(raw, mask, block);
  } catch (const replay::CapsuleError& error) {
    return error.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("dflash tables give the dflash mask back: block size, anchors and documents", "[mask_fit]") {
  // 8 draft blocks of 16 over a context of 300 in 3 documents; blocks of 64 leave ragged edges.
  const auto mask = resolved(kernels::MaskKind::dflash, 8, 16, 300, 3);
  const replay::MaskTables tables = read(tables_of(mask, 64), mask, 64);
  for (int64_t q = 0; q < mask.q_len; q += 7)
    for (int64_t kv = 0; kv < mask.kv_len; kv += 3) REQUIRE(tables.visible(q, kv) == mask.visible(q, kv));
  std::vector<std::string> why_not;
  const auto fitted = replay::fit_named_mask(tables, why_not);
  REQUIRE(fitted.has_value());
  CHECK(fitted->mask["type"] == "dflash");
  CHECK(fitted->mask["in_block"] == "bidirectional");
  CHECK(fitted->block_size == 16);
  CHECK(fitted->anchors == 8);
  CHECK(fitted->context == 300);
  CHECK(fitted->anchor_positions == mask.anchors);
  // The documents that hold anchors start where the fit says; the masks agree everywhere.
  kernels::ResolvedMask refit = mask;
  refit.doc_id = fitted->doc_id;
  refit.anchors = fitted->anchor_positions;
  for (int64_t q = 0; q < mask.q_len; ++q)
    for (int64_t kv = 0; kv < mask.kv_len; ++kv) REQUIRE(refit.visible(q, kv) == mask.visible(q, kv));
  int64_t total = 0;
  for (int64_t length : fitted->doc_lengths) total += length;
  CHECK(total == 300);
}

TEST_CASE("in-block causal dflash, causal and full tables are matched to their kinds", "[mask_fit]") {
  std::vector<std::string> why_not;
  const auto causal_blocks = resolved(kernels::MaskKind::dflash, 4, 32, 200, 1, kernels::InBlock::causal);
  auto fitted = replay::fit_named_mask(read(tables_of(causal_blocks, 32), causal_blocks, 32), why_not);
  REQUIRE(fitted.has_value());
  CHECK(fitted->mask["in_block"] == "causal");
  CHECK(fitted->block_size == 32);
  CHECK(fitted->anchor_positions == causal_blocks.anchors);

  const auto causal = resolved(kernels::MaskKind::causal, 10, 16, 90);  // Q 160, KV 250: bottom-right aligned
  fitted = replay::fit_named_mask(read(tables_of(causal, 64), causal, 64), why_not);
  REQUIRE(fitted.has_value());
  CHECK(fitted->mask["type"] == "causal");
  CHECK(fitted->anchors * fitted->block_size == 160);
  CHECK(fitted->context == 90);

  const auto full = resolved(kernels::MaskKind::full, 3, 16, 10);
  fitted = replay::fit_named_mask(read(tables_of(full, 16), full, 16), why_not);
  REQUIRE(fitted.has_value());
  CHECK(fitted->mask["type"] == "full");
}

TEST_CASE("one flipped bit matches no kind, and the element is named", "[mask_fit]") {
  const auto mask = resolved(kernels::MaskKind::dflash, 8, 16, 300, 3);
  auto raw = tables_of(mask, 64);
  std::string& bits = raw.back().second.bytes;
  REQUIRE(!bits.empty());
  bits[5] = static_cast<char>(bits[5] ? 0 : 1);  // partial block 0, row 0, column 5
  std::vector<std::string> why_not;
  CHECK_FALSE(replay::fit_named_mask(read(raw, mask, 64), why_not).has_value());
  REQUIRE(!why_not.empty());
  std::string reasons;
  for (const auto& reason : why_not) reasons += reason + "\n";
  CHECK(contains(reasons, "full: query 0"));
  INFO(reasons);
  // The anchors read off the flipped row differ from the true ones, so the first element where the
  // refitted dflash mask disagrees lies in query 0's row, at or before key 5.
  CHECK(contains(reasons, "dflash (block 16, bidirectional): query 0, key "));
}

TEST_CASE("tables that do not fit together are refused with the problem named", "[mask_fit]") {
  const auto mask = resolved(kernels::MaskKind::dflash, 8, 16, 300, 3);
  auto raw = tables_of(mask, 64);
  auto missing = raw;
  missing.pop_back();
  CHECK(contains(refusal(missing, mask, 64), "tensor 'mask.partial_bits' is missing"));

  auto too_many = raw;
  too_many[0].second = int32_table({9, 0}, {1, 1, 2});
  CHECK(contains(refusal(too_many, mask, 64), "mask.kv_num_blocks entry 0 is 9, outside 0..7"));

  auto fewer_bits = raw;
  fewer_bits.back().second.shape[0] -= 1;
  fewer_bits.back().second.bytes.resize(fewer_bits.back().second.bytes.size() - 64 * 64);
  CHECK(contains(refusal(fewer_bits, mask, 64), "but the lists name"));

  CHECK(contains(refusal(raw, mask, 32), "expected [1, 1, 4] for Q_LEN 128"));

  // Two heads whose lists differ: the named kinds are the same for every head.
  auto other = resolved(kernels::MaskKind::dflash, 8, 16, 300, 1);
  auto second = tables_of(other, 64);
  auto two_heads = raw;
  for (size_t i = 0; i < two_heads.size(); ++i) {
    RawTable& table = two_heads[i].second;
    table.bytes += second[i].second.bytes;
    if (i < 4) table.shape[1] = 2;
    else table.shape[0] += second[i].second.shape[0];
  }
  CHECK(contains(refusal(two_heads, mask, 64), "differs between batch entries or heads (b 0, h 1"));
}
