"""The capture of a process started with HARNESS_CAPTURE=DIR in its environment (python/README.md,
"Capture"): imported at interpreter start by `harness-capture.pth`, which `pip install .` puts into
site-packages. Launchers that start `python train.py` themselves (torchrun, Slurm's srun, accelerate,
deepspeed) then capture every worker without a change to their command line.

Nothing happens until the process imports torch: the capture starts right after `import torch`
finishes (a finder on sys.meta_path wraps torch's loader), so a process that never imports torch
(the launcher's own helpers) is left alone, and one that does sees the attention functions patched
before its own imports bind them. An exception that ends the process goes through sys.excepthook,
which writes the capture file first.
"""

import importlib.abc
import importlib.util
import os
import sys


def _start():
    import atexit

    from harness import capture

    state = capture.start(capture.Options.from_env())
    atexit.register(state.at_exit)
    previous = sys.excepthook

    def excepthook(kind, error, trace):
        state.failure(error, "script")
        previous(kind, error, trace)

    sys.excepthook = excepthook


class _AfterTorchImport(importlib.abc.MetaPathFinder):
    """Finds `torch` the normal way and starts the capture once its module has executed."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_start(module):
            exec_module(module)
            try:
                _start()
            except Exception as error:  # noqa: BLE001 - a capture that cannot start never stops the job
                print(f"harness.capture: HARNESS_CAPTURE is set but the capture did not start: {error}", file=sys.stderr)

        spec.loader.exec_module = exec_then_start
        return spec


def install():
    """Starts capturing now if torch is imported, else right after it is."""
    if not os.environ.get("HARNESS_CAPTURE"):
        return
    if "torch" in sys.modules:
        _start()
    elif not any(isinstance(finder, _AfterTorchImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorchImport())


install()
