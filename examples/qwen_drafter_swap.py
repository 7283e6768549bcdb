#!/usr/bin/env python3
"""A Qwen2.5-7B-shaped DFlash drafter layer trained with flex_attention, then with harness.attention.

The swap is one line in DrafterLayer.forward:

    out = flex_attention(q, k, v, block_mask=self.block_mask, enable_gqa=True)   # before
    out = harness.attention(q, k, v, self.block_mask)                            # after

The same BlockMask (create_block_mask of the drafter's mask_mod) goes to both; harness converts it
to bits once (harness.FlexMask) and caches it with the BlockMask. The script trains the layer for
--steps steps with each, from the same initial weights and data, and prints the time per step
(median after --warmup steps) and how far the two runs' losses are apart.

Shapes (--device cuda, the default): Qwen2.5-7B's hidden 3584, 28 query heads on 4 kv heads
(head_dim 128), context 6000, 256 anchors of 16 draft tokens (Q_LEN 4096, KV_LEN 10096), bf16;
flex_attention compiled (torch.compile(flex_attention, dynamic=False)). On a CPU (--device cpu) the
same layer at small dims (hidden 256, 4 / 1 heads, context 512, 16 anchors), fp32, a few steps; flex_attention
has no backward on the CPU, so there the BlockMask's mask goes through scaled_dot_product_attention
instead: it checks the swap, its timings mean little.

    python examples/qwen_drafter_swap.py                  # an H200 (Hopper): the real shapes
    python examples/qwen_drafter_swap.py --device cpu     # anywhere: small dims
    python examples/qwen_drafter_swap.py --mask dflash    # harness's own DFlashMask instead of the BlockMask

From a checkout without `pip install .`, harness comes from python/ and the op library from
build/python/libharness_ops.so (HARNESS_OPS_LIBRARY overrides it).
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
from torch.nn.attention.flex_attention import create_block_mask, create_mask, flex_attention

try:
    import harness
except ImportError:  # a checkout: the package lives in python/
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
    import harness

SHAPES = {
    "cuda": dict(hidden=3584, heads=28, kv_heads=4, context=6000, anchors=256, block=16, dtype=torch.bfloat16),
    "cpu": dict(hidden=256, heads=4, kv_heads=1, context=512, anchors=16, block=16, dtype=torch.float32),
}


def dflash_mask_mod(anchors, context, block):
    """The drafter's mask: draft block i sees the context before its anchor and all of its own block."""

    def mask_mod(b, h, q_idx, kv_idx):
        draft_block = q_idx // block
        in_context = kv_idx < anchors[draft_block]
        own_block = (kv_idx >= context + draft_block * block) & (kv_idx < context + (draft_block + 1) * block)
        return in_context | own_block

    return mask_mod


def flex_on_cpu(block_mask):
    """flex_attention's stand-in on the CPU, where it has no backward: the BlockMask's mask (its
    lists with the mask_mod in the partial blocks, as flex evaluates it) through PyTorch's
    scaled_dot_product_attention."""
    q_block, kv_block = block_mask.BLOCK_SIZE
    q_len, kv_len = block_mask.seq_lengths
    listed = block_mask.to_dense()[0, 0].bool()  # [q blocks, kv blocks], partial and full
    blocks = listed[torch.arange(q_len) // q_block][:, torch.arange(kv_len) // kv_block]
    visible = blocks & create_mask(block_mask.mask_mod, 1, 1, q_len, kv_len, device="cpu")[0, 0]

    def attend(q, k, v, block_mask=None, enable_gqa=False):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=visible, enable_gqa=enable_gqa)

    return attend


class DrafterLayer(torch.nn.Module):
    """One attention layer of a DFlash drafter: queries from the draft tokens, keys and values from
    [target context | draft tokens], GQA."""

    def __init__(self, hidden, heads, kv_heads, block_mask, use_harness, flex):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.q_proj = torch.nn.Linear(hidden, hidden, bias=False)
        self.kv_proj = torch.nn.Linear(hidden, 2 * kv_heads * self.head_dim, bias=False)
        self.o_proj = torch.nn.Linear(hidden, hidden, bias=False)
        self.block_mask, self.use_harness, self.flex = block_mask, use_harness, flex

    def forward(self, draft, context_and_draft):
        batch, q_len, _ = draft.shape
        kv_len = context_and_draft.shape[1]
        q = self.q_proj(draft).view(batch, q_len, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv_proj(context_and_draft).view(batch, kv_len, 2, self.kv_heads, self.head_dim).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        if self.use_harness:
            out = harness.attention(q, k, v, self.block_mask)
        else:
            out = self.flex(q, k, v, block_mask=self.block_mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, q_len, -1))


