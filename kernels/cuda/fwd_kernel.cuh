#pragma once
// Forward kernel (device code only): block-sparse flash attention with online softmax.
// Grid: one CTA per (q block, head pack, batch), in the longest-first order of `schedule`. One CTA
// computes `rows` = heads_packed x block_m query rows
// (heads_packed query heads of one GQA group, block_m positions each) against the kv blocks its
// q block lists (partial first, then full), K/V tiles double-buffered with cp.async.

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/attention_config.h"
#include "kernels/cuda/attention_params.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/kernel_common.cuh"
#include "kernels/cuda/mask_device.cuh"
#include "kernels/cuda/tile_math.cuh"
#include "kernels/cuda/tile_scheduler.cuh"

namespace harness::kernels::cuda::device {

//! cp.async of the K and V tiles of one kv block (kBlockN keys from kv0 of one kv head) into
//! swizzled shared-memory tiles; keys past kv_len are zero-filled. Shared by the mma.sync forward
//! and dQ kernels, which run the same K/V ring.
template <int kBlockN, int kHeadDim, int kThreads>
__device__ __forceinline__ void load_kv_tiles_async(uint32_t s_k, uint32_t s_v, const TensorRef& k, const TensorRef& v,
                                                    int batch, int kv_head, int kv0, int kv_len) {
  load_tile_async<kBlockN, kHeadDim, kThreads>(s_k, k.data, [&](int row) -> const __nv_bfloat16* {
    return kv0 + row < kv_len ? row_pointer(k, batch, kv_head, kv0 + row) : nullptr;
  });
  load_tile_async<kBlockN, kHeadDim, kThreads>(s_v, v.data, [&](int row) -> const __nv_bfloat16* {
    return kv0 + row < kv_len ? row_pointer(v, batch, kv_head, kv0 + row) : nullptr;
  });
}

//! The ring of kStages shared-memory stages through which a tile streams the blocks it visits
//! (the forward and dQ stream K/V blocks, dK/dV streams Q/dO blocks): block indices of the next
//! kStages steps in `upcoming`, the tiles of the next kStages - 1 in flight. Each index is read
//! from global memory kStages steps before its tile is used, so no step waits on a load for the
//! index it needs (reading it in the step that uses it stalls every warp for an L2 round trip).
//! One commit group per tile, empty or not, keeps the wait counts uniform. `block_at(step)` gives
//! a step's block index; `load(step, block, stage)` issues the cp.async of its tile into a stage.
template <int kStages>
struct BlockRing {
  int upcoming[kStages];

  //! The prologue: the first kStages steps' indices, the first kStages - 1 tiles in flight.
  template <typename BlockAt, typename Load>
  __device__ __forceinline__ void start(int num_steps, const BlockAt& block_at, const Load& load) {
#pragma unroll
    for (int i = 0; i < kStages; ++i) upcoming[i] = block_at(i);
#pragma unroll
    for (int i = 0; i < kStages - 1; ++i) {
      if (i < num_steps) load(i, upcoming[i], i);
      cp_async_commit();
    }
  }

  //! The top of step `step`: reads the index of step + kStages (returned, for advance()), waits
  //! until this step's tile has landed in every thread's copies, then refills the stage step - 1
  //! read (every warp is past the barrier, so none still reads it).
  template <typename BlockAt, typename Load>
  __device__ __forceinline__ int begin_step(int step, int num_steps, const BlockAt& block_at, const Load& load) {
    const int fetched = block_at(step + kStages);
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (step + kStages - 1 < num_steps) load(step + kStages - 1, upcoming[kStages - 1], (step + kStages - 1) % kStages);
    cp_async_commit();
    return fetched;
  }

  //! This step's block.
  __device__ __forceinline__ int current() const { return upcoming[0]; }

