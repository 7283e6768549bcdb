#pragma once
// Backward for Hopper with dQ summed by atomic adds (device code only): FlashAttention-3's
// structure, written from the PTX ISA on top of this folder's deterministic wgmma backward.
//
// One CTA per (kv block of 128 keys, kv head, batch): one producer warpgroup (TMA) and two consumer
// warpgroups, consumer c owning keys 64c..64c+63. K and V stay resident; the producer streams
// (Q, per-row (lse2, delta), mask rows) and dO for every step = (head pack of the GQA group, listed
// q block) of 64 packed query rows. Per step, keys as the M dimension (as in the dK/dV tile of
// bwd_wgmma_kernels.cuh), five GEMMs:
//   S^T = K Q^T, P^T = 2^(S^T scale log2e - lse2)       (smem x smem)
//   dV += P^T dO                                         (P^T from registers)
//   dP^T = V dO^T, dS^T = P^T (dP^T - delta)             (smem x smem)
//   dK += dS^T Q                                         (dS^T from registers)
//   dQ  = dS K (this step's 64 rows)                     (dS^T stored to smem, read M-major)
// GQA: the CTA loops over every query head of its kv head's group itself, so dK and dV are
// complete sums in registers when it ends (no atomics there, and the same TMA stores as the
// deterministic kernel); only dQ, whose rows every kv block touches, is summed across CTAs.
// dQ of a step goes registers -> an fp32 shared tile (16-byte chunks swizzled by row, so the
// stores are bank-conflict free) -> one cp.reduce.async.bulk add.f32 per packed head into the fp32
// accumulator [B, H, q_pad, D] (same chunk swizzle: the reduction is elementwise), issued by a
// reducer thread of the producer warpgroup on an mbarrier handshake (dq_full / dq_empty), so the
// consumers meet only once per step (dS^T of both halves is in; dS^T is double-buffered so that
// one consumer may write the next while the other still reads this one).
// attention_bwd_dq_convert_kernel then writes bf16 dQ. The prep kernel zeroes the accumulator; the
// convert kernel is launched programmatically (it may start while this one finishes, and waits
// for it before it reads the sums: grid_dependency_wait).
// With few kv heads (tiling::bwd_atomic_dkdv_splits) a kv block's head packs are split over
// several CTAs (WorkItem::copy = (batch, kv head, split)); each adds its partial dK and dV to fp32
// accumulators [B, KVH, kv_pad, D] by one bulk reduce-add per consumer and tensor, and the convert
// kernel writes them as bf16 after dQ.
// dQ's fp32 sums depend on the order the CTAs' adds land in, so dQ is not bitwise reproducible
// (dK and dV are, unless their kv blocks are split).

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/attention_config.h"
#include "kernels/cuda/attention_params.h"
#include "kernels/cuda/bwd_prep_kernel.cuh"
#include "kernels/cuda/bwd_wgmma_kernels.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/hopper_utils.cuh"
#include "kernels/cuda/kernel_common.cuh"
#include "kernels/cuda/mask_bits.cuh"
#include "kernels/cuda/mask_device.cuh"
#include "kernels/cuda/tile_math.cuh"
#include "kernels/cuda/tile_scheduler.cuh"
#include "kernels/cuda/wgmma_ops.cuh"
#include "kernels/cuda/wgmma_tiles.cuh"

