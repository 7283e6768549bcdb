"""Kept for scripts that do `sys.path.insert(0, "<checkout>/replay"); from save_step import save_step`.

The helper lives in the Python package: `import harness; harness.save_step(...)`
(python/harness/steps.py, installed by `pip install .`). This file finds the package in the
checkout when it is not installed.
"""

import os
import sys

try:
    from harness.steps import save_step
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    from harness.steps import save_step

__all__ = ["save_step"]
