#pragma once
// Register-tile math shared by the mma.sync and the wgmma kernels (device code only). Every score
// tile here is fp32 in the m16n8 accumulator layout, float[kCols / 8][4] per thread: n8 chunk j
// holds (row g, cols 8j + 2t, 8j + 2t + 1) in elements 0, 1 and (row g + 8, same cols) in 2, 3,
// for lane = 4g + t (mma.sync's C layout, and per warp the wgmma accumulator's). So each thread
// sees two rows ("row tiles": queries in S, keys in S^T) and kCols / 4 columns of a tile.

#include <cstdint>

#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/mask_device.cuh"

namespace harness::kernels::cuda::device {

//! Sum / max over the four threads of a quad (they hold one row's columns in the C layout).
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return x;
}

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

//! Column of element e of n8 chunk j for this lane.
__device__ __forceinline__ int tile_column(int j, int e) {
  return j * 8 + (static_cast<int>(threadIdx.x) & 3) * 2 + (e & 1);
}

//! The documents of this thread's columns kv0 + tile_column(j, e & 1) of a tile (key_doc), all
//! loads issued together.
template <int kCols>
__device__ __forceinline__ void load_key_docs(int32_t (&docs)[kCols / 8][2], const MaskParams& mask, int kv0) {
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) docs[j][e] = key_doc(mask, kv0 + tile_column(j, e));
  }
}

//! S (query rows x keys kv0..): -inf where row i's query does not see the key. The keys'
//! documents are read first, all at once (one load latency per tile, not one per score).
template <int kCols>
__device__ __forceinline__ void mask_scores(float (&s)[kCols / 8][4], const QueryMask (&row_mask)[2], const MaskParams& mask,
                                            int kv0) {
  if (mask.kind == MaskCode::blockmask) {
    // Each row's words for the tile's keys loaded once (kCols / 32 per row), then a bit per score:
    // a load per score made every partial step of a generic mask several times slower than a
    // full one. A word past the row's end, or a row without bits (past q_len), reads as 0.
    static_assert(kCols % 32 == 0, "the tile's keys start at a word (kv0 = kv block x kCols)");
    constexpr int kWords = kCols / 32;
    uint32_t words[2][kWords];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const bool has_bits = row_mask[i].doc == kBitmapRow;
#pragma unroll
      for (int w = 0; w < kWords; ++w) {
        const int word = (kv0 >> 5) + w;
        words[i][w] = has_bits && word < mask.bit_words ? __ldg(bitmap_words(row_mask[i]) + word) : 0u;
      }
    }
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = tile_column(j, e);
        if (!((words[e >> 1][c >> 5] >> (c & 31)) & 1u)) s[j][e] = -INFINITY;
      }
    }
    return;
  }
  int32_t docs[kCols / 8][2];
  load_key_docs<kCols>(docs, mask, kv0);
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (!visible_named(row_mask[e >> 1], docs[j][e & 1], kv0 + tile_column(j, e))) s[j][e] = -INFINITY;
    }
  }
}

//! S^T (key rows my_kv, of documents my_doc, x query columns): -inf where column c's query
//! (masks[c & column_mask]) does not see row i's key.
template <int kCols>
__device__ __forceinline__ void mask_scores_transposed(float (&st)[kCols / 8][4], const QueryMaskRow* masks, int column_mask,
                                                       const int32_t (&my_doc)[2], const int (&my_kv)[2]) {
  // Every column's row is of the mask's kind: the first one says which test the tile takes.
  if (masks[0].mask.doc == kBitmapRow) {
    // The thread's two keys (rows g and g + 8 of its warp's 16) lie in one 32-key word of every
    // column's row: one load per column serves both. A column without bits (past q_len) and a
    // key past kv_len (the row's ctx_hi) see nothing.
    const int word = my_kv[0] >> 5;
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const QueryMask& row = masks[tile_column(j, c) & column_mask].mask;
        const bool has_bits = (row.doc == kBitmapRow) & (my_kv[0] >= 0) & (word < (row.ctx_hi + 31) >> 5);
        const uint32_t bits = has_bits ? __ldg(bitmap_words(row) + word) : 0u;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          if (!((my_kv[r] < row.ctx_hi) & ((bits >> (my_kv[r] & 31)) & 1u))) st[j][2 * r + c] = -INFINITY;
        }
      }
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) {
    // Every field of every column loaded at once (16 x 5 registers) made ptxas spill the atomic
    // backward's descriptors; a warp sync every two chunks keeps it to loads for two at a time.
    if (j % 2 == 0) __syncwarp();
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (!visible_named(masks[tile_column(j, e) & column_mask].mask, my_doc[e >> 1], my_kv[e >> 1])) st[j][e] = -INFINITY;
    }
  }
}

