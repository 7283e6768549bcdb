#!/usr/bin/env python3
"""Our fused CUDA attention vs torch.compile(flex_attention), same dims, same mask, one run.

For each case it runs harness_bench_attention (our kernels through the harness's attention(),
JSON on stdout, including the resolved mask: anchors and document lengths), rebuilds exactly that
mask as a flex mask_mod, checks that both masks have the same number of visible pairs, times
flex the same way (CUDA events, median, 256 MB L2 flush before each rep, peak extra memory from
the caching allocator) and prints a Markdown table. Timed ops are enqueued back to back without
host synchronization (host dispatch overhead hidden, like triton's do_bench), each after a 256 MB
write that evicts the 60 MB L2.

    python3 bench/attention_vs_flex.py --binary build/bench/harness_bench_attention \
        [--cases dflash-128,dflash-512,causal-128] [--reps 20] [--json-out results.json]

FLOPs count visible (q, kv) pairs only: fwd 4*pairs*D, bwd 10*pairs*D, summed over batch and heads.
"""

import argparse
import json
import subprocess
import sys

import torch
from torch.nn.attention.flex_attention import create_block_mask, create_mask, flex_attention

# Real dims of the founding case: 32 heads, 8 KV heads, head_dim 128, context 8192, 4 documents.
BASE = ["--heads", "32", "--kv-heads", "8", "--head-dim", "128", "--context", "8192", "--documents", "4"]
CASES = {
    "dflash-128": ["--mask", "dflash", "--anchors", "128"],
    "dflash-256": ["--mask", "dflash", "--anchors", "256"],
    "dflash-512": ["--mask", "dflash", "--anchors", "512"],
    # Bottom-right aligned like every harness mask: query q sits at KV position q + KV - Q.
    "causal-128": ["--mask", "causal", "--anchors", "128"],
}
PEAK_TFLOPS = 790.0  # bf16 dense matmul measured on this H200 model (KINDS.md), for the "of peak" column


