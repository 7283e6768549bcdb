#include "replay/mask_bits.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "replay/capsule.h"

namespace harness::replay {
namespace {

std::string sizes_text(const at::Tensor& tensor) {
  std::string text = "[";
  for (int64_t dim = 0; dim < tensor.dim(); ++dim) text += (dim ? ", " : "") + std::to_string(tensor.size(dim));
  return text + "]";
}

const at::Tensor* find(const std::map<std::string, at::Tensor>& tensors, const std::string& name,
                       std::set<std::string>* used) {
  const auto found = tensors.find(name);
  if (found == tensors.end()) return nullptr;
  if (used) used->insert(name);
  return &found->second;
}

// [.., rows] with leading 1s added up to `dims` dimensions.
at::Tensor leading_ones(const at::Tensor& tensor, int64_t dims) {
  at::Tensor out = tensor;
  while (out.dim() < dims) out = out.unsqueeze(0);
  return out;
}

// The packed words of a [rows, kv_len] boolean tile row by row into `words` (kv_len bits per row).
void pack_rows(const at::Tensor& dense, int64_t kv_len, uint32_t* words) {
  const at::Tensor rows = dense.to(at::kBool).contiguous();
  const bool* data = rows.data_ptr<bool>();
  const int64_t per_row = kernels::blockmask_words(kv_len);
  for (int64_t q = 0; q < rows.size(0); ++q) {
    uint32_t* row = words + q * per_row;
    std::fill(row, row + per_row, 0u);
    for (int64_t kv = 0; kv < kv_len; ++kv)
      if (data[q * kv_len + kv]) row[kv >> 5] |= uint32_t{1} << (kv & 31);
  }
}

// Keeps one slice along batch, then along heads, where every slice is alike (words are
// [batch][heads][slice]).
kernels::ResolvedMask collapsed(int64_t q_len, int64_t kv_len, std::vector<uint32_t> words, int64_t batch, int64_t heads) {
  const auto slice = static_cast<std::ptrdiff_t>(q_len * kernels::blockmask_words(kv_len));
  const auto at = [&](int64_t b, int64_t h) { return words.begin() + (b * heads + h) * slice; };
  const auto equal = [&](int64_t b, int64_t h, int64_t b0, int64_t h0) { return std::equal(at(b, h), at(b, h) + slice, at(b0, h0)); };
  bool batch_alike = batch > 1, heads_alike = heads > 1;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h) {
      batch_alike = batch_alike && equal(b, h, 0, h);
      heads_alike = heads_alike && equal(b, h, b, 0);
    }
  const int64_t kept_batch = batch_alike ? 1 : batch, kept_heads = heads_alike ? 1 : heads;
  if (kept_batch != batch || kept_heads != heads) {
    std::vector<uint32_t> kept;
    for (int64_t b = 0; b < kept_batch; ++b)
      for (int64_t h = 0; h < kept_heads; ++h) kept.insert(kept.end(), at(b, h), at(b, h) + slice);
    words = std::move(kept);
  }
  return kernels::blockmask_mask(q_len, kv_len, std::move(words), kept_batch, kept_heads);
}

kernels::ResolvedMask from_packed(const at::Tensor& packed, int64_t q_len, int64_t kv_len, const std::string& where) {
  const at::Tensor bits = leading_ones(packed, 4);
  const int64_t words = kernels::blockmask_words(kv_len);
  if (bits.scalar_type() != at::kInt || bits.dim() != 4 || bits.size(2) != q_len || bits.size(3) != words)
    throw CapsuleError(where + ": mask.bits is " + std::string(c10::toString(packed.scalar_type())) + " " +
                       sizes_text(packed) + " but Q_LEN " + std::to_string(q_len) + " and KV_LEN " + std::to_string(kv_len) +
                       " need int32 [batch, heads, " + std::to_string(q_len) + ", " + std::to_string(words) + "]");
  const at::Tensor contiguous = bits.contiguous();
  const auto* data = reinterpret_cast<const uint32_t*>(contiguous.data_ptr<int32_t>());
  return collapsed(q_len, kv_len, std::vector<uint32_t>(data, data + contiguous.numel()), bits.size(0), bits.size(1));
}

// The block size from the mask.block_size tensor, else from the meta's (a number or a pair).
at::Tensor block_sizes(const at::Tensor* tensor, const nlohmann::json& meta) {
  if (tensor) return tensor->to(at::kLong).flatten();
  std::vector<int64_t> sizes;
  if (meta.is_number_integer()) sizes.push_back(meta.get<int64_t>());
  if (meta.is_array())
    for (const auto& size : meta)
      sizes.push_back(size.is_number_integer() ? size.get<int64_t>() : 0);
  return at::tensor(sizes, at::TensorOptions().dtype(at::kLong));
}

kernels::ResolvedMask from_blocks(const std::map<std::string, at::Tensor>& tensors, int64_t q_len, int64_t kv_len,
                                  const std::string& where, std::set<std::string>* used, const nlohmann::json& block_meta) {
  std::vector<std::string> problems;
  const auto require = [&](const std::string& name) {
    const at::Tensor* found = find(tensors, name, used);
    if (!found) problems.push_back(name + " is missing (a BlockMask's lists need mask.kv_num_blocks, mask.kv_indices, "
                                          "mask.partial_bits and the block size)");
    return found;
  };
  const at::Tensor* num = require("mask.kv_num_blocks");
  const at::Tensor* indices = require("mask.kv_indices");
  const at::Tensor* block_size = find(tensors, "mask.block_size", used);
  if (!block_size && block_meta.is_null())
    problems.push_back("the block size is missing: a mask.block_size tensor (Q block, KV block), or meta.mask.block_size");
  const at::Tensor* tiles = require("mask.partial_bits");
  const at::Tensor* full_num = find(tensors, "mask.full_kv_num_blocks", used);
  const at::Tensor* full_indices = find(tensors, "mask.full_kv_indices", used);
  if (!full_num != !full_indices) problems.push_back("mask.full_kv_num_blocks and mask.full_kv_indices come together");
  const auto fail = [&] {
    std::string message = where + ": the mask's BlockMask tensors do not fit together:";
    for (const auto& problem : problems) message += "\n  " + problem;
    throw CapsuleError(message);
  };
  if (!problems.empty()) fail();

  const at::Tensor sizes = block_sizes(block_size, block_meta);
  if (sizes.numel() < 1 || sizes.numel() > 2 || (sizes < 1).any().item<bool>()) {
    problems.push_back("the block size must be one or two positive sizes (Q block, KV block), got " +
                       (block_size ? sizes_text(*block_size) : block_meta.dump()));
    fail();
  }
  const int64_t q_block = sizes[0].item<int64_t>(), kv_block = sizes[sizes.numel() - 1].item<int64_t>();
  const at::Tensor counts = leading_ones(num->to(at::kLong), 3).contiguous();
  const at::Tensor lists = leading_ones(indices->to(at::kLong), 4).contiguous();
  const int64_t batch = counts.size(0), heads = counts.size(1), q_blocks = counts.size(2);
  const int64_t kv_blocks = (kv_len + kv_block - 1) / kv_block;
  if (counts.dim() != 3 || lists.dim() != 4 || lists.size(0) != batch || lists.size(1) != heads || lists.size(2) != q_blocks)
    problems.push_back("mask.kv_num_blocks " + sizes_text(*num) + " and mask.kv_indices " + sizes_text(*indices) +
                       " must be [B, H, NQ] and [B, H, NQ, *]");
  if (q_blocks * q_block < q_len)
    problems.push_back(std::to_string(q_blocks) + " q blocks of " + std::to_string(q_block) + " do not cover Q_LEN " +
                       std::to_string(q_len));
  at::Tensor full_counts, full_lists;
  if (full_num) {
    full_counts = leading_ones(full_num->to(at::kLong), 3).contiguous();
    full_lists = leading_ones(full_indices->to(at::kLong), 4).contiguous();
    if (full_counts.sizes() != counts.sizes() || full_lists.dim() != 4 || full_lists.size(2) != q_blocks)
      problems.push_back("mask.full_kv_num_blocks " + sizes_text(*full_num) + " and mask.full_kv_indices " +
                         sizes_text(*full_indices) + " must have the shapes of the partial lists");
  }
  const at::Tensor tile_values = tiles->to(at::kBool).contiguous();
  const int64_t partial_blocks = problems.empty() ? counts.sum().item<int64_t>() : 0;
  if (problems.empty() &&
      (tile_values.dim() != 3 || tile_values.size(0) != partial_blocks || tile_values.size(1) != q_block ||
       tile_values.size(2) != kv_block))
    problems.push_back("mask.partial_bits is " + sizes_text(*tiles) + " but the lists name " +
                       std::to_string(partial_blocks) + " partial blocks of " + std::to_string(q_block) + " x " +
                       std::to_string(kv_block) + ": expected [" + std::to_string(partial_blocks) + ", " +
                       std::to_string(q_block) + ", " + std::to_string(kv_block) + "]");
  if (!problems.empty()) fail();

  // One slice at a time: a [NQ * q_block, NKV * kv_block] boolean canvas, cropped and packed.
  const int64_t words = kernels::blockmask_words(kv_len);
  std::vector<uint32_t> bits(static_cast<size_t>(batch * heads * q_len * words));
  int64_t tile = 0;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      at::Tensor canvas = at::zeros({q_blocks * q_block, kv_blocks * kv_block}, at::kBool);
      const auto place = [&](const at::Tensor& count_of, const at::Tensor& list_of, bool partial) {
        for (int64_t qb = 0; qb < q_blocks; ++qb) {
          const int64_t count = count_of[b][h][qb].item<int64_t>();
          if (count < 0 || count > list_of.size(3)) {
            problems.push_back("batch " + std::to_string(b) + ", head " + std::to_string(h) + ", q block " +
                               std::to_string(qb) + " lists " + std::to_string(count) + " blocks in a row of " +
                               std::to_string(list_of.size(3)));
            return;
          }
          for (int64_t i = 0; i < count; ++i) {
            const int64_t kvb = list_of[b][h][qb][i].item<int64_t>();
            if (kvb < 0 || kvb >= kv_blocks) {
              problems.push_back("kv block index " + std::to_string(kvb) + " lies outside the " +
                                 std::to_string(kv_blocks) + " kv blocks of KV_LEN " + std::to_string(kv_len));
              return;
            }
            at::Tensor block = canvas.narrow(0, qb * q_block, q_block).narrow(1, kvb * kv_block, kv_block);
            if (partial) block.copy_(tile_values[tile++]);
            else block.fill_(true);
          }
        }
      };
      place(counts, lists, true);
      if (full_num) place(full_counts, full_lists, false);
      if (!problems.empty()) fail();
      const size_t slice = static_cast<size_t>(b * heads + h);
      pack_rows(canvas.narrow(0, 0, q_len).narrow(1, 0, kv_len), kv_len,
                bits.data() + slice * static_cast<size_t>(q_len * words));
    }
  }
  return collapsed(q_len, kv_len, std::move(bits), batch, heads);
}

}  // namespace

