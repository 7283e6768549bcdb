"""What `python -m harness.capture` costs a training job that does not fail.

Runs examples/train_dflash.py --report-speed in fresh processes, alternating plain and captured runs
(so that a machine whose load drifts affects both alike), and prints one JSON object: the steps/s of
every run, the median of each side and the overhead (1 - captured / plain, in %).

    python bench/capture_overhead.py --runs 5 -- --small --device cpu --steps 12          # the CPU mode
    python bench/capture_overhead.py --runs 3 -- --attention flex-compiled --steps 8      # a GPU, founding dims

Everything after `--` goes to the example. PYTHONPATH must let `import harness` work (the checkout's
python/, or the installed package).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_dflash.py"


def steps_per_s(command, env):
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["steps_per_s"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each side (default 5)")
    parser.add_argument("example_args", nargs=argparse.REMAINDER, help="-- arguments of train_dflash.py")
    args = parser.parse_args()
    example_args = args.example_args[1:] if args.example_args[:1] == ["--"] else args.example_args
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "python"), env.get("PYTHONPATH")]))
    plain_command = [sys.executable, str(EXAMPLE), *example_args, "--report-speed"]
    captured_command = [sys.executable, "-m", "harness.capture", "--out", str(ROOT / "build" / "capture-overhead"), "--",
                        str(EXAMPLE), *example_args, "--report-speed"]
    plain, captured = [], []
    for _ in range(args.runs):
        plain.append(steps_per_s(plain_command, env))
        captured.append(steps_per_s(captured_command, env))
    plain_median, captured_median = statistics.median(plain), statistics.median(captured)
    print(json.dumps({"example_args": example_args, "plain_steps_per_s": plain, "captured_steps_per_s": captured,
                      "plain_median": plain_median, "captured_median": captured_median,
                      "overhead_percent": 100.0 * (1.0 - captured_median / plain_median)}))


if __name__ == "__main__":
    main()
