#!/usr/bin/env python3
"""The forwards' lazy rescale against the eager one, in precision, on the CPU (no GPU needed).

Simulates what the CUDA forwards do per q block of 64 rows (kernels/cuda/tile_math.cuh): kv tiles
of TILE keys visited partial blocks first, then full ones in ascending order; scores in fp32 log2
units; P = 2^(s - reference max) in fp32, rounded to bf16 for P V; O and the row sums in fp32; the
reference max moved at every growth (eager) or, lazily, only when some row of the warp (16 rows)
grows past THRESHOLD (kLazyRescaleLog2). Then the flash backward's dq (P from the LSE, delta =
rowsum(O dO) from bf16 O, dS rounded to bf16), all against an fp64 oracle. Inputs are those of the
hidden Catch2 case [sinks_hd64]: sliding_window 300 over 640 queries, head_dim 64, 4 heads on one
kv head, keys 0..319 scaled by 6 ("sinks"); other seeds than the GPU test's (CPU RNG).

What it shows (kernels/cuda/README.md, "The lazy rescale"): the lazy rescale's out error is
larger in a few percent of rows, by up to 5x, because in eager mode the tile max's probability is
exactly 1 (exp2(0), exact in bf16) while lazily it is 2^J for the jump J below the threshold,
which bf16 rounds (2^-9 relative): rows one key dominates get one more rounding on their dominant
term. Usage: lazy_rescale_precision.py [--seeds N] [--threshold 8] [--tile 64]
"""
import argparse
import math

import torch


def bf16(x):
    return x.to(torch.bfloat16).to(torch.float64)


def simulate(seed, threshold, tile=64, q_len=640, head_dim=64, heads=4, window=300, sinks=320, sink_scale=6.0):
    """(per-row max |out error|, max |dq error|, max |dq error| of dense bf16, max |dq|) for one seed;
    threshold None = eager."""
    gen = torch.Generator().manual_seed(seed)
    q = bf16(torch.randn(heads, q_len, head_dim, generator=gen, dtype=torch.float64))
    k_full = torch.randn(q_len, head_dim, generator=gen, dtype=torch.float64)
    k_full[:sinks] *= sink_scale
    k = bf16(k_full)
    v = bf16(torch.randn(q_len, head_dim, generator=gen, dtype=torch.float64))
    dout = bf16(torch.randn(heads, q_len, head_dim, generator=gen, dtype=torch.float64))
    scale, log2e = 1 / math.sqrt(head_dim), 1 / math.log(2)
    rows_idx = torch.arange(q_len)[:, None]
    keys_idx = torch.arange(q_len)[None, :]
    visible = (keys_idx <= rows_idx) & (keys_idx > rows_idx - window)
    s = torch.einsum("hqd,kd->hqk", q, k)

    p_exact = torch.softmax((s * scale).masked_fill(~visible, -math.inf), -1)
    out_exact = p_exact @ v
    dp = torch.einsum("hqd,kd->hqk", dout, v)
    dq_exact = (p_exact * (dp - (out_exact * dout).sum(-1, keepdim=True))) @ k * scale

    out = torch.zeros(heads, q_len, head_dim, dtype=torch.float64)
    lse = torch.zeros(heads, q_len, dtype=torch.float64)
    for q0 in range(0, q_len, 64):
        rows = slice(q0, q0 + 64)
        seen = visible[rows].view(64, q_len // tile, tile)
        partial = [kb for kb in range(q_len // tile) if seen[:, kb].any() and not seen[:, kb].all()]
        full = [kb for kb in range(q_len // tile) if seen[:, kb].all()]
        ref = torch.full((heads, 64), -math.inf, dtype=torch.float64)
        row_sum = torch.zeros(heads, 64, dtype=torch.float64)
        acc = torch.zeros(heads, 64, head_dim, dtype=torch.float64)
        for kb in partial + full:
            keys = slice(kb * tile, (kb + 1) * tile)
            st = (s[:, rows, keys] * scale * log2e).float().double().masked_fill(~visible[rows, keys], -math.inf)
            tile_max = torch.maximum(ref, st.max(-1).values)
            if threshold is None:
                move = torch.ones_like(ref, dtype=torch.bool)
            else:
                grows = ((tile_max - ref) > threshold) | (torch.isinf(ref) & ~torch.isinf(tile_max))
                move = grows.view(heads, 4, 16).any(-1, keepdim=True).expand(heads, 4, 16).reshape(heads, 64)
            new_ref = torch.where(move, tile_max, ref)
            corr = torch.where(torch.isinf(ref), torch.zeros_like(ref), torch.exp2(ref - new_ref))
            corr = torch.where(move, corr, torch.ones_like(corr))
            base = torch.where(torch.isinf(new_ref), torch.zeros_like(new_ref), new_ref)
            p = torch.exp2(st - base[..., None]).float().double()
            row_sum = row_sum * corr + p.sum(-1)
            acc = (acc * corr[..., None] + bf16(p) @ v[keys]).float().double()
            ref = new_ref
        out[:, rows] = acc / row_sum[..., None]
        lse[:, rows] = (ref + torch.log2(row_sum)) / log2e
    out_bf16 = bf16(out)
    p = torch.exp(s * scale - lse[..., None]).masked_fill(~visible, 0.0).float().double()
    delta = (out_bf16 * dout).sum(-1, keepdim=True).float().double()
    dq = bf16(bf16(p * (dp - delta)) @ k * scale)
    return ((out_bf16 - out_exact).abs().amax(-1), (dq - dq_exact).abs().max().item(),
            (bf16(dq_exact) - dq_exact).abs().max().item(), dq_exact.abs().max().item())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--threshold", type=float, default=8.0, help="kLazyRescaleLog2 (log2 units)")
    parser.add_argument("--tile", type=int, default=64, help="keys per kv tile (64 or 128)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| seed | out err eager | out err lazy | rows lazy > 1.5x eager | dq err eager | dq err lazy | "
          "dq err dense bf16 | tolerance 2 x dense + 0.002 max|dq| |")
    print("|---|---|---|---|---|---|---|---|")
    worse = []
    for seed in range(args.seeds):
        eager = simulate(seed, None, args.tile)
        lazy = simulate(seed, args.threshold, args.tile)
        rows = int((lazy[0] > 1.5 * eager[0] + 1e-4).sum())
        worse.append(rows / eager[0].numel())
        tolerance = 2 * eager[2] + 2e-3 * max(1.0, eager[3])
        print(f"| {seed} | {eager[0].max():.4f} | {lazy[0].max():.4f} | {rows} of {eager[0].numel()} | {eager[1]:.4f} | "
              f"{lazy[1]:.4f} | {eager[2]:.4f} | {tolerance:.4f} |", flush=True)
    print(f"rows whose out error the lazy rescale makes > 1.5x the eager one: {100 * sum(worse) / len(worse):.1f}% on average")


if __name__ == "__main__":
    main()
