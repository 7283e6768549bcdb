"""pytest over the Python package (python/harness). Run by CTest (`ctest -R python`, part of
scripts/test.sh) with this build's op library and binary:
    HARNESS_OPS_LIBRARY=build/python/libharness_ops.so HARNESS_BIN=build/harness/harness \\
    HARNESS_REQUIRE_NATIVE=1 ~/.cache/harness/venv/bin/python -m pytest tests/python
Without HARNESS_REQUIRE_NATIVE, tests that need the op library or the binary skip when they are
not built. HARNESS_TEST_INSTALLED=1 tests the installed package instead of the checkout's.
CUDA tests are marked `cuda` and run only where a GPU is (dev/gpu/gpu_check_python.sh)."""

import os
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if os.environ.get("HARNESS_TEST_INSTALLED") != "1":
    sys.path.insert(0, str(ROOT / "python"))
# A fresh inductor cache per session: a cached graph compiled against an earlier fake kernel of
# the op would otherwise be reused.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="harness-inductor-"))


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (Hopper for the fused kernels)")


def _require_native() -> bool:
    return os.environ.get("HARNESS_REQUIRE_NATIVE") == "1"


@pytest.fixture(scope="session")
def ops():
    """The op library, loaded (skips, or fails under HARNESS_REQUIRE_NATIVE=1, when not built)."""
    import harness.ops

    try:
        harness.ops.load_library()
    except RuntimeError as error:
        if _require_native():
            raise
        pytest.skip(str(error))
    return harness.ops


@pytest.fixture(scope="session")
def harness_binary():
    import harness.cli

    try:
        return harness.cli.binary()
    except harness.cli.HarnessError as error:
        if _require_native():
            raise
        pytest.skip(str(error))


@pytest.fixture
def cuda_device():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the fused CUDA kernels are built for Hopper (sm_90)")
    return torch.device("cuda")
