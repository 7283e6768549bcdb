#pragma once
// The Hopper backward's dK/dV mainloop (device code only), one for both wgmma backwards; what they
// do about dQ is its template parameter kAtomicDq:
//   deterministic (bwd_wgmma_kernels.cuh): dQ is computed by separate q-block tiles of the same
//     launch, 4 GEMMs per step here;
//   atomic (bwd_wgmma_atomic_kernel.cuh, FlashAttention-3's structure): 5 GEMMs per step, the fifth
//     dQ = dS K, added in fp32 to a global accumulator by the kernel's reducer thread.
// A tile is 128 keys of one kv head (consumer c owns keys 64c..64c+63); K and V stay resident and
// the producer streams (Q, the rows' (lse2, delta) and mask rows, the keys' mask bits) and dO of
// every step = (head pack of the GQA group, listed q block) of 64 packed query rows. Per step, with
// the transposed formulation (keys are the M dimension, so P^T and dS^T come out of the MMA already
// as the A operand of the next one):
//   S^T = K Q^T (smem x smem), P^T = 2^(S^T scale log2e - lse2),
//   dV += P^T dO (P^T from registers), dP^T = V dO^T, dS^T = P^T (dP^T - delta),
//   dK += dS^T Q (dS^T from registers), and with kAtomicDq: dQ = dS K (dS^T stored to smem, read
//   M-major), its 64 x D fp32 tile handed to the reducer.
// GQA: the tile loops over every query head of its kv head's group (or, with split kv blocks, its
// share of the head packs), so dK and dV are sums in registers when it ends, stored once by TMA
// (or, split, added in fp32 to accumulators).

#include <cuda.h>

#include <cstdint>

#include "kernels/cuda/attention_params.h"
#include "kernels/cuda/hopper_utils.cuh"
#include "kernels/cuda/kernel_common.cuh"
#include "kernels/cuda/mask_bits.cuh"
#include "kernels/cuda/mask_device.cuh"
#include "kernels/cuda/tile_math.cuh"
#include "kernels/cuda/tiling.h"
#include "kernels/cuda/wgmma_ops.cuh"
#include "kernels/cuda/wgmma_tiles.cuh"

namespace harness::kernels::cuda::device {

//! Tensor maps of the backward (4-D: head dim, rows, heads, batch; 128-byte swizzle, boxes of 64
//! columns): the q-side maps exist twice because the dK/dV steps (64 rows) and the dQ tiles (128
//! rows) pack different boxes.
struct BwdTensorMaps {
  CUtensorMap q_dkdv, dout_dkdv;  //!< boxes of the dK/dV step's 64 packed rows
  CUtensorMap k_dkdv, v_dkdv;     //!< boxes of 128 keys (the dK/dV tile)
  CUtensorMap dk, dv;             //!< boxes of 64 keys (one consumer's rows)
  CUtensorMap q_dq, dout_dq;      //!< boxes of the dQ tile's 128 packed rows
  CUtensorMap k_dq, v_dq;         //!< boxes of the dQ step's kBlockN keys
  CUtensorMap dq;                 //!< boxes of one consumer's 64 rows
};

//! Barrier id of the two consumer warpgroups together (1 and 2 are each one's own).
constexpr int kConsumersBarrier = 3;

//! A dK/dV tile's steps: (head pack, q block) over `packs` head packs from head_base and the q
//! blocks its kv block lists (partial first).
struct DkdvSteps {
  VisitList q_list;
  int num_partial;
  int num_q_blocks;
  int num_steps;
  int heads_packed;
  int block_m;
  int head_base;
  int kv0;
  //! The first query head of step `step`'s pack.
  __device__ __forceinline__ int head0(int step) const { return head_base + (step / num_q_blocks) * heads_packed; }
};

//! The dK/dV tile (Layout: DkdvTileLayout) at the 1024-aligned shared memory `smem`; S^T = K Q^T
//! sums over the first kSumDim columns, dP^T = V dO^T over kSumDimV (HeadDims::kSumDim).
template <class Layout, ElementType kElement, bool kAtomicDq, int kSumDim, int kSumDimV>
struct BwdDkdvMainloop {
  static constexpr int kHeadDim = Layout::kHeadDim;    // q·k: K, Q, dK
  static constexpr int kHeadDimV = Layout::kHeadDimV;  // v: V, dO, dV
  static constexpr int kStages = Layout::kStages;
  static constexpr int kHalves = kHeadDim / 64;        // 64-column blocks of K, Q, dK
  static constexpr int kHalvesV = kHeadDimV / 64;      // and of V, dO, dV
  static constexpr int kKeys = Layout::kKeys;  // 128, or 64 with split columns
  static constexpr int kRows = Layout::kRows;  // 64 query rows per step
  //! Split columns (Layout::kSplitColumns, head dims above 128): both consumers take all 64 keys
  //! and consumer c keeps the 64-column blocks c, c + 2, ... of dK and of dV: kOwnedK and kOwnedV
  //! of them at most (consumer 0's count where the blocks are odd).
  static constexpr bool kSplitColumns = Layout::kSplitColumns;
  static constexpr int kOwnedK = (kHalves + 1) / 2;
  static constexpr int kOwnedV = (kHalvesV + 1) / 2;
  static_assert(!(kAtomicDq && (kSplitColumns || kHeadDim != kHeadDimV)), "the atomic backward: head dims up to 128, alike");

