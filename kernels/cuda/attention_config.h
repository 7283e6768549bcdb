#pragma once
// Tile configurations of the three fused-attention kernels, one constexpr table per kernel and
// head dim (the `kernel_traits.h` of this folder). Every CTA is kWarps warps; in the forward and
// dQ kernels each warp owns 16 query rows, in the dK/dV kernel 16 key rows, so that every
// accumulator stays in registers (mma.sync m16n8k16) and P / dS feed the next MMA straight from
// registers without a shared-memory round trip.

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace harness::kernels::cuda {

//! The forward kernels, the autotuner's candidates. Names (fwd_kernel_name) are what the dispatch
//! trace and the tuning cache store. Times: H200, B1 H32 KV8 D128 bf16 unless said otherwise,
//! "dflash-N" = the dflash mask with N anchors over a context of 8192 in 4 documents, "causal-128"
//! = causal at Q 2048, KV 10240 (harness_attention_selftest, kernels alone, L2 flushed).
enum class FwdKernel : int32_t {
  mma_m128_n64 = 0,     //!< mma.sync + ldmatrix + cp.async, 8 warps x 16 rows, 64-key tiles (fwd_kernel.cuh)
  wgmma_m128_n128 = 1,  //!< TMA + wgmma, warp-specialized, 2 consumer warpgroups, 128-key tiles (fwd_wgmma_kernel.cuh)
  wgmma_m128_n64 = 2,   //!< same, 64-key tiles
  wgmma_m64_n64 = 3,    //!< same, 1 consumer warpgroup of 64 rows, 64-key tiles, 2 CTAs per SM
  //! wgmma_m128_n128 in FlashAttention-3's schedule: P V of the previous step issued with S of
  //! this one (the softmax runs while P V is on the tensor cores), the two consumer warpgroups
  //! taking turns to issue their MMAs (ping-pong), a 3-deep K/V ring (a stage is held from S_j to
  //! P_j V_j, one turn longer). The fastest forward on near-dense masks: causal-128 0.470-0.483 ms
  //! against wgmma_m128_n128's 0.52.
  wgmma_m128_n128_pingpong = 4,
  //! wgmma_m64_n64 (1 consumer warpgroup, 2 CTAs per SM) in the same overlapped schedule without
  //! turns: S of step j and P V of step j - 1 issued together, the softmax of S_j while P V runs;
  //! K and V released apart, so a 2-deep ring holds. As fast as wgmma_m64_n64 on dflash (the other
  //! CTA on the SM already fills the softmax gaps), 4% faster on causal-128 (0.595 ms against 0.620)
  //! and on the 8k sliding-window and document masks; 0.370 ms at dflash-512 against
  //! wgmma_m128_n64's 0.374.
  wgmma_m64_n64_overlap = 5,
  //! wgmma_m64_n64_overlap on 128-key tiles: half the steps per item, so half the per-step
  //! barriers, waits and row reductions, for head_dim 64 where those weigh most against the
  //! products (2 CTAs per SM there; 1 at head_dim 128, where the K/V ring needs 128 KB). At
  //! head_dim 64 the fastest forward on dflash-512 (0.262 ms against the ping-pong's 0.264 and
  //! wgmma_m64_n64_overlap's 0.269).
  wgmma_m64_n128_overlap = 6,
  //! wgmma_m64_n64_overlap, wgmma_m128_n128_pingpong and wgmma_m64_n128_overlap with their CTA
  //! table kv head by kv head (ScheduleOrder::kv_head): the CTAs running at once read one kv
  //! head's K/V instead of all of them, at the cost of a launch that no longer ends on the
  //! cheapest items of every head. Neither order wins everywhere (Nsight Compute, kernel µs, batch
  //! order -> kv head order: the overlapped forward dflash-512 311.5 -> 298.9, dflash-512 at
  //! head_dim 64 235.0 -> 228.9, but dflash-128 82.4 -> 90.1; the ping-pong document_causal-8k
  //! 283.6 -> 275.1, sliding_window-8k 289.3 -> 281.0, but dflash-512 328.3 -> 349.3), so both are
  //! candidates and the autotuner picks.
  wgmma_m64_n64_overlap_kv_major = 7,
  wgmma_m128_n128_pingpong_kv_major = 8,
  wgmma_m64_n128_overlap_kv_major = 9,
};

//! The order of a launch's CTA table (tile_scheduler.cuh), longest first within each group:
//! `interleaved`, each item's copies for every batch and head in turn; `batch`, batch by batch;
//! `kv_head`, batch by batch and within a batch kv head by kv head. `kernel_default` (a launch
//! option only): the order the kernel runs with (fwd_kernel_schedule_order; the backwards `batch`).
enum class ScheduleOrder : int32_t { kernel_default = -1, interleaved = 0, batch = 1, kv_head = 2 };

//! The names of the orders (launch options, the dispatch record); "" for kernel_default.
constexpr const char* schedule_order_label(ScheduleOrder order) {
  switch (order) {
    case ScheduleOrder::kernel_default: return "";
    case ScheduleOrder::interleaved: return "interleaved";
    case ScheduleOrder::batch: return "batch";
    case ScheduleOrder::kv_head: return "kv_head";
  }
  return "unknown";
}

//! The kernel a forward candidate launches: a `_kv_major` twin's base kernel, else itself. A twin
//! differs from its base only in its CTA table's order (and so in its kept schedule).
constexpr FwdKernel fwd_kernel_base(FwdKernel kernel) {
  switch (kernel) {
    case FwdKernel::wgmma_m64_n64_overlap_kv_major: return FwdKernel::wgmma_m64_n64_overlap;
    case FwdKernel::wgmma_m128_n128_pingpong_kv_major: return FwdKernel::wgmma_m128_n128_pingpong;
    case FwdKernel::wgmma_m64_n128_overlap_kv_major: return FwdKernel::wgmma_m64_n128_overlap;
    default: return kernel;
  }
}

//! The schedule order a forward kernel runs with (the backwards run `batch`: the kv head order
//! measured 1-31% slower on every backward, H200).
constexpr ScheduleOrder fwd_kernel_schedule_order(FwdKernel kernel) {
  return fwd_kernel_base(kernel) != kernel ? ScheduleOrder::kv_head : ScheduleOrder::batch;
}

//! The backward kernels (autotuner candidates); all read the dK/dV BlockMask, the first two the
//! dQ one too.
enum class BwdKernel : int32_t {
  mma = 0,    //!< mma.sync + ldmatrix + cp.async, merged dK/dV + dQ launch (bwd_kernels.cuh)
  wgmma = 1,  //!< TMA + wgmma, warp-specialized, the same merged launch (bwd_wgmma_kernels.cuh)
  //! TMA + wgmma, one CTA per kv block and kv head doing all 5 GEMMs per (q block, head pack); dQ
  //! summed in fp32 global memory by bulk reduce-add (cp.reduce.async.bulk), so not bitwise
  //! reproducible (bwd_wgmma_atomic_kernel.cuh). FlashAttention-3's backward structure.
  wgmma_atomic = 2,
};

//! Query rows per CTA and keys per step of a forward kernel: the tiling its BlockMask must have
//! (after head packing, see attention_launch.cu). Also what the memory model reads.
struct FwdKernelTiling {
  int rows;
  int block_n;
};
constexpr FwdKernelTiling fwd_kernel_tiling(FwdKernel kernel) {
  switch (kernel) {
    case FwdKernel::mma_m128_n64: return {128, 64};
    case FwdKernel::wgmma_m128_n128: return {128, 128};
    case FwdKernel::wgmma_m128_n64: return {128, 64};
    case FwdKernel::wgmma_m64_n64: return {64, 64};
    case FwdKernel::wgmma_m128_n128_pingpong: return {128, 128};
    case FwdKernel::wgmma_m64_n64_overlap: return {64, 64};
    case FwdKernel::wgmma_m64_n128_overlap: return {64, 128};
    case FwdKernel::wgmma_m64_n64_overlap_kv_major:
    case FwdKernel::wgmma_m128_n128_pingpong_kv_major:
    case FwdKernel::wgmma_m64_n128_overlap_kv_major: return fwd_kernel_tiling(fwd_kernel_base(kernel));
  }
  return {128, 64};
}
//! Whether a forward kernel reads its partial blocks' masks as bits from a table built with its
//! schedule (the overlapped kernels, FwdWgmmaConfig::kOverlap: fwd_wgmma_kernel.cuh, mask_bits.cuh)
//! rather than evaluating the mask per score.
constexpr bool fwd_kernel_reads_mask_bits(FwdKernel kernel) {
  const FwdKernel base = fwd_kernel_base(kernel);
  return base == FwdKernel::wgmma_m128_n128_pingpong || base == FwdKernel::wgmma_m64_n64_overlap ||
         base == FwdKernel::wgmma_m64_n128_overlap;
}
//! The names the dispatch trace, the tuning cache and CudaKernelChoice use.
constexpr const char* fwd_kernel_label(FwdKernel kernel) {
  switch (kernel) {
    case FwdKernel::mma_m128_n64: return "mma_m128_n64";
    case FwdKernel::wgmma_m128_n128: return "wgmma_m128_n128";
    case FwdKernel::wgmma_m128_n64: return "wgmma_m128_n64";
    case FwdKernel::wgmma_m64_n64: return "wgmma_m64_n64";
    case FwdKernel::wgmma_m128_n128_pingpong: return "wgmma_m128_n128_pingpong";
    case FwdKernel::wgmma_m64_n64_overlap: return "wgmma_m64_n64_overlap";
    case FwdKernel::wgmma_m64_n128_overlap: return "wgmma_m64_n128_overlap";
    case FwdKernel::wgmma_m64_n64_overlap_kv_major: return "wgmma_m64_n64_overlap_kv_major";
    case FwdKernel::wgmma_m128_n128_pingpong_kv_major: return "wgmma_m128_n128_pingpong_kv_major";
    case FwdKernel::wgmma_m64_n128_overlap_kv_major: return "wgmma_m64_n128_overlap_kv_major";
  }
  return "unknown";
}
//! Every forward kernel, the default (what runs untuned) first.
constexpr FwdKernel kFwdKernels[] = {FwdKernel::wgmma_m128_n128, FwdKernel::wgmma_m128_n64, FwdKernel::wgmma_m64_n64,
                                     FwdKernel::mma_m128_n64, FwdKernel::wgmma_m128_n128_pingpong,
                                     FwdKernel::wgmma_m64_n64_overlap, FwdKernel::wgmma_m64_n64_overlap_kv_major,
                                     FwdKernel::wgmma_m128_n128_pingpong_kv_major, FwdKernel::wgmma_m64_n128_overlap,
                                     FwdKernel::wgmma_m64_n128_overlap_kv_major};
//! Untuned forward: the 128x128 wgmma kernel, fastest on near-dense masks (H200, causal 128 anchors:
//! 0.520 ms against 0.595 / 0.613 / 1.313 for the others) and within 22% of the best on dflash
//! (0.135 ms against wgmma_m64_n64's 0.111 at 128 anchors), which the autotuner picks there.
constexpr FwdKernel kDefaultFwdKernel = kFwdKernels[0];
constexpr const char* bwd_kernel_label(BwdKernel kernel) {
  switch (kernel) {
    case BwdKernel::mma: return "mma";
    case BwdKernel::wgmma: return "wgmma";
    case BwdKernel::wgmma_atomic: return "wgmma_atomic";
  }
  return "unknown";
}
//! Whether a backward kernel gives bitwise-identical gradients on every run (no atomics).
constexpr bool bwd_kernel_deterministic(BwdKernel kernel) {
  return kernel != BwdKernel::wgmma_atomic;
}
//! Every backward kernel, the default first: the atomic-dQ wgmma kernel (5 GEMMs per pair instead
//! of 7), then the deterministic ones.
constexpr BwdKernel kBwdKernels[] = {BwdKernel::wgmma_atomic, BwdKernel::wgmma, BwdKernel::mma};
constexpr BwdKernel kDefaultBwdKernel = kBwdKernels[0];
//! The candidates when `deterministic` is asked for, the default first: the wgmma one, faster than
//! mma.sync on every measured case.
constexpr BwdKernel kDeterministicBwdKernels[] = {BwdKernel::wgmma, BwdKernel::mma};
constexpr BwdKernel kDefaultDeterministicBwdKernel = kDeterministicBwdKernels[0];

//! The kernel of `kernels` whose label is `name`; false when none is.
template <typename Kernel, std::size_t N>
constexpr bool kernel_from_label(std::string_view name, const Kernel (&kernels)[N], const char* (*label)(Kernel),
                                 Kernel* found) {
  for (const Kernel kernel : kernels) {
    if (name == label(kernel)) {
      *found = kernel;
      return true;
    }
  }
  return false;
}

// ---- Element types and head dims ---------------------------------------------------------------

//! The element type of q, k, v, o and the gradients (the kernels compute in fp32 either way: P and
//! dS are rounded to it for their products, as in every flash kernel).
enum class ElementType : int32_t { bf16 = 0, fp16 = 1 };
constexpr const char* element_type_label(ElementType type) { return type == ElementType::fp16 ? "fp16" : "bf16"; }

//! The TMA + wgmma kernels are instantiated at head dims that are multiples of 64 and serve a real
//! head dim by the next one up: TMA zero-fills the columns past the real ones on load (zeros add
//! nothing to Q K^T, and give output columns nobody stores) and stores none of them. So head_dim 96
//! runs the 128 tiles, 80 too, 160 the 192 ones. The mma.sync kernels load rows with cp.async and
//! take real head dims 64 and 128 only.
constexpr int padded_head_dim(int head_dim) { return (head_dim + 63) / 64 * 64; }

//! Real head dims up to 96 (FlashAttention-3's 96; 72, 80, 88 too) have an instantiation of their
//! own on the 128 tiles whose two head-dim sums, S = Q K^T and dP = dO V^T, stop after 96 columns:
//! 6 wgmma k-steps of 16 instead of 8, the 32 zero columns never multiplied. The products whose
//! output columns are the head dim (O = P V, dV, dK, dQ) still run 128 wide: wgmma's N of a
//! 128-byte swizzled operand whose head dim is contiguous (V, dO, Q, K) comes in 64-column blocks.
constexpr int kSumDim96 = 96;
constexpr bool sums_96_columns(int head_dim, int v_head_dim) {
  return padded_head_dim(head_dim) == 128 && head_dim <= kSumDim96 && v_head_dim <= kSumDim96;
}

//! A kernel instantiation's operands: the q·k head dim, the v head dim (both padded to 64), the
//! element type, and the columns of the q·k and v head dims that the sums over them read (S = Q K^T
//! over kSumDim, dP = dO V^T over kSumDimV; multiples of 16, the rest of the tile's columns zeros
//! that TMA filled): the padded head dims but for the 96 instantiation (sums_96_columns).
template <int kHeadDim_, int kHeadDimV_, ElementType kElement_, int kSumDim_ = kHeadDim_, int kSumDimV_ = kHeadDimV_>
struct HeadDims {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr ElementType kElement = kElement_;
  static constexpr int kSumDim = kSumDim_;
  static constexpr int kSumDimV = kSumDimV_;
  //! Whether the sums read every column of the tiles (the mma.sync kernels have no shorter sums).
  static constexpr bool kSumsAll = kSumDim == kHeadDim && kSumDimV == kHeadDimV;
  static_assert(kHeadDim % 64 == 0 && kHeadDimV % 64 == 0 && kHeadDim <= 256 && kHeadDimV <= kHeadDim,
                "head dims padded to 64, at most 256, v's at most q·k's (O is staged in Q's tile)");
  static_assert(kSumDim % 16 == 0 && kSumDimV % 16 == 0 && kSumDim <= kHeadDim && kSumDimV <= kHeadDimV &&
                    kSumDim > kHeadDim - 64 && kSumDimV > kHeadDimV - 64,
                "sums over whole wgmma k-steps, within the last 64-column block");
};

//! The padded (q·k, v) head dims with kernels, each in both element types: FlashAttention-3's
//! head dims (64; 96 and 128 through 128; 192; 256) and DeepSeek's MLA attention (q·k 192, v 128).
struct HeadDimPair {
  int head_dim;
  int v_head_dim;
};
constexpr HeadDimPair kHeadDimPairs[] = {{64, 64}, {128, 128}, {192, 192}, {256, 256}, {192, 128}};
//! Whether real head dims (multiples of 8, for 16-byte rows) have kernels, and which text names them.
constexpr bool head_dims_have_kernels(int head_dim, int v_head_dim) {
  if (head_dim <= 0 || v_head_dim <= 0 || head_dim % 8 != 0 || v_head_dim % 8 != 0) return false;
  for (const HeadDimPair pair : kHeadDimPairs) {
    if (pair.head_dim == padded_head_dim(head_dim) && pair.v_head_dim == padded_head_dim(v_head_dim)) return true;
  }
  return false;
}
constexpr const char* kSupportedHeadDimsText =
    "q·k and v head dims multiples of 8 whose round-ups to 64 are 64/64, 128/128, 192/192, 256/256 or 192/128 (so "
    "64, 96, 128, 192, 256 alike, and 192/128); bf16 or fp16";

//! Whether the mma.sync generation has kernels for real head dims (64 or 128, q·k and v alike).
constexpr bool mma_supports(int head_dim, int v_head_dim) {
  return head_dim == v_head_dim && (head_dim == 64 || head_dim == 128);
}

// ---- Backward tilings ---------------------------------------------------------------------------

//! Above a padded q·k head dim of 128 a consumer warpgroup cannot hold its dK and dV rows (64 keys
//! x 2 x 192 or 256 fp32 columns: 192-256 registers a thread) nor a dQ tile beside S and dP, so
//! the Hopper backward splits columns: a dK/dV tile is 64 keys and a dQ tile 64 rows that both
//! consumers share, each computing S (S^T) and dP in full and keeping the 64-column blocks of the
//! head dims it owns (every other one). The BlockMasks follow these tilings.
constexpr bool bwd_splits_columns(int head_dim) { return padded_head_dim(head_dim) > 128; }
constexpr int kBwdDkdvRows = 64;  //!< query rows per dK/dV step (packed heads x positions)
constexpr int bwd_dkdv_keys(int head_dim) { return bwd_splits_columns(head_dim) ? 64 : 128; }
constexpr int bwd_dq_rows(int head_dim) { return bwd_splits_columns(head_dim) ? 64 : 128; }
constexpr int kBwdDqBlockN = 64;  //!< keys per dQ step

// ---- mma.sync generation ------------------------------------------------------------------------

//! Forward (and its shared-memory plan): Q tile [kBlockM x D] resident, K and V tiles
//! [kBlockN x D] in a kStages-deep cp.async ring.
template <class Dims>
struct FwdConfig {
  static constexpr int kHeadDim = Dims::kHeadDim;
  static constexpr ElementType kElement = Dims::kElement;
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
  static_assert(mma_supports(Dims::kHeadDim, Dims::kHeadDimV), "head_dim 64 or 128, q·k and v alike");
  static_assert(kStages >= 2 && kSmemBytes <= 227 * 1024, "a ring of 2+ stages within the 227 KB an sm_90 CTA may use");
};

//! Backward dQ: like the forward, plus dO resident; recomputes P from the saved LSE.
template <class Dims>
struct BwdDqConfig {
  static constexpr int kHeadDim = Dims::kHeadDim;
  static constexpr ElementType kElement = Dims::kElement;
  static constexpr int kBlockM = 128;  //!< 8 warps x 16 rows, like the forward
  static constexpr int kBlockN = kBwdDqBlockN;  //!< S and dP: 2 x 32 registers beside 64 for dQ (D = 128)
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kStages = 2;  //!< K/V ring depth, as in the forward
  static constexpr int kSmemBytes = (2 * kBlockM + 2 * kStages * kBlockN) * kHeadDim * 2;  // Q, dO + K, V ring
  static_assert(kBlockM == 16 * kWarps, "one warp per 16 query rows");
  static_assert(mma_supports(Dims::kHeadDim, Dims::kHeadDimV), "head_dim 64 or 128, q·k and v alike");
  static_assert(kBlockM == bwd_dq_rows(kHeadDim), "the dQ tiling (and so BlockMask) of the Hopper backwards");
  static_assert(kStages >= 2 && kSmemBytes <= 227 * 1024, "a ring of 2+ stages within the 227 KB an sm_90 CTA may use");
};

//! Backward dK/dV: one CTA owns kBlockN keys of one kv head and loops over every query head of
//! its GQA group and every listed q block, so dK and dV are complete sums when the CTA ends: no
//! atomics, no fp32 scratch, deterministic by construction.
template <class Dims>
struct BwdDkdvConfig {
  static constexpr int kHeadDim = Dims::kHeadDim;
  static constexpr ElementType kElement = Dims::kElement;
  //! Query rows per step (several heads x block_m positions): S^T and dP^T are 16 keys x 64
  //! queries per warp, 2 x 32 registers beside 2 x 64 for dK and dV (D = 128). This is the
  //! register-bound kernel: at D = 128 ptxas reports 255 registers and spills (32 bytes stored, 48 loaded;
  //! ptxas -v, CUDA 13.0).
  static constexpr int kBlockM = kBwdDkdvRows;
  static constexpr int kBlockN = 128;  //!< 8 warps x 16 keys; K and V stay resident
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kStages = 2;  //!< Q / dO / row-info ring depth, as in the forward
  //! Per stage and q row: (lse2, delta) as float2 and the 32-byte QueryMaskRow.
  static constexpr int kRowInfoBytes = kBlockM * (8 + 32);
  static constexpr int kSmemBytes = (2 * kBlockN + 2 * kStages * kBlockM) * kHeadDim * 2 + kStages * kRowInfoBytes;
  static_assert(kBlockN == 16 * kWarps, "one warp per 16 key rows");
  static_assert(mma_supports(Dims::kHeadDim, Dims::kHeadDimV), "head_dim 64 or 128, q·k and v alike");
  static_assert(kBlockN == bwd_dkdv_keys(kHeadDim), "the dK/dV tiling (and so BlockMask) of the Hopper backwards");
  static_assert(kStages >= 2 && kSmemBytes <= 227 * 1024, "a ring of 2+ stages within the 227 KB an sm_90 CTA may use");
};

//! The merged backward launch runs dK/dV and dQ tiles in one grid: the larger plan of the two.
template <class Dims>
constexpr int kBwdSmemBytes = BwdDkdvConfig<Dims>::kSmemBytes > BwdDqConfig<Dims>::kSmemBytes
                                  ? BwdDkdvConfig<Dims>::kSmemBytes
                                  : BwdDqConfig<Dims>::kSmemBytes;

// ---- Hopper forward -----------------------------------------------------------------------------

//! Shared memory of a wgmma forward CTA of `block_m` rows: 1024 bytes of slack to align the tiles
//! (the dynamic smem base is only 16-byte aligned), Q, a `stages`-deep ring of K and V tiles of
//! `block_n` keys, the barriers (Q full and empty per Q buffer; work item full, empty; K, V full;
//! K, V empty) and the 16-byte work item slot.
constexpr int fwd_wgmma_smem_bytes(int block_m, int block_n, int stages, int head_dim, int v_head_dim) {
  return 1024 + block_m * head_dim * 2 + stages * block_n * (head_dim + v_head_dim) * 2 + 8 * (6 + 4 * stages) + 16;
}
//! What the SM gives one CTA: 228 KB of shared memory, of which the system reserves 1 KB per CTA.
constexpr bool fits_sm(int smem_bytes, int ctas_per_sm) { return ctas_per_sm * (smem_bytes + 1024) <= 228 * 1024; }

//! A wgmma forward's configuration at a head dim: keys per step, consumer warpgroups (64 rows
//! each), K/V ring depth, CTAs per SM it is planned for, overlapped schedule; consumers = 0 where
//! the kernel has none (its ring does not fit in shared memory even at 2 stages, or its consumer's
//! registers would spill).
struct FwdWgmmaPlan {
  int block_n;
  int consumers;
  int stages;
  int min_blocks_per_sm;
  bool overlap;
};
//! Each kernel's preferred configuration (the one measured at head_dim 128, and at 64 for
//! wgmma_m64_n128_overlap's 2 CTAs per SM), then at larger head dims first one CTA per SM, then
//! fewer stages, as long as the ring fits.
constexpr FwdWgmmaPlan fwd_wgmma_plan(FwdKernel kernel, int head_dim, int v_head_dim) {
  FwdWgmmaPlan plan{0, 0, 0, 0, false};
  switch (fwd_kernel_base(kernel)) {
    case FwdKernel::wgmma_m128_n128: plan = {128, 2, 2, 1, false}; break;
    case FwdKernel::wgmma_m128_n64: plan = {64, 2, 3, 1, false}; break;
    case FwdKernel::wgmma_m64_n64: plan = {64, 1, 2, 2, false}; break;
    case FwdKernel::wgmma_m128_n128_pingpong: plan = {128, 2, 3, 1, true}; break;
    case FwdKernel::wgmma_m64_n64_overlap: plan = {64, 1, 2, 2, true}; break;
    case FwdKernel::wgmma_m64_n128_overlap: plan = {128, 1, 2, 2, true}; break;
    default: return plan;  // the mma.sync forward
  }
  auto fits = [&] {
    return fits_sm(fwd_wgmma_smem_bytes(64 * plan.consumers, plan.block_n, plan.stages, head_dim, v_head_dim),
                   plan.min_blocks_per_sm);
  };
  if (!fits()) plan.min_blocks_per_sm = 1;
  while (!fits() && plan.stages > 2) --plan.stages;
  if (!fits()) plan.consumers = 0;
  // One overlapping consumer holds O and two S tiles: at a v head dim of 256 ptxas spills
  // (wgmma_m64_n64_overlap: 12 bytes stored, 32 loaded per thread, sm_90a, CUDA 13); at 192 it
  // does not, with 128 keys either.
  if (plan.overlap && plan.consumers == 1 && v_head_dim > 192) plan.consumers = 0;
  return plan;
}

//! Warp-specialized Hopper forward (fwd_wgmma_kernel.cuh): one producer warpgroup (TMA) and
//! kConsumers warpgroups of 64 query rows (wgmma m64), K/V in a kStages-deep ring of kBlockN keys.
template <class Dims, int kBlockN_, int kConsumers_, int kStages_, int kMinBlocksPerSm_, bool kOverlap_ = false>
struct FwdWgmmaConfig {
  static constexpr int kHeadDim = Dims::kHeadDim;    //!< q·k (Q and K tiles)
  static constexpr int kHeadDimV = Dims::kHeadDimV;  //!< v (V tiles, O)
  static constexpr int kSumDim = Dims::kSumDim;      //!< the columns S = Q K^T sums over
  //! O's columns that O += P V computes (its N): the v head dim, or at D 96 (kSumDimV 96) the 96
  //! real ones; the O tile's columns past them are left unwritten, and its store's box, 64 columns
  //! a block, stops at the tensor's last column.
  static constexpr int kOutDimV = Dims::kSumDimV;
  static constexpr ElementType kElement = Dims::kElement;
  //! FlashAttention-3's overlapped consumer schedule (ping-pong when there are two consumers):
  //! see fwd_mainloop.cuh.
  static constexpr bool kOverlap = kOverlap_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kConsumers = kConsumers_;
  static constexpr int kStages = kStages_;
  //! CTAs per SM the registers and shared memory are planned for.
  static constexpr int kMinBlocksPerSm = kMinBlocksPerSm_;
  static constexpr int kBlockM = 64 * kConsumers;  //!< query rows per CTA (packed heads x positions)
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKBytes = kBlockN * kHeadDim * 2;   //!< one K stage
  static constexpr int kVBytes = kBlockN * kHeadDimV * 2;  //!< one V stage
  static constexpr int kOBytes = kBlockM * kHeadDimV * 2;  //!< an O tile of its own (kOwnO)
  static constexpr int kSmemBytes = fwd_wgmma_smem_bytes(kBlockM, kBlockN, kStages, kHeadDim, kHeadDimV);
  //! Whether a persistent CTA may give O a tile of its own and Q a second buffer (kSmemBytes +
  //! kQBytes + kOBytes): then the next work item's Q loads while this one still runs (into the
  //! buffer the item before freed), not behind this one's last product. Only at one CTA per SM (at
  //! two the other CTA runs meanwhile anyway), where it fits: the 3-stage 128 x 128 ping-pong at
  //! head_dim 128 has no room for it. The launcher decides (own_o). The second Q buffer measured no
  //! faster than loading Q during the epilogue (H200, dflash-512, wgmma_m128_n64: 0.374 ms both)
  //! and is kept: it takes the Q load off the path between two items at no cost in shared memory
  //! that any kernel uses otherwise.
  static constexpr bool kOwnO = kMinBlocksPerSm == 1 && kSmemBytes + kQBytes + kOBytes + 1024 <= 228 * 1024;
  //! Whether the launch is persistent by default (one CTA per SM slot, each taking work items from
  //! a counter) rather than one CTA per work item. Persistent is faster for every kernel but the
  //! ping-pong (H200: dflash-512 wgmma_m128_n64 0.395 -> 0.372 ms, wgmma_m128_n128 0.460 -> 0.439;
  //! causal-128 wgmma_m128_n128 0.526 -> 0.514), which at head_dim 128 has no room for an O tile
  //! of its own, so reloads Q after each item's epilogue: causal-128 0.496 -> 0.519 ms persistent.
  //! A ping-pong with room for the O tile (head_dim 64) is persistent.
  static constexpr bool kPersistent = !(kOverlap && kConsumers == 2) || kOwnO;
  //! setmaxnreg budgets (multiples of 8): the producer's one thread needs a few dozen registers;
  //! the consumers hold O (kHeadDimV / 2 fp32), S (kBlockN / 2 fp32) and P (kBlockN / 4) per
  //! thread. The SM's 64K registers: 128 x kProducerRegisters + kConsumers x 128 x
  //! kConsumerRegisters per CTA, times kMinBlocksPerSm.
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters = kConsumers == 2 ? 232 : (kMinBlocksPerSm == 2 ? 216 : 232);
  static_assert(kBlockN == 64 || kBlockN == 128, "wgmma N of 64 or 128 keys");
  static_assert(kConsumers == 1 || kConsumers == 2, "one or two consumer warpgroups");
  static_assert(kMinBlocksPerSm * (128 * kProducerRegisters + kConsumers * 128 * kConsumerRegisters) <= 65536,
                "register budget of the SM");
  static_assert(fits_sm(kSmemBytes, kMinBlocksPerSm), "shared memory of the SM");
};

// ---- Hopper backward ----------------------------------------------------------------------------

//! Shared memory of a Hopper dK/dV tile (bwd_dkdv_mainloop.cuh), 1024-aligned offsets in bytes:
//! K and V of kKeys keys resident, per stage Q and dO of kRows packed query rows, kExtraBytes of
//! the kernel's own (wgmma_atomic: dS^T and its dQ tile), then per stage the rows' (lse2, delta),
//! their positions' 32-byte mask rows and the keys' mask bit entries (mask_bits.cuh), then the
//! barriers (BwdBarriers: resident, two "full" and one "empty" per stage, and the kernel's own).
template <int kHeadDim_, int kHeadDimV_, int kKeys_, int kStages_, int kExtraBytes>
struct DkdvTileLayout {
  static constexpr int kHeadDim = kHeadDim_;    //!< q·k: K, Q, dK
  static constexpr int kHeadDimV = kHeadDimV_;  //!< v: V, dO, dV
  static constexpr int kStages = kStages_;
  static constexpr int kKeys = kKeys_;       //!< keys per tile: 128, 64 per consumer; 64 shared when columns split
  static constexpr int kRows = kBwdDkdvRows;  //!< query rows per step (packed heads x positions)
  static constexpr bool kSplitColumns = kKeys == 64;
  static constexpr int kKBytes = kKeys * kHeadDim * 2;   //!< resident K
  static constexpr int kVBytes = kKeys * kHeadDimV * 2;  //!< resident V
  static constexpr int kQBytes = kRows * kHeadDim * 2;   //!< one stage's Q
  static constexpr int kDoBytes = kRows * kHeadDimV * 2;  //!< one stage's dO
  static constexpr int kOffK = 0;
  static constexpr int kOffV = kOffK + kKBytes;
  static constexpr int kOffQ = kOffV + kVBytes;
  static constexpr int kOffDo = kOffQ + kStages * kQBytes;
  static constexpr int kOffExtra = kOffDo + kStages * kDoBytes;
  static constexpr int kOffStats = kOffExtra + kExtraBytes;          //!< kStages x kRows (lse2, delta)
  static constexpr int kOffMasks = kOffStats + kStages * kRows * 8;  //!< kStages x kRows QueryMaskRow
  static constexpr int kOffBits = kOffMasks + kStages * kRows * 32;  //!< kStages x kKeys mask bit words
  static constexpr int kOffBarriers = kOffBits + kStages * kKeys * 8;
  static_assert(kKeys == 128 || kKeys == 64, "64 keys per consumer, or 64 shared by both");
};

//! Hopper backward (bwd_wgmma_kernels.cuh): one launch of dK/dV and dQ tiles, each CTA one
//! producer warpgroup (TMA) and two consumer warpgroups (wgmma). Up to head_dim 128 the tilings
//! equal the mma.sync backward's (dK/dV: 128 keys x 64-row q steps; dQ: 128 rows x 64-key steps),
//! so both read the same BlockMasks; above it the columns split (bwd_splits_columns): 64-key dK/dV
//! tiles and 64-row dQ tiles shared by the two consumers.
template <class Dims, int kStages_>
struct BwdWgmmaConfig {
  static constexpr int kHeadDim = Dims::kHeadDim;
  static constexpr int kHeadDimV = Dims::kHeadDimV;
  static constexpr int kSumDim = Dims::kSumDim;    //!< the columns S = Q K^T sums over
  static constexpr int kSumDimV = Dims::kSumDimV;  //!< and dP = dO V^T
  static constexpr ElementType kElement = Dims::kElement;
  static constexpr int kStages = kStages_;
  static constexpr int kThreads = 3 * 128;
  static constexpr bool kSplitColumns = bwd_splits_columns(kHeadDim);
  //! The dK/dV tile: K, V, then per stage Q, dO, (lse2, delta) and the 32-byte mask row of each q
  //! row, and the mask bits of each key (mask_bits.cuh).
  using Dkdv = DkdvTileLayout<kHeadDim, kHeadDimV, bwd_dkdv_keys(kHeadDim), kStages, 0>;
  static constexpr int kDkdvKeys = Dkdv::kKeys;  //!< keys per dK/dV tile
  static constexpr int kDkdvRows = Dkdv::kRows;  //!< query rows per dK/dV step
  static constexpr int kDqRows = bwd_dq_rows(kHeadDim);  //!< query rows per dQ tile
  static constexpr int kDqBlockN = kBwdDqBlockN;         //!< keys per dQ step
  static constexpr int kDqQBytes = kDqRows * kHeadDim * 2;     //!< resident Q
  static constexpr int kDqDoBytes = kDqRows * kHeadDimV * 2;   //!< resident dO
  static constexpr int kDqKBytes = kDqBlockN * kHeadDim * 2;   //!< one stage's K
  static constexpr int kDqVBytes = kDqBlockN * kHeadDimV * 2;  //!< one stage's V
  static constexpr int kDkdvBarrierOffset = Dkdv::kOffBarriers;
  //! dQ: the tiles' Q and dO (with 128-row tiles a CTA runs two head packs of a q block, the
  //! second's rows loaded while the first runs), then per stage K and V.
  static constexpr int kDqTiles = kSplitColumns ? 1 : 2;
  static constexpr int kDqBarrierOffset = kDqTiles * (kDqQBytes + kDqDoBytes) + kStages * (kDqKBytes + kDqVBytes);
  //! resident, "first"/"second"/"empty" per stage, and the second dQ tile's resident rows.
  static constexpr int kBarrierBytes = 8 * (2 + 3 * kStages);
  static constexpr int kSmemBytes =
      1024 + (kDkdvBarrierOffset > kDqBarrierOffset ? kDkdvBarrierOffset : kDqBarrierOffset) + kBarrierBytes;
  //! Consumers hold dK and dV (their 64 keys x the head dims, or with split columns all 64 keys x
  //! every other 64-column block) plus S^T, dP^T (2 x 32) and their fragments in the dK/dV tile;
  //! dQ, S and dP in the dQ tile.
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters = 232;
  static_assert(kSmemBytes <= 227 * 1024, "within the 227 KB an sm_90 CTA may use");
  static_assert(128 * kProducerRegisters + 2 * 128 * kConsumerRegisters <= 65536, "register budget of the SM");
};

//! Hopper backward with atomic dQ (bwd_wgmma_atomic_kernel.cuh): one CTA per kv block (128 keys)
//! and kv head, one producer warpgroup (a TMA thread and a dQ-reducer thread) and two consumer
//! warpgroups of 64 keys; K and V resident, (Q, dO, row info) streamed per 64-row step over every
//! head pack of the GQA group and every listed q block, as in the deterministic kernel's dK/dV
//! tile. Per step the consumers also write dS^T (keys x queries, two buffers) to shared memory,
//! meet once, and compute dQ = dS K (consumer c the D columns 64c.. at D = 128; at D = 64 the
//! consumers alternate steps) into an fp32 shared tile; the reducer thread adds that tile to an
//! fp32 dQ accumulator in global memory with one bulk reduce-add per packed head. A last small
//! kernel converts the accumulator to dQ. Head dims up to 128, q·k and v alike (a consumer holds
//! dK, dV, the dQ tile and the next S^T at once).
template <class Dims, int kStages_>
struct BwdWgmmaAtomicConfig {
  static constexpr int kHeadDim = Dims::kHeadDim;
  static constexpr int kSumDim = Dims::kSumDim;    //!< the columns S = Q K^T sums over
  static constexpr int kSumDimV = Dims::kSumDimV;  //!< and dP = dO V^T (the same here)
  static constexpr ElementType kElement = Dims::kElement;
  //! Q / dO / row-info ring depth. Measured (H200, real dims, bwd ms) at 3 against 2: dflash 128
  //! anchors 0.349 vs 0.350, 512 anchors 1.259 vs 1.262, causal 1.79 vs 1.81-1.84: within noise,
  //! so 2 (33 KB less shared memory).
  static constexpr int kStages = kStages_;
  static constexpr int kThreads = 3 * 128;
  static constexpr int kKeys = 128;  //!< keys per CTA, 64 per consumer
  static constexpr int kRows = 64;   //!< query rows per step (packed heads x positions)
  static constexpr int kDsBytes = kKeys * kRows * 2;     //!< dS^T, 128-byte swizzled rows of 64 queries
  static constexpr int kDqBytes = kRows * kHeadDim * 4;  //!< one step's dQ, fp32
  static constexpr int kDqColumns = 64;                  //!< dQ columns one consumer computes per step
  //! The dK/dV tile with dS^T (double-buffered) and the dQ tile as its extra part; offsets (bytes)
  //! from the 1024-aligned base: every wgmma operand 1024-aligned.
  using Dkdv = DkdvTileLayout<kHeadDim, kHeadDim, kKeys, kStages, 2 * kDsBytes + kDqBytes>;
  static constexpr int kOffDs = Dkdv::kOffExtra;
  static constexpr int kOffDq = kOffDs + 2 * kDsBytes;
  static constexpr int kOffBarriers = Dkdv::kOffBarriers;
  //! resident, 2 "full" and 1 "empty" per stage, dQ tile full / empty.
  static constexpr int kBarrierBytes = 8 * (1 + 3 * kStages + 2);
  static constexpr int kSmemBytes = 1024 + kOffBarriers + kBarrierBytes;
  //! 240, not 232: with the next step's S^T issued behind dK and dQ, a consumer holds dK, dV, dS^T,
  //! the dQ tile and S^T at once (208 accumulator registers); at 232 ptxas serialized the wgmma
  //! (C7512). The producer's one TMA thread and one reducer thread need no more than 24.
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;
  static_assert(Dims::kHeadDim == Dims::kHeadDimV && kHeadDim <= 128 && kSumDim == kSumDimV,
                "head dims up to 128, q·k and v alike");
  static_assert(kSmemBytes <= 227 * 1024, "within the 227 KB an sm_90 CTA may use");
  static_assert(128 * kProducerRegisters + 2 * 128 * kConsumerRegisters <= 65536, "register budget of the SM");
  static_assert(kKeys == Dkdv::kKeys && kRows == Dkdv::kRows && kKeys == bwd_dkdv_keys(kHeadDim),
                "the dK/dV tiling (and so BlockMask) of the other backward kernels");
};

//! fp32 accumulators -> dQ (and with split kv blocks dK, dV): kHeadDim / 8 threads per row, 8
//! columns each.
template <class Dims>
struct BwdDqConvertConfig {
  static constexpr int kHeadDim = Dims::kHeadDim;
  static constexpr ElementType kElement = Dims::kElement;
  static constexpr int kThreadsPerRow = kHeadDim / 8;
  static_assert((kThreadsPerRow & (kThreadsPerRow - 1)) == 0, "rows of a power-of-two threads (head dims up to 128)");
  static constexpr int kThreads = 256;
  static constexpr int kRowsPerCta = kThreads / kThreadsPerRow;
};

//! Backward prep (delta = rowsum(dO * O), lse2, mask rows): kHeadDimV / 8 threads per row rounded
//! up to a power of two (the row's sum is a butterfly of shuffles within those threads: 192 columns
//! take 32 threads, 24 of them loading), 16-byte loads; wgmma_atomic's fp32 dQ accumulator rows are
//! kHeadDim wide.
template <class Dims>
struct BwdPrepConfig {
  static constexpr int kHeadDim = Dims::kHeadDim;
  static constexpr int kHeadDimV = Dims::kHeadDimV;
  static constexpr ElementType kElement = Dims::kElement;
  static constexpr int kThreadsPerRow = kHeadDimV <= 64 ? 8 : kHeadDimV <= 128 ? 16 : 32;
  static_assert(kThreadsPerRow * 8 >= kHeadDimV, "a row's columns covered");
  static constexpr int kThreads = 256;
  static constexpr int kRowsPerCta = kThreads / kThreadsPerRow;
};

//! Whether a backward kernel runs at real head dims.
constexpr bool bwd_kernel_supports(BwdKernel kernel, int head_dim, int v_head_dim) {
  if (!head_dims_have_kernels(head_dim, v_head_dim)) return false;
  switch (kernel) {
    case BwdKernel::mma: return mma_supports(head_dim, v_head_dim);
    case BwdKernel::wgmma: return true;
    case BwdKernel::wgmma_atomic:
      return padded_head_dim(head_dim) == padded_head_dim(v_head_dim) && padded_head_dim(head_dim) <= 128;
  }
  return false;
}
//! Whether a forward kernel runs at real head dims.
constexpr bool fwd_kernel_supports(FwdKernel kernel, int head_dim, int v_head_dim) {
  if (!head_dims_have_kernels(head_dim, v_head_dim)) return false;
  if (kernel == FwdKernel::mma_m128_n64) return mma_supports(head_dim, v_head_dim);
  return fwd_wgmma_plan(kernel, padded_head_dim(head_dim), padded_head_dim(v_head_dim)).consumers > 0;
}

// ---- From a problem to its instantiations -------------------------------------------------------

//! Calls f(HeadDims<...>{}) for the instantiation that serves real head dims and an element type
//! (the dims padded to 64, see padded_head_dim) and returns true; false where there is none.
template <typename F>
bool with_head_dims(int head_dim, int v_head_dim, ElementType element, F&& f) {
  if (!head_dims_have_kernels(head_dim, v_head_dim)) return false;
  const int qk = padded_head_dim(head_dim), v = padded_head_dim(v_head_dim);
  const bool sums_96 = sums_96_columns(head_dim, v_head_dim);
  auto of_type = [&](auto type) {
    constexpr ElementType kElement = decltype(type)::value;
    if (qk == 64) f(HeadDims<64, 64, kElement>{});
    if (qk == 128 && sums_96) f(HeadDims<128, 128, kElement, kSumDim96, kSumDim96>{});
    if (qk == 128 && !sums_96) f(HeadDims<128, 128, kElement>{});
    if (qk == 192 && v == 192) f(HeadDims<192, 192, kElement>{});
    if (qk == 192 && v == 128) f(HeadDims<192, 128, kElement>{});
    if (qk == 256) f(HeadDims<256, 256, kElement>{});
  };
  if (element == ElementType::fp16) {
    of_type(std::integral_constant<ElementType, ElementType::fp16>{});
  } else {
    of_type(std::integral_constant<ElementType, ElementType::bf16>{});
  }
  return true;
}

//! A wgmma forward kernel and its configuration (the tiling table, fwd_kernel_tiling, and the
//! configuration must agree).
template <FwdKernel kKernel, class Cfg>
struct WgmmaFwd {
  using Config = Cfg;
  static_assert(fwd_kernel_tiling(kKernel).rows == Cfg::kBlockM && fwd_kernel_tiling(kKernel).block_n == Cfg::kBlockN,
                "the tiling table matches the kernel's configuration");
};

//! Calls f(WgmmaFwd<kernel, its FwdWgmmaConfig at Dims>{}) for a wgmma forward kernel with a
//! configuration at Dims (fwd_wgmma_plan) and returns true; false for any other (the mma.sync
//! forward, or no room at these head dims). The one place a kernel's configuration is named: the
//! launcher launches it, describe_fwd_config describes it.
template <class Dims, typename F>
bool with_wgmma_fwd_config(FwdKernel kernel, F&& f) {
  auto run = [&](auto kernel_constant) {
    constexpr FwdKernel kKernel = decltype(kernel_constant)::value;
    constexpr FwdWgmmaPlan kPlan = fwd_wgmma_plan(kKernel, Dims::kHeadDim, Dims::kHeadDimV);
    if constexpr (kPlan.consumers > 0) {
      f(WgmmaFwd<kKernel, FwdWgmmaConfig<Dims, kPlan.block_n, kPlan.consumers, kPlan.stages, kPlan.min_blocks_per_sm,
                                         kPlan.overlap>>{});
      return true;
    } else {
      return false;
    }
  };
  switch (fwd_kernel_base(kernel)) {
    case FwdKernel::wgmma_m128_n128: return run(std::integral_constant<FwdKernel, FwdKernel::wgmma_m128_n128>{});
    case FwdKernel::wgmma_m128_n64: return run(std::integral_constant<FwdKernel, FwdKernel::wgmma_m128_n64>{});
    case FwdKernel::wgmma_m64_n64: return run(std::integral_constant<FwdKernel, FwdKernel::wgmma_m64_n64>{});
    case FwdKernel::wgmma_m128_n128_pingpong:
      return run(std::integral_constant<FwdKernel, FwdKernel::wgmma_m128_n128_pingpong>{});
    case FwdKernel::wgmma_m64_n64_overlap: return run(std::integral_constant<FwdKernel, FwdKernel::wgmma_m64_n64_overlap>{});
    case FwdKernel::wgmma_m64_n128_overlap: return run(std::integral_constant<FwdKernel, FwdKernel::wgmma_m64_n128_overlap>{});
    default: return false;  // the mma.sync forward (the `_kv_major` twins are their bases here)
  }
}

//! Schedule kernel: one CTA ranks up to kMaxRankedItems work items in shared memory with O(n^2)
//! compares (n is 144 for the 128-anchor backward, 384 for 512 anchors); beyond that, grid order.
struct ScheduleConfig {
  static constexpr int kThreads = 1024;
  static constexpr int kMaxRankedItems = 12 * 1024 - 4;  // (items + 4) ints within the 48 KB default
};

}  // namespace harness::kernels::cuda
