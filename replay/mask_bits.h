#pragma once
// A blockmask's bits as tensors: what a mask file, a step saved from Python and a capsule hold
// (replay/README.md, "Masks as tensors"), turned into the kernels' ResolvedMask and back.
//
// Two forms are read, each as safetensors / torch.save entries named "mask.<name>":
//  - packed bits: mask.bits, int32 [B, H, Q_LEN, ceil(KV_LEN / 32)] (or [Q_LEN, words]), bit
//    kv % 32 of word kv / 32 of row q (harness.FlexMask's bits, pack_bits in python/harness);
//  - a FlexAttention BlockMask's lists: mask.kv_num_blocks int32 [B, H, NQ], mask.kv_indices int32
//    [B, H, NQ, *], optionally mask.full_kv_num_blocks and mask.full_kv_indices (the same shapes),
//    the block size (Q block, KV block; one value for both) as mask.block_size int [2] or
//    the meta's mask.block_size, and mask.partial_bits bool
//    [P, Q block, KV block]: the mask_mod's values in each partial block, P = sum(kv_num_blocks),
//    in the order of the lists (batch, head, q block, position in its row). Full blocks are
//    visible, blocks in no list hidden (what compiled flex_attention computes).
// B and H are 1 (the same for every batch element / head) or the call's batch size / heads.
// A capsule always stores the packed form.

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <map>
#include <set>
#include <string>

#include "kernels/mask_desc.h"

namespace harness::replay {

//! Whether `tensors` holds a mask in either form (a "mask.bits" or a "mask.kv_num_blocks" entry).
bool has_mask_tensors(const std::map<std::string, at::Tensor>& tensors);

//! The blockmask in `tensors` for Q_LEN x KV_LEN keys; adds the names it read to `used`. Slices
//! that are all alike collapse to one. `block_size` (a number or [Q block, KV block]; null when
//! absent) stands for a missing mask.block_size tensor. Throws CapsuleError naming `where` and
//! every problem.
kernels::ResolvedMask mask_from_tensors(const std::map<std::string, at::Tensor>& tensors, int64_t q_len, int64_t kv_len,
                                        const std::string& where, std::set<std::string>* used = nullptr,
                                        const nlohmann::json& block_size = nullptr);

//! The blockmask of a safetensors mask file (either form) for Q_LEN x KV_LEN. Throws CapsuleError.
kernels::ResolvedMask load_mask_file(const std::string& path, int64_t q_len, int64_t kv_len);

//! A blockmask's bits as the capsule stores them: int32 [bit_batch, bit_heads, Q_LEN, words].
at::Tensor mask_bits_tensor(const kernels::ResolvedMask& mask);

}  // namespace harness::replay