  // kAtomicDq: dS^T (bf16, keys x queries, 128-byte swizzled rows of 64 queries, two buffers) and a
  // step's dQ tile (kRows x kHeadDim fp32, chunk-swizzled: dq_column_offset) in the layout's extra
  // part; each consumer computes kDqColumns of dQ's columns per step.
  static constexpr int kDsBytes = kKeys * kRows * 2;
  static constexpr int kDqColumns = 64;

  uint32_t s_k, s_v, s_q, s_do, s_stats, s_masks, s_bits;
  uint32_t s_ds, s_dq;  //!< kAtomicDq only
  BwdBarriers<kStages> bar;

  __device__ __forceinline__ explicit BwdDkdvMainloop(uint32_t smem)
      : s_k(smem + Layout::kOffK), s_v(smem + Layout::kOffV), s_q(smem + Layout::kOffQ), s_do(smem + Layout::kOffDo),
        s_stats(smem + Layout::kOffStats), s_masks(smem + Layout::kOffMasks), s_bits(smem + Layout::kOffBits),
        s_ds(smem + Layout::kOffExtra), s_dq(smem + Layout::kOffExtra + 2 * kDsBytes), bar{smem + Layout::kOffBarriers} {}

  //! kAtomicDq: the dQ tile's barriers, after the stages': written (every consumer thread arrives) /
  //! read by the reduction (the reducer).
  __device__ __forceinline__ uint32_t dq_full() const { return bar.base + 8u * (1 + 3 * kStages); }
  __device__ __forceinline__ uint32_t dq_empty() const { return dq_full() + 8u; }
  //! One thread sets up the barriers: resident and "full" (the producer), "empty" (every consumer
  //! thread), and with kAtomicDq dQ's.
  __device__ __forceinline__ void init_barriers() const {
    for (int i = 0; i < 1 + 2 * kStages; ++i) mbarrier_init(bar.base + 8u * i, 1);
    for (int stage = 0; stage < kStages; ++stage) mbarrier_init(bar.empty(stage), 2 * 128);
    if constexpr (kAtomicDq) {
      mbarrier_init(dq_full(), 2 * 128);
      mbarrier_init(dq_empty(), 1);
    }
    fence_barrier_init();
  }

  //! The steps of kv block `kv_block` of `kv_head`: every head pack of the GQA group, or with
  //! `splits` > 1 share `split` of them (its dK/dV are partial sums then).
  static __device__ __forceinline__ DkdvSteps steps(const BwdParams& p, int kv_block, int kv_head, int split, int splits) {
    const BlockListParams& blocks = p.dkdv_blocks;
    const int block_m = blocks.block_m;
    const int heads_packed = kRows / block_m;
    const int group = p.shape.heads / p.shape.kv_heads;
    const VisitList q_list = q_blocks_of(blocks, kv_block);
    const int packs = group / heads_packed / splits;
    return {q_list,       q_list.num_partial, q_list.count,
            packs * q_list.count, heads_packed, block_m,
            kv_head * group + split * packs * heads_packed, kv_block * kKeys};
  }

  // ---- Producer: one thread issues every copy. ----------------------------------------------------

