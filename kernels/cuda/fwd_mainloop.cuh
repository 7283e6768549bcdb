#pragma once
// The Hopper forward's mainloop (device code only), the piece FlashAttention-3 calls its collective
// mainloop: where a CTA's tiles and barriers sit in shared memory, what the producer thread loads
// for one work item, and what a consumer warpgroup computes for it.
//   producer (load): the item's Q, then K and V of each listed kv block into a kStages-deep ring
//             that runs on across items; "full" barriers count the bytes in, "empty" barriers count
//             the consumer warps out before a stage is refilled. K and V are released apart
//             (FlashAttention-3's two pipelines): K once S is in, V once P V is, so the overlapped
//             schedule, which holds V one step longer than K, refills K a step earlier.
//   consumer (FwdConsumerItem): S = Q K^T (wgmma, both operands in shared memory), mask (partial
//             blocks and the ragged last block only), online softmax in registers, then O += P V
//             with P as the register A operand (the accumulator layout of S is the A fragment
//             layout of P, so P never touches shared memory); in order (sequential), or in
//             FlashAttention-3's overlapped schedule (P V of step j - 1 issued with S of step j;
//             with two consumers they take turns to issue: ping-pong).
// The epilogue (O and the LSE out) is fwd_epilogue.cuh's, the work items tile_scheduler.cuh's, the
// kernel that puts them together fwd_wgmma_kernel.cuh's.

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/attention_params.h"
#include "kernels/cuda/hopper_utils.cuh"
#include "kernels/cuda/kernel_common.cuh"
#include "kernels/cuda/mask_bits.cuh"
#include "kernels/cuda/mask_device.cuh"
#include "kernels/cuda/tile_math.cuh"
#include "kernels/cuda/tile_scheduler.cuh"
#include "kernels/cuda/wgmma_ops.cuh"

namespace harness::kernels::cuda::device {

//! The tensor maps of the forward (4-D: head dim, rows, heads, batch; 128-byte swizzle, boxes of
//! 64 columns): q and o with boxes of the packed rows, k and v with boxes of kBlockN rows.
struct FwdTensorMaps {
  CUtensorMap q;
  CUtensorMap k;
  CUtensorMap v;
  CUtensorMap o;
};

//! Where a forward CTA's tiles and barriers sit in shared memory. TMA's 128-byte swizzle and the
//! wgmma descriptors (base offset 0) need 1024-byte aligned tiles. own_o (FwdWgmmaConfig::kOwnO,
//! persistent CTAs): Q in two buffers, work item `tile` in buffer tile % 2, and O in a tile of its
//! own; else one Q buffer, in which O is staged. Then the barriers: Q full and empty (one pair per
//! Q buffer); work item full, empty; K, V full per stage; K, V empty per stage; then the 16-byte
//! work item slot.
template <class Cfg>
struct FwdSharedStorage {
  static constexpr int kStages = Cfg::kStages;
  bool own_o;
  uint32_t s_q0, s_k, s_v, s_o0, bars;

