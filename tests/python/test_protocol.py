"""harness.report: the python kind's protocol (experiments/python/README.md) in one call."""

import io
import json
import subprocess
import sys

import pytest

import harness
from conftest import ROOT


def reported(*args, **kwargs):
    out = io.StringIO()
    printed = harness.report(*args, file=out, **kwargs)
    last_line = out.getvalue().splitlines()[-1]
    assert json.loads(last_line) == printed
    return printed


def test_metrics_pass_through_and_nan_becomes_null():
    printed = reported({"bwd_ms": [1.5, float("nan")], "fused": True, "mode": "compiled", "peak": float("inf")})
    assert printed == {"bwd_ms": [1.5, None], "fused": True, "mode": "compiled", "peak": None}


def test_a_callable_that_raises_is_reported_by_kind():
    def oom():
        raise RuntimeError("CUDA out of memory. Tried to allocate 15.09 GiB (GPU 0; 79.1 GiB total)")

    def skip():
        raise harness.Skip("needs a GPU")

    def broken():
        raise KeyError("anchors")

    assert reported(oom) == {"oom": "RuntimeError: CUDA out of memory. Tried to allocate 15.09 GiB (GPU 0; 79.1 GiB total)",
                             "requested_bytes": int(15.09 * 2**30)}
    assert reported(skip) == {"skipped": "needs a GPU"}
    assert reported(broken) == {"error": "KeyError: 'anchors'"}
    assert reported(lambda: {"x": 1}) == {"x": 1}


def test_bad_calls():
    with pytest.raises(ValueError, match="exactly one of result, skipped, error, oom"):
        harness.report({"x": 1}, skipped="no")
    with pytest.raises(TypeError, match="result must be a dict"):
        harness.report([1, 2], file=io.StringIO())
    with pytest.raises(TypeError, match=r"result.when is a object"):
        harness.report({"when": object()}, file=io.StringIO())


def test_a_script_using_report_speaks_the_protocol(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT / 'python')!r})\n"
        "import harness\n"
        "print('a log line')\n"
        "harness.report(lambda: {'bwd_peak_bytes': 59e6, 'device': sys.argv[2]})\n")
    done = subprocess.run([sys.executable, str(script), "--device", "cpu"], capture_output=True, text=True, check=True)
    lines = done.stdout.splitlines()
    assert lines[0] == "a log line"
    assert json.loads(lines[-1]) == {"bwd_peak_bytes": 59e6, "device": "cpu"}