  __device__ __forceinline__ void load(const BwdParams& p, const BwdTensorMaps& maps, const BwdScratch& scratch,
                                       const DkdvSteps& t, int kv_block, int kv_head, int batch) const {
    mbarrier_arrive_expect_tx(bar.resident(), Layout::kKBytes + Layout::kVBytes);
#pragma unroll
    for (int half = 0; half < kHalves; ++half) {
      tma_load_4d(s_k + half * kKeys * 128, &maps.k_dkdv, bar.resident(), half * 64, t.kv0, kv_head, batch);
      if (half < kHalvesV) tma_load_4d(s_v + half * kKeys * 128, &maps.v_dkdv, bar.resident(), half * 64, t.kv0, kv_head, batch);
    }
    int q_block = t.q_list.at(0);
    for (int step = 0; step < t.num_steps; ++step) {
      const int next = step + 1 < t.num_steps ? t.q_list.at((step + 1) % t.num_q_blocks) : 0;
      const int stage = step % kStages;
      const int head0 = t.head0(step);
      const int q0 = q_block * t.block_m;
      mbarrier_wait(bar.empty(stage), ((step / kStages) & 1) ^ 1);
      const uint32_t q_stage = s_q + stage * Layout::kQBytes;
      const uint32_t do_stage = s_do + stage * Layout::kDoBytes;
      // First: Q, the rows' (lse2, delta) (block_m per head, contiguous) and the positions' mask
      // rows. A partial step within the table's slots also copies its keys' mask bits.
      const int slot = step % t.num_q_blocks;
      const bool bits = slot < t.num_partial && slot < tiling::kBwdMaskBitSlots;
      const int bits_bytes = kKeys * (t.block_m / 8);
      mbarrier_arrive_expect_tx(bar.first(stage), Layout::kQBytes + kRows * 8 + t.block_m * 32 + (bits ? bits_bytes : 0));
#pragma unroll
      for (int half = 0; half < kHalves; ++half) {
        tma_load_4d(q_stage + half * kRows * 128, &maps.q_dkdv, bar.first(stage), half * 64, q0, head0, batch);
      }
      for (int h = 0; h < t.heads_packed; ++h) {
        bulk_load(s_stats + stage * kRows * 8 + h * t.block_m * 8,
                  scratch.row_stats + (static_cast<int64_t>(batch) * p.shape.heads + head0 + h) * scratch.q_pad + q0,
                  t.block_m * 8, bar.first(stage));
      }
      bulk_load(s_masks + stage * kRows * 32, scratch.mask_rows + q0, t.block_m * 32, bar.first(stage));
      if (bits) {
        bulk_load(s_bits + stage * kKeys * 8,
                  scratch.key_bits + (static_cast<int64_t>(kv_block) * tiling::kBwdMaskBitSlots + slot) * bits_bytes,
                  bits_bytes, bar.first(stage));
      }
      // Second: dO.
      mbarrier_arrive_expect_tx(bar.second(stage), Layout::kDoBytes);
#pragma unroll
      for (int half = 0; half < kHalvesV; ++half) {
        tma_load_4d(do_stage + half * kRows * 128, &maps.dout_dkdv, bar.second(stage), half * 64, q0, head0, batch);
      }
      q_block = next;
    }
  }

  // ---- Consumers ------------------------------------------------------------------------------------

  //! A consumer thread's keys: its warp's 16 of the consumer's 64 (rows g and g + 8 of the
  //! accumulator layout for lane 4g + t), their documents, and the consumer's K and V rows (with
  //! split columns every consumer's 64 keys are the tile's).
  struct Thread {
    int consumer;
    int lane;
    int warp_in_group;
    int first_key;  //!< this warp's 16 keys within the tile's kKeys
    int my_kv[2];
    int32_t my_doc[2];
    float scale_log2;
    uint32_t k_rows, v_rows;
  };
  __device__ __forceinline__ Thread thread(const BwdParams& p, int consumer, int kv0) const {
    Thread th;
    th.consumer = consumer;
    th.lane = static_cast<int>(threadIdx.x) & 31;
    th.warp_in_group = (static_cast<int>(threadIdx.x) >> 5) & 3;
    th.first_key = (kSplitColumns ? 0 : consumer * 64) + th.warp_in_group * 16;
    th.my_kv[0] = kv0 + th.first_key + (th.lane >> 2);
    th.my_kv[1] = kv0 + th.first_key + (th.lane >> 2) + 8;
    th.my_doc[0] = key_doc(p.mask, th.my_kv[0]);
    th.my_doc[1] = key_doc(p.mask, th.my_kv[1]);
    th.scale_log2 = p.scale * kLog2e;
    th.k_rows = s_k + (kSplitColumns ? 0 : consumer * 64 * 128);
    th.v_rows = s_v + (kSplitColumns ? 0 : consumer * 64 * 128);
    return th;
  }

