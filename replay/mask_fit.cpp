#include "replay/mask_fit.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <tuple>

namespace harness::replay {
namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// An integer table (int32 or int64) as int64 values.
std::vector<int64_t> integers(const RawTable& table) {
  std::vector<int64_t> values;
  if (table.dtype == "int32") {
    values.resize(table.bytes.size() / 4);
    for (size_t i = 0; i < values.size(); ++i) {
      int32_t v = 0;
      std::memcpy(&v, table.bytes.data() + 4 * i, 4);
      values[i] = v;
    }
  } else {
    values.resize(table.bytes.size() / 8);
    std::memcpy(values.data(), table.bytes.data(), values.size() * 8);
  }
  return values;
}

std::pair<int64_t, int64_t> block_sizes(const nlohmann::json& block_size, const std::string& where) {
  const auto positive = [](const nlohmann::json& v) { return v.is_number_integer() && v.get<int64_t>() > 0; };
  if (positive(block_size)) return {block_size.get<int64_t>(), block_size.get<int64_t>()};
  if (block_size.is_array() && block_size.size() == 2 && positive(block_size[0]) && positive(block_size[1]))
    return {block_size[0].get<int64_t>(), block_size[1].get<int64_t>()};
  throw CapsuleError(where + ": meta.mask.block_size must be [Q_BLOCK, KV_BLOCK] (positive integers), got " +
                     block_size.dump());
}

// The first element where the tables and `mask` disagree, or "".
std::string first_difference(const MaskTables& tables, const kernels::ResolvedMask& mask, const std::string& kind) {
  std::vector<uint8_t> ours(static_cast<size_t>(tables.kv_len));
  std::unique_ptr<bool[]> theirs(new bool[static_cast<size_t>(tables.kv_len)]);
  for (int64_t q = 0; q < tables.q_len; ++q) {
    tables.visible_row(q, ours);
    mask.visible_row(q, 0, tables.kv_len, theirs.get());
    for (int64_t kv = 0; kv < tables.kv_len; ++kv)
      if (static_cast<bool>(ours[static_cast<size_t>(kv)]) != theirs[static_cast<size_t>(kv)])
        return kind + ": query " + std::to_string(q) + ", key " + std::to_string(kv) + ": the captured mask says " +
               (ours[static_cast<size_t>(kv)] ? "visible" : "hidden") + ", " + kind + " says " +
               (theirs[static_cast<size_t>(kv)] ? "visible" : "hidden");
  }
  return "";
}

// dflash with draft blocks of `block_size` and `in_block`, anchors and documents read off the rows:
// block i's first row sees the context [doc_start_i, anchor_i), so anchor_i is one past the last
// context key it sees and each block's first visible key starts a document.
std::optional<FittedMask> dflash_candidate(const MaskTables& tables, int64_t block_size, kernels::InBlock in_block,
                                           std::vector<std::string>& why_not) {
  const int64_t context = tables.kv_len - tables.q_len;
  const std::string kind = std::string("dflash (block ") + std::to_string(block_size) + ", " +
                           std::string(kernels::in_block_name(in_block)) + ")";
  if (block_size < 1 || tables.q_len % block_size != 0) {
    why_not.push_back(kind + ": Q_LEN " + std::to_string(tables.q_len) + " is not a multiple of the block");
    return std::nullopt;
  }
  const int64_t blocks = tables.q_len / block_size;
  std::vector<int64_t> anchors(static_cast<size_t>(blocks)), starts(static_cast<size_t>(blocks));
  std::vector<uint8_t> row(static_cast<size_t>(tables.kv_len));
  for (int64_t block = 0; block < blocks; ++block) {
    tables.visible_row(block * block_size, row);
    int64_t first = -1, last = -1;
    for (int64_t kv = 0; kv < context; ++kv)
      if (row[static_cast<size_t>(kv)]) {
        if (first < 0) first = kv;
        last = kv;
      }
    if (first < 0) {
      why_not.push_back(kind + ": draft block " + std::to_string(block) +
                        " sees no context (a dflash anchor always has an earlier token to see)");
      return std::nullopt;
    }
    anchors[static_cast<size_t>(block)] = last + 1;
    starts[static_cast<size_t>(block)] = first;
  }
  std::set<int64_t> boundaries(starts.begin(), starts.end());
  boundaries.erase(0);
  FittedMask fitted;
  fitted.doc_id.resize(static_cast<size_t>(context));
  int32_t document = 0;
  for (int64_t position = 0; position < context; ++position) {
    if (boundaries.count(position)) ++document;
    fitted.doc_id[static_cast<size_t>(position)] = document;
  }
  int64_t previous = 0;
  for (int64_t boundary : boundaries) {
    fitted.doc_lengths.push_back(boundary - previous);
    previous = boundary;
  }
  fitted.doc_lengths.push_back(context - previous);

  kernels::ResolvedMask mask;
  mask.kind = kernels::MaskKind::dflash;
  mask.context_rule = kernels::ContextRule::before_anchor;
  mask.in_block = in_block;
  mask.q_len = tables.q_len;
  mask.kv_len = tables.kv_len;
  mask.context = context;
  mask.block_size = block_size;
  mask.anchors = anchors;
  mask.doc_id = fitted.doc_id;
  const std::string difference = first_difference(tables, mask, kind);
  if (!difference.empty()) {
    why_not.push_back(difference);
    return std::nullopt;
  }
  fitted.mask = {{"type", "dflash"},
                 {"context_rule", "before_anchor"},
                 {"in_block", std::string(kernels::in_block_name(in_block))},
                 {"doc_lengths", fitted.doc_lengths}};
  fitted.block_size = block_size;
  fitted.anchors = blocks;
  fitted.context = context;
  fitted.anchor_positions = std::move(anchors);
  return fitted;
}

}  // namespace

