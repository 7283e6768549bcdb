"""harness.attention (torch.ops.harness.fused_attention) on the CPU: forward and the three
gradients against a float64 reference and against PyTorch's own flex_attention (eager), on every
mask kind, with GQA and odd lengths; torch.compile without graph breaks; opcheck; bad input."""

import gc
import math

import pytest
import torch

import harness

pytestmark = pytest.mark.usefixtures("ops")


def dflash(context_rule="before_anchor", in_block="bidirectional"):
    doc_id = torch.tensor([0] * 13 + [1] * 9 + [2] * 19)  # context 41, three documents
    return harness.DFlashMask(torch.tensor([3, 14, 30, 13, 25]), doc_id, context=41, block_size=5,
                              context_rule=context_rule, in_block=in_block)


# (mask factory, q_len, kv_len): odd lengths that are no multiple of any tile.
CASES = {
    "dflash": (dflash, None, None),
    "dflash_through_anchor_causal": (lambda: dflash("through_anchor", "causal"), None, None),
    "causal": (harness.CausalMask, 37, 53),
    "causal_q_longer_than_kv": (harness.CausalMask, 45, 30),  # the first 15 queries see nothing
    "document_causal": (lambda: harness.DocumentCausalMask(torch.tensor([0] * 20 + [1] * 17 + [2] * 16)), 37, 53),
    "sliding_window": (lambda: harness.SlidingWindowMask(9), 37, 53),
    "full": (harness.FullMask, 29, 71),
}
HEADS = [(4, 2), (3, 1), (2, 2)]  # (heads, kv_heads): GQA groups of 2 and 3, and plain MHA


def make_inputs(mask, q_len, kv_len, heads, kv_heads, dtype=torch.float32, batch=2, head_dim=16, seed=0):
    if q_len is None:
        q_len, kv_len = mask.q_len, mask.kv_len
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, head_dim, generator=generator, dtype=dtype)
    k = torch.randn(batch, kv_heads, kv_len, head_dim, generator=generator, dtype=dtype)
    v = torch.randn(batch, kv_heads, kv_len, head_dim, generator=generator, dtype=dtype)
    grad_out = torch.randn(batch, heads, q_len, head_dim, generator=generator, dtype=dtype)
    return [t.requires_grad_() for t in (q, k, v)], grad_out


