"""Any attention mask as plain tensors: block lists plus the partial blocks' bits.

A mask written as a closure (a FlexAttention `mask_mod` over anchor positions and document ids, or
an SDPA boolean `attn_mask`) cannot be stored as code. What any kernel needs of it can: which
(q block, kv block) pairs are empty, full or partial, and inside each partial block which elements
are visible. `harness.capture` stores a captured mask this way and `harness replay --import` reads
it back (python/README.md, "Mask tables"):

    mask.kv_num_blocks       int32 [B, H, NQ]        partial kv blocks per q block
    mask.kv_indices          int32 [B, H, NQ, NKV]   their indices, the first kv_num_blocks valid
    mask.full_kv_num_blocks  int32 [B, H, NQ]        full kv blocks per q block (0 when none)
    mask.full_kv_indices     int32 [B, H, NQ, NKV]
    mask.partial_bits        bool  [P, Q_BLOCK, KV_BLOCK]

P is the sum of kv_num_blocks; partial block p is the p-th (b, h, q block, i < kv_num_blocks) in
that order (b outermost, i innermost), its kv block kv_indices[b, h, q block, i]. Element [p, r, c]
says whether query q_block * Q_BLOCK + r sees key kv_block * KV_BLOCK + c; positions past Q_LEN or
KV_LEN are False. B and H are 1 where the mask broadcasts over them. Full blocks are visible
everywhere in range, blocks in neither list nowhere: the layout of FlexAttention's BlockMask,
which kernels/block_mask.h follows too.
"""

import torch

#: Partial blocks whose mask_mod is evaluated at once (each is Q_BLOCK x KV_BLOCK elements).
_BLOCKS_PER_CHUNK = 64


def _int32(tensor):
    return tensor.detach().to(device="cpu", dtype=torch.int32).contiguous()


def _partial_block_list(kv_num_blocks, kv_indices):
    """(b, h, q block, kv block) of every partial block, as four int64 CPU tensors, in table order."""
    batch, heads, q_blocks = kv_num_blocks.shape
    counts = kv_num_blocks.to(torch.int64)
    slots = torch.arange(kv_indices.shape[-1]).view(1, 1, 1, -1)
    valid = slots < counts.unsqueeze(-1)                       # [B, H, NQ, NKV]
    b, h, qb, slot = valid.nonzero(as_tuple=True)              # row-major: b, h, q block, slot
    return b, h, qb, kv_indices.to(torch.int64)[b, h, qb, slot]


def block_mask_tables(block_mask, q_len=None, kv_len=None):
    """The tables of a FlexAttention BlockMask, its mask_mod evaluated on every partial block.

    The mask_mod runs where its closure's tensors live (the BlockMask's device), under torch.vmap
    over (b, h, q, kv) as FlexAttention's create_mask runs it, 64 blocks at a time; indices past the
    sequence are clamped before the call and masked after it, so a mask_mod that indexes a tensor by
    q or kv never reads out of range."""
    q_block, kv_block = (int(size) for size in block_mask.BLOCK_SIZE)
    seq_q, seq_kv = (int(length) for length in block_mask.seq_lengths)
    q_len = seq_q if q_len is None else int(q_len)
    kv_len = seq_kv if kv_len is None else int(kv_len)
    kv_num_blocks = _int32(block_mask.kv_num_blocks)
    kv_indices = _int32(block_mask.kv_indices)
    if block_mask.full_kv_num_blocks is not None:
        full_kv_num_blocks = _int32(block_mask.full_kv_num_blocks)
        full_kv_indices = _int32(block_mask.full_kv_indices)
    else:
        full_kv_num_blocks = torch.zeros_like(kv_num_blocks)
        full_kv_indices = torch.zeros_like(kv_indices)
    b, h, qb, kvb = _partial_block_list(kv_num_blocks, kv_indices)
    device = block_mask.kv_indices.device
    mask_mod = block_mask.mask_mod
    # vmap over kv, then q, then the blocks: mask_mod sees 0-d index tensors, as in create_mask.
    per_kv = torch.vmap(mask_mod, in_dims=(None, None, None, 0))
    per_q = torch.vmap(per_kv, in_dims=(None, None, 0, None))
    per_block = torch.vmap(per_q, in_dims=(0, 0, 0, 0))
    rows = torch.arange(q_block)
    cols = torch.arange(kv_block)
    chunks = []
    for start in range(0, b.numel(), _BLOCKS_PER_CHUNK):
        part = slice(start, start + _BLOCKS_PER_CHUNK)
        q_idx = qb[part].unsqueeze(1) * q_block + rows              # [n, Q_BLOCK]
        kv_idx = kvb[part].unsqueeze(1) * kv_block + cols           # [n, KV_BLOCK]
        in_range = (q_idx < q_len).unsqueeze(2) & (kv_idx < kv_len).unsqueeze(1)
        bits = per_block(b[part].to(device), h[part].to(device), q_idx.clamp(max=q_len - 1).to(device),
                         kv_idx.clamp(max=kv_len - 1).to(device))
        chunks.append(bits.to(device="cpu", dtype=torch.bool) & in_range)
    partial_bits = torch.cat(chunks) if chunks else torch.zeros(0, q_block, kv_block, dtype=torch.bool)
    return {"mask.kv_num_blocks": kv_num_blocks, "mask.kv_indices": kv_indices,
            "mask.full_kv_num_blocks": full_kv_num_blocks, "mask.full_kv_indices": full_kv_indices,
            "mask.partial_bits": partial_bits.contiguous()}, (q_block, kv_block)


