"""The python experiment kind's protocol (experiments/python/README.md) in one call.

A script run by `harness run` prints one JSON object as its last stdout line: metrics, or
{"skipped": reason}, {"oom": message, "requested_bytes": N} or {"error": message}. `report` does
that, and turns what a step raises into the right object:

    import harness

    def measure():
        if not torch.cuda.is_available():
            raise harness.Skip("needs a GPU")
        ...
        return {"bwd_peak_bytes": peak, "bwd_ms": [1.2, 1.3, 1.25], "mode": "compiled"}

    harness.report(measure)          # or harness.report({"bwd_ms": 1.2}) with the values at hand
"""

from __future__ import annotations

import json
import math
import re
import sys
import traceback

_UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "B": 1, "bytes": 1}
# PyTorch's allocator: "Tried to allocate 15.09 GiB (GPU 0; ...)".
_REQUESTED = re.compile(r"Tried to allocate\s+([0-9.]+)\s*(KiB|MiB|GiB|TiB|B|bytes)")


class Skip(Exception):
    """Raise inside the measured callable (or pass skipped=...) when this configuration cannot run
    here: the trial is recorded as unsupported, with the reason."""


def requested_bytes(message: str):
    """The bytes an allocator OOM message says were requested, or None."""
    match = _REQUESTED.search(message)
    if not match:
        return None
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def _is_oom(error: BaseException) -> bool:
    if isinstance(error, MemoryError):
        return True
    try:
        import torch

        oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                                      getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)) if t)
        if oom_types and isinstance(error, oom_types):
            return True
    except ImportError:
        pass
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


def _plain(value, where: str):
    """JSON-ready form: NaN and infinities become null (JSON has neither), tensors their values."""
    if hasattr(value, "tolist") and callable(value.tolist):  # torch tensors, numpy arrays and scalars
        value = value.tolist()
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _plain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise TypeError(f"harness.report: {where} is a {type(value).__name__}, which JSON cannot hold "
                    "(numbers, lists of numbers, booleans, strings and dicts can)")


def report(result=None, *, skipped=None, error=None, oom=None, file=None):
    """Prints the script's result line and returns the object printed.

    result: a dict of metrics (a number is measured once, a list one value per repeat, booleans
        1/0, strings and dicts kept as details), or a callable returning one; what the callable
        raises becomes {"skipped": ...} (Skip), {"oom": ..., "requested_bytes": N} (an
        out-of-memory error) or {"error": ...} (anything else, with its traceback on stderr).
    skipped / error / oom: report that outcome directly, with this message.
    """
    out = file or sys.stdout
    outcomes = [name for name, given in (("result", result is not None), ("skipped", skipped is not None),
                                         ("error", error is not None), ("oom", oom is not None)) if given]
    if len(outcomes) != 1:
        raise ValueError("harness.report: pass exactly one of result, skipped, error, oom "
                         f"(got {', '.join(outcomes) or 'none'})")
    if skipped is not None:
        printed = {"skipped": str(skipped)}
    elif error is not None:
        printed = {"error": str(error)}
    elif oom is not None:
        printed = {"oom": str(oom)}
        if requested_bytes(str(oom)) is not None:
            printed["requested_bytes"] = requested_bytes(str(oom))
    else:
        if callable(result):
            try:
                result = result()
            except Skip as skip:
                return report(skipped=str(skip) or "skipped", file=file)
            except BaseException as caught:  # noqa: BLE001 - every failure must reach the parent as JSON
                if isinstance(caught, (KeyboardInterrupt, SystemExit)):
                    raise
                traceback.print_exc(file=sys.stderr)
                if _is_oom(caught):
                    return report(oom=f"{type(caught).__name__}: {caught}", file=file)
                return report(error=f"{type(caught).__name__}: {caught}", file=file)
        if not isinstance(result, dict):
            raise TypeError(f"harness.report: result must be a dict of metrics (got {type(result).__name__})")
        printed = _plain(result, "result")
    # Anything printed before stays a log; the result must be the last line.
    out.flush()
    print(json.dumps(printed, allow_nan=False), file=out, flush=True)
    return printed


__all__ = ["report", "Skip", "requested_bytes"]