def run_ours(binary, case_args, reps):
    proc = subprocess.run([binary, *BASE, *case_args, "--reps", str(reps)], capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        sys.exit(f"{binary} printed no JSON (exit {proc.returncode}): {proc.stderr.strip()}")
    result = json.loads(lines[-1])
    if "error" in result:
        sys.exit(f"{binary}: {result['error']}")
    return result


def mask_mod_for(mask, device):
    """The harness's ResolvedMask::visible as a flex mask_mod (see kernels/mask_desc.h)."""
    kind, q_len, kv_len = mask["kind"], mask["q_len"], mask["kv_len"]
    lengths = torch.tensor(mask["doc_lengths"], dtype=torch.int64)
    doc_id = torch.repeat_interleave(torch.arange(len(lengths)), lengths).to(device=device, dtype=torch.int32)
    offset = kv_len - q_len  # bottom-right alignment of the non-dflash masks
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
    if kind == "causal":
        return lambda b, h, q_idx, kv_idx: kv_idx <= q_idx + offset
    if kind == "document_causal":
        return lambda b, h, q_idx, kv_idx: (kv_idx <= q_idx + offset) & (
            doc_id[kv_idx] == doc_id[torch.clamp(q_idx + offset, min=0)])
    if kind == "sliding_window":
        window = mask["window"]
        return lambda b, h, q_idx, kv_idx: (kv_idx <= q_idx + offset) & (kv_idx > q_idx + offset - window)
    if kind == "full":
        return lambda b, h, q_idx, kv_idx: kv_idx >= 0
    sys.exit(f"unknown mask kind {kind}")


def bench_flex(ours, reps):
    device = "cuda"
    dims, mask = ours["dims"], ours["mask"]
    batch, heads, kv_heads, head_dim = dims["batch"], dims["heads"], dims["kv_heads"], dims["head_dim"]
    q_len, kv_len = mask["q_len"], mask["kv_len"]
    mask_mod = mask_mod_for(mask, device)
    pairs = int(create_mask(mask_mod, 1, 1, q_len, kv_len, device=device).sum().item())
    if pairs != ours["pairs_per_head"]:
        sys.exit(f"mask mismatch: flex mask_mod sees {pairs} pairs, the harness mask {ours['pairs_per_head']}")
    block_mask = create_block_mask(mask_mod, None, None, q_len, kv_len, device=device, BLOCK_SIZE=128)
    flex = torch.compile(flex_attention)
    gen = torch.Generator(device=device).manual_seed(1)
    opts = dict(device=device, dtype=torch.bfloat16, generator=gen)
    q = torch.randn(batch, heads, q_len, head_dim, **opts)
    k = torch.randn(batch, kv_heads, kv_len, head_dim, **opts)
    v = torch.randn(batch, kv_heads, kv_len, head_dim, **opts)
    dout = torch.randn(batch, heads, q_len, head_dim, **opts)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    call = lambda a, b, c: flex(a, b, c, block_mask=block_mask, enable_gqa=heads != kv_heads)
    leaves = lambda: [t.detach().requires_grad_(True) for t in (q, k, v)]
    # Timing pass: back to back, no host synchronization (host overhead hidden, as in do_bench).
    for _ in range(2):  # compile forward and backward before timing
        call(*leaves()).backward(dout)
    torch.cuda.synchronize()
    events = []
    for rep in range(reps + 3):
        e = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        ql, kl, vl = leaves()
        flush.fill_(rep & 0xFF)
        e[0].record()
        out = call(ql, kl, vl)
        e[1].record()
        flush.fill_(rep & 0xFF)
        e[2].record()
        out.backward(dout)
        e[3].record()
        events.append(e)
    torch.cuda.synchronize()
    fwd_ms = [e[0].elapsed_time(e[1]) for e in events[3:]]
    bwd_ms = [e[2].elapsed_time(e[3]) for e in events[3:]]
    # Memory pass: one synchronized step, peak reset before each op.
    ql, kl, vl = leaves()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = call(ql, kl, vl)
    torch.cuda.synchronize()
    fwd_peak = torch.cuda.max_memory_allocated() - before
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out.backward(dout)
    torch.cuda.synchronize()
    bwd_peak = torch.cuda.max_memory_allocated() - before
    median = lambda xs: sorted(xs)[len(xs) // 2]
    flop_pairs = pairs * batch * heads * head_dim
    f, b = median(fwd_ms), median(bwd_ms)
    return {"impl": "flex (torch.compile)", "fwd_ms": f, "bwd_ms": b, "fwd_peak_bytes": fwd_peak,
            "bwd_peak_bytes": bwd_peak, "fwd_tflops": 4 * flop_pairs / (f * 1e-3) / 1e12,
            "bwd_tflops": 10 * flop_pairs / (b * 1e-3) / 1e12}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True, help="path of harness_bench_attention")
    parser.add_argument("--cases", default="dflash-128,dflash-512,causal-128", help=f"comma list of {sorted(CASES)}")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--json-out", help="also write every number here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("no CUDA device")
    rows, everything = [], []
    for name in args.cases.split(","):
        if name not in CASES:
            sys.exit(f"unknown case {name}; known: {sorted(CASES)}")
        ours = run_ours(args.binary, CASES[name], args.reps)
        fused = next(r for r in ours["results"] if r["impl"] == "fused")
        # The kernels the autotuner picked, from the dispatch configs ("fwd wgmma_m64_n64: ...").
        picked = [d["config"].split(":")[0] for d in fused.get("dispatch", []) if ":" in d.get("config", "")]
        fused["impl"] = "ours (fused_cuda" + (": " + ", ".join(picked) if picked else "") + ")"
        flex = bench_flex(ours, args.reps)
        everything.append({"case": name, "ours": ours, "flex": flex})
        for r in (flex, fused):
            rows.append((name, r, flex))
        print(f"{name}: done", file=sys.stderr, flush=True)
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}; median of {args.reps}, cold L2, back to back; "
          "TFLOP/s of visible pairs (fwd 4*pairs*D, bwd 10*pairs*D); peak = extra bytes allocated during the op\n")
    print("| case | impl | fwd ms | bwd ms | fwd peak GB | bwd peak GB | fwd TFLOP/s (% of 790) | bwd TFLOP/s (% of 790) "
          "| fwd speedup vs flex | bwd speedup vs flex |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r, flex in rows:
        print(f"| {name} | {r['impl']} | {r['fwd_ms']:.3f} | {r['bwd_ms']:.3f} | {r['fwd_peak_bytes'] / 1e9:.3f} | "
              f"{r['bwd_peak_bytes'] / 1e9:.3f} | {r['fwd_tflops']:.0f} ({100 * r['fwd_tflops'] / PEAK_TFLOPS:.0f}%) | "
              f"{r['bwd_tflops']:.0f} ({100 * r['bwd_tflops'] / PEAK_TFLOPS:.0f}%) | "
              f"{flex['fwd_ms'] / r['fwd_ms']:.2f}x | {flex['bwd_ms'] / r['bwd_ms']:.2f}x |")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(everything, f, indent=1)


if __name__ == "__main__":
    main()
