"""harness.run and the `harness` console script's entry point, through the real binary."""

import os
import subprocess
import sys

import pytest

import harness
import harness.cli
from conftest import ROOT


def test_run_returns_the_json_of_the_run(harness_binary, tmp_path):
    result = harness.run("bwd_fusion", device="cpu", db=tmp_path / "h.db", sets={"dims.anchors": 4})
    assert result["run"]["experiment"] == "bwd_fusion"
    assert result["run"]["status"] == "ok"
    assert {t["variant"] for t in result["trials"]} == {"fused", "dense"}
    runs = harness.runs(tmp_path / "h.db")
    assert runs["run"].tolist() == [result["run"]["id"]]


def test_run_raises_with_the_exit_code_of_a_usage_error(harness_binary, tmp_path):
    with pytest.raises(harness.HarnessError, match="exit code 2") as caught:
        harness.run("no_such_experiment", device="cpu", db=tmp_path / "h.db")
    assert caught.value.exit_code == 2
    assert "unknown experiment 'no_such_experiment'" in str(caught.value)
    with pytest.raises(TypeError, match="sets must be a dict"):
        harness.run("bwd_fusion", sets=["dims.anchors=4"])


def test_console_entry_point_execs_the_binary(harness_binary, tmp_path):
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'python')!r}); from harness.cli import main; "
            "sys.exit(main(['list']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "bwd_fusion" in done.stdout


def test_the_entry_point_imports_neither_torch_nor_pandas():
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'python')!r}); import harness.cli; "
            "print('torch' in sys.modules, 'pandas' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]


def test_missing_binary_is_an_infrastructure_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HARNESS_BIN", str(tmp_path / "nothing"))
    monkeypatch.setattr(harness.cli, "_installed_root", lambda: tmp_path)
    monkeypatch.setattr(harness.cli, "__file__", str(tmp_path / "a" / "b" / "cli.py"))
    with pytest.raises(harness.HarnessError, match="no harness binary found"):
        harness.cli.binary()
    assert harness.cli.main(["list"]) == harness.cli.EXIT_INFRA


def test_json_errors_and_version(harness_binary, tmp_path):
    import json

    env = harness.cli.binary_env()
    done = subprocess.run([str(harness_binary), "run", "no_such_experiment", "--json", "--db", str(tmp_path / "h.db")],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 2
    error = json.loads(done.stdout)
    assert error["exit_code"] == 2 and "unknown experiment" in error["error"]
    assert "unknown experiment" in done.stderr
    done = subprocess.run([str(harness_binary), "--version"], capture_output=True, text=True, env=env)
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert lines[0] == f"harness {harness.__version__}"
    assert lines[1].startswith("commit ") and lines[2].startswith("LibTorch 2.") and lines[3].startswith("CUDA ")


def test_the_package_version_is_the_projects():
    import re

    cmake = (ROOT / "CMakeLists.txt").read_text()
    assert re.search(r"project\(harness VERSION ([0-9.]+)", cmake).group(1) == harness.__version__
