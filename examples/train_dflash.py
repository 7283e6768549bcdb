"""Train a small DFlash drafter with flex_attention: the founding job of harness, in one file.

A DFlash drafter predicts a block of draft tokens after each anchor position at once. Its attention
has Q = the draft blocks (anchors x block_size) and KV = [the target model's context hidden states |
the draft blocks]: a query of draft block i sees the context strictly before its anchor, in the
anchor's document, and every position of its own block. The mask is a mask_mod closure over the
anchor positions and document ids, written the way SpecForge writes it, not with harness's masks.

    python examples/train_dflash.py                                   # CUDA, the founding dims
    python examples/train_dflash.py --memory-fraction 0.6             # ... under a cap: the founding OOM
    python examples/train_dflash.py --attention flex-compiled         # the fused flex kernels: it fits
    python examples/train_dflash.py --small --device cpu --plant-oom-at-step 1   # CPU, a planted failure
    python -m harness.capture -- examples/train_dflash.py --memory-fraction 0.6  # the failing step captured

Attention paths (--attention): `flex` is flex_attention uncompiled, which materializes the fp32
scores in its backward (the founding OOM); `flex-compiled` is torch.compile(flex_attention), the fused
Triton kernels; `sdpa` is scaled_dot_product_attention with the same mask as a dense boolean tensor
(SpecForge's sdpa backend; the only one with a backward on the CPU: flex_attention has none there in
torch 2.11). examples/README.md.
"""

import argparse
import json
import math
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import create_block_mask, create_mask, flex_attention

# bwd_fusion's CPU profile: one fp32 score matrix is 12 MiB, several times what the fused kernels need.
SMALL = {"heads": 4, "kv_heads": 2, "head_dim": 64, "anchors": 32, "context": 1024, "documents": 2, "layers": 2,
         "dtype": "fp32", "vocab": 512}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--attention", choices=["flex", "flex-compiled", "sdpa"],
                        help="attention path (default: flex on CUDA, sdpa on the CPU)")
    parser.add_argument("--small", action="store_true",
                        help="CPU-sized dims: 4 heads, 2 KV heads, head_dim 64, 32 anchors, context 1024, fp32")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16, help="draft block length")
    parser.add_argument("--anchors", type=int, default=512, help="draft blocks per sequence")
    parser.add_argument("--context", type=int, default=8192, help="context length (the target's hidden states)")
    parser.add_argument("--documents", type=int, default=4, help="documents packed into the context")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--memory-fraction", type=float,
                        help="CUDA: cap this process at that fraction of the GPU (set_per_process_memory_fraction)")
    parser.add_argument("--plant-oom-at-step", type=int, metavar="N",
                        help="raise an out-of-memory error inside the last layer's attention backward at step N "
                             "(the CPU allocator's message, asking for one fp32 score matrix of the step)")
    parser.add_argument("--report-speed", action="store_true",
                        help="print {\"steps_per_s\": ...} over the steps after the first as the last line")
    args = parser.parse_args(argv)
    if args.small:
        defaults = {action.dest: action.default for action in parser._actions}
        for key, value in SMALL.items():
            if getattr(args, key) == defaults[key]:
                setattr(args, key, value)
    if args.attention is None:
        args.attention = "flex" if args.device.startswith("cuda") else "sdpa"
    if args.heads % args.kv_heads:
        parser.error("--heads must be a multiple of --kv-heads")
    return args


# ---- the mask, as SpecForge writes it: closures over anchors and document ids -------------------------

def sample_anchors(doc_ids, num_anchors, block_size, generator):
    """Anchor positions per sequence, sorted: inside a document, with an earlier token to see and a
    whole draft block after it."""
    batch, context = doc_ids.shape
    anchors = []
    for b in range(batch):
        ids = doc_ids[b]
        starts = torch.cat([torch.tensor([0]), (ids[1:] != ids[:-1]).nonzero().flatten() + 1])
        ends = torch.cat([starts[1:], torch.tensor([context])])
        valid = torch.cat([torch.arange(s + 1, e - block_size + 1) for s, e in zip(starts.tolist(), ends.tolist())])
        if valid.numel() < num_anchors:
            raise SystemExit(f"only {valid.numel()} valid anchor positions for {num_anchors} anchors")
        pick = torch.randperm(valid.numel(), generator=generator)[:num_anchors]
        anchors.append(valid[pick].sort().values)
    return torch.stack(anchors)


def create_dflash_mask_mod(anchor_positions, doc_ids, context_len, block_size):
    """KV: [context | block 0 | ... | block N-1], Q: [block 0 | ... | block N-1].
    A block sees the context strictly before its anchor, within the anchor's document, and all of
    its own block; other blocks not at all."""
    num_blocks = anchor_positions.shape[1]

    def dflash_mask_mod(b, h, q_idx, kv_idx):
        q_block_id = q_idx // block_size
        anchor_pos = anchor_positions[b, q_block_id.clamp(max=num_blocks - 1)]
        is_context = kv_idx < context_len
        same_document = doc_ids[b, kv_idx.clamp(max=context_len - 1)] == doc_ids[b, anchor_pos]
        mask_context = is_context & (kv_idx < anchor_pos) & same_document
        is_draft = kv_idx >= context_len
        kv_block_id = (kv_idx - context_len) // block_size
        mask_draft = is_draft & (q_block_id == kv_block_id)
        return mask_context | mask_draft

    return dflash_mask_mod


# ---- the drafter -------------------------------------------------------------------------------------