def reference(q, k, v, mask, scale=None):
    """Dense attention in q's dtype (float64 for the reference), GQA by repeating kv heads."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale
    visible = mask.dense(q.shape[2], k.shape[2])
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    probabilities = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num(0.0)  # rows that see nothing: 0
    return probabilities @ v, lse


def flex_eager(q, k, v, mask, scale=None):
    """PyTorch's flex_attention, eager (its dense math path), with gradients on the CPU.

    torch 2.11's flex_attention() refuses requires_grad inputs on the CPU, so this calls the same
    higher-order op it calls, under the "eager" backend (no code generation)."""
    from torch._higher_order_ops.flex_attention import flex_attention as flex_hop
    from torch.nn.attention.flex_attention import _apply_kernel_options, _identity

    block_mask = mask.flex_block_mask(q.shape[2], k.shape[2])
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale

    def call(q, k, v):
        options = _apply_kernel_options(q, k, v, True, None, None)
        return flex_hop(q, k, v, _identity, block_mask.as_tuple(), scale, options)

    out, lse, _ = torch.compile(call, backend="eager", fullgraph=True)(q, k, v)
    return out, lse * math.log(2.0)  # the op's LSE is base 2; flex_attention() returns it in base e


def grads(out, inputs, grad_out):
    return torch.autograd.grad(out, inputs, grad_out)


def max_err(a, b):
    finite = torch.isfinite(b)
    assert torch.equal(torch.isfinite(a), finite), "non-finite entries differ"
    return (a[finite].double() - b[finite].double()).abs().max().item() if finite.any() else 0.0


@pytest.mark.parametrize("heads, kv_heads", HEADS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_and_gradients_match_float64_reference(case, heads, kv_heads):
    make_mask, q_len, kv_len = CASES[case]
    mask = make_mask()
    (q, k, v), grad_out = make_inputs(mask, q_len, kv_len, heads, kv_heads)
    out, lse = harness.attention(q, k, v, mask, return_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32

    q64, k64, v64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref_out, ref_lse = reference(q64, k64, v64, mask)
    # PyTorch's own fp32 path: how far fp32 arithmetic alone lands from the float64 truth.
    fp32_out, fp32_lse = reference(q, k, v, mask)
    atol = 1e-5
    assert max_err(out, ref_out) <= 2 * max_err(fp32_out, ref_out) + atol
    assert max_err(lse, ref_lse) <= 2 * max_err(fp32_lse, ref_lse) + atol
    ours = grads(out, (q, k, v), grad_out)
    truth = grads(ref_out, (q64, k64, v64), grad_out.double())
    fp32 = grads(fp32_out, (q, k, v), grad_out)
    for name, mine, exact, torch_fp32 in zip(("dq", "dk", "dv"), ours, truth, fp32):
        assert mine.shape == exact.shape, name
        assert max_err(mine, exact) <= 2 * max_err(torch_fp32, exact) + atol, name


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_pytorch_flex_attention_eager(case):
    make_mask, q_len, kv_len = CASES[case]
    mask = make_mask()
    (q, k, v), grad_out = make_inputs(mask, q_len, kv_len, 4, 2, seed=1)
    out, lse = harness.attention(q, k, v, mask, return_lse=True)
    flex_out, flex_lse = flex_eager(q, k, v, mask)
    assert max_err(out, flex_out) < 2e-5
    assert max_err(lse, flex_lse) < 2e-5
    for name, mine, theirs in zip(("dq", "dk", "dv"), grads(out, (q, k, v), grad_out), grads(flex_out, (q, k, v), grad_out)):
        assert max_err(mine, theirs) < 5e-5, name


def test_rows_that_see_nothing_give_zero_and_minus_infinity():
    mask = harness.CausalMask()
    (q, k, v), _ = make_inputs(mask, 12, 8, 2, 1)
    out, lse = harness.attention(q, k, v, mask, return_lse=True)
    assert torch.equal(out[:, :, :4], torch.zeros_like(out[:, :, :4]))
    assert torch.isneginf(lse[:, :, :4]).all() and torch.isfinite(lse[:, :, 4:]).all()


def test_flex_call_shapes_return_lse_and_return_aux():
    from torch.nn.attention.flex_attention import AuxRequest

    mask = dflash()
    (q, k, v), _ = make_inputs(mask, None, None, 4, 2)
    plain = harness.attention(q, k, v, mask, enable_gqa=True)
    out, aux = harness.attention(q, k, v, mask, return_aux=AuxRequest(lse=True))
    _, lse = harness.attention(q, k, v, mask, return_lse=True)
    assert torch.equal(plain, out) and torch.equal(aux.lse, lse) and aux.max_scores is None
    with pytest.raises(NotImplementedError, match="max_scores"):
        harness.attention(q, k, v, mask, return_aux=AuxRequest(max_scores=True))


def test_scale_and_non_contiguous_inputs():
    mask = harness.SlidingWindowMask(5)
    (q, k, v), grad_out = make_inputs(mask, 21, 33, 2, 2)
    # [B, L, H, D] storage viewed as [B, H, L, D], as a model's projection produces it.
    qt, kt, vt = [t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for t in (q, k, v)]
    assert not qt.is_contiguous()
    out = harness.attention(qt, kt, vt, mask, scale=0.3)
    ref_out, _ = reference(q.double(), k.double(), v.double(), mask, scale=0.3)
    assert max_err(out, ref_out) < 1e-5
    ours = grads(out, (qt, kt, vt), grad_out)
    truth = grads(ref_out, (q, k, v), grad_out.double())
    for mine, exact in zip(ours, truth):
        assert max_err(mine, exact) < 1e-4


def test_masks_are_resolved_once_and_released_with_the_mask(ops):
    gc.collect()  # masks of earlier tests that are garbage already
    before = ops.mask_cache_size()
    mask = dflash()
    (q, k, v), grad_out = make_inputs(mask, None, None, 2, 1)
    for _ in range(3):
        harness.attention(q, k, v, mask).backward(grad_out)
    assert ops.mask_cache_size() == before + 1
    causal = harness.CausalMask()  # shape-agnostic kinds: one entry per (Q_LEN, KV_LEN)
    for q_len, kv_len in ((8, 8), (8, 16), (8, 16)):
        (q, k, v), _ = make_inputs(causal, q_len, kv_len, 2, 1)
        harness.attention(q, k, v, causal)
    assert ops.mask_cache_size() == before + 3
    del mask, causal
    gc.collect()
    assert ops.mask_cache_size() == before


class TinyDrafterLayer(torch.nn.Module):
    """Projections around harness.attention, with GQA: what a DFlash drafter layer does."""

    def __init__(self, mask, dim=32, heads=4, kv_heads=2):
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


def layer_and_inputs():
    torch.manual_seed(0)
    mask = dflash()
    layer = TinyDrafterLayer(mask)
    draft = torch.randn(2, mask.q_len, 32)
    context_and_draft = torch.randn(2, mask.kv_len, 32)
    return layer, draft, context_and_draft


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph_matches_eager(backend):
    layer, draft, context_and_draft = layer_and_inputs()
    eager_out = layer(draft, context_and_draft)
    eager_out.square().sum().backward()
    eager_grads = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend=backend, fullgraph=True)
    out = compiled(draft, context_and_draft)
    out.square().sum().backward()
    assert torch.allclose(out, eager_out, atol=1e-5, rtol=1e-5)
    for mine, theirs in zip((p.grad for p in layer.parameters()), eager_grads):
        assert torch.allclose(mine, theirs, atol=1e-4, rtol=1e-4)


def test_dynamo_explain_finds_no_graph_break():
    layer, draft, context_and_draft = layer_and_inputs()
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(layer)(draft, context_and_draft)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("case", ["dflash", "causal", "document_causal"])
def test_opcheck(case, transposed):
    make_mask, q_len, kv_len = CASES[case]
    mask = make_mask()
    (q, k, v), _ = make_inputs(mask, q_len, kv_len, 4, 2, batch=1)
    if transposed:  # [B, L, H, D] storage, as projections produce it
        q, k, v = [t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for t in (q, k, v)]
    kind, params, anchors, doc_id, bits = mask.op_inputs(q.device)
    args = (q, k, v, kind, params, anchors, doc_id, bits, mask.uid, 0.25)
    torch.library.opcheck(torch.ops.harness.fused_attention.default, args)


# --- bad input: a Python exception naming the argument, never a crash ---------------------------
def test_bad_input_names_the_argument():
    mask = dflash()
    (q, k, v), _ = make_inputs(mask, None, None, 4, 2)
    q, k, v = q.detach(), k.detach(), v.detach()
    with pytest.raises(TypeError, match=r"q, k and v must share one dtype \(got q torch.float32, k torch.float64"):
        harness.attention(q, k.double(), v, mask)
    with pytest.raises(TypeError, match="q must be a floating-point tensor"):
        harness.attention(q.long(), k, v, mask)
    with pytest.raises(ValueError, match="k and v must have one batch, kv_heads and KV_LEN"):
        harness.attention(q, k, v[:, :, :-1], mask)
    with pytest.raises(ValueError, match=r"heads of q \(3\) must be a multiple of the kv heads of k and v \(2\)"):
        harness.attention(q[:, :3], k, v, mask)
    with pytest.raises(ValueError, match="q must be 4-D"):
        harness.attention(q[0], k, v, mask)
    with pytest.raises(ValueError, match="q and k must have one batch size"):
        harness.attention(q[:1], k, v, mask)
    with pytest.raises(ValueError, match="q and k must have one head_dim"):
        harness.attention(q, k[..., :8], v[..., :8], mask)
    with pytest.raises(ValueError, match="Q_LEN 24 but the mask has 5 anchors"):
        harness.attention(q[:, :, :24], k, v, mask)
    with pytest.raises(ValueError, match="KV_LEN 60 but the mask needs context 41"):
        harness.attention(q, k[:, :, :60], v[:, :, :60], mask)
    with pytest.raises(TypeError, match="mask must be a harness mask"):
        harness.attention(q, k, v, mask.dense(mask.q_len, mask.kv_len))
    with pytest.raises(ValueError, match="scale must be a positive finite number"):
        harness.attention(q, k, v, mask, scale=float("nan"))
    with pytest.raises(ValueError, match="anchors must lie in the context"):
        harness.DFlashMask(torch.tensor([3, 41]), context=41, block_size=5)


def test_the_op_checks_its_inputs_itself():
    # A direct torch.ops call past the Python checks: a RuntimeError, not a read out of bounds.
    mask = dflash()
    (q, k, v), _ = make_inputs(mask, None, None, 4, 2)
    kind, params, _, doc_id, bits = mask.op_inputs(q.device)
    outside = torch.tensor([3, 14, 30, 13, 99], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="anchor 99 lies outside the context"):
        torch.ops.harness.fused_attention(q, k, v, kind, params, outside, doc_id, bits, -7, 0.25)
    with pytest.raises(RuntimeError, match="must be a multiple of the kv heads"):
        torch.ops.harness.fused_attention(q[:, :3], k, v, kind, params, torch.tensor([3, 14, 30, 13, 25], dtype=torch.int32), doc_id, bits, -8, 0.25)