  __device__ __forceinline__ FwdSharedStorage(const unsigned char* smem_raw, bool own_o_) : own_o(own_o_) {
    s_q0 = (smem_address(smem_raw) + 1023u) & ~1023u;
    s_k = s_q0 + q_buffers() * Cfg::kQBytes;
    s_v = s_k + kStages * Cfg::kKBytes;
    s_o0 = own_o ? s_v + kStages * Cfg::kVBytes : s_q0;
    bars = s_v + kStages * Cfg::kVBytes + (own_o ? Cfg::kOBytes : 0);
  }
  __device__ __forceinline__ int q_buffers() const { return own_o ? 2 : 1; }
  //! A work item's Q buffer, and how many items used that buffer before it (its barriers' phase).
  __device__ __forceinline__ int q_buffer(int tile) const { return own_o ? tile & 1 : 0; }
  __device__ __forceinline__ int q_use(int tile) const { return own_o ? tile >> 1 : tile; }
  __device__ __forceinline__ uint32_t s_q(int tile) const { return s_q0 + q_buffer(tile) * Cfg::kQBytes; }
  //! Where a work item's O is staged for its store: a tile of its own, or the item's Q rows.
  __device__ __forceinline__ uint32_t s_o(int tile) const { return own_o ? s_o0 : s_q(tile); }
  __device__ __forceinline__ uint32_t q_full(int tile) const { return bars + 8u * q_buffer(tile); }
  __device__ __forceinline__ uint32_t q_empty(int tile) const { return bars + 16u + 8u * q_buffer(tile); }
  __device__ __forceinline__ uint32_t k_full(int stage) const { return bars + 8u * (6 + stage); }
  __device__ __forceinline__ uint32_t v_full(int stage) const { return bars + 8u * (6 + kStages + stage); }
  __device__ __forceinline__ uint32_t k_empty(int stage) const { return bars + 8u * (6 + 2 * kStages + stage); }
  __device__ __forceinline__ uint32_t v_empty(int stage) const { return bars + 8u * (6 + 3 * kStages + stage); }
  __device__ __forceinline__ WorkItemHandoff item_handoff() const {
    return WorkItemHandoff{bars + 8u * (6 + 4 * kStages), bars + 32u, bars + 40u};
  }