//! The max of row i's scores of this thread (and m0) in four independent chains instead of one
//! chain of kCols / 4 dependent FMNMX (H200, self-test: no measurable change in the forwards'
//! times; kept for the shorter dependency chain).
template <int kCols>
__device__ __forceinline__ float tile_row_max(const float (&s)[kCols / 8][4], int i, float m0) {
  float m[4] = {m0, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) m[j % 4] = fmaxf(m[j % 4], fmaxf(s[j][2 * i], s[j][2 * i + 1]));
  return fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3]));
}

//! The step of the online softmax after the maxima: s becomes 2^(s scale log2e - base) per row,
//! and row_sum takes the factor corr and the tile's sum (this thread's columns only, quad-reduced
//! at the end; four partial sums per row, as in tile_row_max).
template <int kCols>
__device__ __forceinline__ void exponentiate_rows(float (&s)[kCols / 8][4], const float (&base)[2], float scale_log2,
                                                  const float (&corr)[2], float (&row_sum)[2]) {
  float part[2][4] = {};
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[j][e] = exp2_approx(fmaf(s[j][e], scale_log2, -base[e >> 1]));
      part[e >> 1][(j & 1) * 2 + (e & 1)] += s[j][e];
    }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) row_sum[i] = fmaf(row_sum[i], corr[i], (part[i][0] + part[i][1]) + (part[i][2] + part[i][3]));
}

//! One online-softmax step of the forward without touching O: folds the tile's row maxima into
//! row_max (raw scores), rescales row_sum by what the new maxima change and returns that factor
//! in corr (O's, applied by the caller: at once, or once the MMAs still adding to O are done),
//! and turns s into the tile's unnormalized probabilities 2^(s scale log2e - max), adding them to
//! row_sum (this thread's columns only, quad-reduced at the end; four partial sums per row, as in
//! tile_row_max).
template <int kCols>
__device__ __forceinline__ void online_softmax_scores(float (&s)[kCols / 8][4], float (&row_max)[2], float (&row_sum)[2],
                                                      float scale_log2, float (&corr)[2]) {
  float base[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float m = quad_max(tile_row_max<kCols>(s, i, row_max[i]));
    // A row with nothing visible so far keeps max -inf; subtract 0 then (every p is 0).
    base[i] = m == -INFINITY ? 0.f : m * scale_log2;
    // corr rescales what was accumulated under the previous max; nothing was when it was -inf.
    corr[i] = row_max[i] == -INFINITY ? 0.f : exp2_approx(row_max[i] * scale_log2 - base[i]);
    row_max[i] = m;
  }
  exponentiate_rows<kCols>(s, base, scale_log2, corr, row_sum);
}

//! Scales this thread's two rows of an accumulator tile (O) by corr[0] and corr[1].
template <int kCols>
__device__ __forceinline__ void scale_rows(float (&acc)[kCols / 8][4], const float (&corr)[2]) {
#pragma unroll
  for (int d = 0; d < kCols / 8; ++d) {
    acc[d][0] *= corr[0];
    acc[d][1] *= corr[0];
    acc[d][2] *= corr[1];
    acc[d][3] *= corr[1];
  }
}

//! online_softmax_scores with O rescaled at once (nothing is adding to it meanwhile).
template <int kCols, int kHeadDim>
__device__ __forceinline__ void online_softmax(float (&s)[kCols / 8][4], float (&acc_o)[kHeadDim / 8][4], float (&row_max)[2],
                                               float (&row_sum)[2], float scale_log2) {
  float corr[2];
  online_softmax_scores<kCols>(s, row_max, row_sum, scale_log2, corr);
  scale_rows<kHeadDim>(acc_o, corr);
}

//! online_softmax_scores with a lazy rescale (FlashAttention-4's): a row's reference max moves
//! only when the tile's max exceeds it by more than kLazyRescaleLog2 (a probability of 2^8), and
//! then all of the warp's rows take their new maxima; otherwise the tile's probabilities are taken
//! against the old max (each at most 2^8 = 256: no fp32 sum overflows, and bf16 or fp16 hold P at
//! that magnitude with their usual relative precision), corr is 1 and O needs no rescale. Returns whether O must be
//! rescaled by corr (the same in every lane of the warp, `__any_sync`), so that the caller can skip
//! kHeadDim / 2 FMUL per thread and step once the maxima have settled. Exact: O, the sum and the
//! LSE (finish_rows) all refer to the same max. No branch: the overlapped forwards call it between
//! two wgmma waits.
constexpr float kLazyRescaleLog2 = 8.f;
template <int kCols>
__device__ __forceinline__ bool online_softmax_scores_lazy(float (&s)[kCols / 8][4], float (&row_max)[2],
                                                           float (&row_sum)[2], float scale_log2, float (&corr)[2]) {
  float m[2];
  bool grow = false;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    m[i] = quad_max(tile_row_max<kCols>(s, i, row_max[i]));
    // A row with nothing visible so far (max -inf) grows with its first visible score; one that
    // still sees nothing gives NaN here, which is no growth.
    grow |= (m[i] - row_max[i]) * scale_log2 > kLazyRescaleLog2;
  }
  const bool rescale = __any_sync(0xffffffffu, grow);
  float base[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    // corr rescales what was accumulated under the previous max; nothing was when it was -inf.
    const float moved = row_max[i] == -INFINITY ? 0.f : exp2_approx((row_max[i] - m[i]) * scale_log2);
    corr[i] = rescale ? moved : 1.f;
    row_max[i] = rescale ? m[i] : row_max[i];
    // A row with nothing visible so far keeps max -inf; subtract 0 then (every p is 0).
    base[i] = row_max[i] == -INFINITY ? 0.f : row_max[i] * scale_log2;
  }
  exponentiate_rows<kCols>(s, base, scale_log2, corr, row_sum);
  return rescale;
}

