"""CPU checks of bench/attention_vs_flex.py: every peer's form of every mask against the harness.

The harness's own mask resolution (dflash anchors, document split, pair count) comes from
harness_mask_describe (HARNESS_MASK_DESCRIBE, or build/bench/ under the repository); the tests
that need it skip when it is not built. No GPU: flex runs eagerly on the CPU, forward only.
"""

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch.nn.attention.flex_attention import create_mask  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import attention_vs_flex as bench  # noqa: E402

SCRIPT = ROOT / "bench" / "attention_vs_flex.py"


def describer():
    path = os.environ.get("HARNESS_MASK_DESCRIBE") or str(ROOT / "build" / "bench" / "harness_mask_describe")
    if not os.access(path, os.X_OK):
        pytest.skip(f"harness_mask_describe not built ({path})")
    return path


def reference_pairs(mask, chunk=512):
    total = 0
    for start in range(0, mask["q_len"], chunk):
        rows = torch.arange(start, min(start + chunk, mask["q_len"]))
        total += int(bench.reference_rows(torch, mask, rows, "cpu").sum())
    return total


def test_dry_run_every_form_matches_the_reference():
    assert bench.dry_run() == []


def test_a_wrong_mask_is_caught():
    # The check must be able to fail: a window one too wide, and a top-left aligned causal mask.
    c = bench.DRY_CASES["tiny-sliding_window"]
    mask = bench.synthetic_mask(c)["mask"]
    ref = bench.reference_rows(torch, mask, torch.arange(mask["q_len"]), "cpu")
    wider = dict(mask, window=mask["window"] + 1)
    got = create_mask(bench.mask_mod_rewritten(torch, wider, "cpu"), 1, 1, mask["q_len"], mask["kv_len"], device="cpu")[0, 0]
    assert int(got.sum()) > int(ref.sum())
    causal = bench.synthetic_mask(bench.DRY_CASES["tiny-causal"])["mask"]
    top_left = torch.arange(causal["kv_len"])[None, :] <= torch.arange(causal["q_len"])[:, None]
    assert not torch.equal(top_left, bench.fa4_dense(torch, causal, bench.fa4_plan(causal)[0]))


def test_fa4_has_no_dflash_and_says_so():
    with pytest.raises(NotImplementedError, match="no dflash mask"):
        bench.fa4_plan({"kind": "dflash", "q_len": 16, "kv_len": 32})


@pytest.mark.parametrize("name", ["dflash-128", "causal-128", "document_causal-128", "sliding_window-128"])
def test_real_cases_have_the_harness_pair_count(name):
    """The real dims: the harness resolves the mask, every peer's form must see its pair count."""
    c = bench.CASES[name]
    described = bench.describe(describer(), c)
    mask, pairs = described["mask"], described["pairs_per_head"]
    assert reference_pairs(mask) == pairs
    mod = bench.mask_mod_rewritten(torch, mask, "cpu")
    assert int(create_mask(mod, 1, 1, mask["q_len"], mask["kv_len"], device="cpu").sum()) == pairs
    if mask["kind"] != "dflash":
        assert bench.fa4_plan(mask)[1] == pairs


def test_small_harness_masks_match_every_form_exactly():
    """Small dims resolved by the harness (its anchors and documents), compared pair by pair."""
    path = describer()
    for c in (bench.case(anchors=8, context=512, documents=3), bench.case(anchors=8, context=512, documents=1),
              bench.case(mask="document_causal", anchors=8, context=300, documents=4),
              bench.case(mask="sliding_window", anchors=8, context=64, window=40)):
        mask = bench.describe(path, c)["mask"]
        ref = bench.reference_rows(torch, mask, torch.arange(mask["q_len"]), "cpu")
        for make in (bench.mask_mod_original, bench.mask_mod_rewritten):
            got = create_mask(make(torch, mask, "cpu"), 1, 1, mask["q_len"], mask["kv_len"], device="cpu")[0, 0]
            assert torch.equal(got, ref), (c, make.__name__)
        if mask["kind"] != "dflash":
            assert torch.equal(bench.fa4_dense(torch, mask, bench.fa4_plan(mask)[0]), ref), c


def test_worker_refuses_a_mask_with_another_pair_count():
    mask = bench.synthetic_mask(bench.DRY_CASES["tiny-dflash"])["mask"]
    job = {"peer": "flex", "case": "tiny-dflash", "mask": dict(mask, pairs_per_head=1), "seed": 0, "reps": 1,
           "device": "cpu", "flex_mask": "rewritten", "dims": {"batch": 1, "heads": 2, "kv_heads": 1, "head_dim": 16}}
    result = bench.run_worker(job)
    assert result["unsupported"].startswith("mask mismatch")
    assert result["fwd"] is None


