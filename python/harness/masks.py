"""Mask objects that mirror the spec's mask kinds (kernels/mask_desc.h holds the one definition).

A mask says which keys a query sees. Every mask here can produce:
  - `dense(q_len, kv_len)`: the boolean [q_len, kv_len] matrix (the reference),
  - `mask_mod`: the same predicate as a FlexAttention mask_mod, for `create_block_mask`,
  - `flex_block_mask(q_len, kv_len, device)`: the FlexAttention BlockMask, built once and cached,
and `harness.attention` hands it to the fused kernels, which cache their own BlockMask and device
arrays per mask object, so a mask built once outside a training loop costs nothing per step.

Geometry:
  - DFlash: KV = [context | draft block 0 | ... | draft block N-1], Q = [block 0 | ... ], so
    Q_LEN = anchors * block_size and KV_LEN = context + Q_LEN. Query q of block i = q // block_size
    sees context positions kv < anchors[i] (kv <= anchors[i] with context_rule="through_anchor")
    that lie in the anchor's document, and its own draft block (all of it with
    in_block="bidirectional", positions up to its own with in_block="causal").
  - Causal, DocumentCausal, SlidingWindow: queries are the last Q_LEN positions of the KV
    sequence (bottom-right aligned: query q sits at q + KV_LEN - Q_LEN); documents split the KV
    sequence; the window counts back from the query, itself included (window 1 sees itself).
  - Full: every key.
  - FlexMask (harness/flex_mask.py): any mask a FlexAttention BlockMask or mask_mod describes, as
    its bits.
"""

from __future__ import annotations

import itertools
import threading
import weakref

import torch

CONTEXT_RULES = ("before_anchor", "through_anchor")
IN_BLOCK_MODES = ("bidirectional", "causal")

# Kind codes shared with the C++ op (python/csrc/ops.cpp): the order of kernels::MaskKind.
KIND_CODES = {"dflash": 0, "causal": 1, "document_causal": 2, "sliding_window": 3, "full": 4, "blockmask": 5}

_uids = itertools.count(1)
_uid_lock = threading.Lock()
# Set by harness.ops.load_library: a mask that goes away then drops the op's cached copy.
_ops_loaded = False


def _release(uid: int) -> None:
    if _ops_loaded:
        try:
            torch.ops.harness.release_mask(uid)
        except Exception:  # noqa: BLE001 - at interpreter exit the library may be gone already
            pass


def _next_uid() -> int:
    with _uid_lock:
        return next(_uids)


def _int_vector(value, name: str, *, where: str) -> torch.Tensor:
    """A 1-D int64 CPU tensor from a tensor or a sequence of ints; ValueError/TypeError naming `name`."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            raise TypeError(f"{where}: {name} must hold integers (got dtype {value.dtype})")
        tensor = value.detach().to("cpu", torch.int64)
    else:
        try:
            tensor = torch.as_tensor(list(value), dtype=torch.int64)
        except (TypeError, ValueError, RuntimeError) as error:
            raise TypeError(f"{where}: {name} must be a 1-D tensor or sequence of ints ({error})") from None
    if tensor.dim() != 1:
        raise ValueError(f"{where}: {name} must be 1-D (got shape {tuple(tensor.shape)})")
    return tensor.contiguous()


def _positive_int(value, name: str, *, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{where}: {name} must be an int (got {type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{where}: {name} must be >= {minimum} (got {value})")
    return value


def _device_key(device) -> str:
    """One key per physical device: "cuda" and "cuda:0" (the current device) are the same."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return str(device)


