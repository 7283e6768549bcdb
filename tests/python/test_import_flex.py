"""Steps computed by PyTorch and replayed with `harness replay --import` are judged right by the
correctness check (docs/RUNNING.md, "The correctness check"): MATCH for every mask kind at real
models' GQA ratios, in bf16. The forward is PyTorch's own flex_attention (eager; it has no
backward on the CPU), the gradients PyTorch's autograd through the masked softmax in float32,
rounded to bf16. A planted wrong dq is MISMATCH, naming dq. Compiled flex_attention's own steps,
forward and backward, are judged the same way on the GPU (dev/gpu/model_matrix.sh)."""

import json
import os
import subprocess

import pytest
import torch

import harness

flex = pytest.importorskip("torch.nn.attention.flex_attention")


def flex_step(mask, heads, kv_heads, head_dim, q_len, kv_len, seed):
    """q, k, v, grad_out in bf16; flex_attention's out and autograd's gradients for them."""
    generator = torch.Generator().manual_seed(seed)
    draw = lambda h, n: torch.randn(1, h, n, head_dim, generator=generator).to(torch.bfloat16)  # noqa: E731
    q, k, v, grad_out = draw(heads, q_len), draw(kv_heads, kv_len), draw(kv_heads, kv_len), draw(heads, q_len)
    block_mask = mask.flex_block_mask(q_len, kv_len, block_size=128)
    out = flex.flex_attention(q, k, v, block_mask=block_mask, enable_gqa=heads != kv_heads)
    group = heads // kv_heads
    leaves = [t.float().requires_grad_(True) for t in (q, k, v)]
    scores = leaves[0] @ leaves[1].repeat_interleave(group, 1).transpose(-2, -1) / head_dim**0.5
    probabilities = scores.masked_fill(~mask.dense(q_len, kv_len), float("-inf")).softmax(-1)
    (probabilities @ leaves[2].repeat_interleave(group, 1)).backward(grad_out.float())
    grads = [leaf.grad.to(torch.bfloat16) for leaf in leaves]
    outputs = {"out": out, "dq": grads[0], "dk": grads[1], "dv": grads[2]}
    return (q, k, v, grad_out), outputs


def replay(harness_binary, tmp_path, path, *extra):
    env = dict(os.environ, HARNESS_ALLOW_FAULTS="1")
    done = subprocess.run([harness_binary, "--db", str(tmp_path / "h.db"), "--json", "replay", "--import", str(path),
                           "--device", "cpu", *extra], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


CASES = [
    # (name, mask, heads, kv_heads, head_dim, q_len, kv_len): GQA 7:1 (Qwen2.5-7B), 4:1, 8:1 (MQA-like)
    ("dflash 28/4 d128", lambda: harness.DFlashMask(torch.tensor([20, 90, 130, 260]), torch.arange(320) // 160,
                                                    context=320, block_size=16), 28, 4, 128, 64, 384),
    ("causal 8/1 d64", lambda: harness.CausalMask(), 8, 1, 64, 192, 330),
    ("document_causal 16/4 d64", lambda: harness.DocumentCausalMask(torch.arange(330) // 120), 16, 4, 64, 192, 330),
    ("sliding_window 8/2 d128", lambda: harness.SlidingWindowMask(97), 8, 2, 128, 192, 330),
]


@pytest.mark.parametrize("name,make_mask,heads,kv_heads,head_dim,q_len,kv_len", CASES, ids=[c[0] for c in CASES])
def test_eager_flex_steps_replay_as_match(harness_binary, tmp_path, name, make_mask, heads, kv_heads, head_dim, q_len,
                                          kv_len):
    mask = make_mask()
    inputs, outputs = flex_step(mask, heads, kv_heads, head_dim, q_len, kv_len, seed=len(name))
    path = tmp_path / "step.pt"
    harness.save_step(path, *inputs, mask=mask, outputs=outputs, heads=heads, kv_heads=kv_heads)
    report = replay(harness_binary, tmp_path, path)
    assert report["verdict"] == "MATCH", report["reason"]
    for tensor in ("out", "dq", "dk", "dv"):
        judged = report["tolerance"][tensor]
        assert judged["match"] and judged["max_abs_err"] <= judged["bound"], (tensor, judged)
    # flex_attention's own outputs, judged by the same rule on the same references.
    assert report["imported_check"]["match"], report["imported_check"]


def test_a_planted_wrong_dq_is_a_mismatch_naming_dq(harness_binary, tmp_path):
    name, make_mask, heads, kv_heads, head_dim, q_len, kv_len = CASES[0]
    mask = make_mask()
    inputs, outputs = flex_step(mask, heads, kv_heads, head_dim, q_len, kv_len, seed=1)
    path = tmp_path / "step.pt"
    harness.save_step(path, *inputs, mask=mask, outputs=outputs, heads=heads, kv_heads=kv_heads)
    report = replay(harness_binary, tmp_path, path, "--set", "variants.fused.fault=wrong_dq")
    assert report["verdict"] == "MISMATCH", report["reason"]
    assert not report["tolerance"]["dq"]["match"]
    assert all(report["tolerance"][t]["match"] for t in ("out", "dk", "dv"))
    assert "dq max" in report["reason"]
    assert report["imported_check"]["match"]  # flex's result itself is still right