//! online_softmax with the lazy rescale: O is rescaled (a warp-uniform branch) only when a max
//! moved. Only where no wgmma is in flight.
template <int kCols, int kHeadDim>
__device__ __forceinline__ void online_softmax_lazy(float (&s)[kCols / 8][4], float (&acc_o)[kHeadDim / 8][4],
                                                    float (&row_max)[2], float (&row_sum)[2], float scale_log2) {
  float corr[2];
  if (online_softmax_scores_lazy<kCols>(s, row_max, row_sum, scale_log2, corr)) scale_rows<kHeadDim>(acc_o, corr);
}

//! Backward, S -> P = 2^(S scale log2e - lse2) with the rows' log2-scaled LSE.
template <int kCols>
__device__ __forceinline__ void probabilities(float (&s)[kCols / 8][4], const float (&row_lse2)[2], float scale_log2) {
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = exp2_approx(fmaf(s[j][e], scale_log2, -row_lse2[e >> 1]));
  }
}

//! Backward, dP -> dS = P (dP - delta) in place of P (s) with the rows' delta.
template <int kCols>
__device__ __forceinline__ void score_gradients(float (&s)[kCols / 8][4], const float (&dp)[kCols / 8][4],
                                                const float (&row_delta)[2]) {
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] *= dp[j][e] - row_delta[e >> 1];
  }
}

//! Backward, transposed: S^T -> P^T with each column's (query's) LSE, stats[column].x.
template <int kCols>
__device__ __forceinline__ void probabilities_transposed(float (&st)[kCols / 8][4], const float2* stats, float scale_log2) {
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) {
    const int col = tile_column(j, 0);
    const float l0 = stats[col].x, l1 = stats[col + 1].x;
    st[j][0] = exp2_approx(fmaf(st[j][0], scale_log2, -l0));
    st[j][1] = exp2_approx(fmaf(st[j][1], scale_log2, -l1));
    st[j][2] = exp2_approx(fmaf(st[j][2], scale_log2, -l0));
    st[j][3] = exp2_approx(fmaf(st[j][3], scale_log2, -l1));
  }
}

//! Backward, transposed: dP^T -> dS^T = P^T (dP^T - delta) in place, with P^T in fp32 (the
//! probabilities before they were rounded to the dV product's operand: a flash kernel rounds dS^T
//! once, and a P^T rounded first would double dS^T's rounding error, which dK sums over every query)
//! and each column's delta, stats[column].y. P^T and dP^T are alike m16n8 C-layout tiles.
template <int kCols>
__device__ __forceinline__ void score_gradients_transposed(float (&dpt)[kCols / 8][4], const float (&pt)[kCols / 8][4],
                                                           const float2* stats) {
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) {
    const int col = tile_column(j, 0);
    const float d0 = stats[col].y, d1 = stats[col + 1].y;
    dpt[j][0] = pt[j][0] * (dpt[j][0] - d0);
    dpt[j][1] = pt[j][1] * (dpt[j][1] - d1);
    dpt[j][2] = pt[j][2] * (dpt[j][2] - d0);
    dpt[j][3] = pt[j][3] * (dpt[j][3] - d1);
  }
}

//! The A fragments (of the element type) of an m16 x k(16*kStepsK) operand held in fp32 m16n8
//! C-layout tiles: C tiles 2kk and 2kk+1 are exactly the A fragment of k step kk, so P and dS go
//! from one MMA's output to the next MMA's input without leaving registers.
template <int kStepsK, ElementType kElement>
__device__ __forceinline__ void to_a_fragments(uint32_t (&a)[kStepsK][4], const float (&c)[2 * kStepsK][4]) {
#pragma unroll
  for (int kk = 0; kk < kStepsK; ++kk) {
    a[kk][0] = pack2<kElement>(c[2 * kk][0], c[2 * kk][1]);
    a[kk][1] = pack2<kElement>(c[2 * kk][2], c[2 * kk][3]);
    a[kk][2] = pack2<kElement>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[kk][3] = pack2<kElement>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
  }
}

//! The LSE (natural log) of a finished row from its raw max and quad-reduced sum; -inf when the
//! row saw nothing.
__device__ __forceinline__ float row_lse(float row_max, float sum, float scale_log2) {
  return sum > 0.f ? (row_max * scale_log2 + __log2f(sum)) * kLn2 : -INFINITY;
}

}  // namespace harness::kernels::cuda::device
