#!/usr/bin/env python3
"""Our fused CUDA attention against every peer at its best: one fresh process per (case, peer).

Peers (--peers, comma list):
  ours           harness_bench_attention (the harness's attention(), autotuned fused CUDA kernels); on
                 a mask no named kind expresses, and on the "-generic" cases, harness.attention(q, k,
                 v, block_mask) from Python: the generic path (the BlockMask converted to bits once)
  ours-py        harness.attention from Python with the named mask (DFlashMask, ...): beside the
                 "-generic" cases' ours, the named path under the same Python timing (not default)
  ours-det       the same with --deterministic 1 (the deterministic backward; not in the default list)
  flex           torch.compile(flex_attention, dynamic=False), default mode (Triton kernels)
  flex-autotune  torch.compile(flex_attention, dynamic=False, mode="max-autotune-no-cudagraphs")
  flex-flash     torch.compile(flex_attention, dynamic=False) with kernel_options={"BACKEND": "FLASH"}
                 (the flash-attn-4 CuTe DSL kernels behind flex; needs the flash-attn-4 package)
  fa4            flash-attn-4's own kernels (flash_attn.cute): causal, sliding window, and
                 document_causal through varlen; it has no DFlash mask, the table says so

Every (case, peer) runs in its own Python process (`--worker`), so a compiled function never sees
a second shape and never recompiles with dynamic shapes. The mask is resolved once by
harness_bench_attention (`--describe`: the dflash anchors, the document lengths) and rebuilt in
each peer's own terms; each peer's visible-pair count is checked against the harness's and its
output is checked against an fp32 reference on sampled rows. Inputs: the same seed and generator
sequence as harness_bench_attention (checked through the sums of q, k, v, dout).

Timing (each peer the same way): CUDA events around the op only, a 256 MB write before every op
(the H200's L2 is 60 MB: every op starts cold), ops enqueued back to back without host
synchronization (host overhead hidden, as in triton's do_bench), 3 warm-ups, then --reps timed
ops: the median and the spread (p10-p90) over them; --repeats N runs each (case, peer) in N fresh
processes and reports the median of the medians and the spread across processes.
FLOPs count visible (q, kv) pairs only: fwd 2*pairs*(D + D_V), bwd 2*pairs*(3 D + 2 D_V) (4*pairs*D
and 10*pairs*D when D_V = D), over batch and heads.

Masks no named kind expresses (prefix_lm, tree, dilated_window) and the "-generic" cases are
FlexAttention mask_mods; every peer gets the same mask_mod (ours through harness.attention with the
BlockMask, which needs the op library: --ops-library, default beside --binary's build). Head-dim
cases (hd96, hd192v128, hd256) report "cannot run" for a peer without kernels for them.

    python3 bench/attention_vs_flex.py --binary BUILD/bench/harness_bench_attention \\
        [--cases dflash-128,dflash-512,causal-128 | all] [--peers ours,flex,flex-autotune,flex-flash,fa4]
        [--reps 20] [--repeats 1] [--budget-s 1800] [--json-out r.json] [--md-out r.md]
    python3 bench/attention_vs_flex.py --dry-run     # CPU: mask rewrites and pair counts, small dims
"""

import argparse
import importlib.metadata
import json
import math
import os
import subprocess
import sys
import tempfile
import time

# Real dims of the founding case: 32 heads, 8 KV heads, head_dim 128, context 8192, 4 documents.
BASE = {"mask": "dflash", "anchors": 128, "context": 8192, "heads": 32, "kv_heads": 8, "head_dim": 128,
        "documents": 4, "batch": 1, "window": 0, "v_head_dim": 0, "generic": False}
# Masks no named kind expresses: their mask_mods (generic_mask_mod) are their definition, ours runs
# them through harness.attention(q, k, v, block_mask). Parameters: prefix (prefix_lm), branches
# (tree), window and dilation (dilated_window).
GENERIC_KINDS = ("prefix_lm", "tree", "dilated_window")


def case(**overrides):
    return {**BASE, **overrides}


# Non-dflash masks are bottom-right aligned like every harness mask: Q_LEN = anchors * 16 queries
# are the last Q_LEN positions of KV_LEN = context + Q_LEN keys. "-8k" cases are square (context 0).
CASES = {
    "dflash-128": case(anchors=128),
    "dflash-256": case(anchors=256),
    "dflash-512": case(anchors=512),
    "causal-128": case(mask="causal", anchors=128),
    "dflash-512-hd64": case(anchors=512, head_dim=64),
    "causal-128-hd64": case(mask="causal", anchors=128, head_dim=64),
    "dflash-512-b2": case(anchors=512, batch=2),
    "causal-128-b2": case(mask="causal", anchors=128, batch=2),
    "dflash-512-kv1": case(anchors=512, kv_heads=1),
    "dflash-512-kv32": case(anchors=512, kv_heads=32),
    "dflash-512-ctx4096": case(anchors=512, context=4096),
    "dflash-512-ctx16384": case(anchors=512, context=16384),
    "dflash-512-docs1": case(anchors=512, documents=1),
    "dflash-512-docs8": case(anchors=512, documents=8),
    "document_causal-128": case(mask="document_causal", anchors=128),
    "sliding_window-128": case(mask="sliding_window", anchors=128, window=1024),
    "causal-8k": case(mask="causal", anchors=512, context=0),
    "causal-16k": case(mask="causal", anchors=1024, context=0),
    "document_causal-8k": case(mask="document_causal", anchors=512, context=0),
    "sliding_window-8k": case(mask="sliding_window", anchors=512, context=0, window=1024),
    # The generic path (harness.attention with a BlockMask) on masks no named kind expresses ...
    "prefix_lm-8k": case(mask="prefix_lm", anchors=512, context=0, prefix=2048),
    "tree-4x512": case(mask="tree", anchors=128, context=8192, branches=4),
    "dilated_window-8k": case(mask="dilated_window", anchors=512, context=0, window=512, dilation=2),
    # ... and on named masks, to set beside the named path (ours-py, and ours on the plain case).
    "dflash-512-generic": case(anchors=512, generic=True),
    "document_causal-8k-generic": case(mask="document_causal", anchors=512, context=0, generic=True),
    # FlashAttention-3's other head dims, and DeepSeek's MLA (q, k in 192, v in 128).
    "causal-8k-hd96": case(mask="causal", anchors=512, context=0, head_dim=96),
    "dflash-512-hd96": case(anchors=512, head_dim=96),
    "causal-8k-hd192v128": case(mask="causal", anchors=512, context=0, head_dim=192, v_head_dim=128),
    "dflash-512-hd192v128": case(anchors=512, head_dim=192, v_head_dim=128),
    "causal-8k-hd256": case(mask="causal", anchors=512, context=0, head_dim=256),
    "dflash-512-hd256": case(anchors=512, head_dim=256),
}
DEFAULT_CASES = "dflash-128,dflash-512,causal-128"
# Tiny dims for --device cpu (plumbing) and --dry-run (mask forms against the reference).
TINY = dict(heads=2, kv_heads=1, head_dim=16)
DRY_CASES = {
    "tiny-dflash": case(anchors=6, context=256, documents=3, **TINY),
    "tiny-dflash-through-causal": case(anchors=5, context=200, documents=2, **TINY),
    "tiny-causal": case(mask="causal", anchors=4, context=100, **{**TINY, "kv_heads": 2}),
    "tiny-causal-square": case(mask="causal", anchors=8, context=0, **TINY),
    "tiny-document_causal": case(mask="document_causal", anchors=6, context=150, documents=5, **TINY),
    "tiny-document_causal-square": case(mask="document_causal", anchors=8, context=0, documents=3, **TINY),
    "tiny-sliding_window": case(mask="sliding_window", anchors=4, context=90, window=37, **TINY),
    "tiny-full": case(mask="full", anchors=2, context=40, **TINY),
    "tiny-prefix_lm": case(mask="prefix_lm", anchors=5, context=30, prefix=37, **TINY),
    "tiny-tree": case(mask="tree", anchors=3, context=50, branches=4, **TINY),
    "tiny-dilated_window": case(mask="dilated_window", anchors=6, context=20, window=9, dilation=3, **TINY),
}
PEERS = ["ours", "flex", "flex-autotune", "flex-flash", "fa4", "ours-det", "ours-py"]
DEFAULT_PEERS = "ours,flex,flex-autotune,flex-flash,fa4"  # ours-det: ours with --deterministic 1
FLEX_PEERS = {"flex": {}, "flex-autotune": {"mode": "max-autotune-no-cudagraphs"},
              "flex-flash": {"kernel_options": {"BACKEND": "FLASH"}}}
