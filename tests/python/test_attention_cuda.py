"""harness.attention on the GPU (marked cuda; runs on the H200 through dev/gpu/gpu_check_python.sh):
against torch.compile(flex_attention) in the same process at the real DFlash dims and at others,
on BlockMasks of masks no named kind expresses, a training step under torch.compile and CUDA
graphs, bad CUDA input."""

import math

import pytest
import torch

import harness

pytestmark = [pytest.mark.cuda, pytest.mark.usefixtures("ops")]

REAL = dict(batch=1, heads=32, kv_heads=8, head_dim=128, anchors=128, block_size=16, context=8192, documents=4)


def dflash_mask(anchors, block_size, context, documents, seed=0, **kwargs):
    """Anchors drawn like the spec's (without replacement, a whole draft block after each, one
    earlier token in its document), documents of equal length."""
    generator = torch.Generator().manual_seed(seed)
    doc_length = context // documents
    doc_id = torch.arange(context) // doc_length
    doc_id[doc_id >= documents] = documents - 1
    starts = torch.tensor([d * doc_length for d in range(documents)])
    ends = torch.cat([starts[1:], torch.tensor([context])])
    valid = torch.cat([torch.arange(s + 1, e - block_size + 1) for s, e in zip(starts.tolist(), ends.tolist())])
    picked = valid[torch.randperm(valid.numel(), generator=generator)[:anchors]].sort().values
    return harness.DFlashMask(picked, doc_id, context=context, block_size=block_size, **kwargs)


def inputs(mask, batch, heads, kv_heads, head_dim, q_len=None, kv_len=None, seed=0):
    q_len = q_len or mask.q_len
    kv_len = kv_len or mask.kv_len
    generator = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=generator).requires_grad_()

    return randn(batch, heads, q_len, head_dim), randn(batch, kv_heads, kv_len, head_dim), \
        randn(batch, kv_heads, kv_len, head_dim)


_compiled_flex = None


def flex(q, k, v, block_mask):
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention

    global _compiled_flex
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    out, aux = _compiled_flex(q, k, v, block_mask=block_mask, enable_gqa=True, return_aux=AuxRequest(lse=True))
    return out, aux.lse


def reference_fp32(q, k, v, mask):
    group = q.shape[1] // k.shape[1]
    qf, kf, vf = q.float(), k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    scores = (qf @ kf.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask.dense(q.shape[2], k.shape[2], device=q.device), float("-inf"))
    return torch.softmax(scores, -1).nan_to_num(0.0) @ vf


