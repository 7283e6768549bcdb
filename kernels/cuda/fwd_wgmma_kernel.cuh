#pragma once
// Forward kernel for Hopper (device code only): warp-specialized block-sparse flash attention with
// TMA loads and wgmma, in the structure of FlashAttention-3.
//
// CTA = one producer warpgroup + kConsumers consumer warpgroups of 64 query rows each. The rows
// are packed like the mma.sync forward's (fwd_kernel.cuh: heads_packed query heads of one GQA
// group x block_m positions), so every K/V tile a CTA loads serves all of them. A work item is one
// such tile of rows; a CTA runs one item, or (persistent, FwdWgmmaConfig::kPersistent) one SM
// slot's CTA runs items until a counter says none is left.
//   producer: one thread takes the next work item, hands it to the consumers (item_full / empty)
//             and issues the TMA copies: the item's Q, K and V of each listed kv block into a
//             kStages-deep ring that runs on across items; "full" barriers count the bytes in,
//             "empty" barriers count the consumer warps out before a stage is refilled. K and V
//             are released apart (FlashAttention-3's two pipelines): K once S is in, V once P V
//             is, so the overlapped schedule below, which holds V one step longer than K, refills
//             K a step earlier.
//   consumer: S = Q K^T (wgmma, both operands in shared memory), mask (partial blocks and the
//             ragged last block only), online softmax in registers, then O += P V with P as the
//             register A operand (the accumulator layout of S is the A fragment layout of P, so P
//             never touches shared memory). Epilogue: O / rowsum as bf16 into an O tile of its
//             own (persistent at one CTA per SM, where Q has two buffers and the next item's Q
//             loads while this one runs) or the Q rows (no longer read), TMA store; LSE straight
//             from registers.
// The producer warpgroup gives registers back (setmaxnreg) so the consumers can hold O (64 fp32 at
// D = 128), S (kBlockN / 2 fp32) and P in registers.

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/attention_config.h"
#include "kernels/cuda/attention_params.h"
#include "kernels/cuda/device_utils.cuh"
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

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocksPerSm)
    attention_fwd_wgmma_kernel(const __grid_constant__ FwdParams p, const __grid_constant__ FwdTensorMaps maps,
                               const WorkItem* __restrict__ schedule, const int num_items, int* item_counter,
                               const bool own_o, const uint64_t* __restrict__ mask_bits) {
  constexpr int kHeadDim = Cfg::kHeadDim;
  constexpr int kBlockM = Cfg::kBlockM;
  constexpr int kBlockN = Cfg::kBlockN;
  constexpr int kStages = Cfg::kStages;
  constexpr int kHalves = kHeadDim / 64;

  extern __shared__ unsigned char smem_raw[];
  // TMA's 128-byte swizzle and the wgmma descriptors (base offset 0) need 1024-byte aligned tiles.
  // own_o (see FwdWgmmaConfig::kOwnO): Q in two buffers, work item `tile` in buffer tile % 2, and O
  // in a tile of its own; else one Q buffer, in which O is staged. Then the barriers.
  const int q_buffers = own_o ? 2 : 1;
  const uint32_t s_q0 = (smem_address(smem_raw) + 1023u) & ~1023u;
  const uint32_t s_k = s_q0 + q_buffers * Cfg::kQBytes;
  const uint32_t s_v = s_k + kStages * Cfg::kKvBytes;
  const uint32_t s_o0 = own_o ? s_v + kStages * Cfg::kKvBytes : s_q0;
  const uint32_t bars = s_v + kStages * Cfg::kKvBytes + (own_o ? Cfg::kQBytes : 0);
  // A work item's Q buffer, and how many items used that buffer before it (its barriers' phase).
  auto q_buffer = [&](int tile) { return own_o ? tile & 1 : 0; };
  auto q_use = [&](int tile) { return own_o ? tile >> 1 : tile; };
  auto s_q_of = [&](int tile) { return s_q0 + q_buffer(tile) * Cfg::kQBytes; };
  auto q_full = [&](int tile) { return bars + 8u * q_buffer(tile); };
  auto q_empty = [&](int tile) { return bars + 16u + 8u * q_buffer(tile); };
  const uint32_t item_full = bars + 32u;
  const uint32_t item_empty = bars + 40u;
  auto k_full = [&](int stage) { return bars + 8u * (6 + stage); };
  auto v_full = [&](int stage) { return bars + 8u * (6 + kStages + stage); };
  auto k_empty = [&](int stage) { return bars + 8u * (6 + 2 * kStages + stage); };
  auto v_empty = [&](int stage) { return bars + 8u * (6 + 3 * kStages + stage); };
  // The CTA's work items (tile_scheduler.cuh): drawn by the producer, handed to the consumers.
  const FwdTileScheduler scheduler{schedule, num_items, item_counter};
  const WorkItemHandoff handoff{bars + 8u * (6 + 4 * kStages), item_full, item_empty};

  // The K/V ring runs on across items: `ring` counts the uses before the current item, so step j
  // of the item is use ring + j.
  uint32_t ring = 0;
  auto stage_of = [&](int step) { return static_cast<int>((ring + step) % kStages); };
  auto phase_of = [&](int step) { return ((ring + step) / kStages) & 1u; };

  if (threadIdx.x == 0) {
    for (int tile = 0; tile < q_buffers; ++tile) {
      mbarrier_init(q_full(tile), 1);
      // Q (or, staged there, O) no longer read: every consumer warp, or each consumer's storing thread.
      mbarrier_init(q_empty(tile), own_o ? Cfg::kConsumers * 4 : Cfg::kConsumers);
    }
    mbarrier_init(item_full, 1);
    mbarrier_init(item_empty, Cfg::kConsumers * 4);
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
  __syncthreads();
  // Launched programmatically when its schedule is an earlier call's (attention_launch.cu): the
  // launch and the setup above overlap the kernel ahead, whatever it is; everything below reads
  // inputs it may have written, or writes memory it may still read, so every thread waits first.
  grid_dependency_wait();

  const int warpgroup = warpgroup_index();
  if (warpgroup == 0) {
    // ---- producer ----
    warpgroup_registers_decrease<Cfg::kProducerRegisters>();
    if (threadIdx.x != 0) return;
    prefetch_tensor_map(&maps.q);
    prefetch_tensor_map(&maps.k);
    prefetch_tensor_map(&maps.v);
    for (int tile = 0;; ++tile) {
      WorkItem scheduled;
      if (!scheduler.next(tile, handoff, scheduled)) {
        handoff.publish_end();
        break;
      }
      const FwdWork work = fwd_work(p, scheduled, kBlockM);
      const VisitList kv_list = kv_blocks_of(p.blocks, work.q_block);
      const int num_blocks = kv_list.count;
      handoff.publish(scheduled, kv_list.num_partial, num_blocks);
      // Q first on a CTA's first item (nothing to wait for) and with two Q buffers (the one of the
      // item before last, whose products are done: the producer is an item ahead of the consumers
      // at most); with one, after the item's first K and V, which need only a free ring stage,
      // where Q needs the previous item's O store to be done with the Q tile.
      auto load_q = [&] {
        if (q_use(tile) > 0) mbarrier_wait(q_empty(tile), (q_use(tile) - 1) & 1);
        mbarrier_arrive_expect_tx(q_full(tile), Cfg::kQBytes);
#pragma unroll
        for (int half = 0; half < kHalves; ++half) {
          tma_load_4d(s_q_of(tile) + half * kBlockM * 128, &maps.q, q_full(tile), half * 64, work.rows.q0, work.rows.head0,
                      work.batch);
        }
      };
      const bool q_first = num_blocks == 0 || tile == 0 || own_o;
      if (q_first) load_q();
      int kv_block = kv_list.at(0);
      for (int step = 0; step < num_blocks; ++step) {
        const int next = kv_list.at(step + 1);  // read one step ahead: its latency hides behind the wait
        const int stage = stage_of(step);
        const uint32_t empty_parity = phase_of(step) ^ 1;
        const uint32_t k_stage = s_k + stage * Cfg::kKvBytes;
        const uint32_t v_stage = s_v + stage * Cfg::kKvBytes;
        mbarrier_wait(k_empty(stage), empty_parity);
        mbarrier_arrive_expect_tx(k_full(stage), Cfg::kKvBytes);
#pragma unroll
        for (int half = 0; half < kHalves; ++half) {
          tma_load_4d(k_stage + half * kBlockN * 128, &maps.k, k_full(stage), half * 64, kv_block * kBlockN, work.kv_head,
                      work.batch);
        }
        mbarrier_wait(v_empty(stage), empty_parity);
        mbarrier_arrive_expect_tx(v_full(stage), Cfg::kKvBytes);
#pragma unroll
        for (int half = 0; half < kHalves; ++half) {
          tma_load_4d(v_stage + half * kBlockN * 128, &maps.v, v_full(stage), half * 64, kv_block * kBlockN, work.kv_head,
                      work.batch);
        }
        if (step == 0 && !q_first) load_q();
        kv_block = next;
      }
      ring += num_blocks;
    }
    return;
  }

  // ---- consumers ----
  warpgroup_registers_increase<Cfg::kConsumerRegisters>();
  const int consumer = warpgroup - 1;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int first_row = consumer * 64 + ((static_cast<int>(threadIdx.x) >> 5) & 3) * 16;  // this warp's 16 rows
  const int my_row[2] = {first_row + (lane >> 2), first_row + (lane >> 2) + 8};
  const float scale_log2 = p.scale * kLog2e;
  const int kv_len = p.shape.kv_len;
  const bool storer = (threadIdx.x & 127) == 0;  // issues this warpgroup's O stores

  for (int tile = 0;; ++tile) {
    WorkItem scheduled;
    int num_partial, num_blocks;
    if (!handoff.receive(tile, lane, scheduled, num_partial, num_blocks)) break;
    const FwdWork work = fwd_work(p, scheduled, kBlockM);
    const int batch = work.batch;
    const PackedRows rows = work.rows;
    const VisitList kv_list = kv_blocks_of(p.blocks, work.q_block, num_partial, num_blocks);  // counts from the producer
    auto kv_block_at = [&](int step) { return kv_list.at(step); };
    // The rows' mask predicates: per item in the sequential kernels and the ping-pongs; in the
    // one-consumer overlapped kernel only where a step evaluates its mask (past the bit table), so
    // an item's start does not wait for their loads (dflash: the anchor, then its document). H200,
    // session 15, Nsight Compute: one consumer, dflash-512 311 -> 306 us, the 8k masks -1%; the
    // ping-pong on causal-128 457 -> 461 (slower), so it keeps the per-item predicates.
    auto rows_mask = [&](QueryMask (&row_mask)[2]) {
#pragma unroll
      for (int i = 0; i < 2; ++i) row_mask[i] = query_mask(p.mask, rows.query(my_row[i]));
    };
    constexpr bool kLazyRowMask = Cfg::kOverlap && Cfg::kConsumers == 1;
    // (Unused, so not computed, where kLazyRowMask.)
    const QueryMask item_mask[2] = {query_mask(p.mask, rows.query(my_row[0])), query_mask(p.mask, rows.query(my_row[1]))};

    float acc_o[kHeadDim / 8][4] = {};
    float row_max[2] = {-INFINITY, -INFINITY};  // raw scores (unscaled)
    float row_sum[2] = {0.f, 0.f};              // this thread's columns only; quad-reduced at the end

    int kv_block = kv_block_at(0);
    const uint32_t s_q = s_q_of(tile);
    const uint32_t q_rows = s_q + consumer * 64 * 128;
    const uint32_t s_o = own_o ? s_o0 : s_q;
    // The operands' descriptors, built once and advanced by constant offsets (per k-slice and
    // stage) where each wgmma reads them: Q's rows (K-major, 64-column halves kBlockM rows apart),
    // the K ring (the same per stage) and the V ring (N-major: kBlockN * 128 bytes between halves).
    const uint64_t desc_q0 = smem_descriptor(q_rows, 16, 1024);
    const uint64_t desc_k0 = smem_descriptor(s_k, 16, 1024);
    const uint64_t desc_v0 = smem_descriptor(s_v, kBlockN * 128, 1024);
    // A step's two products, issued and committed; they wait for nothing (the caller waits for the
    // tiles first, so no wait loop sits between two in-flight products). S = Q K^T: 16 columns (32
    // bytes) per k-slice within a 64-column half. O += P V: V is [kBlockN keys x D] with D
    // contiguous, 16 keys per k-slice.
    using STile = float[kBlockN / 8][4];
    using PFragments = uint32_t[kBlockN / 16][4];
    auto issue_s = [&](STile& s, int step) {
      const uint64_t k_desc = smem_descriptor_advance(desc_k0, stage_of(step) * Cfg::kKvBytes);
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        const uint32_t slice = (kk % 4) * 32;
        wgmma_ss<kBlockN, false>(s, smem_descriptor_advance(desc_q0, (kk / 4) * kBlockM * 128 + slice),
                                 smem_descriptor_advance(k_desc, (kk / 4) * kBlockN * 128 + slice), kk > 0);
      }
      wgmma_commit();
    };
    auto issue_pv = [&](const PFragments& p_frag, int step) {
      const uint64_t v_desc = smem_descriptor_advance(desc_v0, stage_of(step) * Cfg::kKvBytes);
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        wgmma_rs<kHeadDim, true>(acc_o, p_frag[kk], smem_descriptor_advance(v_desc, kk * 16 * 128), true);
      }
      wgmma_commit();
    };
    mbarrier_wait(q_full(tile), q_use(tile) & 1);
    if constexpr (Cfg::kOverlap) {
      // FlashAttention-3's schedule. Step j issues S_j = Q K_j^T together with O += P_{j-1} V_{j-1}
      // (so the tensor cores have the next product while this warpgroup does softmax). With two
      // consumers (ping-pong) they also take turns to issue: consumer c waits on named barrier
      // kTurn + c, which the other arrives at once it has issued its own products; consumer 1 grants
      // the first turn. With n steps each consumer takes n + 1 turns (S_0; S_j + PV_{j-1}; PV_{n-1})
      // and grants as many, except that consumer 1 skips its last grant (consumer 0 has no turn
      // left) having granted the first: every wait pairs with one arrival, and an arrival can run at
      // most one ahead. One consumer (wgmma_m64_n64_overlap) overlaps only with itself, and with the
      // other CTA on its SM. The first and last turns are peeled so that every wgmma of the loop is
      // issued unconditionally (ptxas serializes wgmma issued on divergent paths).
      constexpr bool kTakeTurns = Cfg::kConsumers == 2;
      constexpr int kTurn = 4;  // ids 4 and 5 (1 and 2 are the epilogue's)
      const int other = 1 - consumer;
      auto await_turn = [&] {
        if constexpr (kTakeTurns) named_barrier_sync(kTurn + consumer, 256);
      };
      auto grant_turn = [&] {
        if constexpr (kTakeTurns) named_barrier_arrive(kTurn + other, 256);
      };
      PFragments p_frag;  // P of the previous step
      auto wait_k = [&](int step) { mbarrier_wait(k_full(stage_of(step)), phase_of(step)); };
      auto wait_v = [&](int step) { mbarrier_wait(v_full(stage_of(step)), phase_of(step)); };
      // S is each turn's own array (nothing of it carries over to the next turn; the SASS is the
      // same as with one array for all turns).
      // The mask of a step as one bit per score of this thread, computed before the turn's products
      // are issued (it does not depend on S): between the two waits below the code must be free of
      // branches, or ptxas puts the wait for P V at the branch and the softmax no longer overlaps it.
      // The first partial blocks' bits come from the table (mask_bits.cuh: two 8-byte loads per
      // 64 keys, a few shifts), the rest are evaluated here.
      static_assert(kBlockN / 2 <= 64, "one bit per score of this thread");
      constexpr int kWords = kBlockN / 64;
      const int slot_words = p.blocks.block_m * kWords;
      const uint64_t* table_row[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        table_row[i] = mask_bits + (static_cast<int64_t>(work.q_block) * tiling::kMaskBitSlots * p.blocks.block_m +
                                    (my_row[i] & (p.blocks.block_m - 1))) * kWords;
      }
      auto keep_bits = [&](int step) {
        if (step < num_partial && step < tiling::kMaskBitSlots) {
          return keep_bits_from_table<kBlockN>(table_row[0] + step * slot_words, table_row[1] + step * slot_words);
        }
        const int kv0 = kv_block_at(step) * kBlockN;
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
      // nothing is in flight (session 8 had the rescale between the two issues, unconditional:
      // kHeadDim / 2 FMUL per thread and turn; right after the wait for P V ptxas had scheduled the
      // wait into the middle of the softmax, so it now comes after P's packing). kMasked: the step
      // may need its mask (a partial block, or the ragged last one); the unmasked turns skip even
      // the selects.
      auto turn = [&](int step, auto masked) {
        constexpr bool kMasked = decltype(masked)::value;
        uint64_t keep = ~uint64_t{0};
        if constexpr (kMasked) keep = keep_bits(step);
        float s[kBlockN / 8][4];
        await_turn();
        wait_k(step);
        // V_{step-1}: this thread waited for it in the turn before (turn 0 waits for V_0), except in
        // the 2-stage ping-pong, whose turns wait for the V before theirs (below).
        if constexpr (kTakeTurns && kStages == 2) wait_v(step - 1);
        wgmma_fence();
        issue_s(s, step);
        issue_pv(p_frag, step - 1);
        grant_turn();
        wgmma_wait<1>();  // S is in; P V still runs while this warpgroup does the softmax
        fence_registers(s);
        mbarrier_arrive_if(k_empty(stage_of(step)), lane == 0);  // this warp is done with K_step
        if constexpr (kMasked) apply_keep(s, keep);
        float corr[2];
        const bool rescale = online_softmax_scores_lazy<kBlockN>(s, row_max, row_sum, scale_log2, corr);
        fence_registers(s);
        // ptxas hoists a wgmma wait to the top of its basic block (here: above the softmax, which
        // then no longer overlaps P V). A wait loop ends the block here: the one for this step's V
        // (its copy was issued once V_{step-2} was released, a turn ago; the next turn needs it).
        // Waiting for K_{step+1} instead deadlocked in session 8, when K and V were released
        // together: with two stages its copy needed the release just below. A 2-stage ping-pong
        // waits for V_{step-1} instead, complete since the turn began: there V_step's copy needs
        // the other consumer to release V_{step-2} at the end of its turn, which may still be in
        // its softmax, and this wait would expose that and the copy.
        if constexpr (kTakeTurns && kStages == 2) {
          wait_v(step - 1);
        } else {
          wait_v(step);
        }
        wgmma_wait<0>();
        fence_registers(acc_o);
        mbarrier_arrive_if(v_empty(stage_of(step - 1)), lane == 0);  // this warp is done with V_{step-1}
        // P is packed only now: p_frag is P V's operand until the wait, and ptxas serializes every
        // wgmma if a wgmma's input register is written while a product is in flight (C7513).
        to_a_fragments<kBlockN / 16>(p_frag, s);
        if (rescale) scale_rows<kHeadDim>(acc_o, corr);  // before P_step V_step, next turn
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
          mbarrier_arrive_if(k_empty(stage_of(0)), lane == 0);
          apply_keep(s, keep);
          float corr[2];  // O is still 0: nothing to rescale
          online_softmax_scores_lazy<kBlockN>(s, row_max, row_sum, scale_log2, corr);
          to_a_fragments<kBlockN / 16>(p_frag, s);
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
          mbarrier_arrive_if(v_empty(stage_of(num_blocks - 1)), lane == 0);
        }
      }
    } else {
      const QueryMask(&row_mask)[2] = item_mask;
      for (int step = 0; step < num_blocks; ++step) {
        const int next = kv_block_at(step + 1);
        const int stage = stage_of(step);
        const uint32_t parity = phase_of(step);

        float s[kBlockN / 8][4];
        mbarrier_wait(k_full(stage), parity);
        wgmma_fence();
        issue_s(s, step);
        wgmma_wait<0>();
        fence_registers(s);
        mbarrier_arrive_if(k_empty(stage), lane == 0);  // this warp is done with K of the stage

        const int kv0 = kv_block * kBlockN;
        if (step < num_partial || kv0 + kBlockN > kv_len) mask_scores<kBlockN>(s, row_mask, p.mask, kv0);
        online_softmax_lazy<kBlockN, kHeadDim>(s, acc_o, row_max, row_sum, scale_log2);
        PFragments p_frag;
        to_a_fragments<kBlockN / 16>(p_frag, s);

        mbarrier_wait(v_full(stage), parity);
        fence_registers(acc_o);
        wgmma_fence();
        issue_pv(p_frag, step);
        wgmma_wait<0>();
        fence_registers(acc_o);
        mbarrier_arrive_if(v_empty(stage), lane == 0);  // and with V
        kv_block = next;
      }
    }

    // ---- epilogue ----
    if (own_o) mbarrier_arrive_if(q_empty(tile), lane == 0);  // every wgmma of this warp is done: Q is free
    float inv_sum[2];
    finish_rows(p, rows, batch, my_row, row_max, row_sum, scale_log2, inv_sum);
    // The O tile of the previous item has been read by its store (own O tile), or every warp of
    // this warpgroup is past its last wgmma (O staged in the Q rows).
    if (own_o && storer) tma_store_wait_read();
    named_barrier_sync(1 + consumer, 128);
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) {
      const int col = j * 8 + (lane & 3) * 2;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint32_t packed = pack_bf16(acc_o[j][2 * i] * inv_sum[i], acc_o[j][2 * i + 1] * inv_sum[i]);
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(s_o + swizzled_offset(kBlockM, my_row[i], col)), "r"(packed) : "memory");
      }
    }
    fence_async_shared();
    named_barrier_sync(1 + consumer, 128);
    if (storer) {
      // The O map's box is this warpgroup's 64 rows: 64 positions of one head when block_m >= 64,
      // else 64 / block_m heads x block_m positions.
      const int row0 = consumer * 64;
      const int head = rows.head(row0);
      const int q0 = rows.query(row0);
#pragma unroll
      for (int half = 0; half < kHalves; ++half) {
        tma_store_4d(&maps.o, s_o + consumer * 64 * 128 + half * kBlockM * 128, half * 64, q0, head, batch);
      }
      tma_store_commit();
      if (!own_o) {
        tma_store_wait_read();  // the next item's Q may overwrite the staged O now
        mbarrier_arrive(q_empty(tile));
      }
    }
    ring += num_blocks;
  }
  if (storer) tma_store_wait_read();  // the CTA's shared memory must outlive the last store's reads
}

}  // namespace harness::kernels::cuda::device