PEAK_TFLOPS = 790.0  # bf16 dense matmul measured on this H200 model (KINDS.md), for the "% of peak" column
CHECK_TOLERANCE = 3e-2  # max |out - fp32 reference| on sampled rows; bf16 rounding is ~4e-3


def binary_flags(c):
    """harness_bench_attention's flags for a case."""
    flags = ["--mask", c["mask"]]
    for key in ("anchors", "context", "heads", "kv_heads", "head_dim", "documents", "batch", "window", "v_head_dim"):
        flags += [f"--{key.replace('_', '-')}", str(c[key])]
    return flags


def value_head_dim(dims):
    return dims.get("v_head_dim") or dims["head_dim"]


def python_ours(c):
    """Whether the peer ours runs through harness.attention from Python (a generic mask)."""
    return c["mask"] in GENERIC_KINDS or c.get("generic", False)


def generic_case_mask(c):
    """The resolved-mask dict of a mask no named kind expresses (queries bottom-right aligned)."""
    q_len = c["anchors"] * 16
    mask = {"kind": c["mask"], "q_len": q_len, "kv_len": c["context"] + q_len, "context": c["context"], "block_size": 16,
            "window": c.get("window", 0), "context_rule": "before_anchor", "in_block": "bidirectional", "anchors": [],
            "doc_lengths": [c["context"] + q_len]}
    for key in ("prefix", "branches", "dilation"):
        if key in c:
            mask[key] = c[key]
    return mask


def generic_mask_mod(torch, mask, device):
    """The mask_mod of a mask no named kind expresses (written with tensor ops only: it broadcasts
    over index tensors, and the FLASH backend's codegen takes it)."""
    kind, q_len, kv_len = mask["kind"], mask["q_len"], mask["kv_len"]
    offset = kv_len - q_len
    if kind == "prefix_lm":
        prefix = mask["prefix"]
        return lambda b, h, q_idx, kv_idx: (kv_idx < prefix) | (kv_idx <= q_idx + offset)
    if kind == "tree":
        branches = mask["branches"]

        def tree(b, h, q_idx, kv_idx):
            # Context keys for every node; node 0 the root; node n > 0 on branch (n - 1) % branches,
            # seeing the root, its branch's earlier nodes and itself.
            node = kv_idx - offset
            same_branch = ((node - 1) % branches == (q_idx - 1) % branches) & (node < q_idx) & (q_idx > 0) & (node > 0)
            return (node < 0) | (node == q_idx) | (node == 0) | same_branch

        return tree
    if kind == "dilated_window":
        window, dilation = mask["window"], mask["dilation"]

        def dilated(b, h, q_idx, kv_idx):
            back = q_idx + offset - kv_idx
            return (back >= 0) & (back < window * dilation) & (back % dilation == 0)

        return dilated
    raise ValueError(f"unknown generic mask kind {kind!r}")


def generic_reference_rows(torch, mask, q_rows, device):
    """visible[q, kv] of a generic mask, written apart from its mask_mod (checked against it): the
    tree by walking parents, the others from their definitions row by row."""
    kind, q_len, kv_len = mask["kind"], mask["q_len"], mask["kv_len"]
    offset = kv_len - q_len
    rows = []
    for q in q_rows.tolist():
        row = torch.zeros(kv_len, dtype=torch.bool)
        q_abs = q + offset
        if kind == "prefix_lm":
            row[:max(mask["prefix"], q_abs + 1)] = True
        elif kind == "dilated_window":
            for back in range(0, mask["window"] * mask["dilation"], mask["dilation"]):
                if q_abs - back >= 0:
                    row[q_abs - back] = True
        elif kind == "tree":
            row[:offset] = True
            node = q
            while True:  # itself, then each parent: n - branches along the branch, the root after its first node
                row[offset + node] = True
                if node == 0:
                    break
                node = node - mask["branches"] if node > mask["branches"] else 0
        rows.append(row)
    return torch.stack(rows).to(device)


# ---------------------------------------------------------------------------------------------
# The mask in every peer's terms. `mask` is the resolved mask harness_bench_attention prints:
# kind, q_len, kv_len, context, block_size, window, context_rule, in_block, anchors, doc_lengths.

def doc_ids(torch, mask, device):
    lengths = torch.tensor(mask["doc_lengths"], dtype=torch.int64)
    return torch.repeat_interleave(torch.arange(len(lengths)), lengths).to(device=device, dtype=torch.int32)


def reference_rows(torch, mask, q_rows, device):
    """visible[q, kv] for the queries q_rows: ResolvedMask::visible (kernels/mask_desc.cpp) in
    tensor form, written independently of the mask_mods below, which are checked against it."""
    kind, q_len, kv_len = mask["kind"], mask["q_len"], mask["kv_len"]
    if kind in GENERIC_KINDS:
        return generic_reference_rows(torch, mask, q_rows, device)
    q = q_rows.to(device=device, dtype=torch.int64)[:, None]
    kv = torch.arange(kv_len, device=device, dtype=torch.int64)[None, :]
    doc = doc_ids(torch, mask, device).to(torch.int64)
    if kind == "dflash":
        context, block = mask["context"], mask["block_size"]
        anchors = torch.tensor(mask["anchors"], dtype=torch.int64, device=device)
        blk = q // block
        anchor = anchors[blk]
        end = anchor + 1 if mask["context_rule"] == "through_anchor" else anchor
        kv_doc = doc[kv.clamp(max=max(context - 1, 0))] if context > 0 else torch.full_like(kv, -1)
        in_context = (kv < context) & (kv < end) & (kv_doc == doc[anchor])
        begin = context + blk * block
        stop = context + q + 1 if mask["in_block"] == "causal" else begin + block
        return in_context | ((kv >= begin) & (kv < stop))
    q_abs = q + kv_len - q_len
    if kind == "causal":
        return (kv <= q_abs).expand(q.shape[0], kv_len)
    if kind == "document_causal":
        return (kv <= q_abs) & (doc[kv] == doc[q_abs.clamp(min=0)]) & (q_abs >= 0)
    if kind == "sliding_window":
        return (kv <= q_abs) & (kv > q_abs - mask["window"])
    if kind == "full":
        return torch.ones(q.shape[0], kv_len, dtype=torch.bool, device=device)
    raise ValueError(f"unknown mask kind {kind!r}")