  //! The end of a step: the ring moves on by one, `fetched` (from begin_step) joining last.
  __device__ __forceinline__ void advance(int fetched) {
#pragma unroll
    for (int i = 0; i < kStages - 1; ++i) upcoming[i] = upcoming[i + 1];
    upcoming[kStages - 1] = fetched;
  }
};

//! Copies a warp's 16 finished rows (already bf16 in its own rows of a swizzled tile) to global
//! memory with 16-byte stores; `destination(row)` is nullptr for rows not to store.
template <int kHeadDim, typename Destination>
__device__ __forceinline__ void store_warp_rows(uint32_t smem_tile, int first_row, Destination destination) {
  using Tile = SmemTile<16, kHeadDim>;  // only for kChunks; offsets use the full tile's rows
  const int lane = static_cast<int>(threadIdx.x) & 31;
  __syncwarp();
#pragma unroll
  for (int i = 0; i < 16 * Tile::kChunks / 32; ++i) {
    const int index = lane + i * 32;
    const int row = first_row + index / Tile::kChunks;
    const int chunk = index % Tile::kChunks;
    __nv_bfloat16* target = destination(row);
    if (target == nullptr) continue;
    uint4 value;
    const uint32_t address = smem_tile + static_cast<uint32_t>((row * Tile::kChunks + (chunk ^ (row & 7))) * 16);
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(value.x), "=r"(value.y), "=r"(value.z), "=r"(value.w)
                 : "r"(address)
                 : "memory");
    *reinterpret_cast<uint4*>(target + chunk * 8) = value;
  }
}

//! Writes a warp's fp32 accumulator (16 rows x kHeadDim, m16n8 C layout) as bf16 into its own
//! rows of a swizzled tile, each value multiplied by the row's factor.
template <int kHeadDim, ElementType kElement>
__device__ __forceinline__ void accumulator_to_smem(uint32_t smem_tile, int first_row, const float (&acc)[kHeadDim / 8][4],
                                                    float factor_row0, float factor_row1) {
  constexpr int kChunks = kHeadDim / 8;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int row0 = first_row + (lane >> 2);
  const int row1 = row0 + 8;
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; ++j) {
    const uint32_t lo = pack2<kElement>(acc[j][0] * factor_row0, acc[j][1] * factor_row0);
    const uint32_t hi = pack2<kElement>(acc[j][2] * factor_row1, acc[j][3] * factor_row1);
    const uint32_t byte_in_chunk = static_cast<uint32_t>((lane & 3) * 4);
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(smem_tile + static_cast<uint32_t>((row0 * kChunks + (j ^ (row0 & 7))) * 16) +
                                                   byte_in_chunk),
                 "r"(lo)
                 : "memory");
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(smem_tile + static_cast<uint32_t>((row1 * kChunks + (j ^ (row1 & 7))) * 16) +
                                                   byte_in_chunk),
                 "r"(hi)
                 : "memory");
  }
}

//! acc[16 x 8*kTilesN] += A[16 rows from a_first_row of tile A] * B^T where B's rows (the n index)
//! are rows b_first_row.. of tile B (both [rows x kHeadDim] swizzled, k = head dim).
template <int kHeadDim, int kTilesN, ElementType kElement>
__device__ __forceinline__ void gemm_rows_by_rows(float (&acc)[kTilesN][4], uint32_t tile_a, int a_first_row, uint32_t tile_b,
                                                  int b_first_row) {
  constexpr int kChunks = kHeadDim / 8;
  static_assert(kTilesN % 2 == 0, "n tiles come in pairs from one ldmatrix.x4");
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int a_row = a_first_row + (lane & 15);
  const int b_row_in_pair = (lane & 7) + ((lane >> 4) << 3);
  const int b_chunk_half = (lane >> 3) & 1;
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    uint32_t a[4];
    const int a_chunk = kk * 2 + (lane >> 4);
    ldmatrix_x4(a, tile_a + static_cast<uint32_t>((a_row * kChunks + (a_chunk ^ (a_row & 7))) * 16));
#pragma unroll
    for (int nn = 0; nn < kTilesN / 2; ++nn) {
      uint32_t b[4];
      const int b_row = b_first_row + nn * 16 + b_row_in_pair;
      const int b_chunk = kk * 2 + b_chunk_half;
      ldmatrix_x4(b, tile_b + static_cast<uint32_t>((b_row * kChunks + (b_chunk ^ (b_row & 7))) * 16));
      mma_16816<kElement>(acc[2 * nn], a, b[0], b[1]);
      mma_16816<kElement>(acc[2 * nn + 1], a, b[2], b[3]);
    }
  }
}

