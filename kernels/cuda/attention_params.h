#pragma once
// Plain parameter structs of the CUDA fused attention (the `flash.h` of this folder): no LibTorch,
// no CUDA headers beyond the stream type, so the .cu files, the standalone self-test and the
// LibTorch boundary (fused_attention_cuda.cpp) all share them.
//
// Layout conventions: q/dq are [B, H, Q_LEN, D], k/dk [B, H_KV, KV_LEN, D], v/dv [B, H_KV, KV_LEN, Dv]
// and o/do [B, H, Q_LEN, Dv] (Dv = the v head dim, D's unless given), bf16 or fp16, with the last
// dimension contiguous and every other stride given in elements (a multiple of 8 so that rows are
// 16-byte aligned). lse is dense fp32 [B, H, Q_LEN].

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/attention_config.h"

namespace harness::kernels::cuda {

//! Mask family codes, mirroring harness::kernels::MaskKind (kept separate so device code needs no
//! harness headers); fused_attention_cuda.cpp maps one onto the other.
enum class MaskCode : int32_t { dflash = 0, causal = 1, document_causal = 2, sliding_window = 3, full = 4, blockmask = 5 };

//! What the per-element predicate needs: ResolvedMask's scalars plus its two arrays on the device.
struct MaskParams {
  MaskCode kind = MaskCode::full;
  int32_t through_anchor = 0;   //!< dflash: context rule through_anchor (kv <= anchor)
  int32_t in_block_causal = 0;  //!< dflash: in_block causal
  int32_t q_len = 0;
  int32_t kv_len = 0;
  int32_t context = 0;
  int32_t block_size = 1;
  int32_t window = 0;
  const int32_t* anchors = nullptr;  //!< dflash: [q_len / block_size]
  const int32_t* doc_id = nullptr;   //!< dflash: [context]; document_causal: [kv_len]; else unused
  const uint32_t* bits = nullptr;    //!< blockmask: [q_len, bit_words], bit kv % 32 of word kv / 32
  int32_t bit_words = 0;             //!< blockmask: words per query row, ceil(kv_len / 32)
};

//! One BlockMask (FlexAttention layout, B = H = 1) at (block_m, block_n), int32 device arrays.
struct BlockListParams {
  int32_t block_m = 0;  //!< query positions per q block (per head)
  int32_t block_n = 0;  //!< key positions per kv block
  int32_t num_q_blocks = 0;
  int32_t num_kv_blocks = 0;
  const int32_t* kv_num_blocks = nullptr;       //!< [num_q_blocks]
  const int32_t* kv_indices = nullptr;          //!< [num_q_blocks, num_kv_blocks]
  const int32_t* full_kv_num_blocks = nullptr;  //!< [num_q_blocks]
  const int32_t* full_kv_indices = nullptr;     //!< [num_q_blocks, num_kv_blocks]
  const int32_t* q_num_blocks = nullptr;        //!< [num_kv_blocks]
  const int32_t* q_indices = nullptr;           //!< [num_kv_blocks, num_q_blocks]
  const int32_t* full_q_num_blocks = nullptr;   //!< [num_kv_blocks]
  const int32_t* full_q_indices = nullptr;      //!< [num_kv_blocks, num_q_blocks]
};

//! A bf16 [B, heads, rows, D] tensor: base pointer and element strides (last dim contiguous).
struct TensorRef {
  void* data = nullptr;
  int64_t stride_batch = 0;
  int64_t stride_head = 0;
  int64_t stride_row = 0;
};

//! Problem sizes shared by forward and backward.
struct AttentionShape {
  int32_t batch = 1;
  int32_t heads = 1;
  int32_t kv_heads = 1;
  int32_t q_len = 0;
  int32_t kv_len = 0;
  int32_t head_dim = 0;    //!< q·k's: q, k, dq, dk
  int32_t v_head_dim = 0;  //!< v's: v, o, do, dv; 0 means head_dim
  ElementType dtype = ElementType::bf16;
};
//! The v head dim of a shape (v_head_dim, or head_dim where it is 0).
inline int32_t value_head_dim_of(const AttentionShape& shape) {
  return shape.v_head_dim > 0 ? shape.v_head_dim : shape.head_dim;
}

//! How a kernel tiles the queries: `rows` MMA rows per CTA made of `heads_packed` query heads of
//! one GQA group times `block_m` query positions each (they share every K/V tile they load), and
//! `block_n` keys per kv tile. The BlockMask the kernel reads must have (block_m, block_n).
struct TileShape {
  int32_t rows = 0;
  int32_t heads_packed = 1;
  int32_t block_m = 0;
  int32_t block_n = 0;
};

//! One CTA's work in a longest-first schedule: a block (q block, or kv block, or in the merged
//! backward kv blocks first then q blocks) and which copy of it (head pack / kv head, batch).
struct WorkItem {
  int32_t block;
  int32_t copy;
};

//! A launch's CTA schedule kept between calls. The schedule depends only on the block lists (a
//! cached BlockMask never changes them) and the launch shape, so the caller may keep it: `items`
//! points to room for it (schedule_bytes(...)), `written` says it already holds it and the launch
//! skips the schedule kernel. With `items` null the schedule is built in the scratch every launch.
struct ScheduleCache {
  WorkItem* items = nullptr;
  bool written = false;
  //! A kept schedule that is already in place: the launch runs no schedule kernel.
  bool built() const { return items != nullptr && written; }
};

//! How the launcher runs a call's kernels, beyond what they compute: for A/B runs; the defaults are
//! what the kernels are tuned for (the LibTorch boundary fills it from CudaKernelChoice). Host-only,
//! so not part of the parameter structs the kernels receive.
struct LaunchOptions {
  //! The order of the CTA tables the call builds (a kept schedule keeps the order it was built in).
  ScheduleOrder schedule_order = ScheduleOrder::kernel_default;
  //! Programmatic dependent launches where a kernel may start before the one ahead of it ends (the
  //! backward's prep and dQ convert kernels, a forward whose schedule an earlier call built);
  //! false launches every kernel after the one before has completed.
  bool programmatic = true;
};

//! FwdParams::max_ctas values besides N > 0 (at most N persistent CTAs).
constexpr int32_t kFwdCtasKernelDefault = 0;  //!< FwdWgmmaConfig::kPersistent: one per SM slot, or one per work item
constexpr int32_t kFwdCtasPerItem = -1;       //!< one CTA per work item
constexpr int32_t kFwdCtasPerSmSlot = -2;     //!< persistent CTAs, one per SM slot

//! Forward: o = softmax(scale * q k^T + mask) v, lse = logsumexp per row (natural log, -inf for
//! rows that see nothing; their o is 0).
struct FwdParams {
  FwdKernel kernel = kDefaultFwdKernel;  //!< which kernel runs; blocks must be at its tiling
  AttentionShape shape;
  TensorRef q, k, v, o;
  float* lse = nullptr;
  float scale = 1.0f;
  MaskParams mask;
  BlockListParams blocks;  //!< at fwd_tile_shape(shape, kernel)'s (block_m, block_n)
  void* scratch = nullptr;  //!< device scratch of fwd_scratch_bytes(...) bytes (the schedule)
  size_t scratch_bytes = 0;
  ScheduleCache schedule;   //!< optional: the schedule kept between calls, and after it the persistent
                            //!< kernels' item counter (then the scratch is unused)
  //! CTAs of a wgmma forward: kFwdCtasKernelDefault, kFwdCtasPerItem, kFwdCtasPerSmSlot, or N > 0
  //! = at most N persistent CTAs (the mma.sync forward runs one CTA per work item whatever it is).
  int32_t max_ctas = kFwdCtasKernelDefault;
};

//! Backward: dq, dk, dv from q, k, v, o, do and the forward's lse.
struct BwdParams {
  BwdKernel kernel = kDefaultBwdKernel;
  AttentionShape shape;
  TensorRef q, k, v, o, dout, dq, dk, dv;
  const float* lse = nullptr;
  float scale = 1.0f;
  MaskParams mask;
  BlockListParams dq_blocks;    //!< at bwd_dq_tile_shape(...)'s (block_m, block_n)
  BlockListParams dkdv_blocks;  //!< at bwd_dkdv_tile_shape(...)'s (block_m, block_n)
  //! Device scratch of bwd_scratch_bytes(...) bytes: per-row (lse*log2e, delta), per-query mask
  //! rows and the schedule. Its contents are internal to run_attention_bwd.
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  ScheduleCache schedule;  //!< optional: the schedule kept between calls (its part of the scratch unused)
};

//! A configuration these kernels do not implement (head_dim, alignment); the LibTorch boundary
//! turns it into harness::kernels::UnsupportedError.
class UnsupportedConfig : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

//! A failed CUDA call or launch: statement, file, line and device in the message.
class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

//! Whether the shape's head dims and element type have kernels (kSupportedHeadDimsText, in
//! attention_config.h, says which do).
bool shape_supported(const AttentionShape& shape);
//! Why the shape has no kernels, naming the supported set ("" when it has).
std::string unsupported_shape_reason(const AttentionShape& shape);
//! Every forward kernel, in the autotuner's candidate order (the default first).
const std::vector<FwdKernel>& fwd_kernels();
//! The forward kernels that run at the shape's head dims, in the same order (the autotuner's
//! candidates for it); empty when the shape has no kernels.
std::vector<FwdKernel> fwd_candidates(const AttentionShape& shape);
//! "wgmma_m128_n128", ...
const char* fwd_kernel_name(FwdKernel kernel);
//! The kernel of that name; false when there is none.
bool parse_fwd_kernel(const std::string& name, FwdKernel* kernel);
//! The forward kernel to run when nothing was tuned (measured on the H200; see attention_config.h):
//! the first of fwd_candidates(shape). Throws UnsupportedConfig when there is none.
FwdKernel default_fwd_kernel(const AttentionShape& shape);
//! Every backward kernel, in the autotuner's candidate order (the default first).
const std::vector<BwdKernel>& bwd_kernels();
//! The backward kernels that run at the shape's head dims (only the deterministic ones when
//! `deterministic`), in the same order; empty when the shape has no kernels.
std::vector<BwdKernel> bwd_candidates(const AttentionShape& shape, bool deterministic);
//! The backward kernels that are bitwise reproducible (the candidates when `deterministic` is
//! asked for), the default first.
const std::vector<BwdKernel>& deterministic_bwd_kernels();
//! Whether `kernel` gives the same bits on every run (false for wgmma_atomic: dQ sums in fp32 by
//! atomic adds whose order varies).
bool bwd_kernel_is_deterministic(BwdKernel kernel);
//! CTAs per (kv block, kv head, batch) of `kernel`'s dK/dV work: more than 1 only for wgmma_atomic
//! with few dK/dV CTAs (tiling::bwd_atomic_dkdv_splits), whose dK and dV are then summed by atomic
//! adds too (not bitwise reproducible either).
int64_t bwd_dkdv_splits(const AttentionShape& shape, BwdKernel kernel);
//! The backward kernel to run when nothing was tuned: the first of bwd_candidates(shape,
//! deterministic) (wgmma_atomic, or wgmma when deterministic or above head_dim 128). Throws
//! UnsupportedConfig when there is none.
BwdKernel default_bwd_kernel(const AttentionShape& shape, bool deterministic);
//! "wgmma_atomic", "wgmma", "mma".
const char* bwd_kernel_name(BwdKernel kernel);
//! The kernel of that name; false when there is none.
bool parse_bwd_kernel(const std::string& name, BwdKernel* kernel);
//! Tilings of the three kernels for a problem (throws UnsupportedConfig for a shape without kernels,
//! or a forward kernel without a configuration at its head dims).
TileShape fwd_tile_shape(const AttentionShape& shape, FwdKernel kernel);
TileShape bwd_dq_tile_shape(const AttentionShape& shape);
TileShape bwd_dkdv_tile_shape(const AttentionShape& shape);
//! Scratch the forward / backward need for a problem and its BlockMasks (a few MB at most:
//! 8 bytes per CTA for the schedule; backward also 8 bytes per query row and 32 per position).
size_t fwd_scratch_bytes(const AttentionShape& shape, const BlockListParams& blocks, FwdKernel kernel);
//! wgmma_atomic also needs its fp32 dQ accumulator there: 4 * B * H * q_pad * D bytes (D padded to
//! 64), and where it splits kv blocks (bwd_dkdv_splits > 1) the fp32 dK/dV ones: 8 * B * KVH * kv
//! blocks * 128 * D.
size_t bwd_scratch_bytes(const AttentionShape& shape, const BlockListParams& dq_blocks,
                         const BlockListParams& dkdv_blocks, BwdKernel kernel);
//! Room for a kept ScheduleCache of the forward / backward (a few KB: 8 bytes per CTA; the
//! forward's also holds the persistent kernels' work item counter, which they leave at 0). The
//! backward's holds the merged dK/dV + dQ schedule of wgmma and mma, or wgmma_atomic's dK/dV one.
size_t fwd_schedule_bytes(const AttentionShape& shape, const BlockListParams& blocks, FwdKernel kernel);
size_t bwd_schedule_bytes(const AttentionShape& shape, const BlockListParams& dq_blocks,
                          const BlockListParams& dkdv_blocks, BwdKernel kernel);
//! Human-readable tile configuration for dispatch records ("fwd wgmma_m128_n128: 128x128 (4 heads x 32 q) ...").
std::string describe_fwd_config(const AttentionShape& shape, FwdKernel kernel);
std::string describe_bwd_config(const AttentionShape& shape, BwdKernel kernel);

//! Launches the forward on `stream`. Throws CudaError / UnsupportedConfig.
void run_attention_fwd(const FwdParams& params, cudaStream_t stream, const LaunchOptions& launch = {});
//! Launches the backward on `stream`: prep, schedule, then for wgmma / mma the merged dK/dV + dQ
//! launch (deterministic: no atomics, each output element summed by one thread in a fixed order),
//! for wgmma_atomic the dK/dV-per-kv-block kernel with dQ bulk-added in fp32, then dQ to bf16.
void run_attention_bwd(const BwdParams& params, cudaStream_t stream, const LaunchOptions& launch = {});
//! Keeps `stream` busy for about `microseconds` (one thread spinning on the global timer), so that
//! launches the host enqueues meanwhile run back to back: the autotuner times candidates behind it,
//! so a candidate's time is its GPU time, not the host's work between two launches.
void hold_stream(cudaStream_t stream, unsigned microseconds);

}  // namespace harness::kernels::cuda
