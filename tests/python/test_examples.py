"""The examples run as python/README.md says, in their CPU mode."""

import json
import os
import subprocess
import sys

from conftest import ROOT


def test_the_drafter_swap_example_runs_on_the_cpu_and_the_losses_agree(ops):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "qwen_drafter_swap.py"), "--device", "cpu", "--json"],
                            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["q_len"] == 256 and report["kv_len"] == 768
    assert len(report["flex_losses"]) == len(report["harness_losses"]) == 4
    # fp32 on the CPU: the two attentions differ by rounding only, and training follows.
    assert report["losses_max_relative_difference"] < 1e-4, report