def _first_true_indices(flags):
    """For [..., N] booleans: (count, indices) with the True positions first, ascending, as int32."""
    count = flags.sum(-1, dtype=torch.int32)
    positions = torch.arange(flags.shape[-1]).expand_as(flags)
    # Sorting on (not flag, position) puts the flagged positions first and keeps them ascending.
    order = torch.argsort((~flags).to(torch.int64) * flags.shape[-1] + positions, dim=-1)
    indices = torch.where(torch.arange(flags.shape[-1]) < count.unsqueeze(-1), order, torch.zeros_like(order))
    return count, indices.to(torch.int32)


def dense_mask_tables(mask, block_size=128):
    """The tables of a dense boolean mask (an SDPA attn_mask): [Q, KV], or [B or 1, H or 1, Q, KV]."""
    mask = mask.detach().to("cpu", torch.bool)
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    batch, heads, q_len, kv_len = mask.shape
    q_blocks = -(-q_len // block_size)
    kv_blocks = -(-kv_len // block_size)
    padded = torch.zeros(batch, heads, q_blocks * block_size, kv_blocks * block_size, dtype=torch.bool)
    padded[..., :q_len, :kv_len] = mask
    in_range = torch.zeros_like(padded[0, 0])
    in_range[:q_len, :kv_len] = True
    # [B, H, NQ, Q_BLOCK, NKV, KV_BLOCK] -> [B, H, NQ, NKV, Q_BLOCK, KV_BLOCK]
    blocks = padded.view(batch, heads, q_blocks, block_size, kv_blocks, block_size).permute(0, 1, 2, 4, 3, 5)
    in_range = in_range.view(q_blocks, block_size, kv_blocks, block_size).permute(0, 2, 1, 3)
    visible = blocks.flatten(-2).sum(-1)
    possible = in_range.flatten(-2).sum(-1)
    full = visible == possible
    partial = (visible > 0) & ~full
    kv_num_blocks, kv_indices = _first_true_indices(partial)
    full_kv_num_blocks, full_kv_indices = _first_true_indices(full)
    b, h, qb, kvb = _partial_block_list(kv_num_blocks, kv_indices)
    partial_bits = blocks[b, h, qb, kvb].contiguous()
    return {"mask.kv_num_blocks": kv_num_blocks, "mask.kv_indices": kv_indices,
            "mask.full_kv_num_blocks": full_kv_num_blocks, "mask.full_kv_indices": full_kv_indices,
            "mask.partial_bits": partial_bits}, (block_size, block_size)


def tables_to_dense(tables, block_size, q_len, kv_len):
    """The dense boolean mask [B, H, Q, KV] the tables describe (for tests and small masks)."""
    q_block, kv_block = block_size
    num = tables["mask.kv_num_blocks"]
    batch, heads, q_blocks = num.shape
    kv_blocks = tables["mask.kv_indices"].shape[-1]
    dense = torch.zeros(batch, heads, q_blocks * q_block, kv_blocks * kv_block, dtype=torch.bool)
    b, h, qb, kvb = _partial_block_list(tables["mask.full_kv_num_blocks"], tables["mask.full_kv_indices"])
    for bi, hi, qi, ki in zip(b.tolist(), h.tolist(), qb.tolist(), kvb.tolist()):
        dense[bi, hi, qi * q_block:(qi + 1) * q_block, ki * kv_block:(ki + 1) * kv_block] = True
    b, h, qb, kvb = _partial_block_list(num, tables["mask.kv_indices"])
    for p, (bi, hi, qi, ki) in enumerate(zip(b.tolist(), h.tolist(), qb.tolist(), kvb.tolist())):
        dense[bi, hi, qi * q_block:(qi + 1) * q_block, ki * kv_block:(ki + 1) * kv_block] = tables["mask.partial_bits"][p]
    return dense[..., :q_len, :kv_len]


__all__ = ["block_mask_tables", "dense_mask_tables", "tables_to_dense"]