  __device__ __forceinline__ const float2* stats(int stage) const {
    return reinterpret_cast<const float2*>(__cvta_shared_to_generic(s_stats + stage * kRows * 8));
  }
  __device__ __forceinline__ const QueryMaskRow* masks(int stage) const {
    return reinterpret_cast<const QueryMaskRow*>(__cvta_shared_to_generic(s_masks + stage * kRows * 32));
  }

  //! S^T -> P^T (fp32, in place) of a step in slot `slot` of the q list: the mask where the step is
  //! partial (mask rows are per query position: column c, head c / block_m, reads position
  //! c % block_m), then the probabilities from the rows' lse2. dS^T takes P^T in fp32, dV its bf16 A
  //! fragments.
  __device__ __forceinline__ void probabilities(float (&st)[kRows / 8][4], const Thread& th, const DkdvSteps& t, int slot,
                                                int stage) const {
    if (slot < t.num_partial) {
      mask_partial_step_transposed<kRows>(st, slot, s_bits + stage * kKeys * 8, masks(stage), t.block_m, th.my_doc, th.my_kv,
                                          t.kv0);
    }
    probabilities_transposed<kRows>(st, stats(stage), th.scale_log2);
  }

  //! dP^T -> dS^T = P^T (dP^T - delta) (P^T in fp32) and its bf16 A fragments.
  __device__ __forceinline__ void score_gradients(float (&dpt)[kRows / 8][4], const float (&pt)[kRows / 8][4],
                                                  uint32_t (&dst)[kRows / 16][4], int stage) const {
    score_gradients_transposed<kRows>(dpt, pt, stats(stage));
    to_a_fragments<kRows / 16, kElement>(dst, dpt);
  }

  //! With split columns: a consumer's dK and dV blocks (block i is the head dim's 64-column block
  //! consumer + 2 i; consumer 1 has one fewer where the blocks are odd).
  using SplitDk = float[kOwnedK][8][4];
  using SplitDv = float[kOwnedV][8][4];
  //! The deterministic step loop: S^T (this consumer's keys x 64 query rows) and dP^T = V dO^T
  //! issued back to back (dP^T needs no P, so it runs while this consumer masks S^T and computes
  //! P^T), then dS^T from P^T in fp32, and dV and dK issued together behind it. (dV issued before
  //! dS^T, as the atomic loop does, keeps P^T's bf16 fragments and its fp32 values live at once: 16
  //! registers more, which at head dims 128-256 made ptxas spill and serialize the wgmma.) With split
  //! columns (SplitDk, SplitDv) both consumers compute S^T and dP^T over all 64 keys (the same
  //! products: the price of keeping half the accumulators) and dV and dK only for their own column
  //! blocks.
  template <class DkAccumulator, class DvAccumulator>
  __device__ __forceinline__ void run_deterministic(const Thread& th, const DkdvSteps& t, DkAccumulator& acc_dk,
                                                    DvAccumulator& acc_dv) const {
    static_assert(!kAtomicDq, "the deterministic step loop leaves dQ to the dQ tiles");
    mbarrier_wait(bar.resident(), 0);
    for (int step = 0; step < t.num_steps; ++step) {
      const int stage = step % kStages;
      const uint32_t parity = (step / kStages) & 1;
      const uint32_t q_stage = s_q + stage * Layout::kQBytes;
      const uint32_t do_stage = s_do + stage * Layout::kDoBytes;

      float st[kRows / 8][4];
      float dpt[kRows / 8][4];
      mbarrier_wait(bar.first(stage), parity);
      mbarrier_wait(bar.second(stage), parity);
      wgmma_fence();
      keys_times_rows<kSumDim, kKeys, kRows, kElement>(st, th.k_rows, q_stage);
      wgmma_commit();
      keys_times_rows<kSumDimV, kKeys, kRows, kElement>(dpt, th.v_rows, do_stage);
      wgmma_commit();
      wgmma_wait<1>();  // S^T is in; dP^T runs on
      fence_registers(st);
      probabilities(st, th, t, step % t.num_q_blocks, stage);
      wgmma_wait<0>();  // dP^T is in
      fence_registers(dpt);

      // dS^T = P^T (dP^T - delta), then dV += P^T dO and dK += dS^T Q.
      uint32_t pt[kRows / 16][4];
      uint32_t dst[kRows / 16][4];
      score_gradients(dpt, st, dst, stage);
      to_a_fragments<kRows / 16, kElement>(pt, st);
      fence_accumulator(acc_dv);
      fence_accumulator(acc_dk);
      wgmma_fence();
      fragments_times_columns<kHeadDimV, kRows, kElement>(acc_dv, pt, do_stage, th.consumer);
      fragments_times_columns<kHeadDim, kRows, kElement>(acc_dk, dst, q_stage, th.consumer);
      wgmma_commit();
      wgmma_wait<0>();
      fence_accumulator(acc_dv);
      fence_accumulator(acc_dk);
      mbarrier_arrive(bar.empty(stage));
    }
  }