  //! One thread sets up every barrier.
  __device__ __forceinline__ void init_barriers() const {
    for (int tile = 0; tile < q_buffers(); ++tile) {
      mbarrier_init(q_full(tile), 1);
      // Q (or, staged there, O) no longer read: every consumer warp, or each consumer's storing thread.
      mbarrier_init(q_empty(tile), own_o ? Cfg::kConsumers * 4 : Cfg::kConsumers);
    }
    const WorkItemHandoff handoff = item_handoff();
    mbarrier_init(handoff.full, 1);
    mbarrier_init(handoff.empty, Cfg::kConsumers * 4);
    for (int stage = 0; stage < kStages; ++stage) {
      mbarrier_init(k_full(stage), 1);
      mbarrier_init(v_full(stage), 1);
      // The consumers release a stage with one arrival per warp (lane 0, once the warp's wait for
      // the product that read it is done): 4 arrivals per warpgroup instead of 128.
      mbarrier_init(k_empty(stage), Cfg::kConsumers * 4);
      mbarrier_init(v_empty(stage), Cfg::kConsumers * 4);
    }
    fence_barrier_init();
  }
};

//! The K/V ring's position. It runs on across a CTA's work items: `uses` counts the uses before the
//! current item, so step j of the item is use uses + j. The producer and every consumer thread keep
//! their own copy and advance it by the same steps.
template <int kStages>
struct KvRing {
  uint32_t uses = 0;
  __device__ __forceinline__ int stage(int step) const { return static_cast<int>((uses + step) % kStages); }
  __device__ __forceinline__ uint32_t phase(int step) const { return ((uses + step) / kStages) & 1u; }
  __device__ __forceinline__ void advance(int steps) { uses += steps; }
};

//! A consumer thread's place in the tile: its warpgroup (consumer), lane, and its two rows of the
//! m64nNk16 accumulator layout (its warp's 16 rows from first_row; rows g and g + 8 for lane 4g + t).
struct FwdConsumerThread {
  int consumer;
  int lane;
  int my_row[2];
  bool storer;  //!< issues this warpgroup's O stores
  __device__ __forceinline__ explicit FwdConsumerThread(int consumer_) : consumer(consumer_) {
    lane = static_cast<int>(threadIdx.x) & 31;
    const int first_row = consumer * 64 + ((static_cast<int>(threadIdx.x) >> 5) & 3) * 16;  // this warp's 16 rows
    my_row[0] = first_row + (lane >> 2);
    my_row[1] = first_row + (lane >> 2) + 8;
    storer = (threadIdx.x & 127) == 0;
  }
};

//! The producer thread's loads of one work item: Q, and K and V of each of the item's kv blocks.
//! Q first on a CTA's first item (nothing to wait for) and with two Q buffers (the one of the item
//! before last, whose products are done: the producer is an item ahead of the consumers at most);
//! with one, after the item's first K and V, which need only a free ring stage, where Q needs the
//! previous item's O store to be done with the Q tile.
template <class Cfg>
__device__ __forceinline__ void fwd_load_item(const FwdTensorMaps& maps, const FwdSharedStorage<Cfg>& smem,
                                              const KvRing<Cfg::kStages>& ring, int tile, const FwdWork& work,
                                              const VisitList& kv_list) {
  constexpr int kBlockM = Cfg::kBlockM;
  constexpr int kBlockN = Cfg::kBlockN;
  const int num_blocks = kv_list.count;
  auto load_q = [&] {
    if (smem.q_use(tile) > 0) mbarrier_wait(smem.q_empty(tile), (smem.q_use(tile) - 1) & 1);
    mbarrier_arrive_expect_tx(smem.q_full(tile), Cfg::kQBytes);
#pragma unroll
    for (int half = 0; half < Cfg::kHeadDim / 64; ++half) {
      tma_load_4d(smem.s_q(tile) + half * kBlockM * 128, &maps.q, smem.q_full(tile), half * 64, work.rows.q0,
                  work.rows.head0, work.batch);
    }
  };
  const bool q_first = num_blocks == 0 || tile == 0 || smem.own_o;
  if (q_first) load_q();
  int kv_block = kv_list.at(0);
  for (int step = 0; step < num_blocks; ++step) {
    const int next = kv_list.at(step + 1);  // read one step ahead: its latency hides behind the wait
    const int stage = ring.stage(step);
    const uint32_t empty_parity = ring.phase(step) ^ 1;
    // K, then V, each into its stage once the consumers have released it: kColumns wide (q·k or v
    // head dim), as 64-column blocks kBlockN rows apart.
    auto load_stage = [&](auto columns, uint32_t tile_address, const CUtensorMap* map, uint32_t full, uint32_t empty) {
      constexpr int kColumns = decltype(columns)::value;
      mbarrier_wait(empty, empty_parity);
      mbarrier_arrive_expect_tx(full, kBlockN * kColumns * 2);
#pragma unroll
      for (int half = 0; half < kColumns / 64; ++half) {
        tma_load_4d(tile_address + half * kBlockN * 128, map, full, half * 64, kv_block * kBlockN, work.kv_head, work.batch);
      }
    };
    load_stage(std::integral_constant<int, Cfg::kHeadDim>{}, smem.s_k + stage * Cfg::kKBytes, &maps.k, smem.k_full(stage),
               smem.k_empty(stage));
    load_stage(std::integral_constant<int, Cfg::kHeadDimV>{}, smem.s_v + stage * Cfg::kVBytes, &maps.v, smem.v_full(stage),
               smem.v_empty(stage));
    if (step == 0 && !q_first) load_q();
    kv_block = next;
  }
}

//! A consumer warpgroup's products for one work item: O (unnormalized), each row's max (raw
//! scores) and sum (this thread's columns only; quad-reduced by the epilogue), for the item's Q in
//! its buffer and its kv list's K and V in the ring.
template <class Cfg>
struct FwdConsumerItem {
  static constexpr int kHeadDim = Cfg::kHeadDim;
  static constexpr int kOutDimV = Cfg::kOutDimV;  //!< O's columns computed (acc_o)
  static constexpr ElementType kElement = Cfg::kElement;
  static constexpr int kBlockM = Cfg::kBlockM;
  static constexpr int kBlockN = Cfg::kBlockN;
  static constexpr int kStages = Cfg::kStages;
  using STile = float[kBlockN / 8][4];
  using PFragments = uint32_t[kBlockN / 16][4];
  //! The rows' mask predicates: per item in the sequential kernels and the ping-pongs; in the
  //! one-consumer overlapped kernel only where a step evaluates its mask (past the bit table), so
  //! an item's start does not wait for their loads (dflash: the anchor, then its document; H200,
  //! Nsight Compute: one consumer, dflash-512 311 -> 306 us, the 8k masks -1%; the ping-pong on
  //! causal-128 457 -> 461 us, slower, so it keeps the per-item predicates).
  static constexpr bool kLazyRowMask = Cfg::kOverlap && Cfg::kConsumers == 1;