def train(args, shape, device, use_harness, block_mask, harness_mask):
    """Losses and per-step times of --steps steps from the seed's weights and data."""
    torch.manual_seed(args.seed)
    hidden, q_len = shape["hidden"], shape["anchors"] * shape["block"]
    kv_len = shape["context"] + q_len
    flex = torch.compile(flex_attention, dynamic=False) if device.type == "cuda" else flex_on_cpu(block_mask)
    mask = harness_mask if (use_harness and harness_mask is not None) else block_mask
    layer = DrafterLayer(hidden, shape["heads"], shape["kv_heads"], mask, use_harness, flex).to(device, shape["dtype"])
    optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-4)
    draft = torch.randn(1, q_len, hidden, device=device, dtype=shape["dtype"])
    context_and_draft = torch.randn(1, kv_len, hidden, device=device, dtype=shape["dtype"])
    target = torch.randn(1, q_len, hidden, device=device, dtype=shape["dtype"])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    losses, times = [], []
    for _ in range(args.warmup + args.steps):
        sync()
        start = time.perf_counter()
        loss = torch.nn.functional.mse_loss(layer(draft, context_and_draft).float(), target.float())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
        losses.append(loss.item())
    return losses, times[args.warmup:]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (the real shapes) or cpu (small dims)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 20 on cuda, 3 on cpu)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed first steps (default 3 on cuda, 1 on cpu)")
    parser.add_argument("--mask", choices=["blockmask", "dflash"], default="blockmask",
                        help="what harness.attention gets: the same BlockMask as flex (default), or harness.DFlashMask")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device here: run with --device cpu for the small dims")
    shape = SHAPES["cuda" if device.type == "cuda" else "cpu"]
    args.steps = args.steps or (20 if device.type == "cuda" else 3)
    args.warmup = args.warmup if args.warmup is not None else (3 if device.type == "cuda" else 1)

    # Anchors: distinct context positions with at least one earlier token, sorted (the drafter's sample).
    generator = torch.Generator().manual_seed(args.seed)
    context, block, anchors_n = shape["context"], shape["block"], shape["anchors"]
    anchors = (torch.randperm(context - block - 1, generator=generator)[:anchors_n] + 1).sort().values
    q_len, kv_len = anchors_n * block, context + anchors_n * block
    block_mask = create_block_mask(dflash_mask_mod(anchors.to(device), context, block), None, None, q_len, kv_len,
                                   device=device)
    harness_mask = None
    if args.mask == "dflash":
        harness_mask = harness.DFlashMask(anchors, context=context, block_size=block).to(device)

    flex_losses, flex_times = train(args, shape, device, False, block_mask, None)
    ours_losses, ours_times = train(args, shape, device, True, block_mask, harness_mask)
    relative = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(flex_losses, ours_losses))
    result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "shape": {k: (str(v) if k == "dtype" else v) for k, v in shape.items()},
              "q_len": q_len, "kv_len": kv_len, "steps": args.steps, "harness_mask": args.mask,
              "flex_ms_per_step": statistics.median(flex_times), "harness_ms_per_step": statistics.median(ours_times),
              "losses_max_relative_difference": relative, "flex_losses": flex_losses, "harness_losses": ours_losses}
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{result['device']}: hidden {shape['hidden']}, {shape['heads']}/{shape['kv_heads']} heads, context {context}, "
          f"{anchors_n} anchors (Q_LEN {q_len}, KV_LEN {kv_len}), {shape['dtype']}")
    flex_kind = "the BlockMask through SDPA" if device.type == "cpu" else "compiled flex_attention"
    print(f"  {flex_kind:32s} {result['flex_ms_per_step']:9.2f} ms per step (median of {args.steps})")
    print(f"  {'harness.attention (' + args.mask + ')':32s} {result['harness_ms_per_step']:9.2f} ms per step")
    print(f"  losses: largest relative difference over {len(flex_losses)} steps {relative:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
