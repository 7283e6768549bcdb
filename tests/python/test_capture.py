"""harness.capture: a failing attention step of an unmodified job written for `harness triage`.

End to end (python -m harness.capture on examples/train_dflash.py's CPU mode with its planted
failure -> capture file -> harness triage -> writeup, the step replayed by `replay --import` and
compared), a job that succeeds (nothing written), the byte budget, the mask tables of a flex
BlockMask and of an SDPA mask, torch.compile(flex_attention), --nan-check, ranks started by
torch.multiprocessing.spawn and by torchrun through HARNESS_CAPTURE and the package's .pth, and
bench/capture_overhead.py in the CPU mode.
"""

import json
import os
import subprocess
import sys
import sysconfig

import pytest
import torch
import torch.nn.functional as F

import harness
from conftest import ROOT
from harness import mask_tables
from harness.capture_file import read_safetensors_metadata

EXAMPLE = ROOT / "examples" / "train_dflash.py"


def python_env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("HARNESS_CAPTURE", None)
    env.update(extra)
    return env


def captured(folder):
    return sorted(str(path) for path in folder.glob("*.safetensors")) if folder.exists() else []


def header_of(path):
    metadata = read_safetensors_metadata(path)
    return json.loads(metadata["capture"]), json.loads(metadata["meta"]) if "meta" in metadata else None


