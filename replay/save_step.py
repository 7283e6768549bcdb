"""Save one attention step from a training loop, for `harness replay --import step.pt`.

The file is torch.save of a dict: the step's tensors under fixed names plus "meta", a JSON string
with the dims the tensors cannot tell (block size, anchors) and the mask description; or, for a
path ending in .safetensors, a safetensors file of the same tensors with "meta" in its metadata.
The format is in replay/README.md; this helper is all a training script needs:

    from save_step import save_step
    out = attention(q, k, v)                       # q: [batch, heads, Q_LEN, head_dim]
    out.register_hook(lambda grad_out: save_step(
        "step.pt", q, k, v, grad_out, block_size=16,
        mask={"type": "dflash", "context_rule": "before_anchor", "in_block": "bidirectional", "documents": 4},
        anchors=anchor_positions, doc_id=context_document_ids))
"""

import json

import torch


def save_step(path, q, k, v, grad_out, *, mask, block_size=16, anchors=None, doc_id=None, outputs=None,
              name="imported_step", **dims):
    """Writes one step to `path`.

    q, grad_out: [batch, heads, Q_LEN, head_dim]; k, v: [batch, kv_heads, KV_LEN, head_dim], with
    KV_LEN = context + Q_LEN and Q_LEN = anchors * block_size. Lists of tensors save several layers.
    mask: the description (replay/README.md), e.g. {"type": "causal"}.
    anchors: int tensor [anchors], the dflash anchor of each draft block, in the order of q's blocks.
    doc_id: int tensor, the document of each context position (dflash) or KV position (other masks).
    outputs: optional {"out": ..., "dq": ..., "dk": ..., "dv": ...} (same layering as q) that the
    replay's outputs are compared with.
    dims: extra meta dims (anchors, context, heads, ...), checked against the tensors' shapes.
    """
    layered = isinstance(q, (list, tuple))
    entries = {}
    named = [("q", q), ("k", k), ("v", v), ("grad_out", grad_out)] + list((outputs or {}).items())
    for key, value in named:
        if layered:
            for layer, tensor in enumerate(value):
                entries[f"{key}.{layer}"] = tensor.detach().contiguous().cpu()
        else:
            entries[key] = value.detach().contiguous().cpu()
    if anchors is not None:
        entries["anchors"] = torch.as_tensor(anchors).detach().cpu().long()
    if doc_id is not None:
        entries["doc_id"] = torch.as_tensor(doc_id).detach().cpu().int()
    meta = json.dumps({"name": name, "dims": {"block_size": block_size, **dims}, "mask": mask})
    if str(path).endswith(".safetensors"):
        from safetensors.torch import save_file
        save_file(entries, str(path), metadata={"meta": meta})
        return
    entries["meta"] = meta
    torch.save(entries, path, _use_new_zipfile_serialization=True)
