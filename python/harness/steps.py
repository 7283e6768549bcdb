"""Save one attention step from a training loop, for `harness replay --import step.pt`.

The file is torch.save of a dict: the step's tensors under fixed names plus "meta", a JSON string
with the dims the tensors cannot tell (block size, anchors) and the mask description. The format
is in replay/README.md; this helper is all a training script needs:

    import harness
    mask = harness.DFlashMask(anchors, doc_id, context=8192, block_size=16)
    out = harness.attention(q, k, v, mask)           # q: [batch, heads, Q_LEN, head_dim]
    out.register_hook(lambda grad_out: harness.save_step("step.pt", q, k, v, grad_out, mask=mask))

`mask` is a harness mask object (its anchors, document ids and block size are saved with it), a
FlexAttention BlockMask or harness.FlexMask (saved as its bits, "mask.bits": the step replays on our
kernels whatever the mask), or the spec's description as a dict, e.g. {"type": "dflash",
"documents": 4} with anchors=, doc_id=.
"""

import json


def _mask_description(mask):
    """(description dict, anchors, doc_id, block_size or None, bits or None) of a harness mask object
    or a FlexAttention BlockMask."""
    from harness.flex_mask import FlexMask, flex_mask_of
    from harness.masks import DFlashMask, DocumentCausalMask, Mask, SlidingWindowMask
    from harness.ops import _is_block_mask

    if _is_block_mask(mask):
        mask = flex_mask_of(mask)
    if not isinstance(mask, Mask):
        raise TypeError(f"save_step: mask must be a harness mask or a dict, or a BlockMask (got {type(mask).__name__})")
    description = {"type": mask.kind}
    if isinstance(mask, FlexMask):
        return description, None, None, None, mask.bits
    if isinstance(mask, DFlashMask):
        description.update(context_rule=mask.context_rule, in_block=mask.in_block)
        return description, mask.anchors, mask.doc_id, mask.block_size, None
    if isinstance(mask, DocumentCausalMask):
        return description, None, mask.doc_id, None, None
    if isinstance(mask, SlidingWindowMask):
        description["window"] = mask.window
    return description, None, None, None, None


def save_step(path, q, k, v, grad_out, *, mask, block_size=16, anchors=None, doc_id=None, outputs=None,
              name="imported_step", **dims):
    """Writes one step to `path`.

    q: [batch, heads, Q_LEN, head_dim]; k: [batch, kv_heads, KV_LEN, head_dim]; v: [batch, kv_heads,
    KV_LEN, v_head_dim]; grad_out: [batch, heads, Q_LEN, v_head_dim] (v_head_dim may differ from
    head_dim), with KV_LEN = context + Q_LEN and Q_LEN = anchors * block_size. Lists of tensors save
    several layers.
    mask: a harness mask object, a BlockMask, or the description (replay/README.md), e.g.
    {"type": "causal"}.
    anchors: int tensor [anchors], the dflash anchor of each draft block, in the order of q's blocks.
    doc_id: int tensor, the document of each context position (dflash) or KV position (other masks).
    outputs: optional {"out": ..., "dq": ..., "dk": ..., "dv": ...} (same layering as q) that the
    replay's outputs are compared with.
    dims: extra meta dims (anchors, context, heads, ...), checked against the tensors' shapes.
    """
    import torch

    bits = None
    if not isinstance(mask, dict):
        mask, mask_anchors, mask_doc_id, mask_block_size, bits = _mask_description(mask)
        anchors = mask_anchors if anchors is None else anchors
        doc_id = mask_doc_id if doc_id is None else doc_id
        block_size = mask_block_size or block_size
    layered = isinstance(q, (list, tuple))
    entries = {}
    named = [("q", q), ("k", k), ("v", v), ("grad_out", grad_out)] + list((outputs or {}).items())
    for key, value in named:
        if layered != isinstance(value, (list, tuple)):
            raise TypeError(f"save_step: {key} must be {'a list of tensors like q' if layered else 'a tensor like q'}")
        for layer, tensor in enumerate(value if layered else [value]):
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"save_step: {key} must hold tensors (got {type(tensor).__name__})")
            if tensor.dim() != 4:
                raise ValueError(f"save_step: {key} must be 4-D [batch, heads, length, head_dim] "
                                 f"(got shape {tuple(tensor.shape)})")
            entries[f"{key}.{layer}" if layered else key] = tensor.detach().contiguous().cpu()
    if anchors is not None:
        entries["anchors"] = torch.as_tensor(anchors).detach().cpu().long()
    if doc_id is not None:
        entries["doc_id"] = torch.as_tensor(doc_id).detach().cpu().int()
    if bits is not None:
        entries["mask.bits"] = bits.detach().cpu().contiguous()
    first_q = q[0] if layered else q
    if mask.get("type") != "dflash" and first_q.shape[2] % block_size != 0:
        block_size = 1  # block_size is dflash's draft block; elsewhere only Q_LEN = anchors * block_size counts
    meta = json.dumps({"name": name, "dims": {"block_size": block_size, **dims}, "mask": mask})
    if str(path).endswith(".safetensors"):
        # The same tensors as a safetensors file, "meta" in its metadata (replay/README.md).
        from safetensors.torch import save_file
        save_file({key: value.contiguous() for key, value in entries.items()}, str(path), metadata={"meta": meta})
        return
    entries["meta"] = meta
    torch.save(entries, path, _use_new_zipfile_serialization=True)


__all__ = ["save_step"]
