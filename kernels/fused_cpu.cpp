// CPU fused attention: flash-style, block-sparse over the BlockMask, as tiled ATen ops.
//   forward:  per q block, online softmax over the listed kv blocks (fp32), writes O in the
//             input dtype and the LSE (fp32); empty blocks are never visited, full blocks do no
//             mask work.
//   backward: delta = rowsum(dO * O); a dQ pass over the kv lists and a dK/dV pass over the
//             transposed q lists, recomputing P = exp(S - LSE) per tile.
// All heads of a GQA group are processed together: a q tile is [B, H_KV, G*rows, D], so one
// matmul serves every head that shares a kv head and dK/dV reduce the group inside the matmul.
// Extra memory beyond the outputs (O, dQ, dK, dV) is O(tile) per worker thread plus the LSE and
// delta ([B, H, Q] fp32 each): operands are converted to fp32 one tile at a time, and nothing of
// size Q x KV, or an fp32 copy of a whole input, is ever allocated.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cpu_exp.h"
#include "kernels/fused_function.h"

namespace harness::kernels {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Running row maximum before any key was seen: finite, so that exp(m_old - m_new) is exp(0)
// for rows still without a visible key instead of exp(-inf + inf) = NaN.
constexpr float kNoMax = std::numeric_limits<float>::lowest();

//! What the backward needs besides tensors: the mask (a copy, so the caller's MaskContext may go
//! away before the backward) and where to record dispatch.
struct FusedCpuState : torch::CustomClassHolder {
  ResolvedMask mask;
  BlockMask block_mask;
  double scale = 1.0;
  DispatchTrace* trace = nullptr;
  std::string config;
};

//! One kv (or q) block of a row of the BlockMask, in ascending block order.
struct BlockRef {
  int64_t index;
  bool partial;  //!< needs the per-element mask
};

//! Merges the partial and full lists of one row into one ascending list, so that the
//! accumulation order is the block order whatever the classification.
std::vector<BlockRef> merged_blocks(const at::Tensor& num_blocks, const at::Tensor& indices, const at::Tensor& full_num_blocks,
                                    const at::Tensor& full_indices, int64_t row) {
  const auto partial_count = num_blocks.data_ptr<int32_t>()[row];
  const auto full_count = full_num_blocks.data_ptr<int32_t>()[row];
  const int32_t* partial = indices.data_ptr<int32_t>() + row * indices.size(3);
  const int32_t* full = full_indices.data_ptr<int32_t>() + row * full_indices.size(3);
  std::vector<BlockRef> merged;
  merged.reserve(static_cast<std::size_t>(partial_count + full_count));
  int32_t p = 0, f = 0;
  while (p < partial_count || f < full_count) {
    if (f == full_count || (p < partial_count && partial[p] < full[f])) {
      merged.push_back({partial[p++], true});
    } else {
      merged.push_back({full[f++], false});
    }
  }
  return merged;
}

// exp of the tiles: exp_f32 (kernels/cpu_exp.h), not Tensor::exp_(). Inside at::parallel_for,
// ATen hands a contiguous float tensor's exp to MKL's VML, and MKL may split that one call over
// its own threads; the part another thread computed came out with a relative error up to 5e-5
// instead of an ulp. Measured on the forward of the "strided inputs" test (4 heads, 2 kv heads,
// Q 80, KV 230, tiles 32x32, 2 cores): in ~2% of processes 3 957 of one tile's 8 192 probabilities
// differed and the output moved by 3.4e-5 (CI failed on it); with MKL_NUM_THREADS=1, 0 of 150
// processes. A result must not depend on which thread was idle; tests/cpu_attention_processes.sh
// compares the bits across processes. (std::exp per element was also exact, but 38% slower.)

// On x86-64 the loop is compiled for AVX-512, AVX2 and the baseline, picked at load time by the
// CPU; none of them contracts into FMA, so every version gives the same bits. Elsewhere (aarch64:
// Grace) the baseline only.
#if defined(__x86_64__)
#define HARNESS_EXP_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define HARNESS_EXP_CLONES
#endif

//! x[..., r, c] = exp(x[..., r, c] - row[..., r, 0]) in place; both contiguous fp32.
HARNESS_EXP_CLONES void exp_minus_row_in_place(at::Tensor& x, const at::Tensor& row) {
  TORCH_INTERNAL_ASSERT(x.is_contiguous() && row.is_contiguous() && x.scalar_type() == at::kFloat &&
                        row.scalar_type() == at::kFloat && row.numel() * x.size(-1) == x.numel());
  float* data = x.data_ptr<float>();
  const float* row_data = row.data_ptr<float>();
  const int64_t cols = x.size(-1);
  for (int64_t r = 0, rows = row.numel(); r < rows; ++r) {
    float* line = data + r * cols;
    const float shift = row_data[r];
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) line[c] = exp_f32(line[c] - shift);
  }
}

