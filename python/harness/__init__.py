"""harness from Python: the fused attention as a torch op, the db as DataFrames, the CLI.

    import harness
    mask = harness.DFlashMask(anchors, doc_id, context=8192, block_size=16)
    out = harness.attention(q, k, v, mask)          # instead of flex_attention(q, k, v, block_mask=...)
    harness.runs("harness.db")                      # pandas DataFrames: runs, trials, metrics
    harness.run("bwd_fusion", device="cpu")         # the CLI in a child process, its --json as a dict
    with harness.capture("captures"): train()       # a failing attention step written for `harness triage`

Names are loaded on first use, so `import harness` (and the `harness` console script) import
neither torch nor pandas until something needs them.
"""

import importlib

__version__ = "0.1.0"  # = project(harness VERSION ...) in CMakeLists.txt (tests/python/test_cli.py checks)

_EXPORTS = {
    "attention": "harness.ops",
    "load_library": "harness.ops",
    "Mask": "harness.masks",
    "FullMask": "harness.masks",
    "CausalMask": "harness.masks",
    "DocumentCausalMask": "harness.masks",
    "SlidingWindowMask": "harness.masks",
    "DFlashMask": "harness.masks",
    "FlexMask": "harness.flex_mask",
    "runs": "harness.db",
    "trials": "harness.db",
    "metrics": "harness.db",
    "envs": "harness.db",
    "report": "harness.protocol",
    "Skip": "harness.protocol",
    "save_step": "harness.steps",
    "capture": "harness.capture",
    "run": "harness.cli",
    "HarnessError": "harness.cli",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    value = importlib.import_module(module)
    if module != f"harness.{name}":  # harness.capture is the module itself (callable: harness.capture(DIR))
        value = getattr(value, name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