//! acc[16 x kHeadDim] += A[16 x 16*kStepsK] (bf16 fragments in registers) * B where B is a swizzled
//! [rows x kHeadDim] tile read k-major (ldmatrix.trans) from row b_first_row.
template <int kHeadDim, int kStepsK, ElementType kElement>
__device__ __forceinline__ void gemm_frags_by_tile(float (&acc)[kHeadDim / 8][4], const uint32_t (&a)[kStepsK][4],
                                                   uint32_t tile_b, int b_first_row) {
  constexpr int kChunks = kHeadDim / 8;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int b_row_in_step = (lane & 7) + (((lane >> 3) & 1) << 3);
  const int b_chunk_half = lane >> 4;
#pragma unroll
  for (int kk = 0; kk < kStepsK; ++kk) {
    const int b_row = b_first_row + kk * 16 + b_row_in_step;
#pragma unroll
    for (int dd = 0; dd < kHeadDim / 16; ++dd) {
      uint32_t b[4];
      const int b_chunk = dd * 2 + b_chunk_half;
      ldmatrix_x4_trans(b, tile_b + static_cast<uint32_t>((b_row * kChunks + (b_chunk ^ (b_row & 7))) * 16));
      mma_16816<kElement>(acc[2 * dd], a[kk], b[0], b[1]);
      mma_16816<kElement>(acc[2 * dd + 1], a[kk], b[2], b[3]);
    }
  }
}

//! acc += P * B with P in fp32 C-layout tiles (rounded to bf16 for the MMA).
template <int kHeadDim, int kStepsK, ElementType kElement>
__device__ __forceinline__ void gemm_regs_by_tile(float (&acc)[kHeadDim / 8][4], const float (&p)[2 * kStepsK][4],
                                                  uint32_t tile_b, int b_first_row) {
  uint32_t a[kStepsK][4];
  to_a_fragments<kStepsK, kElement>(a, p);
  gemm_frags_by_tile<kHeadDim, kStepsK, kElement>(acc, a, tile_b, b_first_row);
}

//! The K/V blocks one query tile visits (`kv_list`), streamed through a BlockRing: kStages K tiles
//! at s_k and kStages V tiles at s_v, each kStageBytes apart. Shared by the mma.sync forward and
//! dQ kernels.
template <int kBlockN, int kHeadDim, int kThreads, int kStages, int kStageBytes>
struct KvStream {
  const VisitList& kv_list;
  uint32_t s_k, s_v;
  const TensorRef& k;
  const TensorRef& v;
  int batch, kv_head, kv_len;