class PlantedError(torch.autograd.Function):
    """Identity; its backward raises, as an allocator would inside the attention backward."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 4096 bytes.")


def sdpa_step(mask=None, fail=False, size=32, heads=2):
    x = torch.randn(1, heads, size, 16, requires_grad=True)
    q, k, v = x * 1.0, x * 2.0, x * 3.0
    if fail:
        v = PlantedError.apply(v)
    F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum().backward()


# ---- end to end --------------------------------------------------------------------------------

def test_planted_backward_oom_is_captured_triaged_and_replayed(harness_binary, tmp_path):
    harness_binary = os.path.abspath(harness_binary)
    out = tmp_path / "captures"
    done = subprocess.run([sys.executable, "-m", "harness.capture", "--out", str(out), "--", str(EXAMPLE), "--small",
                           "--device", "cpu", "--steps", "3", "--plant-oom-at-step", "1"],
                          capture_output=True, text=True, cwd=tmp_path, env=python_env())
    # The job fails as it would have without the capture, with its own exception.
    assert done.returncode == 1, done.stderr
    assert "RuntimeError: [planted by examples/train_dflash.py --plant-oom-at-step 1] DefaultCPUAllocator" in done.stderr
    files = captured(out)
    assert len(files) == 1 and os.path.basename(files[0]).startswith("capture-pid")
    header, meta = header_of(files[0])
    assert header["failure"]["phase"] == "backward" and header["failure"]["in_attention"]
    assert header["exception"]["type"] == "RuntimeError"
    assert header["calls_observed"] == 4  # 2 layers x step 0 and step 1
    step = header["calls"][-1]
    assert step["op"] == "scaled_dot_product_attention" and step["grad_out_caught"]
    assert step["q"]["shape"] == [1, 4, 512, 64] and step["k"]["shape"] == [1, 2, 1536, 64]
    assert meta["mask"]["type"] == "blockmask"

    db = tmp_path / "h.db"
    writeup = tmp_path / "triage.md"
    triage = subprocess.run([harness_binary, "triage", files[0], "--device", "cpu", "--db", str(db), "-o", str(writeup),
                             "--set", "dims.layers=1", "--json"], capture_output=True, text=True, cwd=tmp_path)
    assert triage.returncode == 0, triage.stderr
    answer = json.loads(triage.stdout)
    plan = answer["plan"]
    assert plan["failure"]["kind"] == "out of memory in an attention call"
    assert plan["failure"]["requested_bytes"] == 4 * 512 * 1536 * 4
    # The mask_mod closure came back as the dflash mask: 32 draft blocks of 16 after a context of 1024.
    assert plan["step"]["mask"]["type"] == "dflash" and plan["step"]["mask"]["doc_lengths"] == [512, 512]
    assert "dims.anchors=32" in plan["sets"] and "dims.context=1024" in plan["sets"]
    steps = {step["id"]: step for step in answer["steps"]}
    assert set(steps) == {"explain_oom", "explain_oom_solve", "bwd_fusion", "anchor_scaling", "replay_dense", "replay_fused"}
    for step in steps.values():
        assert step["exit_code"] == 0, step
    assert steps["bwd_fusion"]["verdict"] == "FUSED"
    assert steps["replay_dense"]["verdict"] == "MATCH" and steps["replay_fused"]["verdict"] == "MATCH"
    assert answer["facts"]["request_is"]["variant"] == "dense"
    # The fix is claimed from the measurements: the fused replay's backward needs less than the
    # request, and less than half the dense replay's.
    facts = answer["facts"]
    assert facts["replay_fused_bwd_peak_bytes"] < facts["requested_bytes"]
    assert 2 * facts["replay_fused_bwd_peak_bytes"] < facts["replay_dense_bwd_peak_bytes"]
    assert facts["fix"] == "fused attention"
    text = writeup.read_text()
    assert "The unfused attention backward materializes the Q×KV scores" in text
    assert "**Fix:** run this attention fused" in text
    assert "## The captured step, replayed" in text and "## Appendix: each run's writeup" in text

    # The replay compared the fused output with the one the job computed.
    replay = subprocess.run([harness_binary, "replay", "--import", files[0], "--variant", "fused", "--device", "cpu",
                             "--db", str(db), "--json"], capture_output=True, text=True, cwd=tmp_path)
    assert replay.returncode == 0, replay.stderr
    report = json.loads(replay.stdout)
    assert report["verdict"] == "MATCH"
    compared = {c["tensor"]: c for c in report["outputs"]}
    assert compared["out.0"]["max_abs_err"] < 1e-4


def test_a_job_that_succeeds_writes_nothing(tmp_path):
    out = tmp_path / "captures"
    script = tmp_path / "fine.py"
    script.write_text("import torch, torch.nn.functional as F\n"
                      "x = torch.randn(1, 2, 16, 8, requires_grad=True)\n"
                      "F.scaled_dot_product_attention(x, x, x).sum().backward()\n")
    done = subprocess.run([sys.executable, "-m", "harness.capture", "--out", str(out), "--", str(script)],
                          capture_output=True, text=True, cwd=tmp_path, env=python_env())
    assert done.returncode == 0, done.stderr
    assert not out.exists()


def test_usage_errors_of_the_runner(tmp_path):
    for args, said in [([], "name what to run"), (["--", str(tmp_path / "missing.py")], "no such file"),
                       (["--max-bytes", "lots", "--", "x.py"], "is not a size")]:
        done = subprocess.run([sys.executable, "-m", "harness.capture", *args], capture_output=True, text=True,
                              cwd=tmp_path, env=python_env())
        assert done.returncode == 2 and said in done.stderr, (args, done.stderr)


# ---- in process ----------------------------------------------------------------------------------

def test_the_byte_budget_keeps_the_newest_calls_only(tmp_path):
    call_bytes = 3 * 1 * 2 * 32 * 16 * 4 + 32 * 32  # q, k, v fp32 and the bool mask ...
    out_bytes = 1 * 2 * 32 * 16 * 4                  # ... then the output, then grad_out
    budget = 2 * (call_bytes + 2 * out_bytes)        # two whole calls
    mask = torch.ones(32, 32, dtype=torch.bool).tril()
    with pytest.raises(RuntimeError, match="DefaultCPUAllocator"):
        with harness.capture(tmp_path, max_bytes=budget) as session:
            for _ in range(3):
                sdpa_step(mask)
            sdpa_step(mask, fail=True)
    header, _ = header_of(session.written[0])
    kept = [call for call in header["calls"] if call["tensors_kept"]]
    assert [call["index"] for call in kept] == [2, 3]
    assert sum(call["kept_bytes"] for call in kept) <= budget
    assert all("over the byte budget" in call["tensors_dropped"] for call in header["calls"][:2])
    assert header["step_call"] == 3

    # A call larger than the whole budget keeps nothing: the failure is still written, without a step.
    with pytest.raises(RuntimeError, match="DefaultCPUAllocator"):
        with harness.capture(tmp_path / "tiny", max_bytes=1000) as session:
            sdpa_step(mask, fail=True)
    header, meta = header_of(session.written[0])
    assert meta is None and header["step_call"] is None
    assert "over the byte budget of 1000 bytes" in header["calls"][0]["tensors_dropped"]


def test_an_sdpa_mask_becomes_tables_and_is_restored(tmp_path):
    mask = torch.rand(40, 72) > 0.5
    mask[:, 0] = True
    with pytest.raises(RuntimeError):
        with harness.capture(tmp_path) as session:
            x = torch.randn(1, 2, 40, 16, requires_grad=True)
            kv = torch.randn(1, 2, 72, 16, requires_grad=True)
            F.scaled_dot_product_attention(x * 1.0, kv * 1.0, PlantedError.apply(kv * 1.0), attn_mask=mask).sum().backward()
    from safetensors.torch import load_file

    tensors = load_file(session.written[0])
    tables = {key: value for key, value in tensors.items() if key.startswith("mask.")}
    assert torch.equal(mask_tables.tables_to_dense(tables, (128, 128), 40, 72)[0, 0], mask)
    # The patched functions are restored when the block ends.
    assert not hasattr(F.scaled_dot_product_attention, "__harness_observed__")


def test_flex_attention_block_mask_and_compiled_calls_are_observed(tmp_path):
    from torch.nn.attention.flex_attention import create_block_mask, create_mask

    anchors = torch.tensor([[5, 40, 70]])

    def mask_mod(b, h, q_idx, kv_idx):  # a closure, as a training script writes it
        block = q_idx // 16
        return ((kv_idx < 96) & (kv_idx < anchors[b, block])) | ((kv_idx >= 96) & ((kv_idx - 96) // 16 == block))

    block_mask = create_block_mask(mask_mod, 1, None, 48, 144, device="cpu", BLOCK_SIZE=32)
    q = torch.randn(1, 2, 48, 16)
    k = torch.randn(1, 2, 144, 16)
    with pytest.raises(ValueError, match="after the attention"):
        with harness.capture(tmp_path) as session:
            from torch.nn.attention.flex_attention import flex_attention

            flex_attention(q, k, k, block_mask=block_mask)  # CPU flex_attention has no backward: forward only
            compiled = torch.compile(flex_attention, backend="eager")
            compiled(q, k, k, block_mask=block_mask, scale=0.5)
            raise ValueError("after the attention")
    header, meta = header_of(session.written[0])
    assert [(call["op"], call["compiled"]) for call in header["calls"]] == [("flex_attention", False),
                                                                           ("flex_attention", True)]
    assert header["calls"][1]["compile_options"] == {"backend": "'eager'"} and header["calls"][1]["scale"] == 0.5
    assert header["calls"][0]["block_mask"]["block_size"] == [32, 32]
    assert header["failure"]["phase"] == "outside" and meta["grad_out"] == "drawn" and meta["scale"] == 0.5
    from safetensors.torch import load_file

    tables = {key: value for key, value in load_file(session.written[0]).items() if key.startswith("mask.")}
    dense = create_mask(mask_mod, 1, 1, 48, 144, device="cpu")
    assert torch.equal(mask_tables.tables_to_dense(tables, (32, 32), 48, 144), dense)


def test_nan_check_fails_the_step_and_captures_it(tmp_path):
    with pytest.raises(FloatingPointError, match="holds NaN or Inf"):
        with harness.capture(tmp_path, nan_check=True) as session:
            x = torch.randn(1, 2, 16, 8)
            x[0, 0, 3, 1] = float("nan")
            F.scaled_dot_product_attention(x, x, x)
    header, _ = header_of(session.written[0])
    assert header["failure"]["phase"] == "forward" and header["calls"][0]["forward_error"]


# ---- ranks ------------------------------------------------------------------------------------------

RANKS = """
import os, sys
import torch
import torch.nn.functional as F


