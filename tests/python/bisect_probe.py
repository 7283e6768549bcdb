"""Probe of tests/cli/bisect_probe.json: imports harness_probe_pkg (the wheels of
tests/python/make_bisect_wheels.py) and prints what this version measures, by the python-kind
protocol (experiments/python/README.md). Standard library only.
"""
import argparse
import json

parser = argparse.ArgumentParser()
parser.add_argument("--device", required=True)
parser.add_argument("--repeats", type=int, default=5)
args = parser.parse_args()
try:
    import harness_probe_pkg
except ImportError as error:
    print(json.dumps({"error": f"harness_probe_pkg is not installed: {error}"}))
    raise SystemExit(0)
result = harness_probe_pkg.measure(args.repeats)
result["version"] = harness_probe_pkg.__version__
print(json.dumps(result))
