#!/usr/bin/env python3
"""harness.attention from Python against the same kernels timed in C++, and a DFlash drafter
layer under torch.compile with harness.attention against the same layer with compiled
flex_attention. One process, one GPU, one run.

    python3 bench/python_vs_cpp.py --binary build-h200/bench/harness_bench_attention [--reps 20]

1. harness_bench_attention (C++: kernels::attention, CUDA events, median, 256 MB L2 flush before
   each op) at the real dims (32 heads, 8 KV heads, head_dim 128, 128 anchors x 16, context 8192,
   4 documents, bf16); its resolved mask (the anchors it drew) becomes a harness.DFlashMask, and
   the Python op is timed the same way: the difference is what the Python path adds on the GPU
   timeline.
2. Host time per call (perf_counter over 200 calls enqueued without synchronizing, so the GPU
   queue absorbs them): harness.attention (checks + op), the bare torch.ops call, and
   flex_attention compiled, each forward only, no grad.
3. The layer (q/kv/o projections + attention, dim 4096) under torch.compile(fullgraph=True) with
   harness.attention vs with flex_attention (compiled, dynamic=False, default mode), same weights:
   max difference of the outputs and of the gradients, and fwd+bwd step time (events, median).
Prints a JSON object and a Markdown table.
"""

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import harness  # noqa: E402
from torch.nn.attention.flex_attention import flex_attention  # noqa: E402

REAL = ["--mask", "dflash", "--anchors", "128", "--heads", "32", "--kv-heads", "8", "--head-dim", "128",
        "--context", "8192", "--documents", "4"]