class Fail(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("rank " + os.environ["RANK"] + ": planted failure")


def work(rank, fail_rank):
    os.environ.setdefault("RANK", str(rank))
    rank = int(os.environ["RANK"])
    x = torch.randn(1, 2, 32, 16, requires_grad=True)
    v = Fail.apply(x * 2.0) if rank == fail_rank else x * 2.0
    F.scaled_dot_product_attention(x * 1.0, x * 3.0, v).sum().backward()


if __name__ == "__main__":
    if sys.argv[1] == "spawn":
        import torch.multiprocessing as mp
        mp.spawn(work, args=(int(sys.argv[2]),), nprocs=2)
    else:
        work(int(os.environ["RANK"]), int(sys.argv[2]))
"""


def test_spawned_ranks_write_one_capture_per_failing_rank(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    out = tmp_path / "captures"
    done = subprocess.run([sys.executable, "-m", "harness.capture", "--out", str(out), "--", str(script), "spawn", "1"],
                          capture_output=True, text=True, cwd=tmp_path, env=python_env())
    assert done.returncode != 0
    files = captured(out)
    assert len(files) == 1 and os.path.basename(files[0]).startswith("capture-rank1-"), done.stderr
    header, _ = header_of(files[0])
    assert header["rank"]["rank"] == 1 and "rank 1: planted failure" in header["exception"]["message"]


def test_harness_capture_env_with_the_pth_captures_torchrun_workers(tmp_path):
    # A venv whose site-packages hold the package's .pth (what `pip install .` installs) and a path
    # file that brings torch and the checkout's python/ in: the interpreter processes both at start.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (venv / site / "a-harness-test-paths.pth").write_text(
        f"{sysconfig.get_paths()['purelib']}\n{ROOT / 'python'}\n")
    (venv / site / "harness-capture.pth").write_text((ROOT / "python" / "site" / "harness-capture.pth").read_text())
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    out = tmp_path / "captures"
    env = python_env(HARNESS_CAPTURE=str(out))
    env.pop("PYTHONPATH")
    done = subprocess.run([str(python), "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script), "torchrun", "0"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert done.returncode != 0
    files = captured(out)
    assert len(files) == 1 and os.path.basename(files[0]).startswith("capture-rank0-"), done.stderr
    header, _ = header_of(files[0])
    assert header["rank"] == {"rank": 0, "local_rank": 0, "world_size": 2}


def test_a_mask_no_named_kind_describes_is_triaged_and_replays_as_its_bits(harness_binary, tmp_path):
    harness_binary = os.path.abspath(harness_binary)
    mask = torch.rand(64, 192, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[:, 0] = True
    with pytest.raises(RuntimeError, match="DefaultCPUAllocator"):
        with harness.capture(tmp_path) as session:
            x = torch.randn(1, 4, 64, 64, requires_grad=True)
            kv = torch.randn(1, 2, 192, 64, requires_grad=True)
            F.scaled_dot_product_attention(x * 1.0, kv * 1.0, PlantedError.apply(kv * 1.0), attn_mask=mask,
                                           enable_gqa=True).sum().backward()
    plan = json.loads(subprocess.run([harness_binary, "triage", session.written[0], "--dry-run", "--json"],
                                     capture_output=True, text=True, check=True, cwd=tmp_path).stdout)
    assert plan["step"]["replayable"] is True and plan["step"]["mask"] is None
    assert "none of the named kinds" in plan["step"]["mask_note"] and "as its bits" in plan["step"]["mask_note"]
    assert [step["id"] for step in plan["steps"]] == ["explain_oom", "explain_oom_solve", "bwd_fusion", "anchor_scaling",
                                                      "replay_dense", "replay_fused"]
    assert any("run their own (dflash) mask" in note for note in plan["notes"])
    replay = subprocess.run([harness_binary, "replay", "--import", session.written[0], "--device", "cpu", "--db",
                             str(tmp_path / "h.db")], capture_output=True, text=True, cwd=tmp_path)
    # The import replays the mask as its bits (a blockmask) and keeps why no named kind fits.
    assert replay.returncode == 0, replay.stderr
    assert "MATCH" in replay.stdout, replay.stdout


def test_the_overhead_bench_times_captured_steps_that_observe_the_jobs_calls():
    # bench/capture_overhead.py in the example's CPU mode: its JSON report, and the captured steps saw
    # the job's 2 attention calls (a figure from steps that observed nothing would not be the capture's).
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "capture_overhead.py"), "--pairs", "2", "--warmup", "1",
                           "--", "--small", "--device", "cpu"],
                          capture_output=True, text=True, env=python_env(), timeout=600)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["attention_calls_per_step"] == 2, report
    assert len(report["plain_step_s"]) == len(report["captured_step_s"]) == 2
    assert report["plain_median_s"] > 0 and report["captured_median_s"] > 0
    per_call = report["per_call_overhead_us"]
    assert per_call["plain_us"] > 0 and per_call["captured_us"] > 0
    assert "no attention call was observed" not in done.stderr