def mask_mod_original(torch, mask, device):
    """The mask_mod the old benchmark gave flex: ResolvedMask::visible with torch.clamp guards."""
    kind, q_len, kv_len = mask["kind"], mask["q_len"], mask["kv_len"]
    doc_id = doc_ids(torch, mask, device)
    offset = kv_len - q_len
    if kind == "dflash":
        context, block = mask["context"], mask["block_size"]
        anchors = torch.tensor(mask["anchors"], dtype=torch.int32, device=device)
        through = mask["context_rule"] == "through_anchor"
        causal_block = mask["in_block"] == "causal"

        def dflash(b, h, q_idx, kv_idx):
            draft_block = q_idx // block
            anchor = anchors[draft_block]
            limit = anchor + 1 if through else anchor
            same_doc = doc_id[torch.clamp(kv_idx, max=context - 1)] == doc_id[anchor]
            in_context = (kv_idx < context) & (kv_idx < limit) & same_doc
            draft = kv_idx - context
            in_draft = (kv_idx >= context) & (draft // block == draft_block)
            if causal_block:
                in_draft = in_draft & (draft <= q_idx)
            return in_context | in_draft

        return dflash
    if kind == "document_causal":
        return lambda b, h, q_idx, kv_idx: (kv_idx <= q_idx + offset) & (
            doc_id[kv_idx] == doc_id[torch.clamp(q_idx + offset, min=0)])
    return mask_mod_rewritten(torch, mask, device)


def mask_mod_rewritten(torch, mask, device):
    """The same mask with no torch.clamp and no captured Python ints that vary: lookups go
    through arrays padded to the index range (the FLASH backend's CuTe DSL codegen refuses
    clamp). Every flex peer gets this one, so that they run the same mask_mod."""
    kind, q_len, kv_len = mask["kind"], mask["q_len"], mask["kv_len"]
    if kind in GENERIC_KINDS:
        return generic_mask_mod(torch, mask, device)
    offset = kv_len - q_len
    if kind == "dflash":
        context, block = mask["context"], mask["block_size"]
        doc = doc_ids(torch, mask, "cpu").to(torch.int64)
        anchors = torch.tensor(mask["anchors"], dtype=torch.int64)
        through = 1 if mask["context_rule"] == "through_anchor" else 0
        # Per key: its document in the context, -2 in the draft part (never an anchor's document).
        kv_doc = torch.full((kv_len,), -2, dtype=torch.int32)
        kv_doc[:context] = doc.to(torch.int32)
        # Per query: the end of the context it sees (exclusive), its anchor's document, and the
        # KV range of its own draft block that it sees.
        q = torch.arange(q_len)
        blk = q // block
        q_end = (anchors[blk] + through).to(torch.int32)
        q_doc = doc[anchors[blk]].to(torch.int32)
        q_begin = (context + blk * block).to(torch.int32)
        q_stop = (context + q + 1 if mask["in_block"] == "causal" else context + (blk + 1) * block).to(torch.int32)
        kv_doc, q_end, q_doc, q_begin, q_stop = (t.to(device) for t in (kv_doc, q_end, q_doc, q_begin, q_stop))

        def dflash(b, h, q_idx, kv_idx):
            in_context = (kv_idx < q_end[q_idx]) & (kv_doc[kv_idx] == q_doc[q_idx])
            in_draft = (kv_idx >= q_begin[q_idx]) & (kv_idx < q_stop[q_idx])
            return in_context | in_draft

        return dflash
    if kind == "causal":
        return lambda b, h, q_idx, kv_idx: kv_idx <= q_idx + offset
    if kind == "document_causal":
        doc = doc_ids(torch, mask, device)
        q_doc = doc[offset:].contiguous()  # bottom-right: query q sits at q + offset >= 0
        return lambda b, h, q_idx, kv_idx: (kv_idx <= q_idx + offset) & (doc[kv_idx] == q_doc[q_idx])
    if kind == "sliding_window":
        window = mask["window"]
        return lambda b, h, q_idx, kv_idx: (kv_idx <= q_idx + offset) & (kv_idx > q_idx + offset - window)
    if kind == "full":
        return lambda b, h, q_idx, kv_idx: kv_idx >= 0
    raise ValueError(f"unknown mask kind {kind!r}")


def fa4_plan(mask):
    """How flash-attn-4's own API expresses the mask, or raises NotImplementedError with why.
    FA aligns causal masks bottom-right when Q_LEN < KV_LEN, like the harness. Returns
    {"causal", "window" (left, right) or None, "varlen": None or (q_lengths, k_lengths)} and
    the pair count that formulation sees per head."""
    kind, q_len, kv_len = mask["kind"], mask["q_len"], mask["kv_len"]
    offset = kv_len - q_len
    if kind == "causal":
        return {"causal": True, "window": None, "varlen": None}, sum(q + offset + 1 for q in range(q_len))
    if kind == "sliding_window":
        w = mask["window"]
        return ({"causal": True, "window": (w - 1, 0), "varlen": None},
                sum(min(w, q + offset + 1) for q in range(q_len)))
    if kind == "document_causal":
        # One varlen sequence per document: its keys are the document, its queries the part of the
        # document inside the last Q_LEN positions; causal bottom-right inside each document.
        q_lengths, k_lengths, pairs, start = [], [], 0, 0
        for length in mask["doc_lengths"]:
            end = start + length
            nq = max(0, end - max(start, offset))
            q_lengths.append(nq)
            k_lengths.append(length)
            pairs += sum(length - nq + i + 1 for i in range(nq))
            start = end
        return {"causal": True, "window": None, "varlen": (q_lengths, k_lengths)}, pairs
    if kind == "full":
        return {"causal": False, "window": None, "varlen": None}, q_len * kv_len
    raise NotImplementedError(f"flash-attn-4 has no {kind} mask (its mask_mod path is the FLASH backend: flex-flash)")


def fa4_dense(torch, mask, plan):
    """The fa4_plan as a dense [q_len, kv_len] mask, to check it against the reference (CPU)."""
    q_len, kv_len = mask["q_len"], mask["kv_len"]
    q = torch.arange(q_len)[:, None] + (kv_len - q_len)
    kv = torch.arange(kv_len)[None, :]
    if plan["varlen"] is None:
        m = (kv <= q) if plan["causal"] else torch.ones(q_len, kv_len, dtype=torch.bool)
        if plan["window"] is not None:
            m = m & (kv >= q - plan["window"][0])
        return m
    m = torch.zeros(q_len, kv_len, dtype=torch.bool)
    q_row, k_start = 0, 0
    for nq, nk in zip(*plan["varlen"]):
        for i in range(nq):  # query i of the document sits at key nk - nq + i of it
            m[q_row + i, k_start: k_start + nk - nq + i + 1] = True
        q_row += nq
        k_start += nk
    return m


# ---------------------------------------------------------------------------------------------
# Worker: one peer on one case, in its own process.

def versions():
    out = {"python": sys.version.split()[0]}
    for module, dist in (("torch", "torch"), ("triton", "triton"), ("flash_attn", "flash-attn-4"),
                         ("cutlass", "nvidia-cutlass-dsl")):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def short(error):
    text = f"{type(error).__name__}: {error}".strip().splitlines()
    first = next((line for line in text if line.strip()), "")
    return first[:300]


def make_inputs(torch, job, device):
    d, m = job["dims"], job["mask"]
    torch.manual_seed(job["seed"] + 1)  # harness_bench_attention: at::manual_seed(seed + 1), then q, k, v, dout
    opts = dict(device=device, dtype=torch.bfloat16)
    q = torch.randn(d["batch"], d["heads"], m["q_len"], d["head_dim"], **opts)
    k = torch.randn(d["batch"], d["kv_heads"], m["kv_len"], d["head_dim"], **opts)
    v = torch.randn(d["batch"], d["kv_heads"], m["kv_len"], value_head_dim(d), **opts)
    dout = torch.randn(d["batch"], d["heads"], m["q_len"], value_head_dim(d), **opts)
    return q, k, v, dout


def harness_mask(torch, harness, mask, device):
    """The named harness mask of a resolved mask dict (ours-py: the named path from Python)."""
    kind = mask["kind"]
    if kind == "dflash":
        return harness.DFlashMask(torch.tensor(mask["anchors"]), doc_ids(torch, mask, "cpu"), context=mask["context"],
                                  block_size=mask["block_size"], context_rule=mask["context_rule"],
                                  in_block=mask["in_block"]).to(device)
    if kind == "document_causal":
        return harness.DocumentCausalMask(doc_ids(torch, mask, "cpu")).to(device)
    if kind == "sliding_window":
        return harness.SlidingWindowMask(mask["window"]).to(device)
    return {"causal": harness.CausalMask, "full": harness.FullMask}[kind]().to(device)


def import_harness(job):
    """The harness package of this checkout with the op library of the build (job["ops_library"])."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "python"))
    import harness
    try:
        harness.load_library(job.get("ops_library"))
    except RuntimeError as error:  # not built: the row says so
        raise ImportError(str(error)) from None
    return harness


def build_peer(torch, job, q, k, v, device):
    """Returns (call(q, k, v) -> out in [B, H, Q, D], pairs per head the peer's mask sees, note)."""
    peer, mask, d = job["peer"], job["mask"], job["dims"]
    gqa = d["heads"] != d["kv_heads"]
    if peer in ("ours", "ours-py", "ours-det"):
        # harness.attention from Python: the BlockMask of the same mask_mod the flex peers get (the
        # generic path), or with ours-py the named mask. The conversion happens here, untimed.
        if peer == "ours-det":
            raise NotImplementedError("ours-det: harness.attention has no deterministic switch; use ours")
        from torch.nn.attention.flex_attention import create_block_mask, create_mask
        harness = import_harness(job)
        if peer == "ours-py":
            if mask["kind"] in GENERIC_KINDS:
                raise NotImplementedError(f"ours-py: no named harness mask expresses {mask['kind']} (ours runs it)")
            ours_mask, note = harness_mask(torch, harness, mask, device), "harness.attention, named mask"
        else:
            mod = mask_mod_rewritten(torch, mask, device)
            block_mask = create_block_mask(mod, None, None, mask["q_len"], mask["kv_len"], device=device, BLOCK_SIZE=128)
            ours_mask, note = harness.FlexMask.from_block_mask(block_mask).to(device), "harness.attention(BlockMask): generic path"
        pairs = int(ours_mask.dense(mask["q_len"], mask["kv_len"], device).sum().item())
        return (lambda a, b, c: harness.attention(a, b, c, ours_mask)), pairs, note
    if peer in FLEX_PEERS:
        from torch.nn.attention.flex_attention import create_block_mask, create_mask, flex_attention
        mod = (mask_mod_original if job.get("flex_mask") == "original" else mask_mod_rewritten)(torch, mask, device)
        pairs = int(create_mask(mod, 1, 1, mask["q_len"], mask["kv_len"], device=device).sum().item())
        block_mask = create_block_mask(mod, None, None, mask["q_len"], mask["kv_len"], device=device, BLOCK_SIZE=128)
        settings = FLEX_PEERS[peer]
        if device == "cpu":  # --device cpu smoke run: eager flex (no compiler needed)
            compiled = flex_attention
        else:
            compiled = torch.compile(flex_attention, dynamic=False, **({"mode": settings["mode"]} if "mode" in settings else {}))
        extra = {"kernel_options": settings["kernel_options"]} if "kernel_options" in settings else {}
        return (lambda a, b, c: compiled(a, b, c, block_mask=block_mask, enable_gqa=gqa, **extra)), pairs, \
            f"flex mask_mod: {job.get('flex_mask', 'rewritten')}"
    if peer == "fa4":
        plan, pairs = fa4_plan(mask)  # NotImplementedError names the missing mask
        from flash_attn.cute import interface as fa  # ImportError when flash-attn-4 is not installed
        first = lambda r: r[0] if isinstance(r, tuple) else r
        kw = {"causal": plan["causal"]}
        if plan["window"] is not None:
            kw["window_size"] = plan["window"]
        B, H, Q, D = q.shape
        if plan["varlen"] is None:
            def call(a, b, c):
                out = first(fa.flash_attn_func(a.transpose(1, 2), b.transpose(1, 2), c.transpose(1, 2), **kw))
                return out.transpose(1, 2)
        else:
            q_lengths, k_lengths = plan["varlen"]
            cu = lambda ls: torch.tensor([0] + [sum(ls[:i + 1]) for i in range(len(ls))], dtype=torch.int32)
            # Batch b's documents follow batch b-1's in the packed [B*len, H, D] layout.
            cu_q = torch.cat([cu(q_lengths)[:-1] + b * Q for b in range(B)] + [torch.tensor([B * Q], dtype=torch.int32)]).to(device)
            cu_k = torch.cat([cu(k_lengths)[:-1] + b * k.shape[2] for b in range(B)]
                             + [torch.tensor([B * k.shape[2]], dtype=torch.int32)]).to(device)

            def call(a, b, c):
                pack = lambda t: t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[3])
                out = first(fa.flash_attn_varlen_func(pack(a), pack(b), pack(c), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                                      max_seqlen_q=max(q_lengths), max_seqlen_k=max(k_lengths), **kw))
                return out.reshape(B, Q, H, D).transpose(1, 2)
        # run_worker stores fa4's inputs BSHD-contiguous (FA's layout), so these transposes are views.
        return call, pairs, "fa4 " + ("varlen per document" if plan["varlen"] else
                                      "window" if plan["window"] else "causal" if plan["causal"] else "full")
    raise ValueError(f"unknown peer {peer!r}")


def check_rows(torch, job, out, q, k, v, device):
    """max |out - fp32 reference| over sampled query rows (batch 0; first and last head), on the
    output of the first call (a second, no-grad call would compile again)."""
    mask, d = job["mask"], job["dims"]
    q_len = mask["q_len"]
    out = out.detach()
    rows = torch.unique(torch.cat([torch.arange(min(64, q_len)), torch.arange(max(0, q_len - 64), q_len),
                                   torch.linspace(0, q_len - 1, 64).long()]))
    visible = reference_rows(torch, mask, rows, device)
    worst = 0.0
    group = d["heads"] // d["kv_heads"]
    for h in {0, d["heads"] - 1}:
        qs = q[0, h, rows.to(device)].float()
        ks, vs = k[0, h // group].float(), v[0, h // group].float()
        s = (qs @ ks.T) / math.sqrt(d["head_dim"])
        s = s.masked_fill(~visible, float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        worst = max(worst, (out[0, h, rows.to(device)].float() - p @ vs).abs().max().item())
    return worst


def run_worker(job):
    import torch
    device = job["device"]
    result = {"peer": job["peer"], "case": job["case"], "versions": versions(), "fwd": None, "bwd": None}
    if device == "cuda":
        result["device_name"] = torch.cuda.get_device_name()
    q, k, v, dout = make_inputs(torch, job, device)
    if job["peer"] == "fa4":  # same values, stored [B, S, H, D] as flash-attn expects (views stay [B, H, S, D])
        q, k, v, dout = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v, dout))
    result["input_sums"] = [t.float().sum().item() for t in (q, k, v, dout)]
    try:
        call, pairs, note = build_peer(torch, job, q, k, v, device)
    except (ImportError, NotImplementedError) as error:
        result["unsupported"] = short(error)
        return result
    result["pairs_per_head"], result["note"] = pairs, note
    if pairs != job["mask"]["pairs_per_head"]:
        result["unsupported"] = f"mask mismatch: the peer's mask sees {pairs} pairs per head, the harness's {job['mask']['pairs_per_head']}"
        return result
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    grads = True
    leaves = lambda: [t.detach().requires_grad_(grads) for t in (q, k, v)]
    # First call: compilation (and max-autotune's benchmarking), forward then backward.
    start = time.perf_counter()
    try:
        out = call(*leaves())
        sync()
    except Exception as error:
        # A peer that refuses inputs needing gradients may still have a forward: time that alone.
        grads, first_error = False, error
        try:
            start = time.perf_counter()
            out = call(*leaves())
            sync()
            result["bwd_unsupported"] = "backward: " + short(first_error)
        except Exception as error:  # the peer refuses the case: say why, time nothing
            result["unsupported"] = "forward: " + short(error)
            return result
    result["compile_fwd_s"] = time.perf_counter() - start
    try:
        result["check_max_abs_err"] = check_rows(torch, job, out, q, k, v, device)
    except Exception as error:
        result["check_error"] = short(error)
    has_bwd = False
    if grads:
        start = time.perf_counter()
        try:
            out.backward(dout)
            sync()
            has_bwd = True
            result["compile_bwd_s"] = time.perf_counter() - start
        except Exception as error:
            result["bwd_unsupported"] = "backward: " + short(error)
    reps = job["reps"]
    total = reps + 3
    if device == "cuda":
        flush = torch.empty(256 << 20, dtype=torch.uint8, device=device)
        events = []
        for rep in range(total):
            e = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            ql, kl, vl = leaves()
            flush.fill_(rep & 0xFF)
            e[0].record()
            out = call(ql, kl, vl)
            e[1].record()
            if has_bwd:
                flush.fill_(rep & 0xFF)
                e[2].record()
                out.backward(dout)
                e[3].record()
            events.append(e)
        sync()
        fwd_ms = [e[0].elapsed_time(e[1]) for e in events[3:]]
        bwd_ms = [e[2].elapsed_time(e[3]) for e in events[3:]] if has_bwd else None
        # Memory: one synchronized step, the peak reset before each op.
        ql, kl, vl = leaves()
        sync()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = call(ql, kl, vl)
        sync()
        result["fwd_peak_bytes"] = torch.cuda.max_memory_allocated() - before
        if has_bwd:
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            out.backward(dout)
            sync()
            result["bwd_peak_bytes"] = torch.cuda.max_memory_allocated() - before
    else:  # --device cpu: wall clock, only to exercise the plumbing
        fwd_ms, bwd_ms = [], [] if has_bwd else None
        for _ in range(total):
            ql, kl, vl = leaves()
            t0 = time.perf_counter()
            out = call(ql, kl, vl)
            t1 = time.perf_counter()
            fwd_ms.append((t1 - t0) * 1e3)
            if has_bwd:
                out.backward(dout)
                bwd_ms.append((time.perf_counter() - t1) * 1e3)
        fwd_ms = fwd_ms[3:]
        bwd_ms = bwd_ms[3:] if has_bwd else None
    result["fwd"] = summarize(fwd_ms)
    result["bwd"] = summarize(bwd_ms) if bwd_ms else None
    return result


# ---------------------------------------------------------------------------------------------
# Driver.

def percentile(values, p):
    s = sorted(values)
    if not s:
        return float("nan")
    x = (len(s) - 1) * p
    lo, hi = math.floor(x), math.ceil(x)
    return s[lo] + (s[hi] - s[lo]) * (x - lo)


def summarize(values):
    return {"median": percentile(values, 0.5), "p10": percentile(values, 0.1), "p90": percentile(values, 0.9),
            "min": min(values), "max": max(values), "n": len(values), "all": values}


def run_ours(binary, c, reps, extra, timeout):
    cmd = [binary, *binary_flags(c), "--reps", str(reps), *extra]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - start
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{' '.join(cmd)} printed no JSON (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    out = json.loads(lines[-1])
    if "error" in out:
        raise RuntimeError(f"{binary}: {out['error']}")
    out["wall_s"] = wall
    return out


def ours_row(raw):
    if raw.get("unsupported"):  # the kernels have none for this shape or dtype
        return {"peer": "ours", "unsupported": raw["unsupported"][:300], "process_s": raw["wall_s"]}
    fused = next(r for r in raw["results"] if r["impl"] == "fused")
    # The kernels the autotuner picked, from the dispatch configs ("fwd wgmma_m64_n64: ...").
    picked = [d["config"].split(":")[0] for d in fused.get("dispatch", []) if ":" in d.get("config", "")]
    return {"peer": "ours", "note": "fused_cuda" + (": " + ", ".join(picked) if picked else ""),
            "fwd": summarize(fused["fwd_ms_all"]), "bwd": summarize(fused["bwd_ms_all"]),
            "fwd_peak_bytes": fused["fwd_peak_bytes"], "bwd_peak_bytes": fused["bwd_peak_bytes"],
            "pairs_per_head": raw["pairs_per_head"], "input_sums": fused.get("input_sums"),
            "process_s": raw["wall_s"], "dispatch": fused.get("dispatch"), "device_name": raw.get("device")}


def run_worker_process(job, timeout):
    with tempfile.TemporaryDirectory() as tmp:
        job_path, result_path = os.path.join(tmp, "job.json"), os.path.join(tmp, "result.json")
        with open(job_path, "w") as f:
            json.dump(job, f)
        start = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", job_path, result_path],
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"peer": job["peer"], "error": f"timed out after {timeout:.0f} s (budget)"}
        wall = time.perf_counter() - start
        if not os.path.exists(result_path):
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return {"peer": job["peer"], "error": f"worker exit {proc.returncode}: {tail[:300]}"}
        with open(result_path) as f:
            result = json.load(f)
        result["wall_s"] = wall
        return result


def merge_repeats(results):
    """One row from N fresh-process runs: median of the medians, spread across the runs."""
    ok = [r for r in results if r.get("fwd")]
    if len(results) == 1 or not ok:
        return results[0]
    row = dict(ok[0])
    for op in ("fwd", "bwd"):
        medians = [r[op]["median"] for r in ok if r.get(op)]
        if medians:
            row[op] = {**summarize(medians), "per_run": [r[op] for r in ok if r.get(op)], "runs": len(medians)}
    row["repeats"] = len(results)
    return row


def fmt_ms(stat):
    if not stat:
        return "—"
    return f"{stat['median']:.3f} ({stat['p10']:.3f}–{stat['p90']:.3f})"


def tflops(stat, pairs, dims, op):
    """Matmul TFLOP/s of visible pairs: fwd 2·(D + D_V), bwd 2·(3 D + 2 D_V) per pair and head."""
    if not stat:
        return None
    d, dv = dims["head_dim"], value_head_dim(dims)
    per_pair = 2 * (d + dv) if op == "fwd" else 2 * (3 * d + 2 * dv)
    return per_pair * pairs * dims["batch"] * dims["heads"] / (stat["median"] * 1e-3) / 1e12


def markdown(report):
    lines = []
    v = report["versions"]
    lines.append(f"{report.get('device_name', '?')}; torch {v.get('torch')}, triton {v.get('triton')}, "
                 f"flash-attn-4 {v.get('flash-attn-4') or 'not installed'}, nvidia-cutlass-dsl {v.get('nvidia-cutlass-dsl') or 'not installed'}; "
                 f"ours at {report.get('commit', '?')}. One fresh process per (case, peer); median (p10–p90) of "
                 f"{report['reps']} ops{' × ' + str(report['repeats']) + ' processes' if report['repeats'] > 1 else ''}, "
                 "cold L2, back to back. TFLOP/s of visible pairs (fwd 2·pairs·(D + D_V), bwd 2·pairs·(3·D + 2·D_V)). "
                 "Speedup = peer ms / ours ms; *best flex* = the faster of flex (default) and flex-autotune, per op.")
    lines.append("")
    lines.append("| case | peer | fwd ms | bwd ms | fwd TFLOP/s | bwd TFLOP/s | ours fwd speedup | ours bwd speedup | compile s | notes |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for c in report["cases"]:
        rows = c["rows"]
        ours = next((r for r in rows if r["peer"] == "ours" and r.get("fwd")), None)
        for r in rows:
            notes = [r.get("note", "")]
            if r.get("error"):
                notes = [f"did not run: {r['error']}"]
            elif r.get("unsupported"):
                notes = [f"cannot run: {r['unsupported']}"]
            if r.get("bwd_unsupported"):
                notes.append(f"no backward: {r['bwd_unsupported']}")
            if r.get("check_max_abs_err") is not None:
                err = r["check_max_abs_err"]
                notes.append(f"max err {err:.1e}" + (" **WRONG**" if err > CHECK_TOLERANCE else ""))
            if r.get("inputs_differ"):
                notes.append("**inputs differ from ours**")
            speed = []
            for op in ("fwd", "bwd"):
                if ours and r.get(op) and ours.get(op) and r["peer"] != "ours":
                    speed.append(f"{r[op]['median'] / ours[op]['median']:.2f}x")
                else:
                    speed.append("—")
            compile_s = "/".join(f"{r[k]:.0f}" for k in ("compile_fwd_s", "compile_bwd_s") if r.get(k) is not None) or (
                f"process {r['process_s']:.0f}" if r.get("process_s") else "—")
            tf = [tflops(r.get(op), c["pairs_per_head"], c["dims"], op) for op in ("fwd", "bwd")]
            lines.append(f"| {c['case']} | {r['peer']} | {fmt_ms(r.get('fwd'))} | {fmt_ms(r.get('bwd'))} | "
                         + " | ".join(f"{t:.0f} ({100 * t / PEAK_TFLOPS:.0f}%)" if t else "—" for t in tf)
                         + f" | {speed[0]} | {speed[1]} | {compile_s} | {'; '.join(n for n in notes if n)} |")
    lines.append("")
    lines.append("| case | ours fwd / bwd ms | best flex fwd / bwd ms (mode) | speedup vs best flex fwd / bwd | fastest peer fwd / bwd | generic / named path fwd / bwd |")
    lines.append("|---|---|---|---|---|---|")
    for c in report["cases"]:
        s = c["summary"]
        if not s:
            continue
        lines.append(f"| {c['case']} | {s['ours']} | {s['best_flex']} | {s['speedup_best_flex']} | {s['fastest_peer']} | "
                     f"{s.get('generic_vs_named', '—')} |")
    return "\n".join(lines) + "\n"


def summarize_case(rows):
    ours = next((r for r in rows if r["peer"] == "ours" and r.get("fwd")), None)
    if not ours:
        return None
    out = {"ours": f"{ours['fwd']['median']:.3f} / {ours['bwd']['median']:.3f}"}
    parts, speed, fastest = [], [], []
    for op in ("fwd", "bwd"):
        flex = [r for r in rows if r["peer"] in ("flex", "flex-autotune") and r.get(op)]
        best = min(flex, key=lambda r: r[op]["median"]) if flex else None
        parts.append(f"{best[op]['median']:.3f} ({best['peer']})" if best else "—")
        speed.append(f"{best[op]['median'] / ours[op]['median']:.2f}x" if best else "—")
        peers = [r for r in rows if not r["peer"].startswith("ours") and r.get(op)]
        top = min(peers, key=lambda r: r[op]["median"]) if peers else None
        fastest.append(f"{top['peer']} {top[op]['median'] / ours[op]['median']:.2f}x" if top else "—")
    out.update(best_flex=" / ".join(parts), speedup_best_flex=" / ".join(speed), fastest_peer=" / ".join(fastest))
    # A "-generic" case: ours is the BlockMask path, ours-py the named one (same Python timing).
    named = next((r for r in rows if r["peer"] == "ours-py" and r.get("fwd")), None)
    if named and "generic path" in ours.get("note", ""):
        out["generic_vs_named"] = " / ".join(f"{ours[op]['median'] / named[op]['median']:.2f}x" if ours.get(op) and named.get(op)
                                             else "—" for op in ("fwd", "bwd"))
    return out


def describe(describer, c):
    """The case's resolved mask from harness_mask_describe (torch-free; the same resolution code
    and seed as harness_bench_attention)."""
    proc = subprocess.run([describer, *binary_flags(c)], capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{describer} printed no JSON (exit {proc.returncode}): {proc.stderr.strip()[-300:]}")
    out = json.loads(lines[-1])
    if "error" in out:
        raise RuntimeError(f"{describer}: {out['error']}")
    return out


def git_commit():
    """The commit ours runs at (with -dirty when tracked files differ from it): the prebuilt
    binaries' (HARNESS_BINARIES_COMMIT, which dev/gpu/run_prebuilt.sh sets from what
    dev/gpu/pack_build.sh recorded; the GPU machine's copy's own git state can be stale), else git,
    else .deps/git_commit on a copy without .git."""
    if os.environ.get("HARNESS_BINARIES_COMMIT"):
        return os.environ["HARNESS_BINARIES_COMMIT"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        if commit:
            changed = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                                     capture_output=True, text=True).stdout.strip()
            return commit + ("-dirty" if changed else "")
    except OSError:
        pass
    try:
        with open(os.path.join(root, ".deps", "git_commit")) as f:
            return f.read().strip()[:12] or None
    except OSError:
        return None


def usage_error(message):
    print(f"attention_vs_flex.py: {message}", file=sys.stderr)
    sys.exit(2)


def selected(text, known, what, everything=None):
    names = list(everything or known) if text == "all" else [x for x in text.split(",") if x]
    unknown = [x for x in names if x not in known]
    if unknown:
        usage_error(f"unknown {what} {', '.join(unknown)}; known: {', '.join(known)} (or all)")
    return names


def drive(args):
    cases = selected(args.cases, {**CASES, **DRY_CASES}, "case", everything=CASES)  # all: the real cases
    peers = selected(args.peers, PEERS, "peer")
    deadline = time.monotonic() + args.budget_s
    report = {"reps": args.reps, "repeats": args.repeats, "commit": git_commit(), "versions": versions(),
              "budget_s": args.budget_s, "cases": []}
    for name in cases:
        c = {**CASES, **DRY_CASES}[name]
        entry = {"case": name, "dims": {k: c[k] for k in ("batch", "heads", "kv_heads", "head_dim", "v_head_dim")}, "flags": c,
                 "rows": []}
        report["cases"].append(entry)
        case_start = time.monotonic()
        try:
            if c["mask"] in GENERIC_KINDS:
                described = generic_described(c)
            else:
                described = describe(args.describe_binary, c) if args.describe_binary else synthetic_mask(c)
        except (RuntimeError, subprocess.TimeoutExpired, OSError) as error:
            entry["error"] = str(error)
            print(f"{name}: cannot resolve the mask: {error}", file=sys.stderr, flush=True)
            continue
        mask = dict(described["mask"], pairs_per_head=described["pairs_per_head"])
        if "synthetic" in described:
            entry["synthetic_mask"] = True  # --device cpu without harness_mask_describe: Python-drawn anchors
        entry["pairs_per_head"], entry["mask"] = described["pairs_per_head"], {k: v for k, v in mask.items() if k != "anchors"}
        for peer in peers:
            runs = []
            for _ in range(args.repeats):
                left = deadline - time.monotonic()
                if left < 5:
                    runs.append({"peer": peer, "error": "skipped: --budget-s spent"})
                    break
                timeout = min(left, args.run_timeout_s)
                if peer in ("ours", "ours-det") and not python_ours(c):
                    extra = args.ours_args.split() + (["--deterministic", "1"] if peer == "ours-det" else [])
                    try:
                        runs.append(dict(ours_row(run_ours(args.binary, c, args.reps, extra, timeout)), peer=peer))
                    except (RuntimeError, subprocess.TimeoutExpired, OSError, KeyError, StopIteration) as error:
                        runs.append({"peer": peer, "error": str(error)[:300]})
                else:
                    job = {"peer": peer, "case": name, "mask": mask, "dims": entry["dims"], "seed": args.seed,
                           "reps": args.reps, "device": args.device, "flex_mask": args.flex_mask,
                           "ops_library": args.ops_library}
                    if args.write_jobs:  # for a profiler: the worker's job, run later with --worker
                        path = os.path.join(args.write_jobs, f"{name}_{peer}.json")
                        with open(path, "w") as f:
                            json.dump(job, f)
                        runs.append({"peer": peer, "error": f"job written to {path}"})
                        break  # one job per (case, peer), whatever --repeats
                    runs.append(run_worker_process(job, timeout))
            row = merge_repeats(runs)
            entry["rows"].append(row)
            if row.get("device_name"):
                report["device_name"] = row["device_name"]
            if not peer.startswith("ours") and row.get("versions"):
                report["versions"] = row["versions"]  # the workers' (with every peer package imported)
            status = row.get("error") or row.get("unsupported") or (
                f"fwd {fmt_ms(row.get('fwd'))} bwd {fmt_ms(row.get('bwd'))}")
            compile_s = "/".join(f"{row[k]:.1f}" for k in ("compile_fwd_s", "compile_bwd_s") if row.get(k) is not None)
            print(f"{name} {peer}: {status}" + (f" (first call fwd/bwd {compile_s} s" + (", process total "
                  f"{row['wall_s']:.0f} s)" if row.get("wall_s") else ")") if compile_s else ""), file=sys.stderr, flush=True)
        ours = next((r for r in entry["rows"] if r["peer"] == "ours" and r.get("input_sums")), None)
        for r in entry["rows"]:
            if ours and r is not ours and r.get("input_sums") and any(
                    abs(a - b) > 1e-3 * max(1.0, abs(a)) for a, b in zip(r["input_sums"], ours["input_sums"])):
                r["inputs_differ"] = True
        entry["summary"] = summarize_case(entry["rows"])
        print(f"{name}: {time.monotonic() - case_start:.0f} s", file=sys.stderr, flush=True)
    text = markdown(report)
    print("\n" + text)
    if args.md_out:
        with open(args.md_out, "w") as f:
            f.write(text)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=1)
    return report


# ---------------------------------------------------------------------------------------------
# CPU checks (--dry-run) and synthetic masks for --device cpu runs without the binary.

def generic_described(c):
    """A generic case's mask and pair count (the reference rows, independent of the mask_mod)."""
    import torch
    mask = generic_case_mask(c)
    pairs = 0
    for start in range(0, mask["q_len"], 1024):
        rows = torch.arange(start, min(start + 1024, mask["q_len"]))
        pairs += int(reference_rows(torch, mask, rows, "cpu").sum())
    return {"mask": mask, "pairs_per_head": pairs}


def synthetic_mask(c, seed=0):
    """A resolved mask in harness_bench_attention's format, for CPU checks only: anchors drawn by
    Python (not the harness's generator), documents split like kernels/mask_desc.cpp."""
    import random
    block = 16
    q_len = c["anchors"] * block
    kv_len = c["context"] + q_len
    split = c["context"] if c["mask"] == "dflash" else kv_len
    n = c["documents"]
    lengths = [split // n] * (n - 1) + [split - (split // n) * (n - 1)]
    anchors = []
    if c["mask"] == "dflash":
        valid, start = [], 0
        for length in lengths:
            valid += list(range(start + 1, start + length - block + 1))
            start += length
        anchors = sorted(random.Random(seed).sample(valid, c["anchors"]))
    mask = {"kind": c["mask"], "q_len": q_len, "kv_len": kv_len, "context": c["context"], "block_size": block,
            "window": c["window"], "context_rule": "before_anchor", "in_block": "bidirectional",
            "anchors": anchors, "doc_lengths": lengths}
    import torch
    pairs = int(reference_rows(torch, mask, torch.arange(q_len), "cpu").sum().item())
    return {"mask": mask, "pairs_per_head": pairs, "synthetic": True}




def dry_run():
    """Checks every mask form against the reference on small dims with create_mask: the original
    and the rewritten flex mask_mods, and flash-attn-4's formulation. Returns the failures."""
    import torch
    from torch.nn.attention.flex_attention import create_mask
    failures = []
    for name, c in DRY_CASES.items():
        described = generic_described(c) if c["mask"] in GENERIC_KINDS else synthetic_mask(c, seed=len(name))
        mask = described["mask"]
        if name == "tiny-dflash-through-causal":
            mask.update(context_rule="through_anchor", in_block="causal")
            described["pairs_per_head"] = int(reference_rows(torch, mask, torch.arange(mask["q_len"]), "cpu").sum())
        ref = reference_rows(torch, mask, torch.arange(mask["q_len"]), "cpu")
        forms = {}
        for label, make in (("original", mask_mod_original), ("rewritten", mask_mod_rewritten)):
            forms[label] = create_mask(make(torch, mask, "cpu"), 1, 1, mask["q_len"], mask["kv_len"], device="cpu")[0, 0]
        try:
            plan, pairs = fa4_plan(mask)
            forms["fa4"] = fa4_dense(torch, mask, plan)
            if pairs != int(forms["fa4"].sum()):
                failures.append(f"{name}: fa4_plan counts {pairs} pairs, its dense form {int(forms['fa4'].sum())}")
        except NotImplementedError:
            pass
        for label, dense in forms.items():
            if not torch.equal(dense.bool(), ref):
                failures.append(f"{name}: {label} differs from the reference at {int((dense.bool() != ref).sum())} pairs")
        print(f"{name}: q {mask['q_len']} kv {mask['kv_len']} pairs {described['pairs_per_head']}; "
              f"checked {', '.join(forms)}", file=sys.stderr)
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog="\n".join(__doc__.splitlines()[1:]))
    parser.add_argument("--binary", help="path of harness_bench_attention (needed for the peer ours and to resolve masks)")
    parser.add_argument("--describe-binary", help="path of harness_mask_describe (default: beside --binary)")
    parser.add_argument("--ops-library", help="libharness_ops.so for harness.attention from Python (ours on generic "
                        "masks, ours-py; default: BUILD/python/ beside --binary's BUILD/bench/)")
    parser.add_argument("--cases", default=DEFAULT_CASES, help=f"comma list or all; known: {', '.join(CASES)}")
    parser.add_argument("--peers", default=DEFAULT_PEERS, help=f"comma list or all; known: {', '.join(PEERS)}")
    parser.add_argument("--reps", type=int, default=20, help="timed ops per process (after 3 warm-ups)")
    parser.add_argument("--repeats", type=int, default=1, help="fresh processes per (case, peer)")
    parser.add_argument("--budget-s", type=float, default=3600, help="total wall-time cap; what does not fit is skipped and says so")
    parser.add_argument("--run-timeout-s", type=float, default=900, help="cap for one process")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--flex-mask", choices=["rewritten", "original"], default="rewritten",
                        help="mask_mod for the flex peers (original: with torch.clamp, refused by FLASH)")
    parser.add_argument("--ours-args", default="", help="extra flags for harness_bench_attention, e.g. '--deterministic 1'")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: eager flex, tiny dims only (plumbing check)")
    parser.add_argument("--json-out")
    parser.add_argument("--md-out")
    parser.add_argument("--dry-run", action="store_true", help="CPU: check the mask forms against the reference, then exit")
    parser.add_argument("--write-jobs", metavar="DIR", help="write each Python peer's worker job to DIR/CASE_PEER.json "
                        "instead of running it (to run one under a profiler: --worker DIR/CASE_PEER.json RESULT)")
    parser.add_argument("--worker", nargs=2, metavar=("JOB", "RESULT"), help=argparse.SUPPRESS)
    parser.add_argument("--binary-flags", metavar="CASE", help="print harness_bench_attention's flags for a named-mask "
                        "case and exit (dev/gpu/kernel_sweep.sh and ncu_kernels.sh run the binary so)")
    args = parser.parse_args()
    if args.binary_flags:
        c = CASES.get(args.binary_flags)
        if c is None or python_ours(c):
            usage_error(f"--binary-flags: {args.binary_flags} is no named-mask case; known: "
                        + ", ".join(name for name, x in CASES.items() if not python_ours(x)))
        print(" ".join(binary_flags(c)))
        return 0
    if args.worker:
        with open(args.worker[0]) as f:
            job = json.load(f)
        result = run_worker(job)
        with open(args.worker[1], "w") as f:
            json.dump(result, f)
        return 0
    if args.write_jobs:
        os.makedirs(args.write_jobs, exist_ok=True)
    if args.dry_run:
        failures = dry_run()
        for failure in failures:
            print("FAIL " + failure, file=sys.stderr)
        print("dry run: " + ("ok" if not failures else f"{len(failures)} failures"), file=sys.stderr)
        return 1 if failures else 0
    if args.reps < 1 or args.repeats < 1 or args.budget_s <= 0:
        usage_error("--reps and --repeats must be >= 1, --budget-s > 0")
    if args.device == "cuda" and not args.binary:
        usage_error("--binary is needed on CUDA (harness_bench_attention: the peer ours)")
    if args.binary and not args.describe_binary:
        args.describe_binary = os.path.join(os.path.dirname(os.path.abspath(args.binary)), "harness_mask_describe")
    if args.binary and not args.ops_library:
        args.ops_library = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(args.binary))), "python",
                                        "libharness_ops.so")
    if args.device == "cpu" and {"ours", "ours-det"} & set(selected(args.peers, PEERS, "peer")) and not all(
            python_ours({**CASES, **DRY_CASES}[name]) for name in selected(args.cases, {**CASES, **DRY_CASES}, "case", CASES)):
        usage_error("the peer ours needs CUDA on named masks (harness_bench_attention); pick --peers without it for "
                    "--device cpu, or generic cases only (ours runs them through harness.attention)")
    drive(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
