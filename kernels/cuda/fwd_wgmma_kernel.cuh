#pragma once
// Forward kernel for Hopper (device code only): warp-specialized block-sparse flash attention with
// TMA loads and wgmma, in the structure of FlashAttention-3.
//
// CTA = one producer warpgroup + kConsumers consumer warpgroups of 64 query rows each. The rows
// are packed like the mma.sync forward's (fwd_kernel.cuh: heads_packed query heads of one GQA
// group x block_m positions), so every K/V tile a CTA loads serves all of them.
//   producer: one thread issues the TMA copies: Q once, then K and V of each listed kv block into a
//             kStages-deep ring; "full" barriers count the bytes in, "empty" barriers count the
//             consumer threads out before a stage is refilled.
//   consumer: S = Q K^T (wgmma, both operands in shared memory), mask (partial blocks and the
//             ragged last block only), online softmax in registers, then O += P V with P as the
//             register A operand (the accumulator layout of S is the A fragment layout of P, so P
//             never touches shared memory). Epilogue: O / rowsum as bf16 into the CTA's own Q rows
//             (no longer read), TMA store; LSE straight from registers.
// The producer warpgroup gives registers back (setmaxnreg) so the consumers can hold O (64 fp32 at
// D = 128), S (kBlockN / 2 fp32) and P in registers.

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/attention_config.h"
#include "kernels/cuda/attention_params.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/fwd_kernel.cuh"
#include "kernels/cuda/hopper_utils.cuh"
#include "kernels/cuda/mask_device.cuh"
#include "kernels/cuda/tile_math.cuh"
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
                               const WorkItem* __restrict__ schedule) {
  constexpr int kHeadDim = Cfg::kHeadDim;
  constexpr int kBlockM = Cfg::kBlockM;
  constexpr int kBlockN = Cfg::kBlockN;
  constexpr int kStages = Cfg::kStages;
  constexpr int kHalves = kHeadDim / 64;

  extern __shared__ unsigned char smem_raw[];
  // TMA's 128-byte swizzle and the wgmma descriptors (base offset 0) need 1024-byte aligned tiles.
  const uint32_t s_q = (smem_address(smem_raw) + 1023u) & ~1023u;
  const uint32_t s_k = s_q + Cfg::kQBytes;
  const uint32_t s_v = s_k + kStages * Cfg::kKvBytes;
  const uint32_t bars = s_v + kStages * Cfg::kKvBytes;
  const uint32_t q_full = bars;
  auto k_full = [&](int stage) { return bars + 8u * (1 + stage); };
  auto v_full = [&](int stage) { return bars + 8u * (1 + kStages + stage); };
  auto kv_empty = [&](int stage) { return bars + 8u * (1 + 2 * kStages + stage); };

  const FwdWork work = fwd_work(p, schedule[blockIdx.x], kBlockM);
  const int q_block = work.q_block;
  const int batch = work.batch;
  const PackedRows rows = work.rows;
  const int kv_head = work.kv_head;

  const VisitList kv_list = kv_blocks_of(p.blocks, q_block);
  const int num_partial = kv_list.num_partial, num_blocks = kv_list.count;
  auto kv_block_at = [&](int step) { return kv_list.at(step); };

  if (threadIdx.x == 0) {
    mbarrier_init(q_full, 1);
    for (int stage = 0; stage < kStages; ++stage) {
      mbarrier_init(k_full(stage), 1);
      mbarrier_init(v_full(stage), 1);
      mbarrier_init(kv_empty(stage), Cfg::kConsumers * 128);
    }
    fence_barrier_init();
  }
  __syncthreads();

  const int warpgroup = static_cast<int>(threadIdx.x) / 128;
  if (warpgroup == 0) {
    // ---- producer ----
    warpgroup_registers_decrease<Cfg::kProducerRegisters>();
    if (threadIdx.x != 0) return;
    prefetch_tensor_map(&maps.q);
    prefetch_tensor_map(&maps.k);
    prefetch_tensor_map(&maps.v);
    mbarrier_arrive_expect_tx(q_full, Cfg::kQBytes);
#pragma unroll
    for (int half = 0; half < kHalves; ++half) {
      tma_load_4d(s_q + half * kBlockM * 128, &maps.q, q_full, half * 64, rows.q0, rows.head0, batch);
    }
    int kv_block = kv_block_at(0);
    for (int step = 0; step < num_blocks; ++step) {
      const int next = kv_block_at(step + 1);  // read one step ahead: its latency hides behind the wait
      const int stage = step % kStages;
      mbarrier_wait(kv_empty(stage), ((step / kStages) & 1) ^ 1);
      const uint32_t k_stage = s_k + stage * Cfg::kKvBytes;
      const uint32_t v_stage = s_v + stage * Cfg::kKvBytes;
      mbarrier_arrive_expect_tx(k_full(stage), Cfg::kKvBytes);
#pragma unroll
      for (int half = 0; half < kHalves; ++half) {
        tma_load_4d(k_stage + half * kBlockN * 128, &maps.k, k_full(stage), half * 64, kv_block * kBlockN, kv_head, batch);
      }
      mbarrier_arrive_expect_tx(v_full(stage), Cfg::kKvBytes);
#pragma unroll
      for (int half = 0; half < kHalves; ++half) {
        tma_load_4d(v_stage + half * kBlockN * 128, &maps.v, v_full(stage), half * 64, kv_block * kBlockN, kv_head, batch);
      }
      kv_block = next;
    }
    return;
  }

  // ---- consumers ----
  warpgroup_registers_increase<Cfg::kConsumerRegisters>();
  const int consumer = warpgroup - 1;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int first_row = consumer * 64 + ((static_cast<int>(threadIdx.x) >> 5) & 3) * 16;  // this warp's 16 rows
  const int my_row[2] = {first_row + (lane >> 2), first_row + (lane >> 2) + 8};
  const QueryMask row_mask[2] = {query_mask(p.mask, rows.query(my_row[0])), query_mask(p.mask, rows.query(my_row[1]))};
  const float scale_log2 = p.scale * kLog2e;
  const int kv_len = p.shape.kv_len;

  float acc_o[kHeadDim / 8][4] = {};
  float row_max[2] = {-INFINITY, -INFINITY};  // raw scores (unscaled)
  float row_sum[2] = {0.f, 0.f};              // this thread's columns only; quad-reduced at the end
  const uint32_t q_rows = s_q + consumer * 64 * 128;

  int kv_block = kv_block_at(0);
  mbarrier_wait(q_full, 0);
  if constexpr (Cfg::kPingPong) {
    // FlashAttention-3's schedule. Step j issues S_j = Q K_j^T together with O += P_{j-1} V_{j-1}
    // (so the tensor cores have the next product while this warpgroup does softmax), and the two
    // consumers take turns to issue: consumer c waits on named barrier kTurn + c, which the other
    // arrives at once it has issued its own products; consumer 1 grants the first turn. With n
    // steps each consumer takes n + 1 turns (S_0; S_j + PV_{j-1}; PV_{n-1}) and grants as many,
    // except that consumer 1 skips its last grant (consumer 0 has no turn left) having granted
    // the first: every wait pairs with one arrival, and an arrival can run at most one ahead. The
    // first and last turns are peeled so that every wgmma of the loop is issued unconditionally
    // (ptxas serializes wgmma issued on divergent paths).
    constexpr int kTurn = 4;  // ids 4 and 5 (1 and 2 are the epilogue's)
    const int other = 1 - consumer;
    uint32_t p_frag[kBlockN / 16][4];  // P of the previous step
    // The issue helpers wait for nothing: each turn waits for its tiles before its first wgmma, so
    // no wait loop sits between two in-flight products.
    auto wait_k = [&](int step) { mbarrier_wait(k_full(step % kStages), (step / kStages) & 1); };
    auto wait_v = [&](int step) { mbarrier_wait(v_full(step % kStages), (step / kStages) & 1); };
    // S is each turn's own array (nothing of it carries over to the next turn; the SASS is the
    // same as with one array for all turns).
    using STile = float[kBlockN / 8][4];
    auto issue_s = [&](STile& s, int step) {
      const uint32_t k_stage = s_k + (step % kStages) * Cfg::kKvBytes;
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        const uint32_t k_offset = (kk % 4) * 32;
        const uint64_t desc_q = smem_descriptor(q_rows + (kk / 4) * kBlockM * 128 + k_offset, 16, 1024);
        const uint64_t desc_k = smem_descriptor(k_stage + (kk / 4) * kBlockN * 128 + k_offset, 16, 1024);
        wgmma_ss<kBlockN, false>(s, desc_q, desc_k, kk > 0);
      }
      wgmma_commit();
    };
    auto issue_pv = [&](int step) {
      const uint32_t v_stage = s_v + (step % kStages) * Cfg::kKvBytes;
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        wgmma_rs<kHeadDim, true>(acc_o, p_frag[kk], smem_descriptor(v_stage + kk * 16 * 128, kBlockN * 128, 1024), true);
      }
      wgmma_commit();
    };
    // The mask of a step as one bit per score of this thread, computed before the turn's products
    // are issued (it does not depend on S): between the two waits below the code must be free of
    // branches, or ptxas puts the wait for P V at the branch and the softmax no longer overlaps it.
    static_assert(kBlockN / 2 <= 64, "one bit per score of this thread");
    auto keep_bits = [&](int step) {
      const int kv0 = kv_block_at(step) * kBlockN;
      uint64_t keep = ~uint64_t{0};
      if (step < num_partial || kv0 + kBlockN > kv_len) {
        keep = 0;
        int32_t docs[kBlockN / 8][2];
        load_key_docs<kBlockN>(docs, p.mask, kv0);
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (visible(row_mask[e >> 1], docs[j][e & 1], kv0 + tile_column(j, e))) keep |= uint64_t{1} << (4 * j + e);
          }
        }
      }
      return keep;
    };
    auto apply_keep = [&](STile& s, uint64_t keep) {
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] = (keep >> (4 * j + e)) & 1 ? s[j][e] : -INFINITY;
      }
    };
    // Turn `step` (1 <= step < n): S_step and P V of step - 1, in FlashAttention-3's order: O takes
    // the previous softmax's factor between the two issues (S does not read O), so that after the
    // wait for P V only P's packing is left; with the rescale after that wait ptxas scheduled the
    // wait into the middle of the softmax. kMasked: the step may need its mask (a partial block,
    // or the ragged last one); the unmasked turns skip even the selects.
    auto turn = [&](int step, float (&corr)[2], auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
      uint64_t keep = ~uint64_t{0};
      if constexpr (kMasked) keep = keep_bits(step);
      float s[kBlockN / 8][4];
      named_barrier_sync(kTurn + consumer, 256);
      wait_k(step);
      wait_v(step - 1);
      wgmma_fence();
      issue_s(s, step);
      scale_rows<kHeadDim>(acc_o, corr);
      fence_registers(acc_o);
      wgmma_fence();
      issue_pv(step - 1);
      named_barrier_arrive(kTurn + other, 256);
      wgmma_wait<1>();  // S is in; P V still runs while this warpgroup does the softmax
      fence_registers(s);
      if constexpr (kMasked) apply_keep(s, keep);
      online_softmax_scores<kBlockN>(s, row_max, row_sum, scale_log2, corr);
      fence_registers(s);
      // ptxas hoists a wgmma wait to the top of its basic block (here: above the softmax, which
      // then no longer overlaps P V). A wait loop ends the block here: the one for this step's V
      // (loaded with K_step, so already in or nearly; the next turn needs it). Not K_{step+1}:
      // with two stages it waits on this stage's release just below, a deadlock.
      wait_v(step);
      wgmma_wait<0>();
      fence_registers(acc_o);
      mbarrier_arrive(kv_empty((step - 1) % kStages));  // this thread is done with the previous stage
      // P is packed only now: p_frag is P V's operand until the wait, and ptxas serializes every
      // wgmma if a wgmma's input register is written while a product is in flight (C7513).
      to_a_fragments<kBlockN / 16>(p_frag, s);
    };
    if (num_blocks > 0) {
      float corr[2];  // O's factor from the last softmax, applied before the next P V
      if (consumer == 1) named_barrier_arrive(kTurn + 0, 256);
      {  // turn 0: S_0 (nothing else in flight: the mask may branch)
        const uint64_t keep = keep_bits(0);
        float s[kBlockN / 8][4];
        named_barrier_sync(kTurn + consumer, 256);
        wait_k(0);
        wgmma_fence();
        issue_s(s, 0);
        named_barrier_arrive(kTurn + other, 256);
        wgmma_wait<0>();
        fence_registers(s);
        apply_keep(s, keep);
        online_softmax_scores<kBlockN>(s, row_max, row_sum, scale_log2, corr);
        to_a_fragments<kBlockN / 16>(p_frag, s);
      }
      // The listed blocks come partial first; a ragged KV length masks the last block too, so then
      // every turn takes the masked path.
      const int masked_steps = kv_len % kBlockN != 0 ? num_blocks : num_partial;
      int step = 1;
      for (; step < masked_steps; ++step) turn(step, corr, std::true_type{});
      for (; step < num_blocks; ++step) turn(step, corr, std::false_type{});
      {  // turn n: P V of the last step
        named_barrier_sync(kTurn + consumer, 256);
        wait_v(num_blocks - 1);
        scale_rows<kHeadDim>(acc_o, corr);
        fence_registers(acc_o);
        wgmma_fence();
        issue_pv(num_blocks - 1);
        if (consumer == 0) named_barrier_arrive(kTurn + other, 256);
        wgmma_wait<0>();
        fence_registers(acc_o);
        mbarrier_arrive(kv_empty((num_blocks - 1) % kStages));
      }
    }
  } else
  for (int step = 0; step < num_blocks; ++step) {
    const int next = kv_block_at(step + 1);
    const int stage = step % kStages;
    const uint32_t parity = (step / kStages) & 1;
    const uint32_t k_stage = s_k + stage * Cfg::kKvBytes;
    const uint32_t v_stage = s_v + stage * Cfg::kKvBytes;

    float s[kBlockN / 8][4];
    mbarrier_wait(k_full(stage), parity);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const uint32_t k_offset = (kk % 4) * 32;  // 16 columns = 32 bytes within a 64-column half
      const uint64_t desc_q = smem_descriptor(q_rows + (kk / 4) * kBlockM * 128 + k_offset, 16, 1024);
      const uint64_t desc_k = smem_descriptor(k_stage + (kk / 4) * kBlockN * 128 + k_offset, 16, 1024);
      wgmma_ss<kBlockN, false>(s, desc_q, desc_k, kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(s);

    const int kv0 = kv_block * kBlockN;
    if (step < num_partial || kv0 + kBlockN > kv_len) mask_scores<kBlockN>(s, row_mask, p.mask, kv0);
    online_softmax<kBlockN, kHeadDim>(s, acc_o, row_max, row_sum, scale_log2);
    uint32_t p_frag[kBlockN / 16][4];
    to_a_fragments<kBlockN / 16>(p_frag, s);

    mbarrier_wait(v_full(stage), parity);
    fence_registers(acc_o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      // V is [kBlockN keys x D] with D contiguous: N-major B, 64-column halves kBlockN * 128 bytes apart.
      const uint64_t desc_v = smem_descriptor(v_stage + kk * 16 * 128, kBlockN * 128, 1024);
      wgmma_rs<kHeadDim, true>(acc_o, p_frag[kk], desc_v, true);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(acc_o);
    mbarrier_arrive(kv_empty(stage));  // this thread is done with the stage
    kv_block = next;
  }

  // ---- epilogue ----
  float inv_sum[2];
  finish_rows(p, rows, batch, my_row, row_max, row_sum, scale_log2, inv_sum);
  // Every warp of this warpgroup is past its last wgmma, so the group's Q rows are free for O.
  named_barrier_sync(1 + consumer, 128);
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; ++j) {
    const int col = j * 8 + (lane & 3) * 2;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t packed = pack_bf16(acc_o[j][2 * i] * inv_sum[i], acc_o[j][2 * i + 1] * inv_sum[i]);
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(s_q + swizzled_offset(kBlockM, my_row[i], col)), "r"(packed) : "memory");
    }
  }
  fence_async_shared();
  named_barrier_sync(1 + consumer, 128);
  if ((threadIdx.x & 127) == 0) {
    // The O map's box is this warpgroup's 64 rows: 64 positions of one head when block_m >= 64,
    // else 64 / block_m heads x block_m positions.
    const int row0 = consumer * 64;
    const int head = rows.head(row0);
    const int q0 = rows.query(row0);
#pragma unroll
    for (int half = 0; half < kHalves; ++half) {
      tma_store_4d(&maps.o, q_rows + half * kBlockM * 128, half * 64, q0, head, batch);
    }
    tma_store_commit();
    tma_store_wait_read();
  }
}

}  // namespace harness::kernels::cuda::device