FittedMask lengths_only_mask(const std::string& type, int64_t q_len, int64_t kv_len) {
  FittedMask fitted;
  fitted.mask = {{"type", type}};
  fitted.block_size = 1;
  for (int64_t size : {16, 8, 4, 2})
    if (q_len % size == 0) {
      fitted.block_size = size;
      break;
    }
  fitted.anchors = q_len / fitted.block_size;
  fitted.context = kv_len - q_len;
  return fitted;
}

bool MaskTables::visible(int64_t q, int64_t kv) const {
  if (q < 0 || q >= q_len || kv < 0 || kv >= kv_len) return false;
  const int64_t state = block_state[static_cast<size_t>((q / block_q) * kv_blocks + kv / block_kv)];
  if (state == -1) return false;
  if (state == -2) return true;
  return partial_bits[static_cast<size_t>((state * block_q + q % block_q) * block_kv + kv % block_kv)] != 0;
}

void MaskTables::visible_row(int64_t q, std::vector<uint8_t>& out) const {
  out.assign(static_cast<size_t>(kv_len), 0);
  const int64_t q_block = q / block_q, row = q % block_q;
  for (int64_t kv_block = 0; kv_block < kv_blocks; ++kv_block) {
    const int64_t state = block_state[static_cast<size_t>(q_block * kv_blocks + kv_block)];
    const int64_t begin = kv_block * block_kv, end = std::min(kv_len, begin + block_kv);
    if (state == -1) continue;
    for (int64_t kv = begin; kv < end; ++kv)
      out[static_cast<size_t>(kv)] =
          state == -2 ? 1 : partial_bits[static_cast<size_t>((state * block_q + row) * block_kv + (kv - begin))];
  }
}

