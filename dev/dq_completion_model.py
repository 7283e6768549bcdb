#!/usr/bin/env python3
"""Where the atomic backward's q blocks get their last dQ add: a model on the CPU (no GPU).

Converting dQ inside the atomic backward, by the CTA whose add completes a (head, q block), was
measured slower than the separate convert kernel (kernels/cuda/README.md, "Rejected designs"). This model shows why: it takes the case's real BlockMask lists at the
atomic backward's tiling (kernels/cuda/tiling.h: 64 packed rows per step, 128 keys per CTA, heads
packed as packed_tile does), orders the CTAs longest first as the schedule kernel does (cost = 5
GEMMs per step per head pack + 4), hands them to 132 SMs one at a time as SMs free up, gives every
step the same time, lands each step's adds three steps later, and reports which CTAs make the
last add of each (head, q block), when, and how many close together.

Usage: dq_completion_model.py BUILD_DIR [harness_mask_describe flags, e.g. --mask dflash --anchors 512]
"""
import heapq
import json
import os
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import attention_vs_flex as bench  # noqa: E402  (reference_rows: the mask in tensor form)

SMS, KEYS, ROWS, ADDS_IN_FLIGHT = 132, 128, 64, 3


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    describe = os.path.join(sys.argv[1], "bench", "harness_mask_describe")
    flags = sys.argv[2:]
    described = json.loads(subprocess.check_output([describe] + flags))
    mask, dims = described["mask"], described["dims"]
    heads, kv_heads = dims["heads"], dims["kv_heads"]
    group = heads // kv_heads
    heads_packed = min(group & -group, ROWS // 16)
    block_m = ROWS // heads_packed
    q_len, kv_len = mask["q_len"], mask["kv_len"]
    nq, nkv = -(-q_len // block_m), -(-kv_len // KEYS)
    listed = torch.zeros(nq, nkv, dtype=torch.bool)
    full = torch.zeros(nq, nkv, dtype=torch.bool)
    for qb in range(nq):
        rows = torch.arange(qb * block_m, min(q_len, (qb + 1) * block_m))
        visible = bench.reference_rows(torch, mask, rows, "cpu")
        visible = torch.nn.functional.pad(visible, (0, nkv * KEYS - kv_len))
        tiles = visible.view(visible.shape[0], nkv, KEYS)
        listed[qb] = tiles.any(0).any(-1)
        full[qb] = tiles.all(0).all(-1) & (visible.shape[0] == block_m)
    packs = group // heads_packed
    ctas = []
    for kv_block in range(nkv):
        partial = [i for i in range(nq) if listed[i, kv_block] and not full[i, kv_block]]
        order = partial + [i for i in range(nq) if full[i, kv_block]]
        for kv_head in range(kv_heads):
            ctas.append((len(order) * packs * 5 + 4, kv_block, kv_head, order))
    ctas.sort(key=lambda c: -c[0])

    free = [(0.0, sm) for sm in range(SMS)]
    last = {}  # (head, q block) -> (time its last add lands, CTA)
    ends = []
    for cta, (_, _, kv_head, order) in enumerate(ctas):
        start, sm = heapq.heappop(free)
        steps = len(order) * packs
        for step in range(steps):
            pack, i = divmod(step, len(order))
            landed = start + 1 + step + ADDS_IN_FLIGHT
            for h in range(heads_packed):
                key = (kv_head * group + pack * heads_packed + h, order[i])
                if key not in last or last[key][0] < landed:
                    last[key] = (landed, cta)
        ends.append(start + 1 + steps)
        heapq.heappush(free, (ends[-1], sm))
    total = max(ends)
    by_cta = {}
    for landed, cta in last.values():
        by_cta.setdefault(cta, []).append(landed)
    in_tail = sum(1 for cta, times in by_cta.items() for t in times if t >= ends[cta] - 8 + ADDS_IN_FLIGHT)
    bursts = []
    for times in by_cta.values():
        times.sort()
        first, best = 0, 0
        for i, t in enumerate(times):
            while t - times[first] > 4:
                first += 1
            best = max(best, i - first + 1)
        bursts.append(best)
    bursts.sort()
    n = len(last)
    print(f"{' '.join(flags)}: {len(ctas)} CTAs ({heads_packed} heads x {block_m} queries per step), "
          f"{n} (head, q block) completions, kernel {total:.0f} steps on {SMS} SMs")
    print(f"  CTAs that make a last add: {len(by_cta)} of {len(ctas)}; completions each: mean {n / len(by_cta):.1f}, "
          f"max {max(len(v) for v in by_cta.values())}")
    print(f"  completions in their CTA's last 8 steps: {100 * in_tail / n:.0f}%; in the kernel's last 5%: "
          f"{100 * sum(1 for t, _ in last.values() if t > 0.95 * total) / n:.0f}%")
    print(f"  most completions one CTA makes within 4 steps: median {bursts[len(bursts) // 2]}, max {bursts[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
