"""Fixture for tests/test_python_kind.cpp: behaves as `--mode` says, one way per protocol case.

Needs no torch: the tests run it with the system python3.
"""
import argparse
import json
import os
import signal
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--device", required=True)
parser.add_argument("--mode", required=True)
parser.add_argument("--echo", action="append", default=[])
args = parser.parse_args()

print("a warning on stderr", file=sys.stderr)
if args.mode != "silent":
    print("log line before the result")
if args.mode == "ok":
    print(json.dumps({"peak_bytes": 1024, "step_ms": [1.5, 2.5, 3.5], "fused": True, "impl": "flex",
                      "count": 7, "units": {"count": "calls"}, "echo": args.echo, "device": args.device,
                      "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "fixture_env": os.environ.get("FIXTURE")}))
elif args.mode == "no_json":
    print("done, but no result")
elif args.mode == "silent":
    pass
elif args.mode == "invalid_json":
    print('{"peak_bytes": 12,')
elif args.mode == "not_object":
    print("[1, 2, 3]")
elif args.mode == "hang":
    time.sleep(60)
elif args.mode == "exit":
    print(json.dumps({"peak_bytes": 5}))
    raise ValueError("the probe failed after measuring")
elif args.mode == "exit_with_hint":
    # Like PyTorch's compile errors: the exception, then hint lines after the traceback.
    sys.stderr.write("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                     "LoweringException: RuntimeError: Found no NVIDIA driver on your system.\n\n"
                     "You can suppress this exception and fall back to eager by setting:\n"
                     "    torch._dynamo.config.suppress_errors = True\n")
    sys.exit(1)
elif args.mode == "skip":
    print(json.dumps({"skipped": "needs a CUDA GPU"}))
elif args.mode == "oom_json":
    print(json.dumps({"oom": "CUDA out of memory. Tried to allocate 15.09 GiB", "requested_bytes": 16203091968}))
elif args.mode == "oom_raise":
    raise MemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
elif args.mode == "crash":
    os.kill(os.getpid(), signal.SIGSEGV)
else:
    sys.exit("unknown mode " + args.mode)