CASES = {
    "dflash_real": lambda: (dflash_mask(REAL["anchors"], REAL["block_size"], REAL["context"], REAL["documents"]),
                            dict(batch=1, heads=32, kv_heads=8, head_dim=128)),
    "dflash_through_causal_d64": lambda: (dflash_mask(37, 16, 1000, 3, context_rule="through_anchor", in_block="causal"),
                                          dict(batch=2, heads=8, kv_heads=2, head_dim=64)),
    "causal_odd": lambda: (harness.CausalMask(), dict(batch=2, heads=4, kv_heads=1, head_dim=128, q_len=333, kv_len=1111)),
    "sliding_window": lambda: (harness.SlidingWindowMask(256), dict(batch=1, heads=8, kv_heads=8, head_dim=64,
                                                                    q_len=1024, kv_len=2048)),
    "document_causal": lambda: (harness.DocumentCausalMask(torch.arange(1500) // 400),
                                dict(batch=1, heads=4, kv_heads=2, head_dim=128, q_len=700, kv_len=1500)),
    "full": lambda: (harness.FullMask(), dict(batch=1, heads=4, kv_heads=4, head_dim=64, q_len=257, kv_len=513)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_compiled_flex_attention(case, cuda_device):
    mask, dims = CASES[case]()
    mask.to(cuda_device)
    q, k, v = inputs(mask, **dims)
    out, lse = harness.attention(q, k, v, mask, return_lse=True)
    flex_out, flex_lse = flex(q, k, v, mask.flex_block_mask(q.shape[2], k.shape[2], device=cuda_device))
    exact = reference_fp32(q, k, v, mask)
    # bf16 tolerance relative to flex's own error against the fp32 reference (docs/STYLE.md rule 6).
    ours_err = (out.float() - exact).abs().max().item()
    flex_err = (flex_out.float() - exact).abs().max().item()
    assert ours_err <= 2 * flex_err + 1e-3, (ours_err, flex_err)
    finite = torch.isfinite(flex_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse[finite] - flex_lse[finite]).abs().max().item() < 2e-2
    grad_out = torch.randn_like(out)
    ours = torch.autograd.grad(out, (q, k, v), grad_out)
    theirs = torch.autograd.grad(flex_out, (q, k, v), grad_out)
    truth = torch.autograd.grad(exact, (q, k, v), grad_out.float()) if q.shape[2] * k.shape[2] <= 2**24 else None
    for name, mine, flex_grad in zip(("dq", "dk", "dv"), ours, theirs):
        if truth is not None:
            exact_grad = truth[("dq", "dk", "dv").index(name)].float()
            mine_err = (mine.float() - exact_grad).abs().max().item()
            flex_grad_err = (flex_grad.float() - exact_grad).abs().max().item()
            assert mine_err <= 2 * flex_grad_err + 1e-3, (name, mine_err, flex_grad_err)
        else:  # real dims: the fp32 reference would need 8.6 GB of scores per direction; compare to flex
            scale = flex_grad.float().abs().max().item()
            assert (mine.float() - flex_grad.float()).abs().max().item() <= 2e-2 * scale + 1e-3, name


def prefix_lm(b, h, q_idx, kv_idx):
    return (kv_idx < 700) | (kv_idx <= q_idx + 1000)


def tree(b, h, q_idx, kv_idx):  # a context of 1000, then a draft tree: root and 4 branches
    node = kv_idx - 1000
    same_branch = ((node - 1) % 4 == (q_idx - 1) % 4) & (node < q_idx) & (q_idx > 0) & (node > 0)
    return (node < 0) | (node == q_idx) | (node == 0) | same_branch


def dilated_window(b, h, q_idx, kv_idx):
    back = q_idx + 1000 - kv_idx
    return (back >= 0) & (back < 128 * 3) & (back % 3 == 0)


def per_batch_documents(b, h, q_idx, kv_idx):
    length = 300 + 211 * b
    return (kv_idx <= q_idx + 1000) & (kv_idx // length == (q_idx + 1000) // length)


@pytest.mark.parametrize("name,batch", [("prefix_lm", None), ("tree", None), ("dilated_window", None),
                                        ("per_batch_documents", 2)])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_a_block_mask_matches_compiled_flex_attention(name, batch, head_dim, cuda_device):
    from torch.nn.attention.flex_attention import create_block_mask

    q_len, kv_len = 1000, 2000
    block_mask = create_block_mask(globals()[name], batch, None, q_len, kv_len, device=cuda_device)
    mask = harness.FlexMask.from_block_mask(block_mask)
    q, k, v = inputs(mask, batch=2, heads=8, kv_heads=2, head_dim=head_dim, seed=head_dim)
    out = harness.attention(q, k, v, block_mask)
    flex_out, _ = flex(q, k, v, block_mask)
    group = q.shape[1] // k.shape[1]
    visible = mask.dense(q_len, kv_len, device=cuda_device)
    scores = (q.float() @ k.float().repeat_interleave(group, 1).transpose(-1, -2)) / math.sqrt(head_dim)
    exact = torch.softmax(scores.masked_fill(~visible, float("-inf")), -1).nan_to_num(0.0) @ \
        v.float().repeat_interleave(group, 1)
    ours_err = (out.float() - exact).abs().max().item()
    flex_err = (flex_out.float() - exact).abs().max().item()
    assert ours_err <= 2 * flex_err + 1e-3, (ours_err, flex_err)
    grad_out = torch.randn_like(out)
    truth = torch.autograd.grad(exact, (q, k, v), grad_out.float())
    for label, mine, theirs, exact_grad in zip(("dq", "dk", "dv"), torch.autograd.grad(out, (q, k, v), grad_out),
                                               torch.autograd.grad(flex_out, (q, k, v), grad_out), truth):
        mine_err = (mine.float() - exact_grad).abs().max().item()
        flex_grad_err = (theirs.float() - exact_grad).abs().max().item()
        assert mine_err <= 2 * flex_grad_err + 1e-3, (label, mine_err, flex_grad_err)


class DrafterLayer(torch.nn.Module):
    def __init__(self, mask, dim, heads, kv_heads):
        super().__init__()
        self.mask, self.heads, self.kv_heads, self.head_dim = mask, heads, kv_heads, dim // heads
        self.q_proj = torch.nn.Linear(dim, dim, bias=False)
        self.kv_proj = torch.nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.o_proj = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, draft, context_and_draft):
        batch, q_len, _ = draft.shape
        kv_len = context_and_draft.shape[1]
        q = self.q_proj(draft).view(batch, q_len, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv_proj(context_and_draft).view(batch, kv_len, 2, self.kv_heads, self.head_dim).unbind(2)
        out = harness.attention(q, k.transpose(1, 2), v.transpose(1, 2), self.mask)
        return self.o_proj(out.transpose(1, 2).reshape(batch, q_len, -1))


def test_training_step_under_compile_and_cuda_graphs(cuda_device):
    torch.manual_seed(0)
    mask = dflash_mask(64, 16, 2048, 2).to(cuda_device)
    layer = DrafterLayer(mask, dim=1024, heads=8, kv_heads=2).to(cuda_device, torch.bfloat16)
    draft = torch.randn(1, mask.q_len, 1024, device=cuda_device, dtype=torch.bfloat16)
    context = torch.randn(1, mask.kv_len, 1024, device=cuda_device, dtype=torch.bfloat16)
    target = torch.randn_like(draft)

    def loss_of(model):
        return (model(draft, context).float() - target.float()).square().mean()

    eager_loss = loss_of(layer)
    eager_loss.backward()
    eager_grads = [p.grad.float().clone() for p in layer.parameters()]
    layer.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    # reduce-overhead: inductor's CUDA graphs (cudagraph trees) around forward and backward.
    compiled = torch.compile(layer, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):  # warm-up, record, replay
        layer.zero_grad(set_to_none=True)
        loss = loss_of(compiled)
        loss.backward()
    torch.cuda.synchronize()
    assert abs(loss.item() - eager_loss.item()) <= 1e-2 * abs(eager_loss.item())
    for mine, theirs in zip((p.grad.float() for p in layer.parameters()), eager_grads):
        assert (mine - theirs).abs().max().item() <= 2e-2 * theirs.abs().max().item() + 1e-3
    # The graphs were recorded and replayed, not skipped (a skip is logged in these counters).
    from torch._dynamo.utils import counters

    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])


def test_bad_cuda_input_names_the_argument(cuda_device):
    mask = dflash_mask(4, 16, 256, 1)
    q, k, v = inputs(mask, batch=1, heads=4, kv_heads=2, head_dim=64)
    # What the kernels have no kernel for: NotImplementedError from their boundary, naming what they take.
    with pytest.raises(NotImplementedError, match=r"dtypes q Float, k Float, v Float have no kernel \(q, k and v all bf16 or all fp16 do\)"):
        harness.attention(q.float(), k.float(), v.float(), mask)
    # Head dims run padded up to the next instantiation (64, 128, 192, 256; 192/128): 20 is no
    # multiple of 8, and 64/192 is no pair of them.
    with pytest.raises(NotImplementedError, match=r"head dims 20/20 \(q.k/v\) bf16 have no kernel"):
        harness.attention(q[..., :20], k[..., :20], v[..., :20], mask)
    wide_v = torch.randn(*v.shape[:-1], 192, device=v.device, dtype=v.dtype)
    with pytest.raises(NotImplementedError, match=r"head dims 64/192 \(q.k/v\) bf16 have no kernel"):
        harness.attention(q, k, wide_v, mask)
    with pytest.raises(ValueError, match="q, k and v must be on one device"):
        harness.attention(q, k.cpu(), v, mask)