def test_driver_on_cpu_end_to_end(tmp_path):
    """One tiny case, one process per peer: flex times its forward and matches the reference;
    fa4 cannot run a dflash mask and the table says why; JSON and Markdown are written."""
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--cases", "tiny-dflash", "--peers", "flex,fa4",
                           "--reps", "2", "--budget-s", "300", "--json-out", str(out_json), "--md-out", str(out_md)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out_json.read_text())
    assert report["versions"]["torch"] == importlib.metadata.version("torch")
    rows = {r["peer"]: r for r in report["cases"][0]["rows"]}
    assert rows["flex"]["fwd"]["n"] == 2 and rows["flex"]["check_max_abs_err"] < bench.CHECK_TOLERANCE
    assert rows["flex"]["pairs_per_head"] == report["cases"][0]["pairs_per_head"]
    assert "no dflash mask" in rows["fa4"]["unsupported"]
    table = out_md.read_text()
    assert "| tiny-dflash | fa4 |" in table and "cannot run" in table


@pytest.mark.parametrize("peer", ["flex", "ours"])
def test_a_written_job_runs_alone_as_the_driver_would_run_it(tmp_path, peer, request):
    """--write-jobs (for a profiler) writes the worker's job and runs nothing; that job run with
    --worker times the peer on the case's mask, as the driver's own process would. ours on a
    generic mask is such a job too (harness.attention given the BlockMask), so Nsight Compute can
    profile the generic path (dev/gpu/ncu_kernels.sh PEER_CASES="CASE:ours")."""
    if peer == "ours":
        request.getfixturevalue("ops")  # the op library (skips, or fails under HARNESS_REQUIRE_NATIVE)
    jobs = tmp_path / "jobs"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--cases", "tiny-prefix_lm", "--peers", peer,
                           "--reps", "2", "--write-jobs", str(jobs)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    job_path = jobs / f"tiny-prefix_lm_{peer}.json"
    job = json.loads(job_path.read_text())
    assert job["peer"] == peer and job["case"] == "tiny-prefix_lm" and job["reps"] == 2
    assert f"job written to {job_path}" in proc.stdout  # the row says so; nothing was timed
    result_path = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--worker", str(job_path), str(result_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(result_path.read_text())
    assert result["fwd"]["n"] == 2 and result["check_max_abs_err"] < bench.CHECK_TOLERANCE
    assert result["pairs_per_head"] == job["mask"]["pairs_per_head"]


def test_unknown_case_is_a_usage_error():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--cases", "nope", "--peers", "flex"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown case nope" in proc.stderr


def test_binary_flags_are_the_flags_the_bench_runs_ours_with():
    # dev/gpu/kernel_sweep.sh and ncu_kernels.sh run harness_bench_attention with these.
    proc = subprocess.run([sys.executable, str(SCRIPT), "--binary-flags", "causal-8k-hd192v128"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    flags = proc.stdout.split()
    assert flags == bench.binary_flags(bench.CASES["causal-8k-hd192v128"])
    pairs = dict(zip(flags[::2], flags[1::2]))
    assert pairs["--mask"] == "causal" and pairs["--context"] == "0"
    assert pairs["--head-dim"] == "192" and pairs["--v-head-dim"] == "128"
    # A generic mask has no flags: ours runs it through harness.attention.
    proc = subprocess.run([sys.executable, str(SCRIPT), "--binary-flags", "tree-4x512"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "tree-4x512 is no named-mask case" in proc.stderr


def test_summary_compares_against_the_faster_flex_mode_per_op():
    stat = lambda ms: bench.summarize([ms])
    rows = [{"peer": "ours", "fwd": stat(1.0), "bwd": stat(2.0), "process_s": 12.0},
            {"peer": "flex", "fwd": stat(2.0), "bwd": stat(3.0), "compile_fwd_s": 30.0, "compile_bwd_s": 40.0},
            {"peer": "flex-autotune", "fwd": stat(1.5), "bwd": stat(3.5)},
            {"peer": "flex-flash", "fwd": stat(1.2), "bwd": None, "bwd_unsupported": "backward: NotImplementedError: x"},
            {"peer": "fa4", "fwd": None, "bwd": None, "unsupported": "flash-attn-4 has no dflash mask"}]
    s = bench.summarize_case(rows)
    assert s["best_flex"] == "1.500 (flex-autotune) / 3.000 (flex)"
    assert s["speedup_best_flex"] == "1.50x / 1.50x"
    assert s["fastest_peer"] == "flex-flash 1.20x / flex 1.50x"
    report = {"versions": {"torch": "2.11.0"}, "reps": 1, "repeats": 1, "commit": "abc",
              "cases": [{"case": "c", "rows": rows, "summary": s, "pairs_per_head": 1000,
                         "dims": {"batch": 1, "heads": 1, "head_dim": 128}}]}
    table = bench.markdown(report)
    assert "| c | flex | 2.000 (2.000–2.000) | 3.000 (3.000–3.000) |" in table
    assert "| 2.00x | 1.50x | 30/40 |" in table
    assert "cannot run: flash-attn-4 has no dflash mask" in table
    assert "no backward: backward: NotImplementedError: x" in table
