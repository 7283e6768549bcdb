"""The `harness` command line from Python: where the binary is, the console script, `harness.run`.

The console script `harness` (pyproject.toml) is `main()` here: it execs the binary that
`pip install` put inside the package (harness/bin/harness) with torch's library folder on
LD_LIBRARY_PATH, so the binary uses the torch of the venv it was built against. It imports
neither torch nor the rest of the package, so a CLI call starts as fast as the binary.

Where the binary is looked for, first found wins:
  1. $HARNESS_BIN;
  2. the package's own bin/harness (pip install / pip install -e: harness/_install.py, written by
     CMake at install time, sits beside it);
  3. a build tree of the checkout this package is imported from (build/harness/harness).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

# Exit codes of the binary (core/errors.h).
EXIT_OK, EXIT_FAIL_ON, EXIT_USAGE, EXIT_INFRA = 0, 1, 2, 3


class HarnessError(RuntimeError):
    """The harness binary failed: `exit_code` (2 usage/spec error, 3 infrastructure), its stderr."""

    def __init__(self, message, exit_code=None, stderr=""):
        super().__init__(message)
        self.exit_code = exit_code
        self.stderr = stderr


def _installed_root():
    """The folder CMake installed the package's binary and data into, or None (not installed)."""
    spec = importlib.util.find_spec("harness._install")
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).parent


def binary() -> Path:
    """Path of the harness binary (see the module docstring for the search order)."""
    candidates = []
    if os.environ.get("HARNESS_BIN"):
        candidates.append(("$HARNESS_BIN", Path(os.environ["HARNESS_BIN"])))
    root = _installed_root()
    if root is not None:
        candidates.append(("the installed package", root / "bin" / "harness"))
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "CMakeLists.txt").is_file():  # imported from a checkout, not from site-packages
        candidates.append(("the checkout's build tree", checkout / "build" / "harness" / "harness"))
    for _, path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    tried = "; ".join(f"{where}: {path}" for where, path in candidates)
    raise HarnessError(f"harness: no harness binary found (tried {tried}); `pip install .` in the checkout "
                       "builds one, or set HARNESS_BIN", EXIT_INFRA)


def torch_lib_dir():
    """torch/lib of the torch this interpreter would import, found without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    lib = Path(spec.origin).parent / "lib"
    return lib if lib.is_dir() else None


def binary_env(env=None) -> dict:
    """The environment the binary needs: torch's libraries on LD_LIBRARY_PATH."""
    env = dict(os.environ if env is None else env)
    lib = torch_lib_dir()
    if lib is not None:
        paths = [str(lib)] + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
        env["LD_LIBRARY_PATH"] = os.pathsep.join(paths)
    return env


def main(argv=None) -> int:
    """The `harness` console script: replaces this process with the binary."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        path = binary()
    except HarnessError as error:
        print(error, file=sys.stderr)
        return EXIT_INFRA
    os.execve(str(path), [str(path), *argv], binary_env())
    return EXIT_INFRA  # not reached


def _set_value(value) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value)


def run(experiment, device="cpu", sets=None, *, db=None, profile=None, experiments_dir=None, extra_args=(),
        timeout=None, cwd=None) -> dict:
    """Runs `harness run EXPERIMENT --device DEVICE --json` in a child process and returns its
    JSON (the run: "run", "env", "spec", "trials", "summary", "metrics", "artifacts").

    sets: {"dims.anchors": 256, ...}, each passed as --set path=value (lists sweep).
    db: the db file (default ./harness.db of cwd). Raises HarnessError with the exit code and
    stderr when the binary fails (2: a usage or spec error, 3: infrastructure).
    """
    if not isinstance(experiment, (str, os.PathLike)):
        raise TypeError(f"harness.run: experiment must be a name or a spec path (got {type(experiment).__name__})")
    if not isinstance(device, str):
        raise TypeError(f"harness.run: device must be a string such as 'cpu' or 'cuda:0' (got {type(device).__name__})")
    if sets is not None and not isinstance(sets, dict):
        raise TypeError(f"harness.run: sets must be a dict of spec path -> value (got {type(sets).__name__})")
    argv = [str(binary()), "run", os.fspath(experiment), "--device", device, "--json"]
    for path, value in (sets or {}).items():
        argv += ["--set", f"{path}={_set_value(value)}"]
    if db is not None:
        argv += ["--db", os.fspath(db)]
    if profile is not None:
        argv += ["--profile", profile]
    if experiments_dir is not None:
        argv += ["--experiments-dir", os.fspath(experiments_dir)]
    argv += list(extra_args)
    done = subprocess.run(argv, capture_output=True, text=True, env=binary_env(), timeout=timeout, cwd=cwd)
    if done.returncode not in (EXIT_OK, EXIT_FAIL_ON):
        # Under --json the binary prints {"error": ..., "exit_code": ...} on stdout as well.
        try:
            message = json.loads(done.stdout)["error"]
        except (json.JSONDecodeError, KeyError, TypeError):
            message = done.stderr.strip()[-2000:]
        raise HarnessError(f"harness run {experiment}: exit code {done.returncode}: {message}",
                           done.returncode, done.stderr)
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError as error:
        raise HarnessError(f"harness run {experiment}: the binary printed no JSON ({error}); stderr: "
                           f"{done.stderr.strip()[-2000:]}", done.returncode, done.stderr) from None


__all__ = ["run", "binary", "main", "HarnessError"]
