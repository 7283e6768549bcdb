#pragma once
// The launchers of one instantiation (Dims: head dims and element type, attention_config.h):
// config -> tensor maps -> grid -> launch -> launch check, for every kernel that exists at Dims.
// Included only by attention_launch_hd*.cu, which instantiate launch::fwd and launch::bwd for their
// head dims (so each head dim's kernels compile apart and in parallel).

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/attention_config.h"
#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/attention_params.h"
#include "kernels/cuda/bwd_kernels.cuh"
#include "kernels/cuda/bwd_prep_kernel.cuh"
#include "kernels/cuda/bwd_wgmma_atomic_kernel.cuh"
#include "kernels/cuda/bwd_wgmma_kernels.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fwd_kernel.cuh"
#include "kernels/cuda/fwd_wgmma_kernel.cuh"
#include "kernels/cuda/tile_scheduler.cuh"
#include "kernels/cuda/tiling.h"

namespace harness::kernels::cuda::launch {

template <class Cfg>
void fwd_wgmma(const FwdParams& params, const TileShape& tile, const WorkItem* schedule, int64_t ctas, cudaStream_t stream,
               const LaunchOptions& launch) {
  static_assert(Cfg::kBlockM == 64 || Cfg::kBlockM == 128, "one or two warpgroups of 64 rows");
  if (tile.rows != Cfg::kBlockM || tile.block_n != Cfg::kBlockN) {
    throw UnsupportedConfig("fused_cuda attention: forward tiling " + std::to_string(tile.rows) + "x" +
                            std::to_string(tile.block_n) + " does not match its kernel's " + std::to_string(Cfg::kBlockM) +
                            "x" + std::to_string(Cfg::kBlockN));
  }
  const AttentionShape& s = params.shape;
  const int qk = s.head_dim, v = value_head_dim_of(s);
  device::FwdTensorMaps maps;
  maps.q = q_side_map(params.q, s, qk, tile.block_m, tile.heads_packed, "q");
  maps.k = kv_side_map(params.k, s, qk, Cfg::kBlockN, "k");
  maps.v = kv_side_map(params.v, s, v, Cfg::kBlockN, "v");
  maps.o = consumer_rows_map(params.o, s, v, tile, "o");
  // Persistent: as many CTAs as fit at once, each taking the next work item from a counter after
  // the schedule when done with one. The kernel leaves the counter at 0, so one kept with the
  // schedule (zeroed by fwd when it built the schedule) needs no memset launch; one in the scratch
  // is zeroed here.
  const int64_t grid = scheduling::fwd_grid(ctas, Cfg::kMinBlocksPerSm, Cfg::kPersistent, params.max_ctas);
  int* counter = nullptr;
  if (grid < ctas) {
    counter = fwd_item_counter(params, ctas);
    if (params.schedule.items == nullptr) HARNESS_CUDA_CHECK(cudaMemsetAsync(counter, 0, sizeof(int), stream));
  }
  // O in its own tile and Q in two buffers only for persistent CTAs (a CTA with one item has no
  // next Q to load early); H200, persistent, dflash-512, wgmma_m128_n64: 0.385 -> 0.374 ms with
  // the O tile.
  const bool own_o = Cfg::kOwnO && counter != nullptr;
  // Overlaps the kernel ahead (programmatic launch; the kernel waits for it before it reads or
  // writes global memory) unless that is the schedule's kernel or the counter's memset.
  launch_kernel_after(params.schedule.built() && launch.programmatic, device::attention_fwd_wgmma_kernel<Cfg>,
                      "attention_fwd_wgmma_kernel", grid, Cfg::kThreads,
                      Cfg::kSmemBytes + (own_o ? Cfg::kQBytes + Cfg::kOBytes : 0), stream, params, maps, schedule,
                      static_cast<int>(ctas), counter, own_o, static_cast<const uint64_t*>(fwd_mask_bits(params)));
}

template <class Dims>
void fwd(const FwdParams& params, cudaStream_t stream, const LaunchOptions& launch) {
  if (!fwd_kernel_supports(params.kernel, params.shape.head_dim, value_head_dim_of(params.shape))) {
    throw UnsupportedConfig(std::string("fused_cuda attention: forward kernel ") + fwd_kernel_label(params.kernel) +
                            " does not run at head dims " + std::to_string(params.shape.head_dim) + "/" +
                            std::to_string(value_head_dim_of(params.shape)));
  }
  const TileShape tile = tile_shape(tiling::fwd_tile(params.shape.heads, params.shape.kv_heads, params.kernel));
  check_blocks(params.blocks, tile, "forward");
  const int64_t ctas = tiling::fwd_ctas(params.shape.batch, params.shape.heads, params.shape.kv_heads,
                                        params.blocks.num_q_blocks, params.kernel);
  if (ctas == 0) return;
  check_scratch(params.scratch, params.scratch_bytes, fwd_scratch_bytes(params.shape, params.blocks, params.kernel), "forward");
  WorkItem* schedule = params.schedule.items ? params.schedule.items : static_cast<WorkItem*>(params.scratch);
  if (!params.schedule.built()) {
    launch_schedule(device::WorkClass{}, scheduling::fwd_items(params.blocks, ctas), params.shape,
                    fwd_kernel_schedule_order(params.kernel), launch.schedule_order, schedule, stream);
    // A kept schedule's counter: zeroed once, here; the persistent kernels leave it at 0.
    if (params.schedule.items) HARNESS_CUDA_CHECK(cudaMemsetAsync(fwd_item_counter(params, ctas), 0, sizeof(int), stream));
    // The partial blocks' mask bits, kept with the schedule (they depend on the mask and the
    // tiling only).
    if (uint64_t* bits = fwd_mask_bits(params)) launch_row_bits(params.mask, params.blocks, bits, stream);
  }
  if (params.kernel == FwdKernel::mma_m128_n64) {
    if constexpr (Dims::kSumsAll && mma_supports(Dims::kHeadDim, Dims::kHeadDimV)) {
      using Cfg = FwdConfig<Dims>;
      return launch_kernel(device::attention_fwd_kernel<Cfg>, "attention_fwd_kernel", ctas, Cfg::kThreads, Cfg::kSmemBytes,
                           stream, params, static_cast<const WorkItem*>(schedule));
    }
  }
  with_wgmma_fwd_config<Dims>(params.kernel, [&](auto wgmma) {
    fwd_wgmma<typename decltype(wgmma)::Config>(params, tile, schedule, ctas, stream, launch);
  });
}

//! The atomic-dQ backward after the prep kernel (which zeroes the fp32 accumulators): rank the
//! dK/dV work items, the main kernel (all five GEMMs per step, dQ bulk-added), then the
//! accumulators to dQ (and split dK, dV).
template <class Cfg>
void bwd_atomic(const BwdParams& params, const TileShape& dkdv_tile, const tiling::BwdScratch& layout,
                const device::BwdScratch& scratch, cudaStream_t stream, const LaunchOptions& launch) {
  using ConvertCfg = BwdDqConvertConfig<HeadDims<Cfg::kHeadDim, Cfg::kHeadDim, Cfg::kElement>>;
  const AttentionShape& s = params.shape;
  const int qk = s.head_dim, v = value_head_dim_of(s);
  // An empty dK/dV block list contributes no CTA (the self-test times the parts apart this way).
  // The main kernel is launched plainly: launched to overlap the prep kernel (griddepcontrol in its
  // producer and reducer), it ran 1.2-1.4% slower on causal-128 even where nothing overlapped
  // (H200, Nsight Compute); the conversion after it is launched to overlap its end.
  if (layout.dkdv_ctas > 0) {
    const int splits = static_cast<int>(layout.dkdv_splits);
    if (!params.schedule.built()) {
      launch_schedule(scheduling::bwd_atomic_items(params, dkdv_tile, splits), device::WorkClass{}, s, ScheduleOrder::batch,
                      launch.schedule_order, scratch.schedule, stream);
    }
    device::BwdTensorMaps maps;
    maps.q_dkdv = q_side_map(params.q, s, qk, dkdv_tile.block_m, dkdv_tile.heads_packed, "q");
    maps.dout_dkdv = q_side_map(params.dout, s, v, dkdv_tile.block_m, dkdv_tile.heads_packed, "dout");
    maps.k_dkdv = kv_side_map(params.k, s, qk, Cfg::kKeys, "k");
    maps.v_dkdv = kv_side_map(params.v, s, v, Cfg::kKeys, "v");
    maps.dk = kv_side_map(params.dk, s, qk, 64, "dk");  // one consumer's 64 keys
    maps.dv = kv_side_map(params.dv, s, v, 64, "dv");
    launch_kernel(device::attention_bwd_atomic_kernel<Cfg>, "attention_bwd_atomic_kernel", layout.dkdv_ctas * splits,
                  Cfg::kThreads, Cfg::kSmemBytes, stream, params, maps, scratch);
  }
  // dQ's rows, then with split kv blocks dK's and dV's.
  const int64_t rows = static_cast<int64_t>(s.batch) * s.heads * s.q_len +
                       (scratch.dkdv_accum != nullptr ? 2ll * s.batch * s.kv_heads * s.kv_len : 0);
  const int64_t ctas = (rows + ConvertCfg::kRowsPerCta - 1) / ConvertCfg::kRowsPerCta;
  launch_kernel_after(launch.programmatic, device::attention_bwd_dq_convert_kernel<ConvertCfg>,
                      "attention_bwd_dq_convert_kernel", ctas, ConvertCfg::kThreads, 0, stream, params, scratch);
}

template <class Dims>
void bwd(const BwdParams& params, cudaStream_t stream, const LaunchOptions& launch) {
  using PrepCfg = BwdPrepConfig<Dims>;
  const AttentionShape& s = params.shape;
  const int qk = s.head_dim, v = value_head_dim_of(s);
  const TileShape dq_tile = tile_shape(tiling::bwd_dq_tile(s.heads, s.kv_heads, qk));
  const TileShape dkdv_tile = tile_shape(tiling::bwd_dkdv_tile(s.heads, s.kv_heads, qk));
  check_blocks(params.dq_blocks, dq_tile, "dQ");
  check_blocks(params.dkdv_blocks, dkdv_tile, "dK/dV");
  if (!bwd_kernel_supports(params.kernel, qk, v)) {
    throw UnsupportedConfig(std::string("fused_cuda attention: backward kernel ") + bwd_kernel_label(params.kernel) +
                            " does not run at head dims " + std::to_string(qk) + "/" + std::to_string(v));
  }
  if (s.batch == 0 || s.q_len == 0) return;
  const tiling::BwdScratch layout = bwd_layout(s, params.dq_blocks, params.dkdv_blocks, params.kernel);
  check_scratch(params.scratch, params.scratch_bytes, layout.bytes, "backward");
  auto* base = static_cast<unsigned char*>(params.scratch);
  device::BwdScratch scratch;
  scratch.row_stats = reinterpret_cast<float2*>(base + layout.row_stats);
  scratch.mask_rows = reinterpret_cast<device::QueryMaskRow*>(base + layout.mask_rows);
  scratch.schedule = params.schedule.items ? params.schedule.items : reinterpret_cast<WorkItem*>(base + layout.schedule);
  // The key bit table follows the schedule, in the kept buffer or in the scratch alike.
  auto* kept = reinterpret_cast<unsigned char*>(scratch.schedule);
  scratch.key_bits = kept + (layout.key_bits - layout.schedule);
  scratch.row_bits = reinterpret_cast<uint64_t*>(kept + (layout.row_bits - layout.schedule));
  scratch.q_pad = static_cast<int>(tiling::padded_q_len(s.q_len));
  scratch.dq_accum = layout.dq_accum_bytes ? reinterpret_cast<float*>(base + layout.dq_accum) : nullptr;
  scratch.dkdv_accum = layout.dkdv_accum_bytes ? reinterpret_cast<float*>(base + layout.dkdv_accum) : nullptr;
  scratch.kv_pad = params.dkdv_blocks.num_kv_blocks * dkdv_tile.block_n;
  scratch.dkdv_splits = static_cast<int32_t>(layout.dkdv_splits);

  const int64_t rows = static_cast<int64_t>(s.batch) * s.heads * scratch.q_pad;
  const int64_t prep_ctas = (rows + PrepCfg::kRowsPerCta - 1) / PrepCfg::kRowsPerCta;
  launch_kernel_after(launch.programmatic, device::attention_bwd_prep_kernel<PrepCfg>, "attention_bwd_prep_kernel",
                      prep_ctas, PrepCfg::kThreads, 0, stream, params, scratch);
  // The partial steps' mask bits (mask_bits.cuh), kept with the schedule like it: the dK/dV
  // kernels' and the deterministic dQ tile's. Built whatever the kernel, since the merged schedule's
  // buffer is shared by wgmma and mma (mma reads no table, but whichever of the two builds the
  // schedule first must leave the tables for the other).
  if (!params.schedule.built() && params.dkdv_blocks.num_kv_blocks > 0) {
    launch_key_bits(params.mask, params.dkdv_blocks, scratch.key_bits, stream);
  }
  if (!params.schedule.built() && params.kernel != BwdKernel::wgmma_atomic && params.dq_blocks.num_q_blocks > 0) {
    launch_row_bits(params.mask, params.dq_blocks, scratch.row_bits, stream);
  }

  if (params.kernel == BwdKernel::wgmma_atomic) {
    if constexpr (Dims::kHeadDim == Dims::kHeadDimV && Dims::kHeadDim <= 128) {
      return bwd_atomic<BwdWgmmaAtomicConfig<Dims, 2>>(params, dkdv_tile, layout, scratch, stream, launch);
    }
  }
  // An empty block list contributes no CTA (the self-test times the two kinds apart this way).
  const int64_t ctas = layout.dkdv_ctas + layout.dq_ctas;
  if (ctas == 0) return;
  if (!params.schedule.built()) {
    launch_schedule(scheduling::bwd_dkdv_items(params, dkdv_tile), scheduling::bwd_dq_items(params, dq_tile), s,
                    ScheduleOrder::batch, launch.schedule_order, scratch.schedule, stream);
  }

  if (params.kernel == BwdKernel::mma) {
    if constexpr (Dims::kSumsAll && mma_supports(Dims::kHeadDim, Dims::kHeadDimV)) {
      using DqCfg = BwdDqConfig<Dims>;
      using DkdvCfg = BwdDkdvConfig<Dims>;
      return launch_kernel(device::attention_bwd_kernel<DkdvCfg, DqCfg>, "attention_bwd_kernel", ctas, DkdvCfg::kThreads,
                           kBwdSmemBytes<Dims>, stream, params, scratch);
    }
  }
  using Cfg = BwdWgmmaConfig<Dims, 2>;
  device::BwdTensorMaps maps;
  maps.q_dkdv = q_side_map(params.q, s, qk, dkdv_tile.block_m, dkdv_tile.heads_packed, "q");
  maps.dout_dkdv = q_side_map(params.dout, s, v, dkdv_tile.block_m, dkdv_tile.heads_packed, "dout");
  maps.k_dkdv = kv_side_map(params.k, s, qk, Cfg::kDkdvKeys, "k");
  maps.v_dkdv = kv_side_map(params.v, s, v, Cfg::kDkdvKeys, "v");
  maps.dk = kv_side_map(params.dk, s, qk, 64, "dk");  // one consumer's 64 keys, or one column block's
  maps.dv = kv_side_map(params.dv, s, v, 64, "dv");
  maps.q_dq = q_side_map(params.q, s, qk, dq_tile.block_m, dq_tile.heads_packed, "q");
  maps.dout_dq = q_side_map(params.dout, s, v, dq_tile.block_m, dq_tile.heads_packed, "dout");
  maps.k_dq = kv_side_map(params.k, s, qk, Cfg::kDqBlockN, "k");
  maps.v_dq = kv_side_map(params.v, s, v, Cfg::kDqBlockN, "v");
  maps.dq = consumer_rows_map(params.dq, s, qk, dq_tile, "dq");
  launch_kernel(device::attention_bwd_wgmma_kernel<Cfg>, "attention_bwd_wgmma_kernel", ctas, Cfg::kThreads, Cfg::kSmemBytes,
                stream, params, maps, scratch);
}

}  // namespace harness::kernels::cuda::launch

