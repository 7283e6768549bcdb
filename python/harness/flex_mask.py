"""Any mask a FlexAttention BlockMask (or a mask_mod) describes, for `harness.attention`.

    block_mask = create_block_mask(my_mask_mod, B, H, Q_LEN, KV_LEN, device="cuda")
    out = flex_attention(q, k, v, block_mask=block_mask)          # before
    out = harness.attention(q, k, v, block_mask)                   # after: converted once, cached
    mask = harness.FlexMask(my_mask_mod, B, H, Q_LEN, KV_LEN, device="cuda")   # or from the mask_mod

The mask reaches the fused kernels as its bits: one bit per (query, key), [batch, heads, Q_LEN,
ceil(KV_LEN / 32)] int32 words, bit kv % 32 of word kv // 32 (kernels/mask_desc.h, kind blockmask).
The kernels build their own block lists from the bits at their own tile sizes, so the BlockMask's
block size (128 by default, any) does not constrain them.

From a BlockMask the bits are what compiled flex_attention computes: full blocks visible, blocks in
neither list hidden, and the mask_mod evaluated once (on the BlockMask's device, vmapped as
create_mask does) inside the partial blocks. The mask_mod is also evaluated in every other block,
to check that it agrees with the lists: where it does not (a block listed full where the mask_mod
hides keys, or a block left out where it shows some), compiled and eager flex_attention give
different results (eager evaluates the mask_mod everywhere and ignores the lists), so by default
this raises ValueError naming the first such block. `mismatch="blocks"` takes compiled flex's
answer, `mismatch="mask_mod"` eager flex's. A BlockMask whose mask_mod is flex's noop_mask (made by
BlockMask.from_kv_blocks without a mask_mod) is block-sparse by definition: its lists are the mask.

Batch and heads: the mask is evaluated at the BlockMask's own batch and head sizes (create_block_mask's
B and H; None there means 1, a mask that is the same for every batch element and head). A pattern
that is the same along an axis is kept once; one that differs runs one kernel call per batch
element (and per head) on our kernels (the dispatch trace says so), as flex_attention needs a
BlockMask with those sizes too.
"""

from __future__ import annotations

import weakref

import torch

from harness.masks import Mask, _check_lengths

MISMATCH_MODES = ("error", "blocks", "mask_mod")
# Elements of the mask_mod grid evaluated at once ([batch, heads, rows, KV_LEN] booleans).
_CHUNK_ELEMENTS = 1 << 26


def pack_bits(visible: torch.Tensor) -> torch.Tensor:
    """[..., KV_LEN] booleans -> [..., ceil(KV_LEN / 32)] int32 words, bit j of word w = key 32 w + j."""
    kv_len = visible.shape[-1]
    words = (kv_len + 31) // 32
    padded = torch.nn.functional.pad(visible.to(torch.int64), (0, words * 32 - kv_len))
    shifts = torch.arange(32, device=visible.device, dtype=torch.int64)
    values = (padded.view(*visible.shape[:-1], words, 32) << shifts).sum(-1)
    return torch.where(values >= 2**31, values - 2**32, values).to(torch.int32)


def unpack_bits(bits: torch.Tensor, kv_len: int) -> torch.Tensor:
    """The inverse of pack_bits: [..., words] int32 -> [..., kv_len] booleans."""
    shifts = torch.arange(32, device=bits.device, dtype=torch.int64)
    unpacked = (bits.to(torch.int64).unsqueeze(-1) >> shifts) & 1
    return unpacked.flatten(-2)[..., :kv_len].bool()


def _evaluate(mask_mod, batch: int, heads: int, q_begin: int, q_end: int, kv_len: int, device) -> torch.Tensor:
    """mask_mod over [batch, heads, q_begin:q_end, kv_len], vmapped as flex's create_mask does."""
    from torch.nn.attention.flex_attention import create_mask

    def shifted(b, h, q_idx, kv_idx):
        return mask_mod(b, h, q_idx + q_begin, kv_idx)

    return create_mask(shifted, batch, heads, q_end - q_begin, kv_len, device=device).bool()


