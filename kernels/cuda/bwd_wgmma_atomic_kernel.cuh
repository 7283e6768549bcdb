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
#include "kernels/cuda/bwd_dkdv_mainloop.cuh"
#include "kernels/cuda/bwd_prep_kernel.cuh"
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

//! Writes 8 columns from `col` of an fp32 accumulator row (chunk-swizzled by `swizzle_row`, see
//! dq_column_offset) to `dst` in the element type, times `factor`; nothing where `col` is past the
//! tensor's real `columns` (a padded instantiation has threads for more).
template <ElementType kElement>
__device__ __forceinline__ void convert_accumulator_row(const float* accum_row, int swizzle_row, int col, int columns,
                                                        float factor, const __nv_bfloat16* dst) {
  if (col >= columns) return;
  const unsigned char* bytes = reinterpret_cast<const unsigned char*>(accum_row);
  const float4 a = *reinterpret_cast<const float4*>(bytes + dq_column_offset(swizzle_row, col));
  const float4 b = *reinterpret_cast<const float4*>(bytes + dq_column_offset(swizzle_row, col + 4));
  uint4 out;
  out.x = pack2<kElement>(a.x * factor, a.y * factor);
  out.y = pack2<kElement>(a.z * factor, a.w * factor);
  out.z = pack2<kElement>(b.x * factor, b.y * factor);
  out.w = pack2<kElement>(b.z * factor, b.w * factor);
  *reinterpret_cast<uint4*>(const_cast<__nv_bfloat16*>(dst) + col) = out;
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    attention_bwd_atomic_kernel(const __grid_constant__ BwdParams p, const __grid_constant__ BwdTensorMaps maps,
                                const BwdScratch scratch) {
  using Mainloop = BwdDkdvMainloop<typename Cfg::Dkdv, Cfg::kElement, /*kAtomicDq=*/true, Cfg::kSumDim, Cfg::kSumDimV>;
  extern __shared__ unsigned char smem_raw[];
  const Mainloop mainloop((smem_address(smem_raw) + 1023u) & ~1023u);
  if (threadIdx.x == 0) mainloop.init_barriers();
  __syncthreads();

  const int splits = scratch.dkdv_splits;
  const DkdvWork work = dkdv_work(scratch.schedule[blockIdx.x], p.shape.kv_heads, splits);
  const DkdvSteps steps = Mainloop::steps(p, work.kv_block, work.kv_head, work.split, splits);

  const int warpgroup = warpgroup_index();
  if (warpgroup == 0) {
    // ---- Producer: one thread issues every copy, another adds each step's dQ tile. ----
    warpgroup_registers_decrease<Cfg::kProducerRegisters>();
    if (threadIdx.x == 32) return mainloop.reduce_dq(p, scratch, steps, work.batch);
    if (threadIdx.x != 0) return;
    return mainloop.load(p, maps, scratch, steps, work.kv_block, work.kv_head, work.batch);
  }

  // ---- Consumers ----
  warpgroup_registers_increase<Cfg::kConsumerRegisters>();
  const typename Mainloop::Thread thread = mainloop.thread(p, warpgroup - 1, steps.kv0);
  float acc_dk[Cfg::kHeadDim / 8][4] = {};
  float acc_dv[Cfg::kHeadDim / 8][4] = {};
  mainloop.run_atomic(thread, steps, acc_dk, acc_dv);
  if (splits > 1) return mainloop.add_partial(p, scratch, thread, steps, work.kv_head, work.batch, acc_dk, acc_dv);
  mainloop.store(p, maps, thread, steps, work.kv_head, work.batch, acc_dk, acc_dv);
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
    convert_accumulator_row<Cfg::kElement>(tensor + (bh * scratch.kv_pad + kv) * kHeadDim, kv, col,
                            is_dv ? value_head_dim(p.shape) : p.shape.head_dim, is_dv ? 1.f : p.scale,
                            row_pointer(is_dv ? p.dv : p.dk, batch, kv_head, kv));
    return;
  }
  const int q = static_cast<int>(row % p.shape.q_len);
  const int64_t bh = row / p.shape.q_len;
  const int head = static_cast<int>(bh % p.shape.heads);
  const int batch = static_cast<int>(bh / p.shape.heads);
  // The tiles' chunk swizzle keys on the tile row, whose low 3 bits are q's (q blocks start at
  // multiples of 16), so the accumulator row of q is swizzled by q % 8.
  convert_accumulator_row<Cfg::kElement>(scratch.dq_accum + (bh * scratch.q_pad + q) * kHeadDim, q, col, p.shape.head_dim, p.scale,
                          row_pointer(p.dq, batch, head, q));
}

}  // namespace harness::kernels::cuda::device