//! Instantiates the launchers of one head-dims pair in both element types (attention_launch_hd*.cu);
//! the last two arguments: the columns the sums read (HeadDims::kSumDim, kSumDimV).
#define HARNESS_ATTENTION_LAUNCHERS_SUMMING(HEAD_DIM, V_HEAD_DIM, SUM_DIM, SUM_DIM_V)                                      \
  namespace harness::kernels::cuda::launch {                                                                            \
  template void fwd<HeadDims<HEAD_DIM, V_HEAD_DIM, ElementType::bf16, SUM_DIM, SUM_DIM_V>>(const FwdParams&, cudaStream_t, \
                                                                                           const LaunchOptions&);         \
  template void fwd<HeadDims<HEAD_DIM, V_HEAD_DIM, ElementType::fp16, SUM_DIM, SUM_DIM_V>>(const FwdParams&, cudaStream_t, \
                                                                                           const LaunchOptions&);         \
  template void bwd<HeadDims<HEAD_DIM, V_HEAD_DIM, ElementType::bf16, SUM_DIM, SUM_DIM_V>>(const BwdParams&, cudaStream_t, \
                                                                                           const LaunchOptions&);         \
  template void bwd<HeadDims<HEAD_DIM, V_HEAD_DIM, ElementType::fp16, SUM_DIM, SUM_DIM_V>>(const BwdParams&, cudaStream_t, \
                                                                                           const LaunchOptions&);         \
  }
#define HARNESS_ATTENTION_LAUNCHERS(HEAD_DIM, V_HEAD_DIM) HARNESS_ATTENTION_LAUNCHERS_SUMMING(HEAD_DIM, V_HEAD_DIM, HEAD_DIM, V_HEAD_DIM)