def _row_chunks(batch: int, heads: int, q_len: int, kv_len: int):
    rows = max(1, _CHUNK_ELEMENTS // max(1, batch * heads * kv_len))
    for begin in range(0, q_len, rows):
        yield begin, min(q_len, begin + rows)


def _listed(num_blocks, indices, kv_blocks: int, where: str) -> torch.Tensor:
    """[B, H, q blocks, kv_blocks] booleans: the blocks a (num_blocks, indices) pair lists."""
    width = indices.shape[-1]
    position = torch.arange(width, device=indices.device)
    valid = position < num_blocks.unsqueeze(-1).to(torch.int64)
    index = indices.to(torch.int64)
    if bool((valid & ((index < 0) | (index >= kv_blocks))).any()):
        raise ValueError(f"{where}: a listed kv block index lies outside the {kv_blocks} kv blocks of KV_LEN")
    listed = torch.zeros(*indices.shape[:-1], kv_blocks + 1, dtype=torch.bool, device=indices.device)
    listed.scatter_(-1, torch.where(valid, index, kv_blocks), True)  # invalid entries land in the spare column
    return listed[..., :kv_blocks]


def _as_4d(tensor):
    if tensor is None:
        return None
    while tensor.dim() < 3:
        tensor = tensor.unsqueeze(0)
    return tensor


def _dedupe(bits: torch.Tensor) -> torch.Tensor:
    """Keeps one slice along batch (dim 0) and heads (dim 1) where every slice is the same."""
    if bits.shape[0] > 1 and bool((bits == bits[:1]).all()):
        bits = bits[:1]
    if bits.shape[1] > 1 and bool((bits == bits[:, :1]).all()):
        bits = bits[:, :1]
    return bits.contiguous()


def bits_from_block_mask(block_mask, mismatch: str = "error") -> torch.Tensor:
    """The bits of a FlexAttention BlockMask (module docstring): int32 [B, H, Q_LEN, words] on its
    device, B and H its own sizes (1 where the mask is the same for every batch element or head)."""
    from torch.nn.attention.flex_attention import noop_mask

    where = "harness.FlexMask"
    if mismatch not in MISMATCH_MODES:
        raise ValueError(f"{where}: mismatch must be one of {', '.join(MISMATCH_MODES)} (got {mismatch!r})")
    q_len, kv_len = (int(x) for x in block_mask.seq_lengths)
    _check_lengths(q_len, kv_len, where)
    q_block, kv_block = (int(x) for x in block_mask.BLOCK_SIZE)
    kv_num_blocks, kv_indices = _as_4d(block_mask.kv_num_blocks), _as_4d(block_mask.kv_indices)
    full_num_blocks, full_indices = _as_4d(block_mask.full_kv_num_blocks), _as_4d(block_mask.full_kv_indices)
    batch, heads, q_blocks = kv_num_blocks.shape
    kv_blocks = (kv_len + kv_block - 1) // kv_block
    if q_blocks * q_block < q_len:
        raise ValueError(f"{where}: the BlockMask has {q_blocks} q blocks of {q_block}, fewer than Q_LEN {q_len} needs")
    device = kv_num_blocks.device
    partial = _listed(kv_num_blocks, kv_indices, kv_blocks, where)
    full = _listed(full_num_blocks, full_indices, kv_blocks, where) if full_num_blocks is not None else torch.zeros_like(partial)
    block_sparse_only = block_mask.mask_mod is noop_mask
    kv_block_of = torch.arange(kv_len, device=device) // kv_block
    chunks = []
    for begin, end in _row_chunks(batch, heads, q_len, kv_len):
        q_block_of = torch.arange(begin, end, device=device) // q_block
        in_partial = partial[:, :, q_block_of][..., kv_block_of]  # [B, H, rows, KV]
        in_full = full[:, :, q_block_of][..., kv_block_of]
        listed = in_partial | in_full
        mod = _evaluate(block_mask.mask_mod, batch, heads, begin, end, kv_len, device)
        compiled = in_full | (in_partial & mod)
        if not block_sparse_only and mismatch == "error":
            wrong = (in_full & ~mod) | (~listed & mod)
            if bool(wrong.any()):
                b, h, row, kv = (int(x) for x in wrong.nonzero()[0])
                q = begin + row
                listed_as = "full" if bool(in_full[b, h, row, kv]) else "in neither list (empty)"
                says = "hides" if listed_as == "full" else "shows"
                raise ValueError(
                    f"{where}: the BlockMask's mask_mod disagrees with its block lists: block (q {q // q_block}, "
                    f"kv {kv // kv_block}) of batch {b}, head {h} is {listed_as}, but the mask_mod {says} key {kv} "
                    f"to query {q}. Compiled flex_attention follows the lists there, eager flex_attention the "
                    f"mask_mod; pass mismatch='blocks' (compiled flex's result) or mismatch='mask_mod' (eager's)")
        chunks.append(pack_bits(mod if mismatch == "mask_mod" else compiled))
    return _dedupe(torch.cat(chunks, dim=2))


def bits_from_mask_mod(mask_mod, batch, heads, q_len: int, kv_len: int, device=None) -> torch.Tensor:
    """The bits of a mask_mod evaluated over [batch or 1, heads or 1, q_len, kv_len] (int32 words)."""
    _check_lengths(q_len, kv_len, "harness.FlexMask")
    batch, heads = batch or 1, heads or 1
    if device is None:
        device = torch.accelerator.current_accelerator() or "cpu"
    chunks = [pack_bits(_evaluate(mask_mod, batch, heads, begin, end, kv_len, device))
              for begin, end in _row_chunks(batch, heads, q_len, kv_len)]
    return _dedupe(torch.cat(chunks, dim=2))


class FlexMask(Mask):
    """Any mask, as its bits: from a mask_mod (as create_block_mask takes it) or a BlockMask.

        harness.FlexMask(mask_mod, B, H, Q_LEN, KV_LEN, device="cuda")
        harness.FlexMask.from_block_mask(block_mask, mismatch="error")
        harness.FlexMask.from_bits(bits, kv_len)      # int32 [B, H, Q_LEN, ceil(KV_LEN / 32)]

    B and H: None (or 1) when the mask is the same for every batch element and head; otherwise the
    call's batch size and head count."""

    kind = "blockmask"

    def __init__(self, mask_mod=None, B=None, H=None, Q_LEN=None, KV_LEN=None, device=None, *, bits=None):
        super().__init__()
        if bits is None:
            if mask_mod is None or Q_LEN is None or KV_LEN is None:
                raise TypeError("harness.FlexMask: give mask_mod, B, H, Q_LEN, KV_LEN (as create_block_mask), "
                                "or use FlexMask.from_block_mask / FlexMask.from_bits")
            bits = bits_from_mask_mod(mask_mod, B, H, Q_LEN, KV_LEN, device)
        elif KV_LEN is None:
            raise TypeError("harness.FlexMask: bits need KV_LEN (the words do not say how many keys the last one holds)")
        self.bits = self._checked_bits(bits, KV_LEN)
        self.q_len, self.kv_len = int(self.bits.shape[2]), int(KV_LEN)
        self._mask_mod = mask_mod

    @staticmethod
    def _checked_bits(bits, kv_len):
        if not isinstance(bits, torch.Tensor) or bits.dtype != torch.int32 or bits.dim() != 4:
            raise TypeError("harness.FlexMask: bits must be an int32 tensor [batch, heads, Q_LEN, ceil(KV_LEN / 32)] "
                            f"(got {getattr(bits, 'dtype', type(bits).__name__)} "
                            f"{tuple(bits.shape) if isinstance(bits, torch.Tensor) else ''})")
        _check_lengths(max(1, int(bits.shape[2])), kv_len, "harness.FlexMask")
        if bits.shape[3] != (kv_len + 31) // 32:
            raise ValueError(f"harness.FlexMask: bits have {bits.shape[3]} words per row, KV_LEN {kv_len} needs "
                             f"{(kv_len + 31) // 32}")
        return bits.contiguous()

    @classmethod
    def from_block_mask(cls, block_mask, mismatch: str = "error"):
        """The mask of a FlexAttention BlockMask (see the module docstring for `mismatch`)."""
        mask = cls(bits=bits_from_block_mask(block_mask, mismatch), KV_LEN=int(block_mask.seq_lengths[1]))
        mask._mask_mod = block_mask.mask_mod
        return mask

    @classmethod
    def from_bits(cls, bits, kv_len: int):
        """A mask from its packed bits (pack_bits' layout), e.g. a capsule's mask.bits."""
        return cls(bits=bits, KV_LEN=kv_len)

    @property
    def slices(self):
        """(batch, heads) patterns the mask holds: 1 along an axis where it is the same everywhere."""
        return int(self.bits.shape[0]), int(self.bits.shape[1])

    def check(self, q_len, kv_len):
        super().check(q_len, kv_len)
        if (q_len, kv_len) != (self.q_len, self.kv_len):
            raise ValueError(f"FlexMask: q has Q_LEN {q_len} and k KV_LEN {kv_len} but the mask was made for Q_LEN "
                             f"{self.q_len}, KV_LEN {self.kv_len}")

    def check_call(self, batch: int, heads: int):
        """Raises ValueError when the mask's batch or head patterns do not fit the call's."""
        for name, have, call in (("batch", self.bits.shape[0], batch), ("heads", self.bits.shape[1], heads)):
            if have not in (1, call):
                raise ValueError(f"FlexMask: the mask has {have} {name} patterns but the call has {name} {call} "
                                 f"(a BlockMask's B and H must be 1 or the call's)")

    def dense(self, q_len: int, kv_len: int, device="cpu") -> torch.Tensor:
        """[Q_LEN, KV_LEN] booleans, or [B, H, Q_LEN, KV_LEN] when the mask differs along batch or heads."""
        self.check(q_len, kv_len)
        dense = unpack_bits(self.bits.to(device), kv_len)
        return dense[0, 0] if self.slices == (1, 1) else dense

    def mask_mod(self, q_len: int, kv_len: int):
        self.check(q_len, kv_len)

        def mask_mod(b, h, q_idx, kv_idx):
            bits = self._arrays(q_idx.device)["bits"]
            word = bits[b % bits.shape[0], h % bits.shape[1], q_idx, kv_idx // 32]
            return ((word >> (kv_idx % 32)) & 1) == 1

        return mask_mod

    def _array_fields(self):
        return {"bits": self.bits}

    def op_args(self):
        kind, params, anchors, doc_id, _ = super().op_args()
        return kind, params, anchors, doc_id, self.bits

    def __repr__(self):
        b, h = self.slices
        return f"FlexMask(Q_LEN={self.q_len}, KV_LEN={self.kv_len}, batch patterns={b}, head patterns={h})"


# BlockMask -> FlexMask, once per BlockMask object (and mismatch mode) for as long as it lives.
_converted = weakref.WeakKeyDictionary()


@torch.compiler.disable
def flex_mask_of(block_mask, mismatch: str = "error") -> FlexMask:
    """The FlexMask of a BlockMask, converted on first use and cached with the BlockMask."""
    per_mode = _converted.setdefault(block_mask, {})
    if mismatch not in per_mode:
        per_mode[mismatch] = FlexMask.from_block_mask(block_mask, mismatch)
    return per_mode[mismatch]


__all__ = ["FlexMask", "flex_mask_of", "pack_bits", "unpack_bits", "bits_from_block_mask", "bits_from_mask_mod"]
