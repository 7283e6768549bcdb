"""Evidence in the formats PyTorch users read, end to end through the built binary:
a capsule the harness writes loads with safetensors and its id checks out from Python; a step
written from Python with safetensors replays through `harness replay --import`; `--trace` on the
CPU keeps a Chrome trace whose ranges name the attention phases and the kernels' configs.

Run: HARNESS_BIN=build/harness/harness python -m pytest tests/python/test_evidence.py
(tests/evidence_python_test.sh does this under CTest). The binary is the one `harness.cli.binary()`
finds: $HARNESS_BIN, else the installed package's, else the checkout's build tree."""
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "tests" / "cli" / "replay_small.json"


def harness(tmp_path, *args, check=True):
    from harness import cli

    result = subprocess.run([str(cli.binary()), *map(str, args), "--db", str(tmp_path / "h.db")],
                            capture_output=True, text=True, env={**os.environ, "HARNESS_ALLOW_FAULTS": "1"})
    if check:
        assert result.returncode == 0, result.stderr
    return result


def artifacts(run_json, kind):
    return [a for a in run_json["artifacts"] if a["kind"] == kind]


def test_a_capsule_loads_with_safetensors(tmp_path):
    run = json.loads(harness(tmp_path, "run", SMALL, "--device", "cpu", "--keep-capsules", "--json").stdout)
    capsules = artifacts(run, "capsule")
    assert capsules, run["artifacts"]
    path = tmp_path / capsules[0]["path"]
    tensors = load_file(str(path))
    spec = run["spec"]
    heads, kv_heads, head_dim = spec["dims"]["heads"], spec["dims"]["kv_heads"], spec["dims"]["head_dim"]
    q_len = spec["dims"]["anchors"] * spec["dims"]["block_size"]
    kv_len = spec["dims"]["context"] + q_len
    for layer in range(2):
        assert tensors[f"q.{layer}"].shape == (1, heads, q_len, head_dim)
        assert tensors[f"k.{layer}"].shape == (1, kv_heads, kv_len, head_dim)
        assert tensors[f"q.{layer}"].dtype == torch.bfloat16
    assert tensors["mask.anchors"].dtype == torch.int64
    # The capsule header travels in the metadata; its SHA-256 is the id (the file's name), and it
    # lists every tensor's SHA-256, which the bytes safetensors loads match.
    with safe_open(str(path), "pt") as f:
        metadata = f.metadata()
    assert metadata["format"] == "harness-capsule"
    assert hashlib.sha256(metadata["capsule"].encode()).hexdigest() == path.stem == capsules[0]["sha256"]
    header = json.loads(metadata["capsule"])
    assert header["role"] == "step"
    assert {t["name"] for t in header["tensors"]} == set(tensors)
    for entry in header["tensors"]:
        raw = tensors[entry["name"]].contiguous().view(torch.uint8).numpy().tobytes()
        assert hashlib.sha256(raw).hexdigest() == entry["sha256"], entry["name"]
    # The outputs too.
    outputs = load_file(str(tmp_path / artifacts(run, "outputs")[0]["path"]))
    assert {"out.0", "dq.0", "dk.0", "dv.0", "out.1"} <= set(outputs)


def test_a_safetensors_step_from_python_replays(tmp_path):
    import sys
    sys.path.insert(0, str(ROOT / "replay"))
    from save_step import save_step
    # A causal step (bottom-right aligned, as the harness's masks are) computed by PyTorch's SDPA
    # in fp32, saved with its outputs and gradients as a safetensors file.
    torch.manual_seed(0)
    q = torch.randn(1, 4, 32, 64, requires_grad=True)
    k = torch.randn(1, 2, 96, 64, requires_grad=True)
    v = torch.randn(1, 2, 96, 64, requires_grad=True)
    mask = torch.ones(32, 96, dtype=torch.bool).tril(diagonal=96 - 32)
    out = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                                           attn_mask=mask)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    path = tmp_path / "step.safetensors"
    save_step(path, q, k, v, grad_out, mask={"type": "causal"}, block_size=16,
              outputs={"out": out, "dq": q.grad, "dk": k.grad, "dv": v.grad}, name="python_causal", heads=4)
    with safe_open(str(path), "pt") as f:  # a plain safetensors file, nothing harness-specific in it
        assert set(f.keys()) == {"q", "k", "v", "grad_out", "out", "dq", "dk", "dv"}
    report = json.loads(harness(tmp_path, "replay", "--import", path, "--device", "cpu", "--json").stdout)
    assert report["verdict"] == "MATCH", report
    assert report["replay"]["status"] == "ok"
    assert len(report["outputs"]) == 4
    for c in report["outputs"]:
        assert c["bitwise_equal"] or c["max_abs_err"] < 1e-4, c  # fp32 against PyTorch's SDPA
    # Without the meta string, the file is refused naming what is missing (exit code 2).
    bare = tmp_path / "bare.safetensors"
    save_file({"q": q.detach(), "k": k.detach(), "v": v.detach(), "grad_out": grad_out}, str(bare))
    refused = harness(tmp_path, "replay", "--import", bare, "--device", "cpu", check=False)
    assert refused.returncode == 2
    assert "meta" in refused.stderr


def test_trace_on_the_cpu_names_the_phases(tmp_path):
    run = json.loads(harness(tmp_path, "run", SMALL, "--device", "cpu", "--trace", "--set", "warmup=1",
                             "--json").stdout)
    traces = artifacts(run, "trace")
    # fused and dense (the "throw" variant fails before its step)
    assert len(traces) == sum(t["status"] == "ok" for t in run["trials"]) == 2
    path = tmp_path / traces[0]["path"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == traces[0]["sha256"]
    events = json.loads(path.read_text())["traceEvents"]
    names = [e.get("name", "") for e in events]
    ranges = [n for n in names if n.startswith("harness ")]
    assert any(n.startswith("harness fwd layer 0") for n in ranges), ranges
    assert any(n.startswith("harness fwd layer 1") for n in ranges), ranges
    assert any(n.startswith("harness bwd") for n in ranges), ranges
    # The measured step's ranges carry the implementations and configs the warm-up's dispatch
    # trace recorded ("harness fwd layer 0 | attention_fwd fused_cpu (...)").
    labelled = [n for n in ranges if "attention_fwd" in n or "attention_bwd" in n]
    assert labelled, ranges
    assert any(n.startswith("aten::") for n in names)  # LibTorch's own ops are in the trace
