"""The founding probe of the DFlash OOM, with PyTorch's own FlexAttention.

Does flex_attention with a BlockMask on the drafter's real dims stay fused in the backward, or
does it materialize the Q x KV scores? Runs one variant: `--mode compiled` (torch.compile, the
fused Triton kernels) or `--mode eager` (the uncompiled reference, which materializes the scores,
for contrast). Measures the memory the forward and the backward add (peak allocated bytes minus
those allocated when the phase began) and their times, over `--repeats` steps after `--warmup`.

Kind python (trials/python_kind.h): called as `flex_fusion.py --device D ...` and prints
one JSON object as its last stdout line; {"skipped": reason} when this PyTorch cannot run the
probe on this device (in torch 2.11 FlexAttention has no backward on the CPU).
"""

import argparse
import json
import os
import sys
import time


def emit(result):
    print(json.dumps(result, allow_nan=False))
    sys.exit(0)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", required=True, help="cpu or cuda:0 (the harness picks the GPU)")
    parser.add_argument("--mode", choices=["compiled", "eager"], required=True)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16, help="draft block length")
    parser.add_argument("--anchors", type=int, default=128, help="draft blocks per sequence")
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--documents", type=int, default=1, help="documents packed in the context")
    parser.add_argument("--context-rule", choices=["before_anchor", "through_anchor"], default="before_anchor")
    parser.add_argument("--in-block", choices=["bidirectional", "causal"], default="bidirectional")
    parser.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    parser.add_argument("--mask-block", type=int, default=128, help="BlockMask block size (q and kv)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def draw_anchors(torch, args):
    """Anchors without replacement from the positions a with doc_start + 1 <= a <= doc_end - block
    (an earlier token to see, a whole draft block after it), as kernels/mask_desc.h does; the draw
    itself is torch's, so the positions differ from the C++ kind's."""
    base, rest = divmod(args.context, args.documents)
    lengths = [base] * (args.documents - 1) + [base + rest]
    doc_of, valid, start = [], [], 0
    for doc, length in enumerate(lengths):
        doc_of += [doc] * length
        valid += range(start + 1, start + length - args.block_size + 1)
        start += length
    if args.anchors > len(valid):
        raise ValueError(f"{args.anchors} anchors do not fit: {len(valid)} valid positions in a context of "
                         f"{args.context} in {args.documents} documents with draft blocks of {args.block_size}")
    generator = torch.Generator().manual_seed(args.seed)
    picks = torch.randperm(len(valid), generator=generator)[: args.anchors]
    anchors = torch.tensor(valid, dtype=torch.int64)[picks].sort().values
    return anchors, torch.tensor(doc_of, dtype=torch.int64)


def dflash_mask_mod(anchors, doc_of, args):
    """KV = [context | draft block 0 | ... ], Q = [block 0 | ...]: a query of block i sees the context
    before its anchor (through it with through_anchor) in the anchor's document, and its own block."""
    context, block = args.context, args.block_size
    through = args.context_rule == "through_anchor"
    causal = args.in_block == "causal"

    def mask_mod(b, h, q_idx, kv_idx):
        draft_block = q_idx // block
        anchor = anchors[draft_block]
        before = (kv_idx <= anchor) if through else (kv_idx < anchor)
        same_doc = doc_of[kv_idx.clamp(max=context - 1)] == doc_of[anchor]
        sees_context = (kv_idx < context) & before & same_doc
        in_own_block = (kv_idx >= context) & ((kv_idx - context) // block == draft_block)
        if causal:
            in_own_block = in_own_block & (kv_idx - context <= q_idx)
        return sees_context | in_own_block

    return mask_mod


class PhasePeak:
    """Bytes a phase adds at its peak: max allocated during it minus allocated when it began; on CUDA
    also the total, the peak with everything allocated before (what a bare max_memory_allocated shows).
    CUDA: the caching allocator's statistics. CPU: the profiler's allocation events, summed in order
    (allocations that bypass c10's CPU allocator, such as oneDNN scratch space, are not seen)."""

    def __init__(self, torch, device):
        self.torch, self.cuda = torch, device.type == "cuda"
        self.bytes, self.total, self.ms = 0, None, 0.0

    def __enter__(self):
        torch = self.torch
        if self.cuda:
            torch.cuda.synchronize()
            self.base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.Event(enable_timing=True)
            self.end = torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
            self.profile.__enter__()
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        torch = self.torch
        if self.cuda:
            self.end.record()
            torch.cuda.synchronize()
            self.ms = self.start.elapsed_time(self.end)
            self.total = torch.cuda.max_memory_allocated()
            self.bytes = self.total - self.base
        else:
            self.ms = (time.perf_counter() - self.t0) * 1e3
            self.profile.__exit__(*exc)
            # The raw allocation events: the per-op view nets out what an op allocates and frees inside.
            events = sorted((e.start_ns(), e.nbytes()) for e in self.profile.profiler.kineto_results.events()
                            if e.name() == "[memory]")
            level = peak = 0
            for _, change in events:
                level += change
                peak = max(peak, level)
            self.bytes = peak
        return False


def main():
    args = parse_args()
    try:
        import torch
    except ImportError as error:
        emit({"skipped": f"torch is not installed for {sys.executable}: {error}"})
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as error:
        emit({"skipped": f"torch {torch.__version__} has no FlexAttention: {error}"})
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        emit({"skipped": f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU"})
    if device.type == "cuda":
        limit = int(os.environ.get("HARNESS_MEMORY_LIMIT_BYTES", "0"))
        if limit > 0:
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), device)

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    q_len = args.anchors * args.block_size
    kv_len = args.context + q_len
    anchors, doc_of = draw_anchors(torch, args)
    mask_mod = dflash_mask_mod(anchors.to(device), doc_of.to(device), args)
    block_mask = create_block_mask(mask_mod, None, None, q_len, kv_len, device=device, BLOCK_SIZE=args.mask_block)

    # Inputs drawn in fp32 on the CPU from the seed, then cast and moved: the same numbers on any device.
    generator = torch.Generator().manual_seed(args.seed)
    def draw(heads, length):
        x = torch.randn(1, heads, length, args.head_dim, generator=generator)
        return x.to(device=device, dtype=dtype).requires_grad_()
    q, k, v = draw(args.heads, q_len), draw(args.kv_heads, kv_len), draw(args.kv_heads, kv_len)
    # The output gradient arrives after the forward, as in training: it is moved to the device between
    # the phases, so it is in neither phase's delta and only in the backward's total.
    grad_out_host = torch.randn(1, args.heads, q_len, args.head_dim, generator=generator).to(dtype=dtype)
    attention = torch.compile(flex_attention, dynamic=False) if args.mode == "compiled" else flex_attention

    def step():
        q.grad = k.grad = v.grad = None
        out = attention(q, k, v, block_mask=block_mask, enable_gqa=True)
        out.backward(grad_out_host.to(device))

    fwd_peak, bwd_peak, fwd_total, bwd_total, fwd_ms, bwd_ms = [], [], [], [], [], []
    try:
        # The first step compiles (and on the CPU tells whether this torch can run the probe at all).
        start = time.perf_counter()
        try:
            step()
        except NotImplementedError as error:
            emit({"skipped": f"torch {torch.__version__}, {args.mode} flex_attention on {device.type}: {error}"})
        except Exception as error:  # noqa: BLE001 - only a CPU compile failure is a skip, anything else stays an error
            # Older PyTorch (2.5) has no CPU lowering of the compiled flex kernel: inductor fails with
            # BackendCompilerFailed ("Found no NVIDIA driver"). That is "this torch cannot run it here".
            if device.type != "cpu" or type(error).__name__ != "BackendCompilerFailed":
                raise
            lines = [line.strip() for line in str(error).splitlines() if line.strip()]
            # The inner exception ("LoweringException: RuntimeError: ..."), not the hints after it.
            reason = next((line for line in lines[1:] if "Error" in line or "Exception" in line), lines[0] if lines else "")
            emit({"skipped": f"torch {torch.__version__}, compiled flex_attention on cpu: inductor cannot compile it "
                             f"({type(error).__name__}: {reason})"})
        first_step_ms = (time.perf_counter() - start) * 1e3
        for _ in range(args.warmup - 1):
            step()
        for _ in range(args.repeats):
            q.grad = k.grad = v.grad = None
            with PhasePeak(torch, device) as fwd:
                out = attention(q, k, v, block_mask=block_mask, enable_gqa=True)
            grad_out = grad_out_host.to(device)
            with PhasePeak(torch, device) as bwd:
                out.backward(grad_out)
            del out, grad_out
            fwd_peak.append(fwd.bytes)
            bwd_peak.append(bwd.bytes)
            if fwd.total is not None:
                fwd_total.append(fwd.total)
                bwd_total.append(bwd.total)
            fwd_ms.append(fwd.ms)
            bwd_ms.append(bwd.ms)
    except torch.OutOfMemoryError as error:
        emit({"oom": str(error), "fwd_peak_bytes": fwd_peak, "bwd_peak_bytes": bwd_peak})

    emit({
        "fwd_peak_bytes": fwd_peak,
        "bwd_peak_bytes": bwd_peak,
        # Peaks with the inputs (and for the backward the output and its gradient) counted too: what a bare
        # max_memory_allocated shows, the founding probe's "Fwd 0.08 GB, Bwd 0.15 GB".
        "fwd_peak_total_bytes": fwd_total,
        "bwd_peak_total_bytes": bwd_total,
        "fwd_ms": fwd_ms,
        "bwd_ms": bwd_ms,
        "first_step_ms": first_step_ms,
        # One fp32 score matrix, heads x Q x KV x 4 B: what an unfused path holds (several of).
        "scores_bytes": args.heads * q_len * kv_len * 4,
        "block_mask_sparsity": block_mask.sparsity(),
        "q_len": q_len,
        "kv_len": kv_len,
        "mode": args.mode,
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "units": {"block_mask_sparsity": "%"},
    })


if __name__ == "__main__":
    main()
