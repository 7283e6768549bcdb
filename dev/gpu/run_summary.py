#!/usr/bin/env python3
"""One line per run from `harness --json show ID` on stdin: the label given, the verdict, then per
trial its variant, status and each tensor's max error / bound and mean error / mean bound."""
import json
import sys

label = sys.argv[1] if len(sys.argv) > 1 else ""
data = json.load(sys.stdin)
run = data.get("run", data)
line = [label, run.get("verdict", "?")]
for trial in data.get("trials", []):
    tolerance = trial.get("details", {}).get("tolerance", {})
    errs = " ".join(f"{t}:{v['max_abs_err']:.3g}/{v['bound']:.3g},m{v['mean_abs_err']:.2g}/{v['mean_bound']:.2g}"
                    for t, v in tolerance.items())
    line.append(f"{trial['variant']}[{trial['status']}] {errs} {trial.get('error', '')[:120]}".rstrip())
print(" | ".join(line))