def median(values):
    return sorted(values)[len(values) // 2]


def run_cpp(binary, reps):
    proc = subprocess.run([binary, *REAL, "--reps", str(reps), "--impl", "fused"], capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        sys.exit(f"{binary} printed no JSON (exit {proc.returncode}): {proc.stderr.strip()}")
    return json.loads(lines[-1])


def mask_from(resolved):
    doc_id = torch.repeat_interleave(torch.arange(len(resolved["doc_lengths"])), torch.tensor(resolved["doc_lengths"]))
    return harness.DFlashMask(torch.tensor(resolved["anchors"]), doc_id, context=resolved["context"],
                              block_size=resolved["block_size"], context_rule=resolved["context_rule"],
                              in_block=resolved["in_block"])


def time_fwd_bwd(call, leaves, dout, reps):
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for _ in range(3):
        call(*leaves()).backward(dout)
    torch.cuda.synchronize()
    events = []
    for rep in range(reps):
        e = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        args = leaves()
        flush.fill_(rep & 0xFF)
        e[0].record()
        out = call(*args)
        e[1].record()
        flush.fill_(rep & 0xFF)
        e[2].record()
        out.backward(dout)
        e[3].record()
        events.append(e)
    torch.cuda.synchronize()
    return median([e[0].elapsed_time(e[1]) for e in events]), median([e[2].elapsed_time(e[3]) for e in events])


def host_us_per_call(call, calls=200):
    with torch.no_grad():
        for _ in range(10):
            call()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            call()
        elapsed = time.perf_counter() - start
        torch.cuda.synchronize()
    return elapsed / calls * 1e6


class DrafterLayer(torch.nn.Module):
    def __init__(self, attend, dim=4096, heads=32, kv_heads=8):
        super().__init__()
        self.attend, self.heads, self.kv_heads, self.head_dim = attend, heads, kv_heads, dim // heads
        self.q_proj = torch.nn.Linear(dim, dim, bias=False)
        self.kv_proj = torch.nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.o_proj = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, draft, context_and_draft):
        batch, q_len, _ = draft.shape
        kv_len = context_and_draft.shape[1]
        q = self.q_proj(draft).view(batch, q_len, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv_proj(context_and_draft).view(batch, kv_len, 2, self.kv_heads, self.head_dim).unbind(2)
        out = self.attend(q, k.transpose(1, 2), v.transpose(1, 2))
        return self.o_proj(out.transpose(1, 2).reshape(batch, q_len, -1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    cpp = run_cpp(args.binary, args.reps)
    fused = next(r for r in cpp["results"] if r["impl"] == "fused")
    mask = mask_from(cpp["mask"]).to("cuda")
    q_len, kv_len = mask.q_len, mask.kv_len
    generator = torch.Generator(device="cuda").manual_seed(1)
    opts = dict(device="cuda", dtype=torch.bfloat16, generator=generator)
    q = torch.randn(1, 32, q_len, 128, **opts)
    k = torch.randn(1, 8, kv_len, 128, **opts)
    v = torch.randn(1, 8, kv_len, 128, **opts)
    dout = torch.randn(1, 32, q_len, 128, **opts)
    leaves = lambda: [t.detach().requires_grad_() for t in (q, k, v)]  # noqa: E731
    py_fwd, py_bwd = time_fwd_bwd(lambda a, b, c: harness.attention(a, b, c, mask), leaves, dout, args.reps)

    kind, params, anchors, doc_id, bits = mask.op_inputs(q.device)
    scale = 1 / math.sqrt(128)
    block_mask = mask.flex_block_mask(q_len, kv_len, device="cuda")
    flex = torch.compile(flex_attention, dynamic=False)
    host = {
        "harness.attention": host_us_per_call(lambda: harness.attention(q, k, v, mask)),
        "torch.ops.harness.fused_attention": host_us_per_call(
            lambda: torch.ops.harness.fused_attention(q, k, v, kind, params, anchors, doc_id, bits, mask.uid, scale)),
        "compiled flex_attention": host_us_per_call(lambda: flex(q, k, v, block_mask=block_mask, enable_gqa=True)),
    }

    torch.manual_seed(0)
    ours_layer = DrafterLayer(lambda a, b, c: harness.attention(a, b, c, mask)).cuda().to(torch.bfloat16)
    flex_layer = DrafterLayer(lambda a, b, c: flex_attention(a, b, c, block_mask=block_mask, enable_gqa=True))
    flex_layer = flex_layer.cuda().to(torch.bfloat16)
    flex_layer.load_state_dict(ours_layer.state_dict())
    draft = torch.randn(1, q_len, 4096, **opts)
    context = torch.randn(1, kv_len, 4096, **opts)
    layer_out = torch.randn(1, q_len, 4096, **opts)
    compiled = {"harness": torch.compile(ours_layer, fullgraph=True, dynamic=False),
                "flex": torch.compile(flex_layer, fullgraph=True, dynamic=False)}
    outputs, grads, times = {}, {}, {}
    for name, model in compiled.items():
        params_of = [p for p in (ours_layer if name == "harness" else flex_layer).parameters()]
        for p in params_of:
            p.grad = None
        out = model(draft, context)
        out.backward(layer_out)
        outputs[name] = out.float()
        grads[name] = [p.grad.float().clone() for p in params_of]
        times[name] = time_fwd_bwd(lambda d: model(d, context), lambda: [draft.detach().requires_grad_()],
                                   layer_out, args.reps)
    result = {
        "device": cpp["device"],
        "cpp_ms": {"fwd": fused["fwd_ms"], "bwd": fused["bwd_ms"]},
        "python_ms": {"fwd": py_fwd, "bwd": py_bwd},
        "host_us_per_forward_call": host,
        "layer_ms": {name: {"fwd": t[0], "bwd": t[1]} for name, t in times.items()},
        "layer_max_abs_diff": {
            "out": (outputs["harness"] - outputs["flex"]).abs().max().item(),
            "grads": [(a - b).abs().max().item() for a, b in zip(grads["harness"], grads["flex"])],
            "out_scale": outputs["flex"].abs().max().item(),
        },
    }
    print(json.dumps(result))
    print(f"\n{cpp['device']}, real DFlash dims (B 1, H 32, H_KV 8, D 128, 128 anchors x 16, context 8192, bf16)\n")
    print("| path | fwd ms | bwd ms |\n| --- | ---: | ---: |")
    print(f"| C++ kernels::attention (harness_bench_attention) | {fused['fwd_ms']:.3f} | {fused['bwd_ms']:.3f} |")
    print(f"| Python harness.attention | {py_fwd:.3f} | {py_bwd:.3f} |")
    for name, (fwd, bwd) in times.items():
        print(f"| drafter layer (dim 4096) compiled, {name} attention | {fwd:.3f} | {bwd:.3f} |")
    print("\n| host time per forward call | µs |\n| --- | ---: |")
    for name, us in host.items():
        print(f"| {name} | {us:.1f} |")


if __name__ == "__main__":
    main()