  __device__ __forceinline__ int operator()(int step) const { return kv_list.at(step); }  // block_at
  __device__ __forceinline__ void operator()(int, int kv_block, int stage) const {        // load
    const uint32_t offset = static_cast<uint32_t>(stage * kStageBytes);
    load_kv_tiles_async<kBlockN, kHeadDim, kThreads>(s_k + offset, s_v + offset, k, v, batch, kv_head,
                                                     kv_block * kBlockN, kv_len);
  }
  //! A step's scores: S = Q K^T of the warp's 16 rows (from first_row of the Q tile at s_q) and
  //! block `kv_block`'s K tile in `stage`, masked where the step is partial (step < num_partial) or
  //! the block ragged. Both kernels start their steps with it.
  template <ElementType kElement>
  __device__ __forceinline__ void scores(float (&s)[kBlockN / 8][4], uint32_t s_q, int first_row, int stage, int step,
                                         int num_partial, int kv_block, const QueryMask (&row_mask)[2],
                                         const MaskParams& mask) const {
    gemm_rows_by_rows<kHeadDim, kBlockN / 8, kElement>(s, s_q, first_row, s_k + static_cast<uint32_t>(stage * kStageBytes), 0);
    const int kv0 = kv_block * kBlockN;
    if (step < num_partial || kv0 + kBlockN > kv_len) mask_scores<kBlockN>(s, row_mask, mask, kv0);
  }
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocksPerSm)
    attention_fwd_kernel(const __grid_constant__ FwdParams p, const WorkItem* __restrict__ schedule) {
  constexpr int kHeadDim = Cfg::kHeadDim, kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN;
  constexpr int kThreads = Cfg::kThreads, kStages = Cfg::kStages;
  using QTile = SmemTile<kBlockM, kHeadDim>;   // Q (and dO) rows
  using KvTile = SmemTile<kBlockN, kHeadDim>;  // K (and V) rows

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s_q = smem_address(smem);
  const uint32_t s_k = s_q + QTile::kBytes;  // kStages K tiles, then kStages V tiles
  const uint32_t s_v = s_k + kStages * KvTile::kBytes;

  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  // Longest-first order: CTA i takes the i-th most expensive (q block, head pack, batch).
  const FwdWork work = fwd_work(p, schedule[blockIdx.x], kBlockM);
  const int q_block = work.q_block;
  const int batch = work.batch;
  const PackedRows rows = work.rows;
  const int kv_head = work.kv_head;
  const int q_len = p.shape.q_len;
  const int kv_len = p.shape.kv_len;

  load_tile_async<kBlockM, kHeadDim, kThreads>(s_q, p.q.data, [&](int row) -> const __nv_bfloat16* {
    const int q = rows.query(row);
    return q < q_len ? row_pointer(p.q, batch, rows.head(row), q) : nullptr;
  });
  cp_async_commit();

  const VisitList kv_list = kv_blocks_of(p.blocks, q_block);
  const int num_partial = kv_list.num_partial, num_blocks = kv_list.count;
  const KvStream<kBlockN, kHeadDim, kThreads, kStages, KvTile::kBytes> kv{kv_list, s_k, s_v, p.k, p.v, batch, kv_head, kv_len};
  BlockRing<kStages> ring;
  ring.start(num_blocks, kv, kv);

  // This thread's two rows of the C layout: warp rows g and g + 8.
  const int first_row = warp * 16;
  const int my_row[2] = {first_row + (lane >> 2), first_row + (lane >> 2) + 8};
  const QueryMask row_mask[2] = {query_mask(p.mask, rows.query(my_row[0])), query_mask(p.mask, rows.query(my_row[1]))};
  const float scale_log2 = p.scale * kLog2e;

  float acc_o[kHeadDim / 8][4] = {};
  float row_max[2] = {-INFINITY, -INFINITY};  // raw scores (unscaled)
  float row_sum[2] = {0.f, 0.f};              // this thread's columns only; quad-reduced at the end

  for (int step = 0; step < num_blocks; ++step) {
    const int fetched = ring.begin_step(step, num_blocks, kv, kv);
    const int stage = step % kStages;
    float s[kBlockN / 8][4] = {};
    kv.template scores<Cfg::kElement>(s, s_q, first_row, stage, step, num_partial, ring.current(), row_mask, p.mask);
    const uint32_t s_v_stage = s_v + static_cast<uint32_t>(stage * KvTile::kBytes);
    online_softmax<kBlockN, kHeadDim>(s, acc_o, row_max, row_sum, scale_log2);
    gemm_regs_by_tile<kHeadDim, kBlockN / 16, Cfg::kElement>(acc_o, s, s_v_stage, 0);
    ring.advance(fetched);
  }
  cp_async_wait<0>();
  __syncthreads();  // the Q tile (rows of every warp) has landed before warps overwrite their rows

  float inv_sum[2];
  finish_rows(p, rows, batch, my_row, row_max, row_sum, scale_log2, inv_sum);
  accumulator_to_smem<kHeadDim, Cfg::kElement>(s_q, first_row, acc_o, inv_sum[0], inv_sum[1]);
  store_warp_rows<kHeadDim>(s_q, first_row, [&](int row) -> __nv_bfloat16* {
    const int q = rows.query(row);
    return q < q_len ? const_cast<__nv_bfloat16*>(row_pointer(p.o, batch, rows.head(row), q)) : nullptr;
  });
}

}  // namespace harness::kernels::cuda::device