//! x = f(x) elementwise in place; contiguous fp32. For the row statistics (one value per row:
//! exp_f32 of the max's correction, std::log of the sum), where the baseline loop suffices.
template <class F>
void map_in_place(at::Tensor& x, F f) {
  TORCH_INTERNAL_ASSERT(x.is_contiguous() && x.scalar_type() == at::kFloat);
  float* data = x.data_ptr<float>();
  for (int64_t i = 0, n = x.numel(); i < n; ++i) data[i] = f(data[i]);
}

//! Positions of a q tile and a kv tile.
struct Tile {
  int64_t q_begin, q_end, kv_begin, kv_end;
  int64_t rows() const { return q_end - q_begin; }
  int64_t cols() const { return kv_end - kv_begin; }
};

Tile tile_of(const BlockMask& block_mask, int64_t q_block, int64_t kv_block) {
  const int64_t q_begin = q_block * block_mask.block_m;
  const int64_t kv_begin = kv_block * block_mask.block_n;
  return {q_begin, std::min(q_begin + block_mask.block_m, block_mask.q_len), kv_begin,
          std::min(kv_begin + block_mask.block_n, block_mask.kv_len)};
}

//! [rows, cols] bool, true where the key is hidden: computed for this tile only (O(tile)).
at::Tensor hidden_tile(const ResolvedMask& mask, const Tile& tile) {
  at::Tensor hidden = at::empty({tile.rows(), tile.cols()}, at::kBool);
  bool* data = hidden.data_ptr<bool>();
  for (int64_t q = tile.q_begin; q < tile.q_end; ++q) {
    bool* row = data + (q - tile.q_begin) * tile.cols();
    mask.visible_row(q, tile.kv_begin, tile.kv_end, row);
    for (int64_t c = 0; c < tile.cols(); ++c) row[c] = !row[c];
  }
  return hidden;
}

//! Scaled scores of a tile, S = (scale*q) k^T, [B, H_KV, G*rows, cols], hidden keys at -inf.
at::Tensor tile_scores(const at::Tensor& q_scaled, const at::Tensor& k_tile, const ResolvedMask& mask, const Tile& tile,
                       bool partial) {
  at::Tensor scores = at::matmul(q_scaled, k_tile.transpose(-2, -1));
  if (partial) {
    const auto& sizes = scores.sizes();
    // [B, H_KV, G*rows, cols] -> [B, H_KV, G, rows, cols]: the tile mask broadcasts over the group.
    scores.view({sizes[0], sizes[1], -1, tile.rows(), tile.cols()}).masked_fill_(hidden_tile(mask, tile), kNegInf);
  }
  return scores;
}

//! Geometry of the call, and the layout change between [B, H, rows, D] and the grouped
//! [B, H_KV, G*rows, D] tiles.
struct Layout {
  int64_t batch, heads, kv_heads, head_dim, v_head_dim;
  //! Rows q_begin..q_end of `x` [B, H, Q, E] times `scale`, as a new contiguous fp32
  //! [B, H_KV, G*rows, E] (always a copy: callers update it in place).
  at::Tensor grouped(const at::Tensor& x, int64_t q_begin, int64_t q_end, double scale = 1.0) const {
    const at::Tensor rows = x.detach().slice(2, q_begin, q_end);
    at::Tensor copy = at::empty(rows.sizes(), rows.options().dtype(at::kFloat)).copy_(rows);
    if (scale != 1.0) copy.mul_(scale);
    return copy.view({batch, kv_heads, -1, x.size(3)});
  }
  //! The inverse: [B, H_KV, G*rows, E] -> [B, H, rows, E].
  at::Tensor ungrouped(const at::Tensor& x) const { return x.view({batch, heads, -1, x.size(3)}); }
};

