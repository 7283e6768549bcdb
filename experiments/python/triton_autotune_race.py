"""The autotuner warm-up race of the DFlash case, with Triton's own @triton.autotune.

In the founding case two GPU pairs warmed up one autotuned kernel at once; the autotuner keeps the
arguments of the call it is benchmarking in shared state (self.nargs), another thread overwrote or
reset it to None, and training died with "TypeError: 'NoneType' object is not a mapping".

Each of `--trials` trials defines a fresh autotuned kernel (empty tuning cache) and lets `--threads`
threads call it at once after a barrier, each with a random start jitter. `--mode concurrent` is
the founding case; `--mode sequential_warmup` is its structural fix (one call tunes the kernel
before the threads start). A trial fails when any thread raises or gets a wrong result. Prints the
failure rate with its 95 % Wilson interval and the messages seen.

Kind python (trials/python_kind.h): called as `triton_autotune_race.py --device D ...`,
prints one JSON object as its last stdout line; {"skipped": reason} without a GPU or Triton.
"""

import argparse
import json
import math
import random
import sys
import threading
import time
import traceback


def emit(result):
    print(json.dumps(result, allow_nan=False))
    sys.exit(0)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", required=True, help="cpu or cuda:0 (the harness picks the GPU)")
    parser.add_argument("--mode", choices=["concurrent", "sequential_warmup"], required=True)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--elements", type=int, default=1 << 20, help="vector length the kernel processes")
    parser.add_argument("--max-jitter-ms", type=float, default=1.0, help="random start delay per thread")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.trials < 1 or args.threads < 1:
        parser.error("--trials and --threads must be at least 1")
    return args


def wilson_interval(failures, trials, z=1.959964):
    """95 % Wilson score interval of a binomial rate: sound at 0/n and n/n, unlike the normal one."""
    if trials == 0:
        return 0.0, 1.0
    rate = failures / trials
    denominator = 1 + z * z / trials
    center = (rate + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(rate * (1 - rate) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, center - half), min(1.0, center + half)


def make_kernel(triton, tl):
    """A new autotuned kernel object: its autotuner starts with an empty cache, as after a restart."""

    @triton.autotune(
        configs=[triton.Config({"BLOCK": block}, num_warps=warps) for block, warps in
                 [(256, 2), (512, 4), (1024, 4), (2048, 8)]],
        key=["n"],
    )
    @triton.jit
    def scale_shift(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < n
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=inside) * 2 + 1, mask=inside)

    return scale_shift


def main():
    args = parse_args()
    try:
        import torch
        import triton
        import triton.language as tl
    except ImportError as error:
        emit({"skipped": f"needs torch and triton in {sys.executable}: {error}"})
    if not args.device.startswith("cuda"):
        emit({"skipped": f"Triton's autotuner benchmarks GPU kernels: needs a CUDA device, got {args.device} "
                         f"(triton {triton.__version__})"})
    if not torch.cuda.is_available():
        emit({"skipped": f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU"})
    device = torch.device(args.device)
    torch.cuda.set_device(device)
    rng = random.Random(args.seed)
    inputs = [torch.randn(args.elements, device=device, generator=torch.Generator(device).manual_seed(args.seed + i))
              for i in range(args.threads)]
    expected = [x * 2 + 1 for x in inputs]
    outputs = [torch.empty_like(x) for x in inputs]
    grid = lambda meta: (triton.cdiv(args.elements, meta["BLOCK"]),)

    failures, thread_failures = 0, 0
    messages, first_traceback = {}, None
    start = time.perf_counter()
    for _ in range(args.trials):
        kernel = make_kernel(triton, tl)
        if args.mode == "sequential_warmup":
            kernel[grid](inputs[0], outputs[0], args.elements)
            torch.cuda.synchronize(device)
        jitters = [rng.uniform(0, args.max_jitter_ms) / 1e3 for _ in range(args.threads)]
        barrier = threading.Barrier(args.threads)
        errors = [None] * args.threads

        def warm(index):
            nonlocal first_traceback
            torch.cuda.set_device(device)
            barrier.wait()
            time.sleep(jitters[index])
            try:
                kernel[grid](inputs[index], outputs[index], args.elements)
                torch.cuda.synchronize(device)
                if not torch.equal(outputs[index], expected[index]):
                    errors[index] = "wrong result"
            except Exception as error:  # every failure is the measurement here, whatever its type
                errors[index] = f"{type(error).__name__}: {error}"
                if first_traceback is None:
                    first_traceback = traceback.format_exc()

        threads = [threading.Thread(target=warm, args=(i,)) for i in range(args.threads)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        failed = [e for e in errors if e is not None]
        failures += bool(failed)
        thread_failures += len(failed)
        for message in failed:
            messages[message] = messages.get(message, 0) + 1

    low, high = wilson_interval(failures, args.trials)
    emit({
        "trials": args.trials,
        "failures": failures,
        "failure_rate": failures / args.trials,
        "failure_rate_ci_low": low,
        "failure_rate_ci_high": high,
        "threads": args.threads,
        "thread_failures": thread_failures,
        "total_ms": (time.perf_counter() - start) * 1e3,
        "mode": args.mode,
        "messages": messages,
        "first_traceback": first_traceback,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "device_name": torch.cuda.get_device_name(device),
    })


if __name__ == "__main__":
    main()
