#pragma once
// Tile configurations of the three fused-attention kernels, one constexpr table per kernel and
// head dim (the `kernel_traits.h` of this folder). Every CTA is kWarps warps; in the forward and
// dQ kernels each warp owns 16 query rows, in the dK/dV kernel 16 key rows, so that every
// accumulator stays in registers (mma.sync m16n8k16) and P / dS feed the next MMA straight from
// registers without a shared-memory round trip.

namespace harness::kernels::cuda {

//! Forward (and its shared-memory plan): Q tile [kBlockM x D] resident, K and V tiles
//! [kBlockN x D] in a kStages-deep cp.async ring.
template <int kHeadDim_>
struct FwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  //! MMA rows per CTA, 16 per warp; the rows are several heads of one GQA group. 128 rows reuse
  //! each K/V tile 128 times. Measured against 64 rows x 2 CTAs per SM (H200, real dims, fwd ms):
  //! dflash 128 anchors 0.214 vs 0.209, 512 anchors 0.805 vs 0.817, causal 1.301 vs 1.417.
  static constexpr int kBlockM = 128;
  //! CTAs per SM the register budget is planned for (up to 255 registers per thread).
  static constexpr int kMinBlocksPerSm = 1;
  //! Keys per kv tile: S for 16 rows x 64 keys is 32 fp32 registers per thread next to 64 for O
  //! (D = 128, 216 registers in all per ptxas); 128 keys would add 32 more, at the 255 limit.
  static constexpr int kBlockN = 64;
  static constexpr int kWarps = kBlockM / 16;
  static constexpr int kThreads = kWarps * 32;
  //! Depth of the K/V ring. Each step waits for its tile, passes one barrier and then refills
  //! the stage the previous step read, so one barrier per step suffices at any depth. Measured
  //! (H200, dflash 128 anchors, real dims): 3 stages 0.214 / 0.649 ms fwd / bwd, 2 stages
  //! 0.214 / 0.645: the loads are already hidden at 2, which needs less shared memory.
  static constexpr int kStages = 2;
  static constexpr int kSmemBytes = (kBlockM + 2 * kStages * kBlockN) * kHeadDim * 2;  // Q + K, V ring
  static_assert(kBlockM == 16 * kWarps, "one warp per 16 query rows");
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim 64 or 128");
  static_assert(kStages >= 2 && kSmemBytes <= 227 * 1024, "a ring of 2+ stages within the 227 KB an sm_90 CTA may use");
};

//! Backward dQ: like the forward, plus dO resident; recomputes P from the saved LSE.
template <int kHeadDim_>
struct BwdDqConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = 128;  //!< 8 warps x 16 rows, like the forward
  static constexpr int kBlockN = 64;   //!< S and dP: 2 x 32 registers beside 64 for dQ (D = 128)
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kStages = 2;  //!< K/V ring depth, as in the forward
  static constexpr int kSmemBytes = (2 * kBlockM + 2 * kStages * kBlockN) * kHeadDim * 2;  // Q, dO + K, V ring
  static_assert(kBlockM == 16 * kWarps, "one warp per 16 query rows");
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim 64 or 128");
  static_assert(kStages >= 2 && kSmemBytes <= 227 * 1024, "a ring of 2+ stages within the 227 KB an sm_90 CTA may use");
};

//! Backward dK/dV: one CTA owns kBlockN keys of one kv head and loops over every query head of
//! its GQA group and every listed q block, so dK and dV are complete sums when the CTA ends: no
//! atomics, no fp32 scratch, deterministic by construction.
template <int kHeadDim_>
struct BwdDkdvConfig {
  static constexpr int kHeadDim = kHeadDim_;
  //! Query rows per step (several heads x block_m positions): S^T and dP^T are 16 keys x 64
  //! queries per warp, 2 x 32 registers beside 2 x 64 for dK and dV (D = 128). This is the
  //! register-bound kernel: ptxas reports 255 registers and a 52-byte spill at D = 128.
  static constexpr int kBlockM = 64;
  static constexpr int kBlockN = 128;  //!< 8 warps x 16 keys; K and V stay resident
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kStages = 2;  //!< Q / dO / row-info ring depth, as in the forward
  //! Per stage and q row: (lse2, delta) as float2 and the 32-byte QueryMaskRow.
  static constexpr int kRowInfoBytes = kBlockM * (8 + 32);
  static constexpr int kSmemBytes = (2 * kBlockN + 2 * kStages * kBlockM) * kHeadDim * 2 + kStages * kRowInfoBytes;
  static_assert(kBlockN == 16 * kWarps, "one warp per 16 key rows");
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim 64 or 128");
  static_assert(kStages >= 2 && kSmemBytes <= 227 * 1024, "a ring of 2+ stages within the 227 KB an sm_90 CTA may use");
};

//! Backward prep (delta = rowsum(dO * O), lse2, mask rows): kHeadDim / 8 threads per row, 16-byte
//! loads.
template <int kHeadDim_>
struct BwdPrepConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kThreadsPerRow = kHeadDim / 8;
  static constexpr int kThreads = 256;
  static constexpr int kRowsPerCta = kThreads / kThreadsPerRow;
};

//! The merged backward launch runs dK/dV and dQ tiles in one grid: the larger plan of the two.
template <int kHeadDim>
constexpr int kBwdSmemBytes = BwdDkdvConfig<kHeadDim>::kSmemBytes > BwdDqConfig<kHeadDim>::kSmemBytes
                                  ? BwdDkdvConfig<kHeadDim>::kSmemBytes
                                  : BwdDqConfig<kHeadDim>::kSmemBytes;

//! Schedule kernel: one CTA ranks up to kMaxRankedItems work items in shared memory with O(n^2)
//! compares (n is 144 for the 128-anchor backward, 384 for 512 anchors); beyond that, grid order.
struct ScheduleConfig {
  static constexpr int kThreads = 1024;
  static constexpr int kMaxRankedItems = 12 * 1024 - 4;  // (items + 4) ints within the 48 KB default
};

}  // namespace harness::kernels::cuda