//! Keys or values of one tile as fp32 [B, H_KV, cols, D]: converted per tile, never as a whole,
//! so the extra memory stays O(tile) (a whole fp32 copy of K and V would be O(KV)).
at::Tensor kv_tile_fp32(const at::Tensor& x, const Tile& tile) {
  return x.detach().slice(2, tile.kv_begin, tile.kv_end).to(at::kFloat);
}

//! The forward: out in q's dtype and the LSE, without autograd.
FusedForward cpu_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const FusedCpuState* state) {
  const Layout layout{q.size(0), q.size(1), k.size(1), q.size(3), v.size(3)};
  const BlockMask& block_mask = state->block_mask;
  // The output is written tile by tile in the input dtype; only the LSE ([B, H, Q], like the
  // GPU kernels) is kept in fp32.
  at::Tensor out = at::empty({layout.batch, layout.heads, block_mask.q_len, layout.v_head_dim}, q.options());
  at::Tensor lse = at::empty({layout.batch, layout.heads, block_mask.q_len}, q.options().dtype(at::kFloat));

  // q blocks are independent: one task each; the ops inside run single-threaded on tiles.
  at::parallel_for(0, block_mask.num_q_blocks, 1, [&](int64_t q_block_begin, int64_t q_block_end) {
    at::NoGradGuard no_grad;  // worker threads do not inherit the caller's grad mode
    for (int64_t q_block = q_block_begin; q_block < q_block_end; ++q_block) {
      const Tile rows = tile_of(block_mask, q_block, 0);
      const at::Tensor q_tile = layout.grouped(q, rows.q_begin, rows.q_end, state->scale);
      at::Tensor row_max = at::full({layout.batch, layout.kv_heads, q_tile.size(2), 1}, kNoMax, q_tile.options());
      at::Tensor row_sum = at::zeros_like(row_max);
      at::Tensor acc = at::zeros({layout.batch, layout.kv_heads, q_tile.size(2), layout.v_head_dim}, q_tile.options());
      for (const BlockRef& kv_block : merged_blocks(block_mask.kv_num_blocks, block_mask.kv_indices,
                                                    block_mask.full_kv_num_blocks, block_mask.full_kv_indices, q_block)) {
        const Tile tile = tile_of(block_mask, q_block, kv_block.index);
        at::Tensor probabilities = tile_scores(q_tile, kv_tile_fp32(k, tile), state->mask, tile, kv_block.partial);
        const at::Tensor new_max = at::maximum(row_max, probabilities.amax(-1, true));
        exp_minus_row_in_place(probabilities, new_max);
        at::Tensor correction = row_max - new_max;
        map_in_place(correction, [](float v) { return exp_f32(v); });
        row_sum.mul_(correction).add_(probabilities.sum(-1, true));
        acc.mul_(correction).add_(at::matmul(probabilities, kv_tile_fp32(v, tile)));
        row_max = new_max;
      }
      // Rows that saw nothing have row_sum 0 and acc 0: output 0, LSE = lowest + log(0) = -inf.
      // Every other row has row_sum >= 1 (its maximum contributes exp(0)), untouched by the clamp.
      acc.div_(row_sum.clamp_min(std::numeric_limits<float>::min()));
      out.slice(2, rows.q_begin, rows.q_end).copy_(layout.ungrouped(acc));
      map_in_place(row_sum, [](float v) { return std::log(v); });
      lse.slice(2, rows.q_begin, rows.q_end).copy_(layout.ungrouped(row_max.add_(row_sum)).squeeze(-1));
    }
  });

  return {out, lse};
}

