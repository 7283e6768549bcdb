#!/usr/bin/env python3
"""Writes snapshot_synthetic_p2.pickle and snapshot_synthetic_p4.pickle: allocator snapshots in the
shape PyTorch's CUDA caching allocator records (torch.cuda.memory._snapshot(): "segments" with
their blocks, "device_traces" with alloc/free/segment/oom events), for the dense attention step
of tests/data/snapshot_spec.json (1 layer, 2 heads, Q 32, KV 96, fp32 scores = 24 KiB, rounded to
512 B blocks), ending in an OOM on the probabilities. Synthetic: the sizes are the ones the
caching allocator would use, the addresses and times made up. The real one recorded on the H200
is snapshot_h200.pickle (dev/gpu/gpu_check_evidence.sh). Protocol 2 is what LibTorch's pickler
writes (BINPUT memo, LONG1), protocol 4 what Python's pickle.dump writes (framing, MEMOIZE)."""
import pickle
import sys
from pathlib import Path

SEGMENT = 2 << 20  # small-pool segments are 2 MiB


def event(action, addr, size, t, **extra):
    e = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": []}
    e.update(extra)
    return e


def build():
    base = 0x7F0000000000
    # Inputs, allocated before the history started: q (8 KiB), k, v (12 KiB each), grad_out (8 KiB).
    inputs = [(base, 8192), (base + 8192, 12288), (base + 20480, 12288), (base + 32768, 8192)]
    scores = 2 * 32 * 96 * 4  # 24 KiB, a multiple of 512
    trace = [
        event("alloc", base + 40960, scores, 1000),                 # scores
        event("alloc", base + 65536, scores, 1010),                 # probabilities
        event("free_requested", base + 40960, scores, 1020),
        event("free_completed", base + 40960, scores, 1020),
        event("alloc", base + 90112, 2 * 32 * 64 * 2, 1030),       # out (bf16) = 8 KiB
        event("segment_alloc", base + SEGMENT, SEGMENT, 1040),
        event("alloc", base + SEGMENT, scores, 1050),              # scores again, in the backward
        event("oom", 0, scores, 1060, device_free=4096),
    ]
    trace[-1].pop("addr")
    # Blocks carry no address: they tile their segment in order from its start.
    blocks = [{"size": s, "requested_size": s, "state": "active_allocated", "frames": []} for _, s in inputs]
    blocks += [
        {"size": scores, "requested_size": scores, "state": "inactive", "frames": []},            # base + 40960
        {"size": scores, "requested_size": scores, "state": "active_allocated", "frames": []},    # base + 65536
        {"size": 8192, "requested_size": 8192, "state": "active_allocated", "frames": []},        # base + 90112
    ]
    used = sum(b["size"] for b in blocks if b["state"] != "inactive")
    blocks.append({"size": SEGMENT - 98304, "requested_size": 0, "state": "inactive", "frames": []})
    segments = [
        {"device": 0, "address": base, "total_size": SEGMENT, "allocated_size": used, "active_size": used,
         "requested_size": used, "stream": 0, "segment_type": "small", "segment_pool_id": (0, 0),
         "is_expandable": False, "frames": [], "blocks": blocks},
        {"device": 0, "address": base + SEGMENT, "total_size": SEGMENT, "allocated_size": scores, "active_size": scores,
         "requested_size": scores, "stream": 0, "segment_type": "small", "segment_pool_id": (0, 0),
         "is_expandable": False, "frames": [],
         "blocks": [{"size": scores, "requested_size": scores, "state": "active_allocated", "frames": []},
                    {"size": SEGMENT - scores, "requested_size": 0, "state": "inactive", "frames": []}]},
    ]
    return {"segments": segments, "device_traces": [trace], "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}}


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent)
    snapshot = build()
    for protocol in (2, 4):
        (out / f"snapshot_synthetic_p{protocol}.pickle").write_bytes(pickle.dumps(snapshot, protocol=protocol))
