#!/usr/bin/env python3
"""dev/check_layers.py: the real tree passes, and a planted backward include fails with a
message naming the file, the include and the rule. Usage: check_layers_test.py REPO_ROOT"""

import os
import shutil
import subprocess
import sys
import tempfile

root = os.path.abspath(sys.argv[1])
script = os.path.join(root, "dev", "check_layers.py")
failures = []
checks = []


def check(what, condition):
    checks.append(what)
    print(("ok   " if condition else "FAIL ") + what)
    if not condition:
        failures.append(what)


real = subprocess.run([sys.executable, script, "--root", root], capture_output=True, text=True)
check("the tree keeps the include rule", real.returncode == 0)
if real.returncode != 0:
    print(real.stderr)

with tempfile.TemporaryDirectory() as scratch:
    for folder in ("core", "db", "kernels", "experiments", "trials", "replay", "analysis", "harness"):
        shutil.copytree(os.path.join(root, folder), os.path.join(scratch, folder),
                        ignore=shutil.ignore_patterns("*.md", "*.json", "*.py", "CMakeLists.txt"))
    clean = subprocess.run([sys.executable, script, "--root", scratch], capture_output=True, text=True)
    check("a copy of the layered folders passes", clean.returncode == 0)

    planted = os.path.join(scratch, "experiments", "planted.cpp")
    with open(planted, "w") as out:
        out.write('#include "experiments/spec.h"\n#include "trials/run_trial.h"\n')
    bad = subprocess.run([sys.executable, script, "--root", scratch], capture_output=True, text=True)
    check("a backward include fails (exit 1)", bad.returncode == 1)
    check("the message names the file and line", "experiments/planted.cpp:2:" in bad.stderr)
    check("the message names the include", '"trials/run_trial.h"' in bad.stderr)
    check("the message states the rule", "only from its own layer or lower" in bad.stderr)
    check("the downward include of the same file is not reported", "planted.cpp:1:" not in bad.stderr)

    os.remove(planted)
    with open(os.path.join(scratch, "core", "planted.h"), "w") as out:
        out.write('#include "db/store.h"\n')
    core_up = subprocess.run([sys.executable, script, "--root", scratch], capture_output=True, text=True)
    check("core/ including db/ fails too", core_up.returncode == 1 and "core/planted.h:1:" in core_up.stderr)

print(f"{len(checks) - len(failures)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
