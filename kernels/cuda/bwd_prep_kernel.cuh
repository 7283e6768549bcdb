#pragma once
// The backward's prep kernel (device code only), run ahead of either generation's main kernel:
// per query row (b, h, q) of a padded length q_pad, (lse * log2e, delta = rowsum(dO * O)), and per
// query position its mask predicate (QueryMaskRow); padded rows see nothing. For the atomic
// backward (bwd_wgmma_atomic_kernel.cuh) it also zeroes the fp32 accumulators.

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/attention_params.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/kernel_common.cuh"
#include "kernels/cuda/mask_device.cuh"

namespace harness::kernels::cuda::device {

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads)
    attention_bwd_prep_kernel(const __grid_constant__ BwdParams p, const BwdScratch scratch) {
  constexpr int kPerRow = Cfg::kThreadsPerRow;
  const int64_t rows_total = static_cast<int64_t>(p.shape.batch) * p.shape.heads * scratch.q_pad;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * Cfg::kRowsPerCta + threadIdx.x / kPerRow;
  const int chunk = static_cast<int>(threadIdx.x) % kPerRow;
  const int q = static_cast<int>(row % scratch.q_pad);
  const int head = static_cast<int>((row / scratch.q_pad) % p.shape.heads);
  const int batch = static_cast<int>(row / (static_cast<int64_t>(scratch.q_pad) * p.shape.heads));
  const bool real = row < rows_total && q < p.shape.q_len;
  // O and dO have v_head_dim real columns (a padded instantiation has threads for more).
  const bool real_chunk = chunk * 8 < value_head_dim(p.shape);
  // Launched programmatically (attention_launch.cu): the kernel ahead, whatever it is, may have
  // written dO or still read the memory this kernel writes, so wait for it first.
  grid_dependency_wait();
  if (scratch.dq_accum != nullptr && row < rows_total && chunk * 8 < Cfg::kHeadDim) {
    // wgmma_atomic: zero this row's chunk of the fp32 dQ accumulator (same rows, kHeadDim floats
    // each: its head dims are alike, so the row's threads cover them), in place of a memset launch;
    // the stores need nothing loaded, so they go out first.
    float4* accum = reinterpret_cast<float4*>(scratch.dq_accum + row * Cfg::kHeadDim + chunk * 8);
    accum[0] = make_float4(0.f, 0.f, 0.f, 0.f);
    accum[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  if (scratch.dkdv_accum != nullptr) {
    // Split wgmma_atomic: zero the dK/dV accumulators too, strided over the whole grid (they are
    // far smaller than dQ's: 2 * KVH * kv_pad rows against H * q_pad).
    const int64_t chunks = 2ll * p.shape.batch * p.shape.kv_heads * scratch.kv_pad * Cfg::kHeadDim / 4;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    float4* accum = reinterpret_cast<float4*>(scratch.dkdv_accum);
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < chunks; i += stride) {
      accum[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  float sum = 0.f;
  if (real && real_chunk) {
    const uint4 o = load_once_16(row_pointer(p.o, batch, head, q) + chunk * 8);
    const uint4 d = load_once_16(row_pointer(p.dout, batch, head, q) + chunk * 8);
    const uint32_t o2[4] = {o.x, o.y, o.z, o.w};
    const uint32_t d2[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 of = unpack2<Cfg::kElement>(o2[i]);
      const float2 df = unpack2<Cfg::kElement>(d2[i]);
      sum = fmaf(of.x, df.x, fmaf(of.y, df.y, sum));
    }
  }
#pragma unroll
  for (int offset = kPerRow / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (chunk != 0 || row >= rows_total) return;
  const float lse2 = real ? lse_log2(p.lse[(static_cast<int64_t>(batch) * p.shape.heads + head) * p.shape.q_len + q]) : INFINITY;
  scratch.row_stats[row] = make_float2(lse2, sum);
  if (batch == 0 && head == 0) {
    QueryMaskRow mask_row{};
    mask_row.mask = query_mask(p.mask, q);  // q >= q_len: sees nothing
    scratch.mask_rows[q] = mask_row;
  }
}

}  // namespace harness::kernels::cuda::device