  //! Epilogue with split columns: once both consumers are past their last product (they share K
  //! and V), each stores its blocks of dK (scaled) and dV through the blocks' own columns of K and V.
  __device__ __forceinline__ void store_split(const BwdParams& p, const BwdTensorMaps& maps, const Thread& th,
                                              const DkdvSteps& t, int kv_head, int batch, const SplitDk& acc_dk,
                                              const SplitDv& acc_dv) const {
    named_barrier_sync(kConsumersBarrier, 256);
    store_kept_blocks<kOwnedK, kElement>(acc_dk, p.scale, s_k, kKeys, kHalves, th.consumer, &maps.dk, t.kv0, kv_head, batch);
    store_kept_blocks<kOwnedV, kElement>(acc_dv, 1.f, s_v, kKeys, kHalvesV, th.consumer, &maps.dv, t.kv0, kv_head, batch);
  }

  //! The atomic step loop (kAtomicDq), 5 GEMMs. S^T of a step is issued at the end of the step
  //! before, behind that step's dK and dQ, so its latency and the dQ tile's store overlap them
  //! (FlashAttention-3 pipelines its forward this way). The wait for the next step's Q comes before
  //! that step's dK is issued: a wait loop between wgmma in flight makes ptxas serialize every wgmma
  //! of the kernel (C7520; see the forward's notes). dV and dP^T are issued together; dS^T goes to
  //! registers (dK's operand) and to shared memory, where dQ = dS K reads it M-major once both
  //! consumers have written theirs; the step's dQ tile then goes to the reducer.
  __device__ __forceinline__ void run_atomic(const Thread& th, const DkdvSteps& t, float (&acc_dk)[kHeadDim / 8][4],
                                             float (&acc_dv)[kHeadDimV / 8][4]) const {
    static_assert(kAtomicDq, "the atomic step loop hands dQ to a reducer");
    // Each product builds its operands' descriptors per k-slice here (kAdvance false): advancing
    // them, as the deterministic loop does, issues fewer instructions but ran this loop 1.04x slower
    // on causal at D 128 and 96 (H100, bench/selftest_ab.py; docs/BENCHMARKS.md).
    constexpr bool kAdvance = false;
    const int consumer = th.consumer, lane = th.lane;
    float st[kRows / 8][4];
    auto issue_scores = [&](uint32_t q_stage) {
      wgmma_fence();
      keys_times_rows<kSumDim, kKeys, kRows, kElement, kAdvance>(st, th.k_rows, q_stage);
      wgmma_commit();
    };
    mbarrier_wait(bar.resident(), 0);
    if (t.num_steps > 0) mbarrier_wait(bar.first(0), 0);
    issue_scores(s_q);
    // The step's q block slot (step % num_q_blocks) as a running counter: the integer division took
    // 3% of the causal backward's samples at the step's start (H200, Nsight Compute source
    // counters). The producer threads keep dividing: with a counter their 24 registers spilled,
    // and they run ahead.
    int slot = 0;
    for (int step = 0; step < t.num_steps; ++step, slot = slot + 1 == t.num_q_blocks ? 0 : slot + 1) {
      const int stage = step % kStages;
      const uint32_t parity = (step / kStages) & 1;
      const uint32_t q_stage = s_q + stage * Layout::kQBytes;
      const uint32_t do_stage = s_do + stage * Layout::kDoBytes;

      // S^T: this consumer's 64 keys x 64 query rows (issued by the step before).
      wgmma_wait<0>();
      fence_registers(st);
      probabilities(st, th, t, slot, stage);
      uint32_t pt[kRows / 16][4];
      to_a_fragments<kRows / 16, kElement>(pt, st);

      // dV += P^T dO and dP^T = V dO^T, issued together.
      float dpt[kRows / 8][4];
      mbarrier_wait(bar.second(stage), parity);
      fence_registers(acc_dv);
      wgmma_fence();
      fragments_times_rows<kHeadDimV, kRows, kElement, kAdvance>(acc_dv, pt, do_stage);
      keys_times_rows<kSumDimV, kKeys, kRows, kElement, kAdvance>(dpt, th.v_rows, do_stage);
      wgmma_commit();
      wgmma_wait<0>();
      fence_registers(acc_dv);
      fence_registers(dpt);

      // dS^T = P^T (dP^T - delta) as bf16 A fragments; also into shared memory for dQ = dS K.
      uint32_t dst[kRows / 16][4];
      score_gradients(dpt, st, dst, stage);
      // The consumers meet once per step, so dS^T alternates between two buffers (the other
      // consumer may still read last step's while this one writes).
      const uint32_t ds_tile = s_ds + (step & 1) * kDsBytes;
      {
        // A fragment kk: registers 0/1 hold rows g / g+8 at columns 16kk + 2t, registers 2/3 the
        // same rows at columns 16kk + 8 + 2t. The tile is kKeys rows of 64 queries (128 bytes),
        // swizzled.
        const int row = th.first_key + (lane >> 2);
        const int col = (lane & 3) * 2;
#pragma unroll
        for (int kk = 0; kk < kRows / 16; ++kk) {
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const int key = row + (r & 1) * 8;
            const int query = kk * 16 + (r >> 1) * 8 + col;
            asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(ds_tile + swizzled_offset(kKeys, key, query)), "r"(dst[kk][r])
                         : "memory");
          }
        }
      }
      fence_async_shared();
      // The next step's Q, waited for while nothing is in flight. After the last step S^T is
      // issued anyway, on a stage no copy writes any more, and its result is dropped: a wgmma on a
      // conditional path would serialize them all.
      const int next_stage = (step + 1) % kStages;
      if (step + 1 < t.num_steps) mbarrier_wait(bar.first(next_stage), ((step + 1) / kStages) & 1);
      // dK += dS^T Q, issued now; it runs while the consumers meet below.
      fence_registers(acc_dk);
      wgmma_fence();
      fragments_times_rows<kHeadDim, kRows, kElement, kAdvance>(acc_dk, dst, q_stage);
      wgmma_commit();
      named_barrier_sync(kConsumersBarrier, 256);  // dS^T of all 128 keys is in s_ds