MaskTables mask_tables_from_raw(const std::vector<std::pair<std::string, RawTable>>& raw, int64_t q_len, int64_t kv_len,
                                const nlohmann::json& block_size, const std::string& where) {
  MaskTables tables;
  tables.q_len = q_len;
  tables.kv_len = kv_len;
  std::tie(tables.block_q, tables.block_kv) = block_sizes(block_size, where);
  tables.q_blocks = ceil_div(q_len, tables.block_q);
  tables.kv_blocks = ceil_div(kv_len, tables.block_kv);
  std::map<std::string, const RawTable*> by_name;
  for (const auto& [name, table] : raw) by_name[name] = &table;
  std::vector<std::string> problems;
  for (const char* name : kMaskTableNames)
    if (!by_name.count(name)) problems.push_back(std::string("tensor '") + name + "' is missing");
  const auto fail = [&](const std::string& heading) {
    std::string message = where + ": " + heading + ":";
    for (const auto& problem : problems) message += "\n  " + problem;
    throw CapsuleError(message);
  };
  if (!problems.empty()) fail("the mask tables are incomplete (python/README.md, Mask tables)");

  const RawTable& counts = *by_name["mask.kv_num_blocks"];
  if (counts.shape.size() != 3) fail("mask.kv_num_blocks must be [B, H, NQ], got " + shape_text(counts.shape));
  const int64_t batch = counts.shape[0], heads = counts.shape[1];
  const std::vector<int64_t> count_shape = {batch, heads, tables.q_blocks};
  const std::vector<int64_t> index_shape = {batch, heads, tables.q_blocks, tables.kv_blocks};
  for (const char* name : {"mask.kv_num_blocks", "mask.full_kv_num_blocks", "mask.kv_indices", "mask.full_kv_indices"}) {
    const RawTable& table = *by_name[name];
    const bool is_count = std::string(name).find("num_blocks") != std::string::npos;
    if (table.dtype != "int32" && table.dtype != "int64") problems.push_back(std::string(name) + " is " + table.dtype + ", not int32");
    if (table.shape != (is_count ? count_shape : index_shape))
      problems.push_back(std::string(name) + " is " + shape_text(table.shape) + ", expected " +
                         shape_text(is_count ? count_shape : index_shape) + " for Q_LEN " + std::to_string(q_len) +
                         ", KV_LEN " + std::to_string(kv_len) + " in blocks of " + std::to_string(tables.block_q) + " x " +
                         std::to_string(tables.block_kv));
  }
  const RawTable& bits = *by_name["mask.partial_bits"];
  if (bits.dtype != "bool" && bits.dtype != "uint8") problems.push_back("mask.partial_bits is " + bits.dtype + ", not bool");
  if (bits.shape.size() != 3 || bits.shape[1] != tables.block_q || bits.shape[2] != tables.block_kv)
    problems.push_back("mask.partial_bits is " + shape_text(bits.shape) + ", expected [P, " + std::to_string(tables.block_q) +
                       ", " + std::to_string(tables.block_kv) + "]");
  if (!problems.empty()) fail("the mask tables do not fit the step");

  const std::vector<int64_t> partial_counts = integers(counts), partial_index = integers(*by_name["mask.kv_indices"]);
  const std::vector<int64_t> full_counts = integers(*by_name["mask.full_kv_num_blocks"]);
  const std::vector<int64_t> full_index = integers(*by_name["mask.full_kv_indices"]);
  int64_t total_partial = 0;
  for (size_t row = 0; row < partial_counts.size(); ++row) {
    for (const auto& [what, list, index] : {std::tuple{"kv", &partial_counts, &partial_index},
                                            std::tuple{"full_kv", &full_counts, &full_index}}) {
      const int64_t count = (*list)[row];
      if (count < 0 || count > tables.kv_blocks) {
        problems.push_back(std::string("mask.") + what + "_num_blocks entry " + std::to_string(row) + " is " +
                           std::to_string(count) + ", outside 0.." + std::to_string(tables.kv_blocks));
        continue;
      }
      for (int64_t slot = 0; slot < count; ++slot) {
        const int64_t kv_block = (*index)[row * static_cast<size_t>(tables.kv_blocks) + static_cast<size_t>(slot)];
        if (kv_block < 0 || kv_block >= tables.kv_blocks)
          problems.push_back(std::string("mask.") + what + "_indices row " + std::to_string(row) + " slot " +
                             std::to_string(slot) + " is " + std::to_string(kv_block) + ", outside 0.." +
                             std::to_string(tables.kv_blocks - 1));
      }
    }
    total_partial += std::max<int64_t>(partial_counts[row], 0);
    if (problems.size() > 8) break;
  }
  if (problems.empty() && bits.shape[0] != total_partial)
    problems.push_back("mask.partial_bits holds " + std::to_string(bits.shape[0]) + " blocks but the lists name " +
                       std::to_string(total_partial) + " partial blocks");
  if (!problems.empty()) fail("the mask tables are inconsistent");

  // Batch entry 0, head 0; every other (b, h) must say the same.
  const size_t rows_per_head = static_cast<size_t>(tables.q_blocks);
  const size_t bits_per_block = static_cast<size_t>(tables.block_q * tables.block_kv);
  std::vector<std::vector<int64_t>> states;  // per (b, h): the block states, partial index local to it
  std::vector<std::string> head_bits;
  size_t partial_seen = 0;
  for (int64_t bh = 0; bh < batch * heads; ++bh) {
    std::vector<int64_t> state(rows_per_head * static_cast<size_t>(tables.kv_blocks), -1);
    const size_t first_partial = partial_seen;
    for (size_t q_block = 0; q_block < rows_per_head; ++q_block) {
      const size_t row = static_cast<size_t>(bh) * rows_per_head + q_block;
      for (int64_t slot = 0; slot < full_counts[row]; ++slot) {
        const int64_t kv_block = full_index[row * static_cast<size_t>(tables.kv_blocks) + static_cast<size_t>(slot)];
        state[q_block * static_cast<size_t>(tables.kv_blocks) + static_cast<size_t>(kv_block)] = -2;
      }
      for (int64_t slot = 0; slot < partial_counts[row]; ++slot) {
        const int64_t kv_block = partial_index[row * static_cast<size_t>(tables.kv_blocks) + static_cast<size_t>(slot)];
        int64_t& cell = state[q_block * static_cast<size_t>(tables.kv_blocks) + static_cast<size_t>(kv_block)];
        if (cell == -2)
          problems.push_back("q block " + std::to_string(q_block) + ", kv block " + std::to_string(kv_block) +
                             " is listed as full and as partial");
        cell = static_cast<int64_t>(partial_seen - first_partial);
        ++partial_seen;
      }
    }
    states.push_back(std::move(state));
    head_bits.push_back(bits.bytes.substr(first_partial * bits_per_block, (partial_seen - first_partial) * bits_per_block));
  }
  if (!problems.empty()) fail("the mask tables are inconsistent");
  for (size_t bh = 1; bh < states.size(); ++bh)
    if (states[bh] != states[0] || head_bits[bh] != head_bits[0])
      throw CapsuleError(where + ": the captured mask differs between batch entries or heads (b " +
                         std::to_string(static_cast<int64_t>(bh) / heads) + ", h " +
                         std::to_string(static_cast<int64_t>(bh) % heads) +
                         " against b 0, h 0); the named mask kinds are the same for every batch entry and head");
  tables.block_state = std::move(states[0]);
  tables.partial_bits.assign(head_bits[0].begin(), head_bits[0].end());
  for (size_t row = 0; row < rows_per_head; ++row) {
    tables.kv_num_blocks.push_back(static_cast<int32_t>(partial_counts[row]));
    tables.full_kv_num_blocks.push_back(static_cast<int32_t>(full_counts[row]));
  }
  tables.kv_indices.assign(partial_index.begin(), partial_index.begin() + static_cast<long>(rows_per_head * tables.kv_blocks));
  tables.full_kv_indices.assign(full_index.begin(), full_index.begin() + static_cast<long>(rows_per_head * tables.kv_blocks));
  return tables;
}

