"""What harness.capture costs a training step that does not fail.

Builds examples/train_dflash.py's job once, with a capture active so that the job's
torch.compile(flex_attention) is the observed form (as under `python -m harness.capture`), and times
its training steps in one process, pairs of steps with the capture on and off (in the order
plain-captured, then captured-plain, so that a drift of the machine's speed affects both alike),
after warm-up steps. Prints one JSON object: every step's time per side, the medians, the overhead
(captured median / plain median - 1, in %) and the attention calls a captured step observed. On CUDA
the captured steps also record the allocator history (the capture's default). Then the fixed
cost per observed call, apart from any model: a tiny SDPA forward and backward (1 x 2 heads x 16 x 8,
on the CPU) timed in blocks of 2000 with the capture off and on, 7 blocks each, medians subtracted.

    python bench/capture_overhead.py --pairs 20 -- --small --device cpu            # the CPU mode
    python bench/capture_overhead.py --pairs 10 -- --attention flex-compiled       # a GPU, the founding dims

Everything after `--` goes to the example. PYTHONPATH must let `import harness` work (the checkout's
python/, or the installed package).
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20, help="pairs of steps, one plain and one captured (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="steps before the measured ones (default 3)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("example_args", nargs=argparse.REMAINDER, help="-- arguments of train_dflash.py")
    args = parser.parse_args()
    example_args = args.example_args[1:] if args.example_args[:1] == ["--"] else args.example_args
    sys.path.insert(0, str(ROOT / "examples"))
    sys.path.insert(0, str(ROOT / "python"))
    import torch
    import train_dflash

    from harness import capture

    if args.threads:
        torch.set_num_threads(args.threads)
    out_dir = tempfile.mkdtemp(prefix="capture-overhead-")
    # The job is built while a capture is active, as under `python -m harness.capture`: its
    # torch.compile(flex_attention) is then the observed form (a compiled attention made outside any
    # capture is never observed). With no capture active, that form calls straight through.
    with capture.capture(out_dir):
        job = train_dflash.Job(train_dflash.parse_args(example_args))
    step_index = 0
    for _ in range(args.warmup):
        job.step(step_index)
        step_index += 1
    times = {"plain": [], "captured": []}
    observed = 0
    for pair in range(args.pairs):
        for side in (("plain", "captured") if pair % 2 == 0 else ("captured", "plain")):
            if side == "captured":
                state = capture.start(capture.Options(out_dir))
            start = time.perf_counter()
            job.step(step_index)
            times[side].append(time.perf_counter() - start)
            step_index += 1
            if side == "captured":
                observed = state.next_index
                capture.stop()
    if observed == 0:
        print("capture_overhead: no attention call was observed in a captured step; the overhead measured "
              "is the allocator history's alone", file=sys.stderr)
    plain, captured = statistics.median(times["plain"]), statistics.median(times["captured"])
    per_call = per_call_overhead_us(torch, capture, out_dir)
    print(json.dumps({"example_args": example_args, "threads": torch.get_num_threads(),
                      "attention_calls_per_step": observed, "plain_step_s": times["plain"],
                      "captured_step_s": times["captured"], "plain_median_s": plain, "captured_median_s": captured,
                      "overhead_percent": 100.0 * (captured / plain - 1.0), "per_call_overhead_us": per_call}))


def per_call_overhead_us(torch, capture, out_dir, calls=2000, blocks=7):
    """Microseconds the capture adds to one observed call (forward and backward), apart from any model."""
    functional = torch.nn.functional
    x = torch.randn(1, 2, 16, 8, requires_grad=True)

    def block():
        start = time.perf_counter()
        for _ in range(calls):
            functional.scaled_dot_product_attention(x * 1.0, x * 2.0, x * 3.0).sum().backward()
        return (time.perf_counter() - start) / calls * 1e6

    block()
    plain, captured = [], []
    for _ in range(blocks):
        plain.append(block())
        capture.start(capture.Options(out_dir))
        captured.append(block())
        capture.stop()
    return {"plain_us": statistics.median(plain), "captured_us": statistics.median(captured),
            "overhead_us": statistics.median(captured) - statistics.median(plain)}


if __name__ == "__main__":
    main()