bool has_mask_tensors(const std::map<std::string, at::Tensor>& tensors) {
  return tensors.count("mask.bits") || tensors.count("mask.kv_num_blocks");
}

kernels::ResolvedMask mask_from_tensors(const std::map<std::string, at::Tensor>& tensors, int64_t q_len, int64_t kv_len,
                                        const std::string& where, std::set<std::string>* used,
                                        const nlohmann::json& block_size) {
  try {
    if (const at::Tensor* packed = find(tensors, "mask.bits", used)) {
      if (tensors.count("mask.kv_num_blocks"))
        throw CapsuleError(where + ": holds the mask twice (mask.bits and mask.kv_num_blocks): keep one form");
      return from_packed(*packed, q_len, kv_len, where);
    }
    if (tensors.count("mask.kv_num_blocks")) return from_blocks(tensors, q_len, kv_len, where, used, block_size);
  } catch (const std::invalid_argument& error) {
    throw CapsuleError(where + ": " + error.what());
  }
  throw CapsuleError(where + ": no mask tensors: a blockmask needs mask.bits (int32 [B, H, Q_LEN, ceil(KV_LEN / 32)]) or "
                             "a BlockMask's mask.kv_num_blocks, mask.kv_indices, mask.partial_bits and block size");
}

kernels::ResolvedMask load_mask_file(const std::string& path, int64_t q_len, int64_t kv_len) {
  const CapsuleInfo file = read_safetensors(path);
  std::map<std::string, at::Tensor> tensors;
  for (const TensorEntry& entry : file.tensors) tensors[entry.name] = load_tensor(file, entry);
  std::set<std::string> used;
  kernels::ResolvedMask mask = mask_from_tensors(tensors, q_len, kv_len, path, &used);
  for (const auto& [name, tensor] : tensors)
    if (!used.count(name))
      throw CapsuleError(path + ": unknown entry '" + name + "' in a mask file (replay/README.md lists the mask tensors)");
  return mask;
}

at::Tensor mask_bits_tensor(const kernels::ResolvedMask& mask) {
  at::Tensor bits = at::empty({mask.bit_batch, mask.bit_heads, mask.q_len, mask.bit_words}, at::kInt);
  std::memcpy(bits.data_ptr<int32_t>(), mask.bit_row(0), static_cast<size_t>(bits.numel()) * sizeof(uint32_t));
  return bits;
}

}  // namespace harness::replay