class PlantedOutOfMemory(torch.autograd.Function):
    """Identity forward; its backward raises the CPU allocator's out-of-memory error. Applied to the
    attention's value input, it raises as the attention's gradients reach their inputs."""

    @staticmethod
    def forward(ctx, value, step, request_bytes):
        ctx.step, ctx.request_bytes = step, request_bytes
        return value.view_as(value)

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError(f"[planted by examples/train_dflash.py --plant-oom-at-step {ctx.step}] DefaultCPUAllocator: "
                           f"not enough memory: you tried to allocate {ctx.request_bytes} bytes.")


class DraftLayer(nn.Module):
    def __init__(self, hidden, heads, kv_heads, head_dim):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.norm_attn = nn.RMSNorm(hidden)
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.norm_mlp = nn.RMSNorm(hidden)
        self.gate_up = nn.Linear(hidden, 4 * hidden, bias=False)
        self.down = nn.Linear(2 * hidden, hidden, bias=False)

    def forward(self, draft, context, attend, planted=None):
        batch, q_len, _ = draft.shape
        x = self.norm_attn(draft)
        kv_input = torch.cat([context, x], dim=1)                     # KV = [context | draft blocks]
        q = self.q_proj(x).view(batch, q_len, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(kv_input).view(batch, -1, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(kv_input).view(batch, -1, self.kv_heads, self.head_dim).transpose(1, 2)
        if planted is not None:
            v = PlantedOutOfMemory.apply(v, *planted)
        out = attend(q, k, v).transpose(1, 2).reshape(batch, q_len, -1)
        draft = draft + self.o_proj(out)
        gate, up = self.gate_up(self.norm_mlp(draft)).chunk(2, dim=-1)
        return draft + self.down(F.silu(gate) * up)


class Drafter(nn.Module):
    def __init__(self, args):
        super().__init__()
        hidden = args.heads * args.head_dim
        self.embed = nn.Embedding(args.vocab, hidden)
        self.context_proj = nn.Linear(hidden, hidden, bias=False)   # the target's hidden states, projected
        self.layers = nn.ModuleList(DraftLayer(hidden, args.heads, args.kv_heads, args.head_dim)
                                    for _ in range(args.layers))
        self.norm = nn.RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, args.vocab, bias=False)

    def forward(self, draft_tokens, target_hidden, attend, planted=None):
        context = self.context_proj(target_hidden)
        draft = self.embed(draft_tokens)
        for index, layer in enumerate(self.layers):
            draft = layer(draft, context, attend, planted if index == len(self.layers) - 1 else None)
        return self.lm_head(self.norm(draft))


class Job:
    """The model, its optimizer and one training step (`bench/capture_overhead.py` times steps)."""

    def __init__(self, args):
        self.args = args
        self.device = torch.device(args.device)
        if self.device.type == "cuda" and self.device.index is None:
            # "cuda" means the current device; the memory cap below needs its index.
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
        torch.manual_seed(args.seed)
        self.generator = torch.Generator().manual_seed(args.seed)
        if self.device.type == "cuda" and args.memory_fraction is not None:
            torch.cuda.set_per_process_memory_fraction(args.memory_fraction, self.device)
        self.q_len = args.anchors * args.block_size
        self.kv_len = args.context + self.q_len
        self.model = Drafter(args).to(device=self.device, dtype=self.dtype)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=args.lr)
        self.compiled_flex = torch.compile(flex_attention, dynamic=False) if args.attention == "flex-compiled" else None

    def step(self, step):
        args, device = self.args, self.device
        q_len, kv_len = self.q_len, self.kv_len
        # One packed sequence: documents of equal length, anchors drawn in them, the target's hidden states.
        doc_ids = (torch.arange(args.context) * args.documents // args.context).view(1, -1)
        anchors = sample_anchors(doc_ids, args.anchors, args.block_size, self.generator)
        mask_mod = create_dflash_mask_mod(anchors.to(device), doc_ids.to(device), args.context, args.block_size)
        if args.attention == "sdpa":
            dense = create_mask(mask_mod, 1, 1, q_len, kv_len, device=device)

            def attend(q, k, v):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=dense, enable_gqa=True)
        else:
            block_mask = create_block_mask(mask_mod, 1, None, q_len, kv_len, device=device)
            run_flex = self.compiled_flex or flex_attention

            def attend(q, k, v):
                return run_flex(q, k, v, block_mask=block_mask, enable_gqa=True)

        hidden = args.heads * args.head_dim
        target_hidden = torch.randn(1, args.context, hidden, generator=self.generator).to(device=device, dtype=self.dtype)
        draft_tokens = torch.randint(args.vocab, (1, q_len), generator=self.generator).to(device)
        labels = torch.randint(args.vocab, (1, q_len), generator=self.generator).to(device)
        planted = None
        if args.plant_oom_at_step == step:
            planted = (step, args.heads * q_len * kv_len * 4)   # one fp32 score matrix [H, Q, KV]
        logits = self.model(draft_tokens, target_hidden, attend, planted)
        loss = F.cross_entropy(logits.float().view(-1, args.vocab), labels.view(-1))
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return loss.item()


def main(argv=None):
    args = parse_args(argv)
    job = Job(args)
    print(f"train_dflash: {args.layers} layers, {args.heads}/{args.kv_heads} heads x {args.head_dim}, {args.anchors} "
          f"anchors x {args.block_size}, context {args.context} ({args.documents} documents), Q {job.q_len}, "
          f"KV {job.kv_len}, {args.dtype}, {args.attention} on {job.device}", file=sys.stderr)
    times = []
    for step in range(args.steps):
        start = time.perf_counter()
        loss = job.step(step)
        times.append(time.perf_counter() - start)
        print(f"step {step}: loss {loss:.4f}, {times[-1] * 1e3:.1f} ms", file=sys.stderr)
    if args.report_speed:
        measured = times[1:] or times
        print(json.dumps({"steps": len(measured), "steps_per_s": len(measured) / math.fsum(measured)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
