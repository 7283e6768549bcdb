#!/usr/bin/env python3
"""Writes the capsule seeds of tests/fuzz/capsule/ in the capsule format (replay/README.md):
a step capsule that fits the fuzz target's small spec (2 heads, 1 KV head, head_dim 64, anchors 2,
block 16, context 64, bf16, 1 layer), an outputs file, and a few damaged variants. Deterministic:
run it again and the files are the same. Usage: make_capsule_seeds.py [DIR]"""
import hashlib
import json
import os
import struct
import sys

ALIGN = 64


def align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def capsule(header, tensors):
    """tensors: list of (name, dtype, shape, bytes)."""
    entries, payload, offset = [], b"", 0
    for name, dtype, shape, data in tensors:
        offset = align(offset)
        payload += b"\0" * (offset - len(payload)) + data
        entries.append({"name": name, "dtype": dtype, "shape": shape, "offset": offset, "bytes": len(data),
                        "sha256": hashlib.sha256(data).hexdigest()})
        offset += len(data)
    header = dict(header, format="harness-capsule", version=1, tensors=entries, payload_bytes=len(payload))
    text = json.dumps(header, separators=(",", ":")).encode()
    payload_offset = 0
    for _ in range(3):  # the preamble names the payload offset, which depends on its own length
        line = f"harness-capsule 1 {len(text)} {payload_offset}\n".encode()
        needed = align(len(line) + len(text))
        if needed == payload_offset:
            break
        payload_offset = needed
    return line + text + b"\0" * (payload_offset - len(line) - len(text)) + payload


def bf16(count, seed):
    # bf16 is the upper half of a float32: small, finite, deterministic values.
    values = [((i * 2654435761 + seed) % 2001 - 1000) / 1000.0 for i in range(count)]
    return b"".join(struct.pack("<f", v)[2:] for v in values)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "capsule")
    os.makedirs(out, exist_ok=True)
    q_len, kv_len = 2 * 16, 64 + 2 * 16
    step = [("q.0", "bf16", [1, 2, q_len, 64], bf16(2 * q_len * 64, 1)),
            ("k.0", "bf16", [1, 1, kv_len, 64], bf16(kv_len * 64, 2)),
            ("v.0", "bf16", [1, 1, kv_len, 64], bf16(kv_len * 64, 3)),
            ("grad_out.0", "bf16", [1, 2, q_len, 64], bf16(2 * q_len * 64, 4)),
            ("mask.anchors", "int64", [2], struct.pack("<2q", 5, 40))]
    good = capsule({"role": "step", "seed": 0}, step)
    outputs = capsule({"role": "outputs", "variant": "fused"},
                      [("out.0", "bf16", [1, 2, q_len, 64], bf16(2 * q_len * 64, 5)),
                       ("dq.0", "fp32", [1, 2, 4, 4], struct.pack("<32f", *[i / 7 for i in range(32)]))])
    files = {
        "seed-step.capsule": good,
        "seed-outputs.capsule": outputs,
        "seed-truncated.capsule": good[: len(good) // 2],
        "seed-flipped-payload.capsule": good[:-10] + bytes([good[-10] ^ 0xFF]) + good[-9:],
        "seed-anchor-out-of-context.capsule": capsule({"role": "step"}, step[:-1] + [("mask.anchors", "int64", [2], struct.pack("<2q", 5, 640))]),
        "seed-huge-shape.capsule": capsule({"role": "step"}, [("q.0", "bf16", [2**40, 2**40, 2**40], b"")]),
    }
    for name, data in files.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