  const FwdParams& p;
  const FwdSharedStorage<Cfg>& smem;
  const KvRing<kStages>& ring;
  const FwdConsumerThread& thread;
  const uint64_t* mask_bits;  //!< the partial blocks' bit table (mask_bits.cuh), for the overlapped schedule
  const FwdWork& work;
  const VisitList kv_list;
  const int num_partial, num_blocks;
  const float scale_log2;
  const int kv_len;
  float (&acc_o)[kOutDimV / 8][4];
  float (&row_max)[2];
  float (&row_sum)[2];
  QueryMask item_mask[2];  //!< (not computed where kLazyRowMask)
  uint64_t desc_q0, desc_k0, desc_v0;

  __device__ __forceinline__ FwdConsumerItem(const FwdParams& p_, const FwdSharedStorage<Cfg>& smem_,
                                             const KvRing<kStages>& ring_, const FwdConsumerThread& thread_,
                                             const uint64_t* mask_bits_, const FwdWork& work_, int num_partial_,
                                             int num_blocks_, float (&acc_o_)[kOutDimV / 8][4], float (&row_max_)[2],
                                             float (&row_sum_)[2])
      : p(p_), smem(smem_), ring(ring_), thread(thread_), mask_bits(mask_bits_), work(work_),
        kv_list(kv_blocks_of(p_.blocks, work_.q_block, num_partial_, num_blocks_)),  // counts from the producer
        num_partial(num_partial_), num_blocks(num_blocks_), scale_log2(p_.scale * kLog2e), kv_len(p_.shape.kv_len),
        acc_o(acc_o_), row_max(row_max_), row_sum(row_sum_) {
    rows_mask(item_mask);
  }

  __device__ __forceinline__ void rows_mask(QueryMask (&row_mask)[2]) const {
#pragma unroll
    for (int i = 0; i < 2; ++i) row_mask[i] = query_mask(p.mask, work.rows.query(thread.my_row[i]));
  }

  //! The products' operand descriptors, built once and advanced by constant offsets (per k-slice and
  //! stage) where each wgmma reads them: Q's rows (K-major, 64-column blocks kBlockM rows apart),
  //! the K ring (the same per stage) and the V ring (N-major: kBlockN * 128 bytes between blocks).
  //! Then waits for the item's Q.
  __device__ __forceinline__ void start(int tile) {
    const uint32_t q_rows = smem.s_q(tile) + thread.consumer * 64 * 128;
    desc_q0 = smem_descriptor(q_rows, 16, 1024);
    desc_k0 = smem_descriptor(smem.s_k, 16, 1024);
    desc_v0 = smem_descriptor(smem.s_v, kBlockN * 128, 1024);
    mbarrier_wait(smem.q_full(tile), smem.q_use(tile) & 1);
  }