//! The backward from the forward's out and LSE, without autograd.
FusedGradients cpu_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                            const at::Tensor& lse, const at::Tensor& grad_out, const FusedCpuState* state) {
  if (state->trace) {
    state->trace->record({"attention_bwd", "fused_cpu", "cpu",
                          "backward of fused_cpu: recomputes P per tile from LSE, dQ pass over kv lists, "
                          "dK/dV pass over transposed q lists",
                          state->config});
  }
  const Layout layout{q.size(0), q.size(1), k.size(1), q.size(3), v.size(3)};
  const BlockMask& block_mask = state->block_mask;
  // Rows that saw nothing have LSE -inf; +inf instead makes P = exp(S - LSE) = 0 for every key
  // (S is -inf or finite there), not exp(-inf + inf) = NaN.
  const at::Tensor lse_for_p = lse.masked_fill(lse == kNegInf, std::numeric_limits<float>::infinity()).unsqueeze(-1);
  // delta = rowsum(dO * O) in fp32, the softmax backward's correction term: [B, H, Q, 1], filled
  // by the dQ pass and read by the dK/dV pass (O(Q), like the LSE).
  at::Tensor delta = at::empty_like(lse_for_p);

  // The grouped fp32 operands of one q block, converted when a tile needs them (O(tile)).
  struct QBlock {
    at::Tensor q_scaled, grad_out, lse, delta;
  };
  const auto q_block_operands = [&](int64_t q_block, bool compute_delta) {
    const Tile rows = tile_of(block_mask, q_block, 0);
    QBlock qb;
    qb.q_scaled = layout.grouped(q, rows.q_begin, rows.q_end, state->scale);
    qb.grad_out = layout.grouped(grad_out, rows.q_begin, rows.q_end);
    qb.lse = layout.grouped(lse_for_p, rows.q_begin, rows.q_end);
    if (compute_delta) {
      qb.delta = layout.grouped(out, rows.q_begin, rows.q_end).mul_(qb.grad_out).sum(-1, true);
      delta.slice(2, rows.q_begin, rows.q_end).copy_(layout.ungrouped(qb.delta));
    } else {
      qb.delta = layout.grouped(delta, rows.q_begin, rows.q_end);
    }
    return qb;
  };

  // dS = P * (dP - delta) of one tile, with P returned too (the dK/dV pass needs it).
  const auto tile_gradients = [&](const QBlock& qb, const Tile& tile, bool partial) {
    at::Tensor probabilities = tile_scores(qb.q_scaled, kv_tile_fp32(k, tile), state->mask, tile, partial);
    exp_minus_row_in_place(probabilities, qb.lse);
    at::Tensor grad_scores = at::matmul(qb.grad_out, kv_tile_fp32(v, tile).transpose(-2, -1));
    grad_scores.sub_(qb.delta).mul_(probabilities);
    return std::make_pair(probabilities, grad_scores);
  };

  at::Tensor grad_q = at::empty(q.sizes(), q.options());
  at::Tensor grad_k = at::empty(k.sizes(), k.options());
  at::Tensor grad_v = at::empty(v.sizes(), v.options());

  at::parallel_for(0, block_mask.num_q_blocks, 1, [&](int64_t q_block_begin, int64_t q_block_end) {
    at::NoGradGuard no_grad;
    for (int64_t q_block = q_block_begin; q_block < q_block_end; ++q_block) {
      const QBlock qb = q_block_operands(q_block, /*compute_delta=*/true);
      at::Tensor grad_q_acc = at::zeros_like(qb.q_scaled);
      for (const BlockRef& kv_block : merged_blocks(block_mask.kv_num_blocks, block_mask.kv_indices,
                                                    block_mask.full_kv_num_blocks, block_mask.full_kv_indices, q_block)) {
        const Tile tile = tile_of(block_mask, q_block, kv_block.index);
        const at::Tensor grad_scores = tile_gradients(qb, tile, kv_block.partial).second;
        grad_q_acc.add_(at::matmul(grad_scores, kv_tile_fp32(k, tile)));
      }
      const Tile rows = tile_of(block_mask, q_block, 0);
      grad_q.slice(2, rows.q_begin, rows.q_end).copy_(layout.ungrouped(grad_q_acc.mul_(state->scale)));
    }
  });

  at::parallel_for(0, block_mask.num_kv_blocks, 1, [&](int64_t kv_block_begin, int64_t kv_block_end) {
    at::NoGradGuard no_grad;
    for (int64_t kv_block = kv_block_begin; kv_block < kv_block_end; ++kv_block) {
      const Tile cols = tile_of(block_mask, 0, kv_block);
      at::Tensor grad_k_acc =
          at::zeros({layout.batch, layout.kv_heads, cols.cols(), layout.head_dim}, k.options().dtype(at::kFloat));
      at::Tensor grad_v_acc =
          at::zeros({layout.batch, layout.kv_heads, cols.cols(), layout.v_head_dim}, k.options().dtype(at::kFloat));
      for (const BlockRef& q_block : merged_blocks(block_mask.q_num_blocks, block_mask.q_indices,
                                                   block_mask.full_q_num_blocks, block_mask.full_q_indices, kv_block)) {
        const Tile tile = tile_of(block_mask, q_block.index, kv_block);
        const QBlock qb = q_block_operands(q_block.index, /*compute_delta=*/false);
        const auto [probabilities, grad_scores] = tile_gradients(qb, tile, q_block.partial);
        // The G*rows rows hold every head of the group: these matmuls also reduce GQA.
        grad_v_acc.add_(at::matmul(probabilities.transpose(-2, -1), qb.grad_out));
        grad_k_acc.add_(at::matmul(grad_scores.transpose(-2, -1), qb.q_scaled));
      }
      grad_k.slice(2, cols.kv_begin, cols.kv_end).copy_(grad_k_acc);
      grad_v.slice(2, cols.kv_begin, cols.kv_end).copy_(grad_v_acc);
    }
  });
  return {grad_q, grad_k, grad_v};
}

