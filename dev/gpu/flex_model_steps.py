#!/usr/bin/env python3
"""Writes one DFlash attention step per model, computed by PyTorch's compiled flex_attention on the
GPU, for `harness replay --import` (dev/gpu/model_matrix.sh replays them).

    python3 dev/gpu/flex_model_steps.py --out DIR --models Llama-3.1-8B,Qwen2.5-7B [--context 7000]
        [--anchors 200] [--documents 6] [--mode compiled|eager]

Each model's heads / kv heads / head dims come from `harness list --models --json` (--harness BIN).
The step: q, k, v, grad_out drawn in fp32 and cast to bf16, the DFlash mask (harness.DFlashMask,
anchors drawn without replacement from each document's valid positions), flex_attention compiled
with dynamic=False (a fresh compile per shape), forward and backward; saved with its outputs
(harness.save_step) as DIR/<model>.pt. Prints one JSON line per model (time, file, or the error).
"""

import argparse
import json
import pathlib
import re
import subprocess
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
import harness  # noqa: E402


def draw_anchors(context, documents, anchors, block_size, generator):
    bounds = torch.linspace(0, context, documents + 1).long().tolist()
    valid = torch.cat([torch.arange(start + 1, end - block_size + 1) for start, end in zip(bounds, bounds[1:])])
    pick = torch.randperm(valid.numel(), generator=generator)[:anchors]
    doc_id = torch.zeros(context, dtype=torch.int64)
    for index, (start, end) in enumerate(zip(bounds, bounds[1:])):
        doc_id[start:end] = index
    return valid[pick], doc_id


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", required=True, help="comma-separated, as harness list --models names them")
    parser.add_argument("--harness", default="build/harness/harness")
    parser.add_argument("--context", type=int, default=7000)
    parser.add_argument("--anchors", type=int, default=200)
    parser.add_argument("--documents", type=int, default=6)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--mode", choices=["compiled", "eager"], default="compiled")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from torch.nn.attention.flex_attention import flex_attention

    shapes = {m["name"]: m for m in json.loads(subprocess.check_output([args.harness, "list", "--models", "--json"]))}
    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in args.models.split(","):
        model = shapes[name]
        started = time.time()
        try:
            generator = torch.Generator().manual_seed(args.seed)
            anchors, doc_id = draw_anchors(args.context, args.documents, args.anchors, args.block_size, generator)
            mask = harness.DFlashMask(anchors, doc_id, context=args.context, block_size=args.block_size)
            q_len, kv_len = mask.q_len, mask.kv_len
            draw = lambda h, n, d: torch.randn(1, h, n, d, generator=generator).to(torch.bfloat16).cuda()  # noqa: E731
            q = draw(model["heads"], q_len, model["head_dim"])
            k = draw(model["kv_heads"], kv_len, model["head_dim"])
            v = draw(model["kv_heads"], kv_len, model["v_head_dim"])
            grad_out = draw(model["heads"], q_len, model["v_head_dim"])
            block_mask = mask.flex_block_mask(q_len, kv_len, device="cuda", block_size=128)
            torch._dynamo.reset()
            attend = torch.compile(flex_attention, dynamic=False) if args.mode == "compiled" else flex_attention
            leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
            result = attend(*leaves, block_mask=block_mask, enable_gqa=model["heads"] != model["kv_heads"])
            result.backward(grad_out)
            torch.cuda.synchronize()
            outputs = {"out": result.detach(), "dq": leaves[0].grad, "dk": leaves[1].grad, "dv": leaves[2].grad}
            path = out_dir / f"{name}.pt"
            harness.save_step(path, q, k, v, grad_out, mask=mask, outputs=outputs, heads=model["heads"],
                              kv_heads=model["kv_heads"], name=f"flex_{args.mode}_" + re.sub(r"[^a-z0-9]+", "_", name.lower()))  # a step name is [a-z0-9_]+
            print(json.dumps({"model": name, "file": str(path), "seconds": round(time.time() - started, 1)}), flush=True)
        except Exception as error:  # one model's failure is reported, the others still run
            print(json.dumps({"model": name, "error": f"{type(error).__name__}: {error}"[:500]}), flush=True)


if __name__ == "__main__":
    main()
