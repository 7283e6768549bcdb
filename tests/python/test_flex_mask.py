"""harness.attention for any BlockMask (harness.FlexMask), at every head dim and dtype on the CPU.

Masks no named kind expresses, built from mask_mods (prefix-LM, a speculative-decoding tree of 4
branches, a dilated sliding window, masks that use b or h), checked against the dense mask and
against flex_attention's own output (eager on the CPU); a BlockMask whose mask_mod disagrees with
its lists; head dims 64 to 256 and 192/128 in fp32, bf16 and fp16 against an fp64 reference with
the rule err <= 2 * err(low-precision reference) + atol; fp16 inputs whose logits overflow fp16;
a flipped bit, planted, caught by the same comparison."""

import json
import math
import subprocess

import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, create_mask, flex_attention

import harness
from harness.flex_mask import pack_bits, unpack_bits

Q_LEN, KV_LEN = 200, 456  # neither a multiple of 128 nor of 32
OFFSET = KV_LEN - Q_LEN   # queries are the last Q_LEN positions (bottom-right), as the named kinds


def prefix_lm(b, h, q_idx, kv_idx):
    return (kv_idx < 300) | (kv_idx <= q_idx + OFFSET)


def tree(b, h, q_idx, kv_idx):
    # A context seen by every draft node, then the tree: node 0 the root, node n > 0 in branch
    # (n - 1) % 4; a node sees the root, the earlier nodes of its branch and itself.
    node = kv_idx - OFFSET
    in_tree = node >= 0
    same_branch = ((node - 1) % 4 == (q_idx - 1) % 4) & (node < q_idx) & (q_idx > 0)
    return ~in_tree | (node == q_idx) | (node == 0) | same_branch


def dilated_window(b, h, q_idx, kv_idx):
    back = q_idx + OFFSET - kv_idx
    return (back >= 0) & (back < 48 * 3) & (back % 3 == 0)


