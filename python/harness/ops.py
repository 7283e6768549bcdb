"""`harness.attention`: the fused block-sparse attention kernels as a torch op.

    out = harness.attention(q, k, v, mask)                       # flex_attention(q, k, v, block_mask=...)
    out = harness.attention(q, k, v, block_mask)                 # any FlexAttention BlockMask
    out, lse = harness.attention(q, k, v, mask, return_lse=True)

q [B, H, Q_LEN, D], k [B, H_KV, KV_LEN, D] and v [B, H_KV, KV_LEN, D_V] with H a multiple of H_KV
(GQA by shapes: no enable_gqa needed; D_V may differ from D, as in DeepSeek's MLA, 192 / 128).
Returns what flex_attention returns for the same call: out [B, H, Q_LEN, D_V] in q's dtype and, with return_lse=True, the log-sum-exp of each row's scaled scores, [B, H, Q_LEN]
fp32 (natural log, -inf for a row that sees no key; its out is 0).

Under the hood: torch.ops.harness.fused_attention (CPU and CUDA kernels, python/csrc/ops.cpp) with
an autograd formula (torch.ops.harness.fused_attention_backward) and fake kernels registered
here, so torch.compile traces it without graph breaks. The lse output carries no gradient.
CUDA: what kernels/cuda has kernels for (Hopper; bf16 or fp16; head dims 64, 96, 128, 192, 256, and
q·k 192 with v 128): any other
call raises NotImplementedError naming what is supported; CPU: any floating dtype and head dims.
A BlockMask is converted to a harness.FlexMask once (harness/flex_mask.py) and cached with it; under
torch.compile, convert it before (harness.FlexMask.from_block_mask) to keep the graph whole.
"""

from __future__ import annotations

import importlib.util
import math
import os
import threading
from pathlib import Path

import torch

from harness.flex_mask import FlexMask, flex_mask_of
from harness.masks import Mask

_LIBRARY_NAME = "libharness_ops.so"
_load_lock = threading.Lock()
_loaded_from = None


def _library_candidates():
    if os.environ.get("HARNESS_OPS_LIBRARY"):
        yield "$HARNESS_OPS_LIBRARY", Path(os.environ["HARNESS_OPS_LIBRARY"])
    spec = importlib.util.find_spec("harness._install")
    if spec is not None and spec.origin:
        yield "the installed package", Path(spec.origin).parent / "lib" / _LIBRARY_NAME
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "CMakeLists.txt").is_file():  # imported from a checkout, not from site-packages
        yield "the checkout's build tree", checkout / "build" / "python" / _LIBRARY_NAME


def load_library(path=None) -> str:
    """Loads the op library once (path, else $HARNESS_OPS_LIBRARY, the installed package's
    lib/, the checkout's build/python/); returns where it came from."""
    global _loaded_from
    with _load_lock:
        if _loaded_from is not None:
            return _loaded_from
        candidates = [("path", Path(path))] if path is not None else list(_library_candidates())
        for _, candidate in candidates:
            if candidate.is_file():
                torch.ops.load_library(str(candidate))
                _register_python_parts()
                _loaded_from = str(candidate)
                from harness import masks

                masks._ops_loaded = True
                return _loaded_from
        tried = "; ".join(f"{where}: {candidate}" for where, candidate in candidates)
        raise RuntimeError(f"harness: the op library {_LIBRARY_NAME} was not found (tried {tried}); "
                           "`pip install .` in the checkout builds it")


def _register_python_parts():
    """Fake kernels and the autograd formula of the C++ ops."""

    @torch.library.register_fake("harness::fused_attention")
    def _fused_attention_fake(q, k, v, mask_kind, mask_params, anchors, doc_id, bits, mask_uid, scale):
        batch, heads, q_len, _ = q.shape
        out = q.new_empty(batch, heads, q_len, v.shape[-1])
        lse = q.new_empty(batch, heads, q_len, dtype=torch.float32)
        return out, lse

    @torch.library.register_fake("harness::fused_attention_backward")
    def _fused_attention_backward_fake(grad_out, q, k, v, out, lse, mask_kind, mask_params, anchors, doc_id,
                                       bits, mask_uid, scale):
        # Contiguous, as the kernels write them (empty_like would keep a transposed q's strides).
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)

    def setup_context(ctx, inputs, output):
        q, k, v, mask_kind, mask_params, anchors, doc_id, bits, mask_uid, scale = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse, anchors, doc_id, bits)
        ctx.mask = (mask_kind, mask_params, mask_uid, scale)
        ctx.mark_non_differentiable(lse)

    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse, anchors, doc_id, bits = ctx.saved_tensors
        mask_kind, mask_params, mask_uid, scale = ctx.mask
        grad_q, grad_k, grad_v = torch.ops.harness.fused_attention_backward(
            grad_out, q, k, v, out, lse, mask_kind, mask_params, anchors, doc_id, bits, mask_uid, scale)
        return grad_q, grad_k, grad_v, None, None, None, None, None, None, None

    torch.library.register_autograd("harness::fused_attention", backward, setup_context=setup_context)