def _check_lengths(q_len: int, kv_len: int, where: str) -> None:
    for name, value in (("q_len", q_len), ("kv_len", kv_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}: {name} must be an int >= 1 (got {value!r})")


class Mask:
    """Base of the mask kinds. Subclasses define `kind`, `_visible(q, kv, q_len, kv_len)` over
    broadcastable index tensors, and `check(q_len, kv_len)`."""

    kind = ""

    def __init__(self):
        # Identifies this mask to the fused op's cache (python/csrc/ops.cpp): built once per
        # (uid, q_len, kv_len), then reused by every call.
        self.uid = _next_uid()
        self._flex_cache = {}
        self._device_arrays = {}
        self._op_cache = {}
        weakref.finalize(self, _release, self.uid)

    # --- geometry ------------------------------------------------------------------------
    def check(self, q_len: int, kv_len: int) -> None:
        """Raises ValueError naming the argument when the mask cannot apply to these lengths."""
        _check_lengths(q_len, kv_len, f"{type(self).__name__}")

    def _visible(self, q_idx, kv_idx, q_len, kv_len):
        raise NotImplementedError

    # --- forms of the predicate ----------------------------------------------------------
    def dense(self, q_len: int, kv_len: int, device="cpu") -> torch.Tensor:
        """Boolean [q_len, kv_len]: True where query q sees key kv."""
        self.check(q_len, kv_len)
        q_idx = torch.arange(q_len, device=device).unsqueeze(1)
        kv_idx = torch.arange(kv_len, device=device).unsqueeze(0)
        return self._visible_on(q_idx, kv_idx, q_len, kv_len, torch.device(device))

    def _visible_on(self, q_idx, kv_idx, q_len, kv_len, device):
        return self._visible(q_idx, kv_idx, q_len, kv_len, self._arrays(device))

    def _arrays(self, device) -> dict:
        """The mask's index arrays on `device` (copied once per device)."""
        key = _device_key(device)
        if key not in self._device_arrays:
            self._device_arrays[key] = {name: t.to(device) for name, t in self._array_fields().items()}
        return self._device_arrays[key]

    def _array_fields(self) -> dict:
        return {}

    def mask_mod(self, q_len: int, kv_len: int):
        """The predicate as a FlexAttention mask_mod(b, h, q_idx, kv_idx) for these lengths."""
        self.check(q_len, kv_len)

        def mask_mod(b, h, q_idx, kv_idx):
            return self._visible(q_idx, kv_idx, q_len, kv_len, self._arrays(q_idx.device))

        return mask_mod

    def flex_block_mask(self, q_len: int, kv_len: int, device="cpu", block_size=128):
        """FlexAttention's BlockMask for this mask (B = H = 1, broadcast), built once per shape."""
        from torch.nn.attention.flex_attention import create_block_mask

        key = (q_len, kv_len, str(device), block_size)
        if key not in self._flex_cache:
            self._flex_cache[key] = create_block_mask(self.mask_mod(q_len, kv_len), None, None, q_len, kv_len,
                                                      device=device, BLOCK_SIZE=block_size)
        return self._flex_cache[key]

    # --- what the fused op needs ---------------------------------------------------------
    def op_args(self):
        """(kind code, [context, block_size, window, context_rule, in_block], anchors, doc_id, bits):
        the description the C++ op builds its cached mask from (python/csrc/ops.cpp)."""
        empty = torch.empty(0, dtype=torch.int32)
        return KIND_CODES[self.kind], [0, 1, 0, 0, 0], empty, empty, empty

    def op_inputs(self, device):
        """op_args() with the three arrays on `device`, computed once per device (the op reads them
        only on its first call of a shape; on the device they keep a compiled graph free of CPU
        inputs, which CUDA graphs need)."""
        key = _device_key(device)
        if key not in self._op_cache:
            kind, params, anchors, doc_id, bits = self.op_args()
            self._op_cache[key] = (kind, params, anchors.to(device), doc_id.to(device), bits.to(device))
        return self._op_cache[key]

    def to(self, device):
        """Prepares the mask's arrays on `device` (as create_block_mask(device=...) does) and
        returns the mask; call it before torch.compile so that no copy lands in the graph."""
        self.op_inputs(torch.device(device))
        self._arrays(torch.device(device))
        return self

    def __repr__(self):
        return f"{type(self).__name__}()"


class FullMask(Mask):
    """Every query sees every key."""

    kind = "full"

    def _visible(self, q_idx, kv_idx, q_len, kv_len, arrays):
        return (q_idx >= 0) & (kv_idx >= 0)


class CausalMask(Mask):
    """Query q (at absolute position q + KV_LEN - Q_LEN) sees keys kv <= its position."""

    kind = "causal"

    def _visible(self, q_idx, kv_idx, q_len, kv_len, arrays):
        return kv_idx <= q_idx + (kv_len - q_len)


class SlidingWindowMask(Mask):
    """Causal, limited to the last `window` positions (the query's own included)."""

    kind = "sliding_window"

    def __init__(self, window: int):
        super().__init__()
        self.window = _positive_int(window, "window", where="SlidingWindowMask")

    def _visible(self, q_idx, kv_idx, q_len, kv_len, arrays):
        q_abs = q_idx + (kv_len - q_len)
        return (kv_idx <= q_abs) & (kv_idx > q_abs - self.window)

    def op_args(self):
        kind, params, anchors, doc_id, bits = super().op_args()
        params[2] = self.window
        return kind, params, anchors, doc_id, bits

    def __repr__(self):
        return f"SlidingWindowMask(window={self.window})"


class DocumentCausalMask(Mask):
    """Causal within documents: `doc_id` gives the document of every KV position."""

    kind = "document_causal"

    def __init__(self, doc_id):
        super().__init__()
        self.doc_id = _int_vector(doc_id, "doc_id", where="DocumentCausalMask")
        if self.doc_id.numel() == 0:
            raise ValueError("DocumentCausalMask: doc_id must name the document of every KV position (got 0 entries)")
        if int(self.doc_id.min()) < 0:
            raise ValueError(f"DocumentCausalMask: doc_id must be >= 0 (got {int(self.doc_id.min())})")

    def check(self, q_len, kv_len):
        super().check(q_len, kv_len)
        if self.doc_id.numel() != kv_len:
            raise ValueError(f"DocumentCausalMask: doc_id has {self.doc_id.numel()} entries but k and v have "
                             f"KV_LEN {kv_len}: it must name the document of every KV position")

    def _array_fields(self):
        return {"doc_id": self.doc_id}

    def _visible(self, q_idx, kv_idx, q_len, kv_len, arrays):
        doc_id = arrays["doc_id"]
        q_abs = q_idx + (kv_len - q_len)
        # A query before the KV sequence (q_len > kv_len) sees nothing; clamp only keeps the
        # lookup in range.
        query_doc = doc_id[q_abs.clamp(0, kv_len - 1)]
        return (kv_idx <= q_abs) & (doc_id[kv_idx] == query_doc) & (q_abs >= 0)

    def op_args(self):
        kind, params, anchors, _, bits = super().op_args()
        return kind, params, anchors, self.doc_id.to(torch.int32), bits

    def __repr__(self):
        return f"DocumentCausalMask(doc_id=<{self.doc_id.numel()} positions, {int(self.doc_id.max()) + 1} documents>)"


class DFlashMask(Mask):
    """The drafter-training mask (see the module docstring).

    anchors: int tensor [N], the context position each draft block is anchored at, in the order
        of q's blocks; every anchor must lie in the context (0 <= anchor < context).
    doc_id: int tensor [context], the document of each context position (None: one document).
    context: length of the context part of KV; Q_LEN = N * block_size, KV_LEN = context + Q_LEN.
    """

    kind = "dflash"

    def __init__(self, anchors, doc_id=None, context=None, block_size: int = 16,
                 context_rule: str = "before_anchor", in_block: str = "bidirectional"):
        super().__init__()
        where = "DFlashMask"
        self.block_size = _positive_int(block_size, "block_size", where=where)
        if context is None:
            if doc_id is None:
                raise ValueError(f"{where}: context is required (the length of the context part of KV) "
                                 "when doc_id is not given")
            context = len(doc_id)
        self.context = _positive_int(context, "context", where=where)
        if context_rule not in CONTEXT_RULES:
            raise ValueError(f"{where}: context_rule must be one of {', '.join(CONTEXT_RULES)} (got {context_rule!r})")
        if in_block not in IN_BLOCK_MODES:
            raise ValueError(f"{where}: in_block must be one of {', '.join(IN_BLOCK_MODES)} (got {in_block!r})")
        self.context_rule = context_rule
        self.in_block = in_block
        self.anchors = _int_vector(anchors, "anchors", where=where)
        if self.anchors.numel() == 0:
            raise ValueError(f"{where}: anchors must hold at least one anchor (one per draft block)")
        low, high = int(self.anchors.min()), int(self.anchors.max())
        if low < 0 or high >= self.context:
            bad = low if low < 0 else high
            raise ValueError(f"{where}: anchors must lie in the context, 0 <= anchor < context = {self.context} "
                             f"(got anchor {bad})")
        if doc_id is None:
            self.doc_id = torch.zeros(self.context, dtype=torch.int64)
        else:
            self.doc_id = _int_vector(doc_id, "doc_id", where=where)
            if self.doc_id.numel() != self.context:
                raise ValueError(f"{where}: doc_id must name the document of each of the {self.context} context "
                                 f"positions (got {self.doc_id.numel()} entries)")
            if self.context and int(self.doc_id.min()) < 0:
                raise ValueError(f"{where}: doc_id must be >= 0 (got {int(self.doc_id.min())})")

    @property
    def q_len(self) -> int:
        return self.anchors.numel() * self.block_size

    @property
    def kv_len(self) -> int:
        return self.context + self.q_len

    def check(self, q_len, kv_len):
        super().check(q_len, kv_len)
        if q_len != self.q_len:
            raise ValueError(f"DFlashMask: q has Q_LEN {q_len} but the mask has {self.anchors.numel()} anchors x "
                             f"block_size {self.block_size} = {self.q_len} query positions")
        if kv_len != self.kv_len:
            raise ValueError(f"DFlashMask: k and v have KV_LEN {kv_len} but the mask needs context {self.context} + "
                             f"Q_LEN {self.q_len} = {self.kv_len}")

    def _array_fields(self):
        return {"anchors": self.anchors, "doc_id": self.doc_id}

    def _visible(self, q_idx, kv_idx, q_len, kv_len, arrays):
        anchors, doc_id = arrays["anchors"], arrays["doc_id"]
        block = q_idx // self.block_size
        anchor = anchors[block]
        context_end = anchor + 1 if self.context_rule == "through_anchor" else anchor
        in_context = kv_idx < self.context
        same_doc = doc_id[kv_idx.clamp(max=self.context - 1)] == doc_id[anchor]
        context_visible = (kv_idx < context_end) & same_doc
        draft_begin = self.context + block * self.block_size
        if self.in_block == "causal":
            draft_end = self.context + q_idx + 1
        else:
            draft_end = draft_begin + self.block_size
        draft_visible = (kv_idx >= draft_begin) & (kv_idx < draft_end)
        return torch.where(in_context, context_visible, draft_visible)

    def op_args(self):
        params = [self.context, self.block_size, 0, CONTEXT_RULES.index(self.context_rule),
                  IN_BLOCK_MODES.index(self.in_block)]
        empty = torch.empty(0, dtype=torch.int32)
        return KIND_CODES["dflash"], params, self.anchors.to(torch.int32), self.doc_id.to(torch.int32), empty

    def __repr__(self):
        return (f"DFlashMask(anchors=<{self.anchors.numel()}>, context={self.context}, block_size={self.block_size}, "
                f"context_rule={self.context_rule!r}, in_block={self.in_block!r})")


__all__ = ["Mask", "FullMask", "CausalMask", "SlidingWindowMask", "DocumentCausalMask", "DFlashMask"]