      // dQ (64 rows x 64 columns per consumer) = dS (A: s_ds read M-major) x K (B: N-major). At
      // D = 128 consumer c computes columns 64c..; at D = 64 the consumers take turns by step.
      const bool does_dq = kHalves == 2 || (step & 1) == consumer;
      const int dq_col0 = kHalves == 2 ? consumer * 64 : 0;
      float acc_dq[kDqColumns / 8][4];
      if (does_dq) {
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kKeys / 16; ++kk) {
          wgmma_ss_mn<kDqColumns, kElement>(acc_dq, smem_descriptor(ds_tile + kk * 16 * 128, kRows * 128, 1024),
                                  smem_descriptor(s_k + (dq_col0 / 64) * kKeys * 128 + kk * 16 * 128, kKeys * 128, 1024),
                                  kk > 0);
        }
        wgmma_commit();
      }
      issue_scores(s_q + next_stage * Layout::kQBytes);
      wgmma_wait<1>();  // dK and dQ are done; the next S^T runs on
      fence_registers(acc_dk);
      if (does_dq) fence_registers(acc_dq);
      mbarrier_arrive(bar.empty(stage));  // Q and dO of this stage are no longer read
      mbarrier_wait(dq_empty(), (step & 1) ^ 1);  // the reducer has read the last tile
      if (does_dq) {
        store_f32_rows<kHeadDim, kDqColumns>(s_dq, acc_dq, th.warp_in_group * 16 + (lane >> 2), dq_col0, lane);
        fence_async_shared();
      }
      mbarrier_arrive(dq_full());
    }
    wgmma_wait<0>();  // the S^T issued after the last step (dropped)
    fence_registers(st);
    named_barrier_sync(kConsumersBarrier, 256);  // the other consumer's last dQ product no longer reads K
  }

  //! kAtomicDq's reducer thread: adds each step's dQ tile to the fp32 accumulator [B, H, q_pad, D],
  //! one bulk reduce-add per packed head.
  __device__ __forceinline__ void reduce_dq(const BwdParams& p, const BwdScratch& scratch, const DkdvSteps& t,
                                            int batch) const {
    for (int step = 0; step < t.num_steps; ++step) {
      // Where the tile goes is worked out (a division and a list load) before the wait, so the
      // adds issue as soon as the consumers have written the tile.
      const int head0 = t.head0(step);
      const int q0 = t.q_list.at(step % t.num_q_blocks) * t.block_m;
      mbarrier_wait(dq_full(), step & 1);
      for (int h = 0; h < t.heads_packed; ++h) {
        float* dst =
            scratch.dq_accum + ((static_cast<int64_t>(batch) * p.shape.heads + head0 + h) * scratch.q_pad + q0) * kHeadDim;
        bulk_reduce_add_f32(dst, s_dq + h * t.block_m * kHeadDim * 4, t.block_m * kHeadDim * 4);
      }
      tma_store_commit();
      bulk_wait_read();
      mbarrier_arrive(dq_empty());
    }
    bulk_wait_all();
  }

  //! A split kv block's end (kAtomicDq): adds this CTA's partial dK and dV (fp32, unscaled) to the
  //! accumulators, one after the other through a 64-row fp32 tile in the consumer's own Q (or dO)
  //! stages, which no copy or product reads any more; the conversion kernel scales and writes bf16.
  __device__ __forceinline__ void add_partial(const BwdParams& p, const BwdScratch& scratch, const Thread& th,
                                              const DkdvSteps& t, int kv_head, int batch,
                                              const float (&acc_dk)[kHeadDim / 8][4],
                                              const float (&acc_dv)[kHeadDimV / 8][4]) const {
    static_assert(kStages * Layout::kQBytes == 64 * kHeadDim * 4, "one consumer's fp32 rows fill its stages");
    if (t.num_steps == 0) return;  // nothing to add
    const int consumer = th.consumer;
    const uint32_t tile = consumer == 0 ? s_q : s_do;
    const int64_t accum_row =
        (static_cast<int64_t>(batch) * p.shape.kv_heads + kv_head) * scratch.kv_pad + t.kv0 + consumer * 64;
    auto add_rows = [&](const float (&acc)[kHeadDim / 8][4], float* accum) {
      store_f32_rows<kHeadDim, kHeadDim>(tile, acc, th.warp_in_group * 16 + (th.lane >> 2), 0, th.lane);
      fence_async_shared();
      named_barrier_sync(1 + consumer, 128);
      if (threadIdx.x % 128 == 0) {
        bulk_reduce_add_f32(accum + accum_row * kHeadDim, tile, 64 * kHeadDim * 4);
        tma_store_commit();
        bulk_wait_read();
      }
      named_barrier_sync(1 + consumer, 128);  // the tile may be written again
    };
    add_rows(acc_dk, scratch.dkdv_accum);
    add_rows(acc_dv, dv_accumulator(p, scratch, kHeadDim));
    if (threadIdx.x % 128 == 0) bulk_wait_all();
  }

  //! Epilogue of a whole kv block: this consumer's 64 keys of dK (scaled) and dV, through its own
  //! rows of K and V.
  __device__ __forceinline__ void store(const BwdParams& p, const BwdTensorMaps& maps, const Thread& th, const DkdvSteps& t,
                                        int kv_head, int batch, const float (&acc_dk)[kHeadDim / 8][4],
                                        const float (&acc_dv)[kHeadDimV / 8][4]) const {
    const int consumer = th.consumer;
    named_barrier_sync(1 + consumer, 128);
    store_consumer_rows<kHeadDim, kElement>(acc_dk, p.scale, s_k, kKeys, consumer * 64, consumer, &maps.dk, t.kv0 + consumer * 64,
                                  kv_head, batch);
    store_consumer_rows<kHeadDimV, kElement>(acc_dv, 1.f, s_v, kKeys, consumer * 64, consumer, &maps.dv, t.kv0 + consumer * 64, kv_head,
                                  batch);
  }
};

}  // namespace harness::kernels::cuda::device