def per_batch_documents(b, h, q_idx, kv_idx):
    # Each batch element packs its own documents: lengths 100 + 57 b.
    length = 100 + 57 * b
    return (kv_idx <= q_idx + OFFSET) & ((kv_idx // length) == ((q_idx + OFFSET) // length))


def per_head_window(b, h, q_idx, kv_idx):
    back = q_idx + OFFSET - kv_idx
    return (back >= 0) & (back < 30 + 40 * h)


MASK_MODS = {"prefix_lm": (prefix_lm, None, None), "tree": (tree, None, None),
             "dilated_window": (dilated_window, None, None), "per_batch_documents": (per_batch_documents, 2, None),
             "per_head_window": (per_head_window, None, 4)}


def inputs(dtype=torch.float32, batch=2, heads=4, kv_heads=2, head_dim=32, v_head_dim=None, seed=0, scale=1.0):
    generator = torch.Generator().manual_seed(seed)
    draw = lambda *shape: torch.randn(*shape, generator=generator)  # noqa: E731
    v_head_dim = v_head_dim or head_dim
    return ((draw(batch, heads, Q_LEN, head_dim) * scale).to(dtype), (draw(batch, kv_heads, KV_LEN, head_dim) * scale).to(dtype),
            draw(batch, kv_heads, KV_LEN, v_head_dim).to(dtype), draw(batch, heads, Q_LEN, v_head_dim).to(dtype))


def fwd_bwd(fn, q, k, v, grad_out):
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    out.backward(grad_out)
    return [out.detach()] + [t.grad for t in leaves]


@pytest.mark.parametrize("name", sorted(MASK_MODS))
def test_a_flexmask_has_the_bits_of_its_mask_mod(name):
    mask_mod, batch, heads = MASK_MODS[name]
    dense = create_mask(mask_mod, batch or 1, heads or 1, Q_LEN, KV_LEN, device="cpu")
    for mask in (harness.FlexMask(mask_mod, batch, heads, Q_LEN, KV_LEN, device="cpu"),
                 harness.FlexMask.from_block_mask(create_block_mask(mask_mod, batch, heads, Q_LEN, KV_LEN, device="cpu"))):
        expected = dense if mask.slices != (1, 1) else dense[0, 0]
        assert torch.equal(mask.dense(Q_LEN, KV_LEN), expected)
        assert mask.slices == (batch or 1, heads or 1)  # a pattern that is the same along an axis is kept once


@pytest.mark.parametrize("name", sorted(MASK_MODS))
def test_attention_with_a_block_mask_matches_flex_attention(ops, name):
    mask_mod, batch, heads = MASK_MODS[name]
    block_mask = create_block_mask(mask_mod, batch, heads, Q_LEN, KV_LEN, device="cpu", BLOCK_SIZE=(64, 32))
    q, k, v, grad_out = inputs(seed=len(name))
    ours = fwd_bwd(lambda a, b, c: harness.attention(a, b, c, block_mask), q, k, v, grad_out)
    # flex_attention has no backward on the CPU: its forward, and the gradients of the dense
    # reference on create_mask's mask (fp64).
    flex_out = flex_attention(q, k, v, block_mask=block_mask, enable_gqa=True)
    torch.testing.assert_close(ours[0], flex_out, atol=2e-5, rtol=1e-4, msg=lambda m: f"{name} out: {m}")
    visible = create_mask(mask_mod, batch or 1, heads or 1, Q_LEN, KV_LEN, device="cpu")
    exact = reference(q, k, v, grad_out, visible, torch.float64, 1 / math.sqrt(q.shape[-1]))
    for label, got, expected in zip(("dq", "dk", "dv"), ours[1:], exact[2:]):
        torch.testing.assert_close(got.double(), expected, atol=2e-5, rtol=1e-4, msg=lambda m: f"{name} {label}: {m}")
    # The conversion is cached with the BlockMask.
    assert harness.flex_mask.flex_mask_of(block_mask) is harness.flex_mask.flex_mask_of(block_mask)


def test_lse_matches_flex_attention(ops):
    block_mask = create_block_mask(tree, None, None, Q_LEN, KV_LEN, device="cpu")
    q, k, v, _ = inputs(seed=3)
    _, lse = harness.attention(q, k, v, block_mask, return_lse=True)
    _, flex_lse = flex_attention(q, k, v, block_mask=block_mask, enable_gqa=True, return_lse=True)
    torch.testing.assert_close(lse, flex_lse, atol=1e-5, rtol=1e-5)


def inconsistent_block_mask():
    """The lists of prefix_lm, with a mask_mod that also hides key 5 (inside full blocks)."""
    good = create_block_mask(prefix_lm, None, None, Q_LEN, KV_LEN, device="cpu")
    hides_5 = lambda b, h, q_idx, kv_idx: prefix_lm(b, h, q_idx, kv_idx) & (kv_idx != 5)  # noqa: E731
    return BlockMask.from_kv_blocks(good.kv_num_blocks, good.kv_indices, good.full_kv_num_blocks, good.full_kv_indices,
                                    BLOCK_SIZE=good.BLOCK_SIZE, mask_mod=hides_5, seq_lengths=(Q_LEN, KV_LEN))


def test_a_block_mask_whose_mask_mod_disagrees_with_its_lists_is_rejected_or_taken_as_asked(ops):
    bad = inconsistent_block_mask()
    q, k, v, _ = inputs(seed=4)
    with pytest.raises(ValueError, match=r"mask_mod disagrees with its block lists: block \(q 0, kv 0\).* is full, but "
                                         r"the mask_mod hides key 5"):
        harness.attention(q, k, v, bad)
    # mismatch="mask_mod": eager flex_attention's answer (the mask_mod everywhere).
    eager = flex_attention(q, k, v, block_mask=bad, enable_gqa=True)
    torch.testing.assert_close(harness.attention(q, k, v, harness.FlexMask.from_block_mask(bad, "mask_mod")), eager,
                               atol=2e-5, rtol=1e-4)
    # mismatch="blocks": compiled flex_attention's. Full blocks skip the mask_mod: key 5 stays visible
    # to q block 0, whose kv block 0 is full; q block 1 (rows 128..199, ragged: Q_LEN 200) has kv
    # block 0 as a partial block, where the mask_mod hides key 5.
    blocks = harness.FlexMask.from_block_mask(bad, "blocks")
    assert int(bad.full_kv_indices[0, 0, 0, 0]) == 0 and int(bad.full_kv_num_blocks[0, 0, 1]) == 0
    dense = blocks.dense(Q_LEN, KV_LEN)
    assert bool(dense[:128, 5].all()) and not bool(dense[128:, 5].any())
    as_compiled = lambda b, h, q_idx, kv_idx: prefix_lm(b, h, q_idx, kv_idx) & ~((kv_idx == 5) & (q_idx >= 128))  # noqa: E731
    expected = flex_attention(q, k, v, block_mask=create_block_mask(as_compiled, None, None, Q_LEN, KV_LEN, device="cpu"),
                              enable_gqa=True)
    torch.testing.assert_close(harness.attention(q, k, v, blocks), expected, atol=2e-5, rtol=1e-4)


def test_a_block_sparse_block_mask_without_mask_mod_is_its_lists(ops):
    good = create_block_mask(prefix_lm, None, None, Q_LEN, KV_LEN, device="cpu", BLOCK_SIZE=32)
    sparse = BlockMask.from_kv_blocks(good.kv_num_blocks, good.kv_indices, BLOCK_SIZE=32, seq_lengths=(Q_LEN, KV_LEN))
    dense = harness.FlexMask.from_block_mask(sparse).dense(Q_LEN, KV_LEN)
    q_block, kv_block = torch.arange(Q_LEN) // 32, torch.arange(KV_LEN) // 32
    listed = sparse.to_dense()[0, 0].bool()
    assert torch.equal(dense, listed[q_block][:, kv_block])


def reference(q, k, v, grad_out, visible, dtype, scale):
    """out, lse, dq, dk, dv in `dtype` arithmetic: fp64, or the low-precision inputs with fp32 math
    and outputs rounded to their dtype (the flash-style low-precision reference)."""
    work = torch.float64 if dtype == torch.float64 else torch.float32
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    group = q.shape[1] // k.shape[1]
    qw, kw, vw = (t.to(work) for t in leaves)
    scores = (qw @ kw.repeat_interleave(group, 1).transpose(-1, -2)) * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    p = torch.softmax(scores, -1).nan_to_num(0.0)
    out = (p @ vw.repeat_interleave(group, 1)).to(dtype)
    out.backward(grad_out.to(dtype))
    return [out.detach(), lse.detach()] + [t.grad for t in leaves]


def check_rule(got, low, ref, where):
    for label, a, b, r in zip(("out", "lse", "dq", "dk", "dv"), got, low, ref):
        err = (a.double() - r).abs().max().item()
        err_low = (b.double() - r).abs().max().item()
        atol = 1e-5 * max(1.0, r.abs().max().item())
        assert math.isfinite(err), f"{where} {label}: not finite"
        assert err <= 2 * err_low + atol, f"{where} {label}: err {err:.3g} > 2 x {err_low:.3g} + {atol:.3g}"


def ours(q, k, v, grad_out, mask, scale):
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out, lse = harness.attention(*leaves, mask, scale=scale, return_lse=True)
    out.backward(grad_out)
    return [out.detach(), lse] + [t.grad for t in leaves]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("head_dim,v_head_dim", [(64, 64), (96, 96), (128, 128), (192, 192), (256, 256), (192, 128)])
def test_every_head_dim_and_dtype_meets_the_rule_against_fp64(ops, head_dim, v_head_dim, dtype):
    mask = harness.FlexMask(dilated_window, None, None, Q_LEN, KV_LEN, device="cpu")
    visible = mask.dense(Q_LEN, KV_LEN)
    q, k, v, grad_out = inputs(dtype, batch=1, head_dim=head_dim, v_head_dim=v_head_dim, seed=head_dim + v_head_dim)
    scale = 1 / math.sqrt(head_dim)
    got = ours(q, k, v, grad_out, mask, scale)
    assert got[0].dtype == dtype and got[0].shape[-1] == v_head_dim and got[4].shape[-1] == v_head_dim
    check_rule(got, reference(q, k, v, grad_out, visible, dtype, scale),
               reference(q, k, v, grad_out, visible, torch.float64, scale), f"D {head_dim}/{v_head_dim} {dtype}")


def test_fp16_logits_past_65504_stay_finite(ops):
    # Every element of q and k about 30: q.k reaches ~115000 (fp16 overflows), the scaled logits
    # ~1e4 differ by ~16 along a row, so the softmax is spread (not one-hot, where the dense
    # reference's backward would be trivially exact).
    q, k, v, grad_out = inputs(torch.float16, batch=1, head_dim=128, seed=5, scale=0.1)
    q, k = (q.float() + 30).half(), (k.float() + 30).half()
    scale = 1 / math.sqrt(128)
    assert not torch.isfinite((q @ k.repeat_interleave(2, 1).transpose(-1, -2)) * scale).all()  # fp16 scores overflow
    mask = harness.FlexMask(prefix_lm, None, None, Q_LEN, KV_LEN, device="cpu")
    visible = mask.dense(Q_LEN, KV_LEN)
    got = ours(q, k, v, grad_out, mask, scale)
    assert all(torch.isfinite(t).all() for t in got)
    exact = reference(q, k, v, grad_out, visible, torch.float64, scale)
    low = reference(q, k, v, grad_out, visible, torch.float16, scale)
    # dq's yardstick is the flash backward's own: delta = rowsum(dO * O) from the output as stored
    # (fp16). Its rounding does not cancel in dq = scale * dS k when the keys share a large
    # component: every flash-style backward has that error, the dense path (its own P) has not.
    low[2] = flash_dq(q, k, v, grad_out, visible, scale, exact[0].half())
    check_rule(got, low, exact, "fp16 overflow")


def flash_dq(q, k, v, grad_out, visible, scale, stored_out):
    """dq of a flash-style backward in fp64 with delta from `stored_out` (the output in its dtype)."""
    group = q.shape[1] // k.shape[1]
    k64, v64 = (t.double().repeat_interleave(group, 1) for t in (k, v))
    scores = (q.double() @ k64.transpose(-1, -2)) * scale
    p = torch.softmax(scores.masked_fill(~visible, float("-inf")), -1).nan_to_num(0.0)
    delta = (grad_out.double() * stored_out.double()).sum(-1, keepdim=True)
    return (p * (grad_out.double() @ v64.transpose(-1, -2) - delta)) @ k64 * scale


def test_planted_a_flipped_bit_is_caught(ops):
    right = harness.FlexMask(dilated_window, None, None, Q_LEN, KV_LEN, device="cpu")
    dense = right.dense(Q_LEN, KV_LEN).clone()
    row, key = 120, 120 + OFFSET - 30  # 30 back: a multiple of 3 inside the window
    assert dense[row, key]
    dense[row, key] = False
    flipped = harness.FlexMask.from_bits(pack_bits(dense)[None, None], KV_LEN)
    q, k, v, grad_out = inputs(torch.float32, batch=1, seed=9)
    visible = right.dense(Q_LEN, KV_LEN)
    low = reference(q, k, v, grad_out, visible, torch.float32, 0.2)
    ref = reference(q, k, v, grad_out, visible, torch.float64, 0.2)
    check_rule(ours(q, k, v, grad_out, right, 0.2), low, ref, "right mask")
    with pytest.raises(AssertionError, match="out: err"):
        check_rule(ours(q, k, v, grad_out, flipped, 0.2), low, ref, "flipped bit")


def test_bits_round_trip_and_bad_bits_are_named():
    visible = torch.rand(3, 70) < 0.5
    assert torch.equal(unpack_bits(pack_bits(visible), 70), visible)
    with pytest.raises(TypeError, match="bits must be an int32 tensor"):
        harness.FlexMask.from_bits(pack_bits(visible).long(), 70)
    with pytest.raises(ValueError, match="3 words per row, KV_LEN 100 needs 4"):
        harness.FlexMask.from_bits(pack_bits(visible)[None, None], 100)
    mask = harness.FlexMask(per_batch_documents, 2, None, Q_LEN, KV_LEN, device="cpu")
    q, k, v, _ = inputs(batch=3)
    with pytest.raises(ValueError, match="2 batch patterns but the call has batch 3"):
        harness.attention(q, k, v, mask)


def test_compiled_attention_with_a_flexmask(ops):
    mask = harness.FlexMask(tree, None, None, Q_LEN, KV_LEN, device="cpu")
    q, k, v, grad_out = inputs(seed=6)
    compiled = torch.compile(lambda a, b, c: harness.attention(a, b, c, mask), fullgraph=True)
    got = fwd_bwd(compiled, q, k, v, grad_out)
    eager = fwd_bwd(lambda a, b, c: harness.attention(a, b, c, mask), q, k, v, grad_out)
    for a, b in zip(got, eager):
        torch.testing.assert_close(a, b)


def test_a_step_with_a_block_mask_replays_on_our_kernels(ops, harness_binary, tmp_path):
    block_mask = create_block_mask(per_head_window, None, 4, Q_LEN, KV_LEN, device="cpu")
    q, k, v, grad_out = inputs(batch=1, head_dim=192, v_head_dim=128, seed=8)
    step = tmp_path / "step.safetensors"
    harness.save_step(step, q, k, v, grad_out, mask=block_mask)
    from safetensors import safe_open
    with safe_open(str(step), "pt") as f:
        assert json.loads(f.metadata()["meta"])["mask"] == {"type": "blockmask"}
        assert f.get_tensor("mask.bits").shape == (1, 4, Q_LEN, (KV_LEN + 31) // 32)
    result = subprocess.run([harness_binary, "replay", "--import", str(step), "--device", "cpu", "--json",
                             "--db", str(tmp_path / "h.db")], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["verdict"] == "MATCH", report


def test_a_step_with_a_block_masks_lists_and_partial_tiles_replays(ops, harness_binary, tmp_path):
    """The lists form: the BlockMask's lists, each partial block's bits, the block size in the meta."""
    from safetensors.torch import save_file

    block_mask = create_block_mask(tree, None, None, Q_LEN, KV_LEN, device="cpu", BLOCK_SIZE=(64, 32))
    dense = torch.nn.functional.pad(create_mask(tree, 1, 1, Q_LEN, KV_LEN, device="cpu")[0, 0],
                                    (0, 15 * 32 - KV_LEN, 0, 4 * 64 - Q_LEN))
    tiles = [dense[qb * 64:(qb + 1) * 64, int(kvb) * 32:(int(kvb) + 1) * 32]
             for qb in range(4) for kvb in block_mask.kv_indices[0, 0, qb, :int(block_mask.kv_num_blocks[0, 0, qb])]]
    q, k, v, grad_out = inputs(batch=1, head_dim=64, seed=12)
    tensors = {"q": q, "k": k, "v": v, "grad_out": grad_out, "mask.partial_bits": torch.stack(tiles)}
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
        tensors[f"mask.{name}"] = getattr(block_mask, name).to(torch.int32).contiguous()
    meta = {"name": "captured", "dims": {}, "mask": {"type": "blockmask", "block_size": [64, 32]}}
    step = tmp_path / "captured.safetensors"
    save_file(tensors, str(step), metadata={"meta": json.dumps(meta)})
    result = subprocess.run([harness_binary, "replay", "--import", str(step), "--device", "cpu", "--json",
                             "--db", str(tmp_path / "h.db")], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["verdict"] == "MATCH"
    # A partial block's bits missing: the import names the mismatch and exits 2.
    del tensors["mask.partial_bits"]
    tensors["mask.partial_bits"] = torch.stack(tiles[1:])
    save_file(tensors, str(step), metadata={"meta": json.dumps(meta)})
    bad = subprocess.run([harness_binary, "replay", "--import", str(step), "--device", "cpu", "--db", str(tmp_path / "h.db")],
                         capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 2 and "mask.partial_bits is [" in bad.stderr, bad.stderr