  // A step's two products, issued and committed; they wait for nothing (the caller waits for the
  // tiles first, so no wait loop sits between two in-flight products). S = Q K^T: 16 columns (32
  // bytes) per k-slice within a 64-column block, over Cfg::kSumDim columns (the zero columns past
  // it are not multiplied). O += P V: V is [kBlockN keys x Dv] with Dv contiguous, 16 keys per
  // k-slice.
  __device__ __forceinline__ void issue_s(STile& s, int step) const {
    const uint64_t k_desc = smem_descriptor_advance(desc_k0, ring.stage(step) * Cfg::kKBytes);
#pragma unroll
    for (int kk = 0; kk < Cfg::kSumDim / 16; ++kk) {
      const uint32_t slice = (kk % 4) * 32;
      wgmma_ss<kBlockN, false, kElement>(s, smem_descriptor_advance(desc_q0, (kk / 4) * kBlockM * 128 + slice),
                                         smem_descriptor_advance(k_desc, (kk / 4) * kBlockN * 128 + slice), kk > 0);
    }
    wgmma_commit();
  }
  __device__ __forceinline__ void issue_pv(const PFragments& p_frag, int step) const {
    const uint64_t v_desc = smem_descriptor_advance(desc_v0, ring.stage(step) * Cfg::kVBytes);
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      wgmma_rs<kOutDimV, true, kElement>(acc_o, p_frag[kk], smem_descriptor_advance(v_desc, kk * 16 * 128), true);
    }
    wgmma_commit();
  }

  //! One step after another: S, its wait, mask and softmax (O rescaled at once, lazily), P V and its
  //! wait.
  __device__ __forceinline__ void run_sequential() {
    const QueryMask(&row_mask)[2] = item_mask;
    int kv_block = kv_list.at(0);
    for (int step = 0; step < num_blocks; ++step) {
      const int next = kv_list.at(step + 1);
      const int stage = ring.stage(step);
      const uint32_t parity = ring.phase(step);

      float s[kBlockN / 8][4];
      mbarrier_wait(smem.k_full(stage), parity);
      wgmma_fence();
      issue_s(s, step);
      wgmma_wait<0>();
      fence_registers(s);
      mbarrier_arrive_if(smem.k_empty(stage), thread.lane == 0);  // this warp is done with K of the stage

      const int kv0 = kv_block * kBlockN;
      if (step < num_partial || kv0 + kBlockN > kv_len) mask_scores<kBlockN>(s, row_mask, p.mask, kv0);
      online_softmax_lazy<kBlockN, kOutDimV>(s, acc_o, row_max, row_sum, scale_log2);
      PFragments p_frag;
      to_a_fragments<kBlockN / 16, kElement>(p_frag, s);

      mbarrier_wait(smem.v_full(stage), parity);
      fence_registers(acc_o);
      wgmma_fence();
      issue_pv(p_frag, step);
      wgmma_wait<0>();
      fence_registers(acc_o);
      mbarrier_arrive_if(smem.v_empty(stage), thread.lane == 0);  // and with V
      kv_block = next;
    }
  }

