#pragma once
// LibTorch boundary of the CUDA fused block-sparse attention (kernels in this folder).

#include <ATen/ATen.h>

#include "kernels/attention.h"
#include "kernels/dispatch.h"

namespace harness::kernels {

//! Fused block-sparse attention on the GPU as a torch::autograd::Function: q [B, H, Q, D], k
//! [B, H_KV, KV, D] and v [B, H_KV, KV, DV] (H a multiple of H_KV), all bf16 or all fp16, head
//! dims D/DV of kernels::cuda::kSupportedHeadDimsText (attention_config.h: 64 to 256, and 192/128),
//! an sm_90 device; out is [B, H, Q, DV]. The forward saves q, k, v, out and the LSE; the backward
//! runs the fused dK/dV and dQ kernels (`deterministic` keeps the candidates to the bitwise
//! reproducible ones). `kernels` picks the kernels (see CudaKernelChoice; by default the autotuner times
//! every candidate on the first call of a key and caches the fastest in memory and on disk).
//! Records attention_fwd / attention_bwd in `trace` (may be null; it must outlive the backward),
//! naming the kernel and how it was chosen. Throws UnsupportedError for a dtype, head_dim or
//! device it has no kernel for, or an unknown kernel name.
at::Tensor fused_attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, MaskContext& mask,
                                double scale, bool deterministic, DispatchTrace* trace,
                                const CudaKernelChoice& kernels = {});

//! The same kernels without autograd (the torch op, python/): the forward returns out and the LSE;
//! the backward takes them back. Same checks, kernel choice and dispatch records as above.
FusedForward fused_attention_cuda_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, MaskContext& mask,
                                          double scale, bool deterministic, DispatchTrace* trace,
                                          const CudaKernelChoice& kernels = {});
FusedGradients fused_attention_cuda_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                             MaskContext& mask, double scale, bool deterministic, DispatchTrace* trace,
                                             const CudaKernelChoice& kernels = {});

}  // namespace harness::kernels
