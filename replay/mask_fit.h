#pragma once
// A captured mask as tables (block lists and the partial blocks' bits: python/harness/mask_tables.py,
// python/README.md "Mask tables"), read back and matched to a named mask kind. A mask_mod closure
// cannot travel, its tables can; the kernels run named kinds, so an imported step whose tables equal
// a dflash, causal or full mask element for element replays with that kind and the anchors and
// documents read off the tables. Torch-free: `harness triage` plans with it, the import uses it.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/mask_desc.h"
#include "replay/capsule_file.h"

namespace harness::replay {

//! The tables of one mask (batch and head broadcast: the named kinds depend on neither).
struct MaskTables {
  int64_t q_len = 0;
  int64_t kv_len = 0;
  int64_t block_q = 128;   //!< rows of a block
  int64_t block_kv = 128;  //!< columns of a block
  int64_t q_blocks = 0;    //!< ceil(q_len / block_q)
  int64_t kv_blocks = 0;   //!< ceil(kv_len / block_kv), the width of the index lists
  std::vector<int32_t> kv_num_blocks;       //!< [q_blocks] partial blocks per q block
  std::vector<int32_t> kv_indices;          //!< [q_blocks * kv_blocks]
  std::vector<int32_t> full_kv_num_blocks;  //!< [q_blocks]
  std::vector<int32_t> full_kv_indices;     //!< [q_blocks * kv_blocks]
  std::vector<uint8_t> partial_bits;        //!< [partial blocks * block_q * block_kv], table order
  //! Per (q block, kv block): -1 empty, -2 full, else the partial block's index into partial_bits.
  std::vector<int64_t> block_state;

  //! Whether query q sees key kv, as the tables say.
  bool visible(int64_t q, int64_t kv) const;
  //! visible(q, kv) for every kv of the row into out[0 .. kv_len).
  void visible_row(int64_t q, std::vector<uint8_t>& out) const;
};

//! The tensor names of the tables in a step file.
inline constexpr const char* kMaskTableNames[] = {"mask.kv_num_blocks", "mask.kv_indices", "mask.full_kv_num_blocks",
                                                  "mask.full_kv_indices", "mask.partial_bits"};

//! One table as it came from the file: its dtype, shape and bytes (little-endian, C order).
struct RawTable {
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

//! Builds the tables from the five raw tensors (by name, kMaskTableNames) for a step of q_len x
//! kv_len with block sizes {block_q, block_kv} (the meta's mask.block_size). Every count, index and
//! shape is checked; lists that differ between batch entries or heads are refused (the named kinds
//! depend on neither). Throws CapsuleError naming `where` and every problem.
MaskTables mask_tables_from_raw(const std::vector<std::pair<std::string, RawTable>>& raw, int64_t q_len, int64_t kv_len,
                                const nlohmann::json& block_size, const std::string& where);

//! The tables of a safetensors step file (read_safetensors), for q_len x kv_len.
MaskTables read_mask_tables(const CapsuleInfo& file, int64_t q_len, int64_t kv_len, const nlohmann::json& block_size);

//! A named mask equal to the tables everywhere.
struct FittedMask {
  nlohmann::json mask;            //!< the spec's mask section: {"type": "dflash", "context_rule": ..., "in_block": ...}
  int64_t block_size = 16;        //!< dims.block_size (the dflash draft block)
  int64_t anchors = 0;            //!< dims.anchors = Q_LEN / block_size
  int64_t context = 0;            //!< dims.context = KV_LEN - Q_LEN
  std::vector<int64_t> anchor_positions;  //!< dflash: one per draft block, in q's order
  std::vector<int32_t> doc_id;            //!< dflash: the document of each context position
  std::vector<int64_t> doc_lengths;       //!< dflash: the documents' lengths (what doc_id says)
};

//! A kind that reads only the lengths (full, causal), in the spec's geometry: Q_LEN = anchors x
//! block_size with the largest of 16, 8, 4, 2, 1 that divides Q_LEN, context = KV_LEN - Q_LEN.
FittedMask lengths_only_mask(const std::string& type, int64_t q_len, int64_t kv_len);

//! Matches the tables to dflash (draft block size, anchors and documents read off the rows),
//! causal (bottom-right aligned) and full, each checked on every element. nullopt when none
//! fits; `why_not` then says, per kind, the first element that differs.
std::optional<FittedMask> fit_named_mask(const MaskTables& tables, std::vector<std::string>& why_not);

}  // namespace harness::replay
