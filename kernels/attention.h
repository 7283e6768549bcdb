#pragma once
// The attention implementations the experiments compare, behind one entry point.
//   dense:  LibTorch ops, GQA-expanded, fp32 scores materialized (the unfused path, and the
//           correctness oracle).
//   fused:  flash-style block-sparse attention (online softmax, LSE; backward recomputes P)
//           on CPU (tiled ATen ops) or CUDA (kernels/cuda), as a torch::autograd::Function.
// Shapes: q and k [B, H or H_KV, Q_LEN or KV_LEN, D], v [B, H_KV, KV_LEN, D_V] (D_V may differ from
// D: DeepSeek's MLA has 192 / 128), H a multiple of H_KV; the output is [B, H, Q_LEN, D_V].

#include <ATen/ATen.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

#include "kernels/block_mask.h"
#include "kernels/dispatch.h"
#include "kernels/mask_desc.h"

namespace harness::kernels {

//! Which implementation a variant asks for.
enum class AttentionImpl { dense, fused };

//! Thrown when an implementation cannot run a configuration (a value for the experiment:
//! recorded as status "unsupported", verdict INVALID; never a pass and never a crash).
class UnsupportedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

//! A resolved mask plus the device-side data and BlockMasks built from it, cached per
//! (block_m, block_n, device). Thread-safe.
class MaskContext {
 public:
  explicit MaskContext(ResolvedMask mask);
  const ResolvedMask& mask() const { return mask_; }
  //! BlockMask with the given block sizes on `device` (built once, then cached).
  const BlockMask& block_mask(int64_t block_m, int64_t block_n, const at::Device& device);
  //! Anchors (int32) and document ids (int32) on `device`, for kernels that evaluate the mask.
  const at::Tensor& anchors(const at::Device& device);
  const at::Tensor& doc_id(const at::Device& device);
  //! blockmask: the bits of the slice visible() reads, int32 words [Q_LEN, ceil(KV_LEN / 32)] on
  //! `device` (cached; kernels/cuda reads them as uint32); an empty tensor for the other kinds.
  const at::Tensor& bits(const at::Device& device);
  //! Dense boolean mask on `device` (cached): [Q_LEN, KV_LEN], or [bit_batch, bit_heads, Q_LEN,
  //! KV_LEN] for a sliced blockmask (it broadcasts over the scores [B, H, Q_LEN, KV_LEN]).
  const at::Tensor& dense(const at::Device& device);
  //! A sliced mask's context of one slice (ResolvedMask::slice(batch, head)), built once and kept
  //! (shared: an autograd graph keeps the slices it ran on).
  std::shared_ptr<MaskContext> slice(int64_t batch, int64_t head);

  //! A device buffer kept with the mask, for what the kernels derive from its BlockMasks alone
  //! (their CTA schedules, per launch shape): built by the first call, reused by the next ones.
  //! Shared, so that an autograd graph keeps it after the MaskContext is gone.
  struct KeptBuffer {
    at::Tensor tensor;
    std::atomic<bool> written{false};  //!< set by its user once the contents are in place
  };
  //! The buffer kept under `key` (which must name everything its contents depend on besides the
  //! mask), allocated with `bytes` bytes on `device` at the first request.
  std::shared_ptr<KeptBuffer> kept_buffer(const std::string& key, int64_t bytes, const at::Device& device);

