#!/usr/bin/env python3
"""Where a fused call's host time goes, from a Kineto trace the harness wrote (`harness run ... --trace`).

    python3 dev/trace_host_breakdown.py TRACE.json

For each host range of the fused CUDA path (kernels/cuda/fused_attention_cuda.cpp records
`harness::fused_cuda prepare`, `... forward (host)`, `... pick`, `... params + launch`,
`... backward (host)`, `... dispatch record`) and each CUDA runtime call inside them
(cudaLaunchKernel, cudaMemsetAsync, ...), prints the count and the median and mean duration in
microseconds, and the ATen ops (aten::empty, ...) called from inside them. Standard library only."""
import json
import statistics
import sys
from collections import defaultdict


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    events = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X"]
    ranges = [e for e in events if e.get("name", "").startswith("harness::fused_cuda")]
    if not ranges:
        print("no harness::fused_cuda ranges in the trace (a build before they were added?)", file=sys.stderr)
        return 1
    outer = [e for e in ranges if e["name"].endswith("(host)") or e["name"].endswith("prepare")]

    def inside(e):
        return any(o["tid"] == e["tid"] and o["ts"] <= e["ts"] and e["ts"] + e["dur"] <= o["ts"] + o["dur"] for o in outer)

    groups = defaultdict(list)
    for e in ranges:
        groups[("range", e["name"])].append(e["dur"])
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver", "cpu_op") and not e["name"].startswith("harness::") and inside(e):
            groups[(e["cat"], e["name"])].append(e["dur"])
    print(f"{'kind':13s} {'name':48s} {'count':>6s} {'median us':>10s} {'mean us':>9s}")
    for (kind, name), durations in sorted(groups.items(), key=lambda item: -statistics.mean(item[1]) * len(item[1])):
        print(f"{kind:13s} {name[:48]:48s} {len(durations):6d} {statistics.median(durations):10.1f} "
              f"{statistics.mean(durations):9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