using FusedAttentionCpu = FusedFunction<FusedCpuState, cpu_forward, cpu_backward>;

c10::intrusive_ptr<FusedCpuState> make_state(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             MaskContext& mask, double scale, const CpuTileConfig& tiles,
                                             DispatchTrace* trace) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(),
              "fused_attention_cpu: q, k, v must be CPU tensors (got ", q.device(), ", ", k.device(), ", ", v.device(), ")");
  TORCH_CHECK(tiles.block_m > 0 && tiles.block_n > 0, "fused_attention_cpu: tile sizes must be > 0 (got block_m=",
              tiles.block_m, " block_n=", tiles.block_n, ")");
  auto state = c10::make_intrusive<FusedCpuState>();
  state->mask = mask.mask();
  state->block_mask = mask.block_mask(tiles.block_m, tiles.block_n, at::kCPU);
  state->scale = scale;
  state->trace = trace;
  state->config = "block_m=" + std::to_string(tiles.block_m) + " block_n=" + std::to_string(tiles.block_n);
  return state;
}

void record_forward(const FusedCpuState& state) {
  if (!state.trace) return;
  state.trace->record({"attention_fwd", "fused_cpu", "cpu",
                       "impl=fused on CPU tensors: tiled ATen ops over the BlockMask (" +
                           std::to_string(state.block_mask.partial_pairs()) + " partial, " +
                           std::to_string(state.block_mask.full_pairs()) + " full of " +
                           std::to_string(state.block_mask.num_q_blocks * state.block_mask.num_kv_blocks) + " blocks)",
                       state.config});
}

}  // namespace

at::Tensor fused_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, MaskContext& mask,
                               double scale, const CpuTileConfig& tiles, DispatchTrace* trace) {
  auto state = make_state(q, k, v, mask, scale, tiles, trace);
  record_forward(*state);
  return FusedAttentionCpu::apply(q, k, v, state);
}

FusedForward fused_attention_cpu_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, MaskContext& mask,
                                         double scale, const CpuTileConfig& tiles, DispatchTrace* trace) {
  const auto state = make_state(q, k, v, mask, scale, tiles, trace);
  record_forward(*state);
  at::NoGradGuard no_grad;
  return cpu_forward(q, k, v, state.get());
}

FusedGradients fused_attention_cpu_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                            MaskContext& mask, double scale, const CpuTileConfig& tiles,
                                            DispatchTrace* trace) {
  const auto state = make_state(q, k, v, mask, scale, tiles, trace);
  at::NoGradGuard no_grad;
  return cpu_backward(q, k, v, out, lse, grad_out, state.get());
}

}  // namespace harness::kernels