namespace harness::kernels::cuda::device {

//! wgmma_atomic's fp32 dV accumulator (split kv blocks): after dK's [B, KVH, kv_pad, D] floats.
__device__ __forceinline__ float* dv_accumulator(const BwdParams& p, const BwdScratch& scratch, int head_dim) {
  return scratch.dkdv_accum + static_cast<int64_t>(p.shape.batch) * p.shape.kv_heads * scratch.kv_pad * head_dim;
}

//! Writes 8 columns from `col` of an fp32 accumulator row (chunk-swizzled by `swizzle_row`, see
//! dq_column_offset) to `dst` as bf16, times `factor`.
__device__ __forceinline__ void convert_accumulator_row(const float* accum_row, int swizzle_row, int col, float factor,
                                                        const __nv_bfloat16* dst) {
  const unsigned char* bytes = reinterpret_cast<const unsigned char*>(accum_row);
  const float4 a = *reinterpret_cast<const float4*>(bytes + dq_column_offset(swizzle_row, col));
  const float4 b = *reinterpret_cast<const float4*>(bytes + dq_column_offset(swizzle_row, col + 4));
  uint4 out;
  out.x = pack_bf16(a.x * factor, a.y * factor);
  out.y = pack_bf16(a.z * factor, a.w * factor);
  out.z = pack_bf16(b.x * factor, b.y * factor);
  out.w = pack_bf16(b.z * factor, b.w * factor);
  *reinterpret_cast<uint4*>(const_cast<__nv_bfloat16*>(dst) + col) = out;
}

//! Barrier id of the two consumer warpgroups together (1 and 2 are each one's own).
constexpr int kConsumersBarrier = 3;

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    attention_bwd_atomic_kernel(const __grid_constant__ BwdParams p, const __grid_constant__ BwdTensorMaps maps,
                                const BwdScratch scratch) {
  constexpr int kHeadDim = Cfg::kHeadDim;
  constexpr int kStages = Cfg::kStages;
  constexpr int kHalves = kHeadDim / 64;
  constexpr int kKeys = Cfg::kKeys;  // 128
  constexpr int kRows = Cfg::kRows;  // 64 query rows per step
  extern __shared__ unsigned char smem_raw[];
  const uint32_t smem = (smem_address(smem_raw) + 1023u) & ~1023u;
  const uint32_t s_k = smem + Cfg::kOffK;
  const uint32_t s_v = smem + Cfg::kOffV;
  const uint32_t s_q = smem + Cfg::kOffQ;    // kStages Q tiles
  const uint32_t s_do = smem + Cfg::kOffDo;  // kStages dO tiles
  const uint32_t s_ds = smem + Cfg::kOffDs;  // 2 x dS^T: kKeys rows x kRows queries, bf16, swizzled
  const uint32_t s_dq = smem + Cfg::kOffDq;  // dQ: kRows x kHeadDim fp32, chunk-swizzled
  const uint32_t s_stats = smem + Cfg::kOffStats;
  const uint32_t s_masks = smem + Cfg::kOffMasks;
  const uint32_t s_bits = smem + Cfg::kOffBits;
  const BwdBarriers<kStages> bar{smem + Cfg::kOffBarriers};
  // The dQ tile: written (every consumer thread arrives) / read by the reduction (the reducer).
  const uint32_t dq_full = bar.base + 8u * (1 + 3 * kStages);
  const uint32_t dq_empty = dq_full + 8u;

  if (threadIdx.x == 0) {
    for (int i = 0; i < 1 + 2 * kStages; ++i) mbarrier_init(bar.base + 8u * i, 1);  // resident, "full": the producer
    for (int stage = 0; stage < kStages; ++stage) mbarrier_init(bar.empty(stage), 2 * 128);  // every consumer thread
    mbarrier_init(dq_full, 2 * 128);
    mbarrier_init(dq_empty, 1);
    fence_barrier_init();
  }
  __syncthreads();

  const int splits = scratch.dkdv_splits;
  const DkdvWork work = dkdv_work(scratch.schedule[blockIdx.x], p.shape.kv_heads, splits);
  const int kv_block = work.kv_block, kv_head = work.kv_head, batch = work.batch, split = work.split;

  const BlockListParams& blocks = p.dkdv_blocks;
  const int block_m = blocks.block_m;
  const int heads_packed = kRows / block_m;
  const int group = p.shape.heads / p.shape.kv_heads;
  const VisitList q_list = q_blocks_of(blocks, kv_block);
  const int num_partial = q_list.num_partial, num_q_blocks = q_list.count;
  // Steps run over (head pack, q block): every query head of the group, so dK/dV end complete;
  // with split kv blocks, this CTA's share of the head packs (its dK/dV are partial sums).
  const int packs = group / heads_packed / splits;
  const int num_steps = packs * num_q_blocks;
  const int head_base = kv_head * group + split * packs * heads_packed;
  const int kv0 = kv_block * kKeys;

  const int warpgroup = warpgroup_index();
  if (warpgroup == 0) {
    // ---- Producer: one thread issues every copy (as in bwd_dkdv_wgmma_tile). ----
    warpgroup_registers_decrease<Cfg::kProducerRegisters>();
    if (threadIdx.x == 32) {
      // ---- Reducer: adds each step's dQ tile to the fp32 accumulator, one bulk op per head. ----
      for (int step = 0; step < num_steps; ++step) {
        // Where the tile goes is worked out (a division and a list load) before the wait, so the
        // adds issue as soon as the consumers have written the tile.
        const int head0 = head_base + (step / num_q_blocks) * heads_packed;
        const int q0 = q_list.at(step % num_q_blocks) * block_m;
        mbarrier_wait(dq_full, step & 1);
        for (int h = 0; h < heads_packed; ++h) {
          float* dst = scratch.dq_accum +
                       ((static_cast<int64_t>(batch) * p.shape.heads + head0 + h) * scratch.q_pad + q0) * kHeadDim;
          bulk_reduce_add_f32(dst, s_dq + h * block_m * kHeadDim * 4, block_m * kHeadDim * 4);
        }
        tma_store_commit();
        bulk_wait_read();
        mbarrier_arrive(dq_empty);
      }
      bulk_wait_all();
      return;
    }
    if (threadIdx.x != 0) return;
    mbarrier_arrive_expect_tx(bar.resident(), 2 * Cfg::kKvBytes);
#pragma unroll
    for (int half = 0; half < kHalves; ++half) {
      tma_load_4d(s_k + half * kKeys * 128, &maps.k_dkdv, bar.resident(), half * 64, kv0, kv_head, batch);
      tma_load_4d(s_v + half * kKeys * 128, &maps.v_dkdv, bar.resident(), half * 64, kv0, kv_head, batch);
    }
    int q_block = q_list.at(0);
    for (int step = 0; step < num_steps; ++step) {
      const int next = step + 1 < num_steps ? q_list.at((step + 1) % num_q_blocks) : 0;
      const int stage = step % kStages;
      const int head0 = head_base + (step / num_q_blocks) * heads_packed;
      const int q0 = q_block * block_m;
      mbarrier_wait(bar.empty(stage), ((step / kStages) & 1) ^ 1);
      const uint32_t q_stage = s_q + stage * Cfg::kQBytes;
      const uint32_t do_stage = s_do + stage * Cfg::kQBytes;
      // A partial step within the table's slots also copies its keys' mask bits.
      const int slot = step % num_q_blocks;
      const bool bits = slot < num_partial && slot < tiling::kBwdMaskBitSlots;
      const int bits_bytes = kKeys * (block_m / 8);
      mbarrier_arrive_expect_tx(bar.first(stage), Cfg::kQBytes + kRows * 8 + block_m * 32 + (bits ? bits_bytes : 0));
#pragma unroll
      for (int half = 0; half < kHalves; ++half) {
        tma_load_4d(q_stage + half * kRows * 128, &maps.q_dkdv, bar.first(stage), half * 64, q0, head0, batch);
      }
      for (int h = 0; h < heads_packed; ++h) {
        bulk_load(s_stats + stage * kRows * 8 + h * block_m * 8,
                  scratch.row_stats + (static_cast<int64_t>(batch) * p.shape.heads + head0 + h) * scratch.q_pad + q0,
                  block_m * 8, bar.first(stage));
      }
      bulk_load(s_masks + stage * kRows * 32, scratch.mask_rows + q0, block_m * 32, bar.first(stage));
      if (bits) {
        bulk_load(s_bits + stage * kKeys * 8,
                  scratch.key_bits + (static_cast<int64_t>(kv_block) * tiling::kBwdMaskBitSlots + slot) * bits_bytes,
                  bits_bytes, bar.first(stage));
      }
      mbarrier_arrive_expect_tx(bar.second(stage), Cfg::kQBytes);
#pragma unroll
      for (int half = 0; half < kHalves; ++half) {
        tma_load_4d(do_stage + half * kRows * 128, &maps.dout_dkdv, bar.second(stage), half * 64, q0, head0, batch);
      }
      q_block = next;
    }
    return;
  }

  // ---- Consumers ----
  warpgroup_registers_increase<Cfg::kConsumerRegisters>();
  const int consumer = warpgroup - 1;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp_in_group = (static_cast<int>(threadIdx.x) >> 5) & 3;
  const int first_key = consumer * 64 + warp_in_group * 16;  // this warp's 16 keys within the CTA's 128
  const int my_kv[2] = {kv0 + first_key + (lane >> 2), kv0 + first_key + (lane >> 2) + 8};
  const int32_t my_doc[2] = {key_doc(p.mask, my_kv[0]), key_doc(p.mask, my_kv[1])};
  const float scale_log2 = p.scale * kLog2e;
  const uint32_t k_rows = s_k + consumer * 64 * 128;
  const uint32_t v_rows = s_v + consumer * 64 * 128;

  float acc_dk[kHeadDim / 8][4] = {};
  float acc_dv[kHeadDim / 8][4] = {};
  // S^T of a step is issued at the end of the step before, behind that step's dK and dQ, so its
  // latency and the dQ tile's store overlap them (FlashAttention-3 pipelines its forward this way).
  // The wait for the next step's Q comes before that step's dK is issued: a wait loop between
  // wgmma in flight makes ptxas serialize every wgmma of the kernel (C7520; see the forward's notes).
  float st[kRows / 8][4];
  auto issue_scores = [&](uint32_t q_stage) {
    wgmma_fence();
    keys_times_rows<kHeadDim, kKeys, kRows>(st, k_rows, q_stage);
    wgmma_commit();
  };
  mbarrier_wait(bar.resident(), 0);
  if (num_steps > 0) mbarrier_wait(bar.first(0), 0);
  issue_scores(s_q);
  // The step's q block slot (step % num_q_blocks) as a running counter: the integer division took
  // 3% of the causal backward's samples at the step's start (session 19's source counters). The
  // producer threads keep dividing: with a counter their 24 registers spilled, and they run ahead.
  int slot = 0;
  for (int step = 0; step < num_steps; ++step, slot = slot + 1 == num_q_blocks ? 0 : slot + 1) {
    const int stage = step % kStages;
    const uint32_t parity = (step / kStages) & 1;
    const uint32_t q_stage = s_q + stage * Cfg::kQBytes;
    const uint32_t do_stage = s_do + stage * Cfg::kQBytes;
    const float2* stats = reinterpret_cast<const float2*>(__cvta_shared_to_generic(s_stats + stage * kRows * 8));
    const QueryMaskRow* masks = reinterpret_cast<const QueryMaskRow*>(__cvta_shared_to_generic(s_masks + stage * kRows * 32));

    // S^T: this consumer's 64 keys x 64 query rows (issued by the step before).
    wgmma_wait<0>();
    fence_registers(st);
    if (slot < num_partial) {
      mask_partial_step_transposed<kRows>(st, slot, s_bits + stage * kKeys * 8, masks, block_m, my_doc, my_kv, kv0);
    }
    probabilities_transposed<kRows>(st, stats, scale_log2);
    uint32_t pt[kRows / 16][4];
    to_a_fragments<kRows / 16>(pt, st);

    // dV += P^T dO and dP^T = V dO^T, issued together.
    float dpt[kRows / 8][4];
    mbarrier_wait(bar.second(stage), parity);
    fence_registers(acc_dv);
    wgmma_fence();
    fragments_times_rows<kHeadDim, kRows>(acc_dv, pt, do_stage);
    keys_times_rows<kHeadDim, kKeys, kRows>(dpt, v_rows, do_stage);
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(acc_dv);
    fence_registers(dpt);

    // dS^T = P^T (dP^T - delta) as bf16 A fragments; also into shared memory for dQ = dS K.
    score_gradients_transposed<kRows>(dpt, pt, stats);
    uint32_t dst[kRows / 16][4];
    to_a_fragments<kRows / 16>(dst, dpt);
    // The consumers meet once per step, so dS^T alternates between two buffers (the other consumer
    // may still read last step's while this one writes).
    const uint32_t ds_tile = s_ds + (step & 1) * Cfg::kDsBytes;
    {
      // A fragment kk: registers 0/1 hold rows g / g+8 at columns 16kk + 2t, registers 2/3 the same
      // rows at columns 16kk + 8 + 2t. The tile is kKeys rows of 64 queries (128 bytes), swizzled.
      const int row = first_key + (lane >> 2);
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
    // The next step's Q, waited for while nothing is in flight. After the last step S^T is issued
    // anyway, on a stage no copy writes any more, and its result is dropped: a wgmma on a
    // conditional path would serialize them all.
    const int next_stage = (step + 1) % kStages;
    if (step + 1 < num_steps) mbarrier_wait(bar.first(next_stage), ((step + 1) / kStages) & 1);
    // dK += dS^T Q, issued now; it runs while the consumers meet below.
    fence_registers(acc_dk);
    wgmma_fence();
    fragments_times_rows<kHeadDim, kRows>(acc_dk, dst, q_stage);
    wgmma_commit();
    named_barrier_sync(kConsumersBarrier, 256);  // dS^T of all 128 keys is in s_ds

    // dQ (64 rows x 64 columns per consumer) = dS (A: s_ds read M-major) x K (B: N-major). At
    // D = 128 consumer c computes columns 64c..; at D = 64 the consumers take turns by step.
    const bool does_dq = kHalves == 2 || (step & 1) == consumer;
    const int dq_col0 = kHalves == 2 ? consumer * 64 : 0;
    float acc_dq[Cfg::kDqColumns / 8][4];
    if (does_dq) {
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        wgmma_ss_mn<Cfg::kDqColumns>(acc_dq, smem_descriptor(ds_tile + kk * 16 * 128, kRows * 128, 1024),
                                     smem_descriptor(s_k + (dq_col0 / 64) * kKeys * 128 + kk * 16 * 128, kKeys * 128, 1024),
                                     kk > 0);
      }
      wgmma_commit();
    }
    issue_scores(s_q + next_stage * Cfg::kQBytes);
    wgmma_wait<1>();  // dK and dQ are done; the next S^T runs on
    fence_registers(acc_dk);
    if (does_dq) fence_registers(acc_dq);
    mbarrier_arrive(bar.empty(stage));  // Q and dO of this stage are no longer read
    mbarrier_wait(dq_empty, (step & 1) ^ 1);  // the reducer has read the last tile
    if (does_dq) {
      store_f32_rows<kHeadDim, Cfg::kDqColumns>(s_dq, acc_dq, warp_in_group * 16 + (lane >> 2), dq_col0, lane);
      fence_async_shared();
    }
    mbarrier_arrive(dq_full);
  }
  wgmma_wait<0>();  // the S^T issued after the last step (dropped)
  fence_registers(st);
  named_barrier_sync(kConsumersBarrier, 256);  // the other consumer's last dQ product no longer reads K

  if (splits > 1) {
    // Split kv block: add this CTA's partial dK and dV (fp32, unscaled) to the accumulators, one
    // after the other through a 64-row fp32 tile in the consumer's own Q (or dO) stages, which no
    // copy or product reads any more; the conversion kernel scales and writes bf16.
    static_assert(kStages * Cfg::kQBytes == 64 * kHeadDim * 4, "one consumer's fp32 rows fill its stages");
    if (num_steps == 0) return;  // nothing to add
    const uint32_t tile = consumer == 0 ? s_q : s_do;
    const int64_t accum_row = (static_cast<int64_t>(batch) * p.shape.kv_heads + kv_head) * scratch.kv_pad + kv0 + consumer * 64;
    auto add_rows = [&](const float (&acc)[kHeadDim / 8][4], float* accum) {
      store_f32_rows<kHeadDim, kHeadDim>(tile, acc, warp_in_group * 16 + (lane >> 2), 0, lane);
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
    return;
  }
  // Epilogue: this consumer's 64 keys of dK (scaled) and dV, through its own rows of K and V.
  named_barrier_sync(1 + consumer, 128);
  store_consumer_rows<kHeadDim>(acc_dk, p.scale, s_k, kKeys, consumer * 64, consumer, &maps.dk, kv0 + consumer * 64, kv_head,
                                batch);
  store_consumer_rows<kHeadDim>(acc_dv, 1.f, s_v, kKeys, consumer * 64, consumer, &maps.dv, kv0 + consumer * 64, kv_head,
                                batch);
}

//! dQ = scale * accumulator, as bf16 (rows q < q_len of every (batch, head)); with split kv blocks
//! also dK = scale * its accumulator and dV = its accumulator (rows kv < kv_len of every (batch,
//! kv head)), in the rows after dQ's.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads)
    attention_bwd_dq_convert_kernel(const __grid_constant__ BwdParams p, const BwdScratch scratch) {
  constexpr int kHeadDim = Cfg::kHeadDim;
  constexpr int kPerRow = Cfg::kThreadsPerRow;
  const int64_t rows_total = static_cast<int64_t>(p.shape.batch) * p.shape.heads * p.shape.q_len;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * Cfg::kRowsPerCta + threadIdx.x / kPerRow;
  // Launched programmatically behind the main kernel: every thread waits for its sums (and so
  // this grid never completes before it).
  grid_dependency_wait();
  const int col = (static_cast<int>(threadIdx.x) % kPerRow) * 8;
  if (row >= rows_total) {
    const int64_t kv_rows = static_cast<int64_t>(p.shape.batch) * p.shape.kv_heads * p.shape.kv_len;
    if (scratch.dkdv_accum == nullptr || row >= rows_total + 2 * kv_rows) return;
    const int64_t r = row - rows_total;
    const bool is_dv = r >= kv_rows;
    const int64_t kv_row = is_dv ? r - kv_rows : r;
    const int kv = static_cast<int>(kv_row % p.shape.kv_len);
    const int64_t bh = kv_row / p.shape.kv_len;
    const int kv_head = static_cast<int>(bh % p.shape.kv_heads);
    const int batch = static_cast<int>(bh / p.shape.kv_heads);
    const float* tensor = is_dv ? dv_accumulator(p, scratch, kHeadDim) : scratch.dkdv_accum;
    // The tiles' chunk swizzle keys on the tile row: kv blocks and consumer halves start at
    // multiples of 64 keys, so the row of kv is swizzled by kv % 8.
    convert_accumulator_row(tensor + (bh * scratch.kv_pad + kv) * kHeadDim, kv, col, is_dv ? 1.f : p.scale,
                            row_pointer(is_dv ? p.dv : p.dk, batch, kv_head, kv));
    return;
  }
  const int q = static_cast<int>(row % p.shape.q_len);
  const int64_t bh = row / p.shape.q_len;
  const int head = static_cast<int>(bh % p.shape.heads);
  const int batch = static_cast<int>(bh / p.shape.heads);
  // The tiles' chunk swizzle keys on the tile row, whose low 3 bits are q's (q blocks start at
  // multiples of 16), so the accumulator row of q is swizzled by q % 8.
  convert_accumulator_row(scratch.dq_accum + (bh * scratch.q_pad + q) * kHeadDim, q, col, p.scale,
                          row_pointer(p.dq, batch, head, q));
}

}  // namespace harness::kernels::cuda::device
