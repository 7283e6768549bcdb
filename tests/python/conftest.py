"""pytest over the Python package (python/harness). Run by CTest (`ctest -R python`, part of
scripts/test.sh) with this build's op library and binary:
    HARNESS_OPS_LIBRARY=build/python/libharness_ops.so HARNESS_BIN=build/harness/harness \\
    HARNESS_REQUIRE_NATIVE=1 ~/.cache/harness/venv/bin/python -m pytest tests/python
Without HARNESS_REQUIRE_NATIVE, tests that need the op library or the binary skip when they are
not built. HARNESS_TEST_INSTALLED=1 tests the installed package instead of the checkout's.
CUDA tests are marked `cuda` and run only where a GPU is (dev/gpu/gpu_check_python.sh)."""

import os
import sqlite3
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


def copy_site_db(folder: Path) -> Path:
    """A copy of the db tests/site_db.sh writes (HARNESS_SITE_DB, CTest's site_db fixture) as
    folder/harness.db, beside links to the folders beside the original (its artifacts), so the copy
    can be changed and still finds its traces and capsules."""
    source = os.environ.get("HARNESS_SITE_DB")
    if not source or not Path(source).is_file():
        pytest.fail(f"HARNESS_SITE_DB={source!r} is not a db (tests/site_db.sh writes it; CTest's site_db fixture)")
    db = folder / "harness.db"
    with sqlite3.connect(source) as original, sqlite3.connect(db) as copy:
        original.backup(copy)
    for entry in Path(source).parent.iterdir():
        if entry.is_dir() and not (folder / entry.name).exists():
            (folder / entry.name).symlink_to(entry)
    return db


@pytest.fixture(scope="module")
def chromium_browser():
    """Headless Chromium (tests/python/chromium.py); without one that starts, the whole run exits 77
    (CTest: skipped) with the reason."""
    from chromium import Chromium, ChromiumUnavailable

    try:
        browser = Chromium.start()
    except ChromiumUnavailable as reason:
        pytest.exit(f"SKIPPED: {reason}", returncode=77)
    with browser:
        yield browser