 private:
  ResolvedMask mask_;
  std::mutex mutex_;
  std::map<std::tuple<int64_t, int64_t, std::string>, BlockMask> block_masks_;
  std::map<std::string, at::Tensor> anchors_, doc_id_, bits_, dense_;
  std::map<std::string, std::shared_ptr<KeptBuffer>> kept_;
  std::map<int64_t, std::shared_ptr<MaskContext>> slices_;
};

//! Tiling of the CPU fused kernel (also the BlockMask block sizes it asks for).
struct CpuTileConfig {
  int64_t block_m = 64;
  int64_t block_n = 64;
};

//! Which CUDA fused kernels run. A kernel name forces that kernel; an empty name lets the
//! autotuner pick among every kernel for the call's key (or take the default when autotuning is
//! off: HARNESS_AUTOTUNE=off). HARNESS_CUDA_FWD_KERNEL / HARNESS_CUDA_BWD_KERNEL force a kernel
//! for every call that names none here.
struct CudaKernelChoice {
  std::string fwd;  //!< "", "wgmma_m128_n128", "wgmma_m128_n64", "wgmma_m64_n64", "mma_m128_n64",
                    //!< "wgmma_m128_n128_pingpong", "wgmma_m64_n64_overlap",
                    //!< "wgmma_m64_n64_overlap_kv_major", "wgmma_m128_n128_pingpong_kv_major",
                    //!< "wgmma_m64_n128_overlap", "wgmma_m64_n128_overlap_kv_major"
  std::string bwd;  //!< "", "wgmma", "mma", "wgmma_atomic"
  //! Keep the kernels' CTA schedules with the MaskContext after the first call (saves the schedule
  //! kernel on every later call). The PyTorch op turns it off: under torch.compile's CUDA graph
  //! trees the first call may run in the graph's private memory pool, where a buffer kept past
  //! the call is refused ("tensors in the cudagraph pool not tracked as outputs", H200).
  bool keep_schedules = true;
  // How the kernels are launched, for A/B runs (the defaults are what they are tuned with).
  //! The order of the CTA tables: "" (each kernel's own: batch by batch, the `_kv_major` forwards kv
  //! head by kv head), "interleaved", "batch" or "kv_head". HARNESS_SCHEDULE_ORDER gives it where "".
  std::string schedule_order;
  //! Programmatic dependent launches where a kernel may start before the one ahead of it ends;
  //! false (or HARNESS_CUDA_PDL=0) launches each kernel after the one before has completed.
  bool programmatic_launch = true;
  //! CTAs of a wgmma forward: 0 = the kernel's default (persistent, one per SM slot, or one per work
  //! item), -1 = one per work item, -2 = persistent, one per SM slot, N > 0 = at most N persistent.
  //! HARNESS_CUDA_FWD_PERSISTENT gives it where 0: "0" (one per work item), "1" (one per SM slot),
  //! "grid:N".
  int fwd_ctas = 0;
};

//! Options of one attention call.
struct AttentionOptions {
  AttentionImpl impl = AttentionImpl::fused;
  double scale = 0.0;          //!< softmax scale; 0 means 1/sqrt(head_dim)
  //! CUDA backward: true limits the kernels to the bitwise-reproducible ones (no atomics: wgmma,
  //! mma); false (default) also allows, and by default runs, wgmma_atomic (dQ by fp32 atomic adds).
  bool deterministic = false;
  CpuTileConfig cpu_tiles{};   //!< tiling of the CPU fused kernel
  CudaKernelChoice cuda_kernels{};  //!< CUDA fused kernels (default: autotuned)
  DispatchTrace* trace = nullptr;  //!< where to record the dispatch decision (may be null)
};

//! What a fused forward returns: out [B, H, Q, D_V] in q's dtype and the log-sum-exp of every row's
//! scaled scores, lse [B, H, Q] fp32 (natural log; -inf for a row that sees no key, whose out is 0).
struct FusedForward {
  at::Tensor out;
  at::Tensor lse;
};

//! What a fused backward returns: the gradients of q, k and v, shaped like them.
struct FusedGradients {
  at::Tensor grad_q;
  at::Tensor grad_k;
  at::Tensor grad_v;
};

//! Runs attention with autograd support. Throws UnsupportedError when the requested
//! implementation does not support the device, dtype or shape. A sliced mask (a blockmask that
//! differs between batch elements or heads) runs one call per slice, recorded in the trace.
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     MaskContext& mask, const AttentionOptions& options);

//! Dense reference (autograd through ATen ops). Scores are materialized in fp32; the output
//! has q's dtype. Fully masked rows give zeros.
at::Tensor dense_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& dense_mask, double scale);

//! CPU fused attention as an autograd Function (q, k, v on the CPU, any float dtype).
//! `trace` (may be null) gets the fwd record now and the bwd record when the backward runs,
//! so it must outlive the backward; the mask data the backward needs is kept by the graph.
at::Tensor fused_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               MaskContext& mask, double scale, const CpuTileConfig& tiles,
                               DispatchTrace* trace = nullptr);

//! The fused forward without autograd: the same boundary checks and device dispatch as
//! attention() with impl=fused, returning the LSE as well (the torch op's forward, python/).
FusedForward fused_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, MaskContext& mask,
                                     const AttentionOptions& options);

//! The fused backward without autograd, from the forward's out and lse (the torch op's backward).
FusedGradients fused_attention_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                        MaskContext& mask, const AttentionOptions& options);

//! fused_attention_cpu's forward and backward as plain functions (no autograd graph).
FusedForward fused_attention_cpu_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, MaskContext& mask,
                                         double scale, const CpuTileConfig& tiles, DispatchTrace* trace = nullptr);
FusedGradients fused_attention_cpu_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                            MaskContext& mask, double scale, const CpuTileConfig& tiles,
                                            DispatchTrace* trace = nullptr);

//! Whether this build has the CUDA fused kernels.
bool cuda_kernels_built();

}  // namespace harness::kernels