  //! FlashAttention-3's schedule. Step j issues S_j = Q K_j^T together with O += P_{j-1} V_{j-1}
  //! (so the tensor cores have the next product while this warpgroup does softmax). With two
  //! consumers (ping-pong) they also take turns to issue: consumer c waits on named barrier
  //! kTurn + c, which the other arrives at once it has issued its own products; consumer 1 grants
  //! the first turn. With n steps each consumer takes n + 1 turns (S_0; S_j + PV_{j-1}; PV_{n-1})
  //! and grants as many, except that consumer 1 skips its last grant (consumer 0 has no turn
  //! left) having granted the first: every wait pairs with one arrival, and an arrival can run at
  //! most one ahead. One consumer (wgmma_m64_n64_overlap) overlaps only with itself, and with the
  //! other CTA on its SM. The first and last turns are peeled so that every wgmma of the loop is
  //! issued unconditionally (ptxas serializes wgmma issued on divergent paths).
  __device__ __forceinline__ void run_overlapped() {
    constexpr bool kTakeTurns = Cfg::kConsumers == 2;
    constexpr int kTurn = 4;  // ids 4 and 5 (1 and 2 are the epilogue's)
    const int consumer = thread.consumer, lane = thread.lane;
    const int other = 1 - consumer;
    auto await_turn = [&] {
      if constexpr (kTakeTurns) named_barrier_sync(kTurn + consumer, 256);
    };
    auto grant_turn = [&] {
      if constexpr (kTakeTurns) named_barrier_arrive(kTurn + other, 256);
    };
    PFragments p_frag;  // P of the previous step
    auto wait_k = [&](int step) { mbarrier_wait(smem.k_full(ring.stage(step)), ring.phase(step)); };
    auto wait_v = [&](int step) { mbarrier_wait(smem.v_full(ring.stage(step)), ring.phase(step)); };
    // S is each turn's own array (nothing of it carries over to the next turn; the SASS is the
    // same as with one array for all turns).
    // The mask of a step as one bit per score of this thread, computed before the turn's products
    // are issued (it does not depend on S): between the two waits below the code must be free of
    // branches, or ptxas puts the wait for P V at the branch and the softmax no longer overlaps it.
    // The first partial blocks' bits come from the table (mask_bits.cuh: two 8-byte loads per
    // 64 keys, a few shifts), the rest are evaluated here (a generic mask's from its own bits, in
    // the table's form: keep_bits_from_bitmap).
    static_assert(kBlockN / 2 <= 64, "one bit per score of this thread");
    constexpr int kWords = kBlockN / 64;
    const int slot_words = p.blocks.block_m * kWords;
    const uint64_t* table_row[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      table_row[i] = mask_bits + (static_cast<int64_t>(work.q_block) * tiling::kMaskBitSlots * p.blocks.block_m +
                                  (thread.my_row[i] & (p.blocks.block_m - 1))) * kWords;
    }
    auto keep_bits = [&](int step) {
      if (step < num_partial && step < tiling::kMaskBitSlots) {
        return keep_bits_from_table<kBlockN>(table_row[0] + step * slot_words, table_row[1] + step * slot_words);
      }
      const int kv0 = kv_list.at(step) * kBlockN;
      uint64_t keep = ~uint64_t{0};
      if (step < num_partial || kv0 + kBlockN > kv_len) {
        keep = 0;
        QueryMask row_mask[2];
        if constexpr (kLazyRowMask) {
          rows_mask(row_mask);
        } else {
          row_mask[0] = item_mask[0];
          row_mask[1] = item_mask[1];
        }
        if (p.mask.kind == MaskCode::blockmask) return keep_bits_from_bitmap<kBlockN>(row_mask, p.mask.bit_words, kv0);
        int32_t docs[kBlockN / 8][2];
        load_key_docs<kBlockN>(docs, p.mask, kv0);
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (visible(row_mask[e >> 1], docs[j][e & 1], kv0 + tile_column(j, e))) keep |= uint64_t{1} << keep_bit(j, e);
          }
        }
      }
      return keep;
    };
    auto apply_keep = [&](STile& s, uint64_t keep) { apply_keep_bits<kBlockN>(s, keep); };
    // Turn `step` (1 <= step < n): S_step and P V of step - 1, in FlashAttention-3's order. The
    // softmax's rescale of O is lazy (online_softmax_scores_lazy): O takes the factor once P V is
    // in, at the end of the turn, and only when a row's max moved, in a warp-uniform branch while
    // nothing is in flight (an unconditional rescale between the two issues cost kOutDimV / 2 FMUL
    // per thread and turn, and right after the wait for P V ptxas scheduled that wait into the
    // middle of the softmax, so it comes after P's packing). kMasked: the step may need its mask
    // (a partial block, or the ragged last one); the unmasked turns skip even the selects.
    auto turn = [&](int step, auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
      uint64_t keep = ~uint64_t{0};
      if constexpr (kMasked) keep = keep_bits(step);
      float s[kBlockN / 8][4];
      await_turn();
      wait_k(step);
      // V_{step-1}: this thread waited for it in the turn before (turn 0 waits for V_0), except in
      // a 2-stage ping-pong, whose turns wait for the V before theirs (below).
      if constexpr (kTakeTurns && kStages == 2) wait_v(step - 1);
      wgmma_fence();
      issue_s(s, step);
      issue_pv(p_frag, step - 1);
      grant_turn();
      wgmma_wait<1>();  // S is in; P V still runs while this warpgroup does the softmax
      fence_registers(s);
      mbarrier_arrive_if(smem.k_empty(ring.stage(step)), lane == 0);  // this warp is done with K_step
      if constexpr (kMasked) apply_keep(s, keep);
      float corr[2];
      const bool rescale = online_softmax_scores_lazy<kBlockN>(s, row_max, row_sum, scale_log2, corr);
      fence_registers(s);
      // ptxas hoists a wgmma wait to the top of its basic block (here: above the softmax, which
      // then no longer overlaps P V). A wait loop ends the block here: the one for this step's V
      // (its copy was issued once V_{step-2} was released, a turn ago; the next turn needs it).
      // Waiting for K_{step+1} instead deadlocks when K and V are released together: with two
      // stages its copy needs the release just below. A 2-stage ping-pong waits for V_{step-1}
      // instead, complete since the turn began: there V_step's copy needs the other consumer to
      // release V_{step-2} at the end of its turn, which may still be in its softmax, and this wait
      // would expose that and the copy.
      if constexpr (kTakeTurns && kStages == 2) {
        wait_v(step - 1);
      } else {
        wait_v(step);
      }
      wgmma_wait<0>();
      fence_registers(acc_o);
      mbarrier_arrive_if(smem.v_empty(ring.stage(step - 1)), lane == 0);  // this warp is done with V_{step-1}
      // P is packed only now: p_frag is P V's operand until the wait, and ptxas serializes every
      // wgmma if a wgmma's input register is written while a product is in flight (C7513).
      to_a_fragments<kBlockN / 16, kElement>(p_frag, s);
      if (rescale) scale_rows<kOutDimV>(acc_o, corr);  // before P_step V_step, next turn
    };
    if (num_blocks > 0) {
      if (consumer == 1) grant_turn();
      {  // turn 0: S_0 (nothing else in flight: the mask may branch)
        const uint64_t keep = keep_bits(0);
        float s[kBlockN / 8][4];
        await_turn();
        wait_k(0);
        wgmma_fence();
        issue_s(s, 0);
        grant_turn();
        if constexpr (!(kTakeTurns && kStages == 2)) wait_v(0);  // for turn 1 (V_0 comes with K_0)
        wgmma_wait<0>();
        fence_registers(s);
        mbarrier_arrive_if(smem.k_empty(ring.stage(0)), lane == 0);
        apply_keep(s, keep);
        float corr[2];  // O is still 0: nothing to rescale
        online_softmax_scores_lazy<kBlockN>(s, row_max, row_sum, scale_log2, corr);
        to_a_fragments<kBlockN / 16, kElement>(p_frag, s);
      }
      // The listed blocks come partial first; a ragged KV length masks the last block too, so then
      // every turn takes the masked path.
      const int masked_steps = kv_len % kBlockN != 0 ? num_blocks : num_partial;
      int step = 1;
      for (; step < masked_steps; ++step) turn(step, std::true_type{});
      for (; step < num_blocks; ++step) turn(step, std::false_type{});
      {  // turn n: P V of the last step
        await_turn();
        wait_v(num_blocks - 1);
        fence_registers(acc_o);
        wgmma_fence();
        issue_pv(p_frag, num_blocks - 1);
        if (consumer == 0) grant_turn();
        wgmma_wait<0>();
        fence_registers(acc_o);
        mbarrier_arrive_if(smem.v_empty(ring.stage(num_blocks - 1)), lane == 0);
      }
    }
  }

  //! The item's products in the configuration's schedule.
  __device__ __forceinline__ void run(int tile) {
    start(tile);
    if constexpr (Cfg::kOverlap) {
      run_overlapped();
    } else {
      run_sequential();
    }
  }
};

}  // namespace harness::kernels::cuda::device