def _describe(tensor) -> str:
    return f"{tuple(tensor.shape)} {tensor.dtype} on {tensor.device}"


def _check(q, k, v, mask, scale):
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"harness.attention: {name} must be a torch.Tensor (got {type(tensor).__name__})")
        if tensor.dim() != 4:
            raise ValueError(f"harness.attention: {name} must be 4-D [batch, heads, length, head_dim] "
                             f"(got {_describe(tensor)})")
        if not tensor.is_floating_point():
            raise TypeError(f"harness.attention: {name} must be a floating-point tensor (got {tensor.dtype})")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"harness.attention: q, k and v must share one dtype (got q {q.dtype}, k {k.dtype}, v {v.dtype})")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"harness.attention: q, k and v must be on one device (got q {q.device}, k {k.device}, "
                         f"v {v.device})")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"harness.attention: k and v must have one batch, kv_heads and KV_LEN (got k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}; only their head dims may differ)")
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"harness.attention: q and k must have one batch size (got q {q.shape[0]}, k {k.shape[0]})")
    if k.shape[3] != q.shape[3]:
        raise ValueError(f"harness.attention: q and k must have one head_dim (got q {q.shape[3]}, k {k.shape[3]})")
    if k.shape[1] < 1 or q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"harness.attention: the heads of q ({q.shape[1]}) must be a multiple of the kv heads of "
                         f"k and v ({k.shape[1]})")
    if not isinstance(mask, Mask):
        raise TypeError(f"harness.attention: mask must be a harness mask (DFlashMask, CausalMask, "
                        f"DocumentCausalMask, SlidingWindowMask, FullMask, FlexMask) or a FlexAttention BlockMask; "
                        f"got {type(mask).__name__}")
    mask.check(q.shape[2], k.shape[2])
    if isinstance(mask, FlexMask):
        mask.check_call(q.shape[0], q.shape[1])
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"harness.attention: q, k and v must be on the CPU or a CUDA device (got {q.device})")
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"harness.attention: scale must be a positive finite number or None (got {scale!r})")


def attention(q, k, v, mask, *, scale=None, return_lse=False, enable_gqa=None, return_aux=None):
    """Fused block-sparse attention (see the module docstring).

    Returns out; (out, lse) with return_lse=True; (out, AuxOutput(lse=..., max_scores=None)) with
    return_aux=AuxRequest(lse=True), as flex_attention does. `enable_gqa` is accepted for
    flex_attention's call shape and ignored: GQA follows from the head counts. `mask` is a harness
    mask or a FlexAttention BlockMask (converted once, harness.FlexMask.from_block_mask)."""
    if _is_block_mask(mask):
        mask = flex_mask_of(mask)
    _check(q, k, v, mask, scale)
    if return_aux is not None:
        if return_lse:
            raise ValueError("harness.attention: pass return_lse or return_aux, not both (as flex_attention)")
        if getattr(return_aux, "max_scores", False):
            raise NotImplementedError("harness.attention: return_aux.max_scores is not computed by the fused kernels "
                                      "(only lse is)")
    if _loaded_from is None:
        load_library()
    kind, params, anchors, doc_id, bits = mask.op_inputs(q.device)
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else float(scale)
    out, lse = torch.ops.harness.fused_attention(q, k, v, kind, params, anchors, doc_id, bits, mask.uid, scale)
    if return_aux is not None:
        from torch.nn.attention.flex_attention import AuxOutput

        return out, AuxOutput(lse=lse if return_aux.lse else None, max_scores=None)
    return (out, lse) if return_lse else out


def _is_block_mask(mask) -> bool:
    try:
        from torch.nn.attention.flex_attention import BlockMask
    except ImportError:  # a torch without FlexAttention has no BlockMask to pass
        return False
    return isinstance(mask, BlockMask)


def mask_cache_size() -> int:
    """Masks the op has resolved and cached (one per mask object and (Q_LEN, KV_LEN))."""
    load_library()
    return torch.ops.harness.mask_cache_size()


def cuda_kernels_built() -> bool:
    """Whether the loaded op library has the CUDA kernels."""
    load_library()
    return bool(torch.ops.harness.cuda_kernels_built())


__all__ = ["attention", "load_library", "mask_cache_size", "cuda_kernels_built"]