MaskTables read_mask_tables(const CapsuleInfo& file, int64_t q_len, int64_t kv_len, const nlohmann::json& block_size) {
  std::vector<std::pair<std::string, RawTable>> raw;
  for (const char* name : kMaskTableNames) {
    const TensorEntry* entry = file.find(name);
    if (!entry) continue;
    raw.emplace_back(name, RawTable{entry->dtype, entry->shape, read_tensor_bytes(file, *entry)});
  }
  return mask_tables_from_raw(raw, q_len, kv_len, block_size, file.path);
}

std::optional<FittedMask> fit_named_mask(const MaskTables& tables, std::vector<std::string>& why_not) {
  kernels::ResolvedMask full;
  full.kind = kernels::MaskKind::full;
  full.q_len = tables.q_len;
  full.kv_len = tables.kv_len;
  std::string difference = first_difference(tables, full, "full");
  if (difference.empty()) return lengths_only_mask("full", tables.q_len, tables.kv_len);
  why_not.push_back(difference);

  if (tables.kv_len >= tables.q_len) {
    kernels::ResolvedMask causal = full;
    causal.kind = kernels::MaskKind::causal;
    difference = first_difference(tables, causal, "causal");
    if (difference.empty()) return lengths_only_mask("causal", tables.q_len, tables.kv_len);
    why_not.push_back(difference);
  } else {
    why_not.push_back("causal: Q_LEN > KV_LEN");
  }

  const int64_t context = tables.kv_len - tables.q_len;
  if (context < 1) {
    why_not.push_back("dflash: no context (KV_LEN - Q_LEN = " + std::to_string(context) + ")");
    return std::nullopt;
  }
  // The draft part of query 0's row: its whole block (bidirectional) or only itself (causal).
  std::vector<uint8_t> row;
  tables.visible_row(0, row);
  int64_t first = -1, count = 0;
  for (int64_t kv = context; kv < tables.kv_len; ++kv)
    if (row[static_cast<size_t>(kv)]) {
      if (first < 0) first = kv;
      ++count;
    }
  if (first != context) {
    why_not.push_back("dflash: query 0 does not see the first draft position (key " + std::to_string(context) + ")");
    return std::nullopt;
  }
  if (auto fitted = dflash_candidate(tables, count, kernels::InBlock::bidirectional, why_not)) return fitted;
  if (count == 1) {
    // In-block causal: the block ends where a row's own draft position is the first it sees.
    int64_t block_size = tables.q_len;
    for (int64_t q = 1; q < tables.q_len && block_size == tables.q_len; ++q) {
      tables.visible_row(q, row);
      for (int64_t kv = context; kv < tables.kv_len; ++kv)
        if (row[static_cast<size_t>(kv)]) {
          if (kv == context + q) block_size = q;
          break;
        }
    }
    if (auto fitted = dflash_candidate(tables, block_size, kernels::InBlock::causal, why_not)) return fitted;
  }
  return std::nullopt;
}

}  // namespace harness::replay
