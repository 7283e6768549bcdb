#!/usr/bin/env python3
"""What ptxas made of the Hopper kernels, checked on the machine without a GPU.

Written plainly, the ping-pong forward ran 17% slower than planned on the H200 because ptxas put
the wait for P V above the softmax (the warpgroup overlapped nothing with itself), which no test
of results can see: they stay right. This test compiles kernels/cuda/attention_launch.cu for sm_90a as
the build does, disassembles it and checks:
  1. ptxas reports no "Potential Performance Loss" (wgmma serialized) for any kernel, and the
     forward wgmma kernels spill nothing;
  2. in every overlapped forward (the ping-pong wgmma_m128_n128_pingpong, its 2-stage persistent
     variant, its 64-key variant and the one-consumer wgmma_m64_n64_overlap, head dims 64 and 128), each turn of its loops waits for S alone
     (`WARPGROUP.DEPBAR.LE gsb0, 0x1`), then runs every exp of the softmax (kBlockN / 2 MUFU.EX2
     per thread), and only then waits for P V (`gsb0, 0x0`); and that there are two such loops
     (masked and unmasked turns);
  3. the check of 2 rejects the sequential wgmma_m128_n128 forward (it must be able to fail);
  4. the atomic-dQ backward (head dims 64 and 128) spills nothing and keeps the next step's S^T in
     flight while it finishes dK and dQ (`WARPGROUP.DEPBAR.LE gsb0, 0x1` in its loop: -5% of
     the causal backward's time on the H200);
  5. every wgmma forward issues the wgmma of one product with its descriptors in uniform registers:
     no `R2UR` between two of them (built per wgmma and moved with R2UR, they were a third of the
     dflash forward's inner loop); and the check rejects the deterministic wgmma
     backward, which still builds its descriptors that way.
Usage: kernel_sass_test.py NVCC SOURCE_ROOT [PYTHON]. cuobjdump comes from the CUDA toolkit or,
where the toolkit has none (Debian's machine here), from the triton wheel torch depends on, found
through PYTHON. Exit 77 (skipped) with the reason when neither exists.
"""
import os
import re
import subprocess
import sys
import tempfile

SKIP = 77
# The overlapped forwards, by the mangled FwdWgmmaConfig<D, kBlockN, kConsumers, kStages, kMinBlocksPerSm,
# kOverlap = true>, with their keys per tile (kBlockN / 2 scores, so exps, per thread and turn).
OVERLAPPED = {"ping-pong": (r"FwdWgmmaConfigILi\d+ELi128ELi2ELi3ELi1ELb1E", 128),
              "ping-pong 2-stage": (r"FwdWgmmaConfigILi\d+ELi128ELi2ELi2ELi1ELb1E", 128),
              "m64_n64_overlap": (r"FwdWgmmaConfigILi\d+ELi64ELi1ELi\d+ELi2ELb1E", 64),
              "ping-pong n64": (r"FwdWgmmaConfigILi\d+ELi64ELi2ELi3ELi1ELb1E", 64)}
SPILL_CHECKED = ("attention_fwd_wgmma_kernel", "attention_bwd_atomic_kernel")  # kernels that must not spill


def find_cuobjdump(nvcc, python):
    candidates = [os.path.join(os.path.dirname(nvcc), "cuobjdump")]
    try:
        triton_dir = subprocess.run([python, "-c", "import os, triton; print(os.path.dirname(triton.__file__))"],
                                    capture_output=True, text=True, timeout=120).stdout.strip()
        if triton_dir:
            candidates.append(os.path.join(triton_dir, "backends", "nvidia", "bin", "cuobjdump"))
    except (OSError, subprocess.TimeoutExpired):
        pass
    return next((c for c in candidates if os.access(c, os.X_OK)), None), candidates


def functions(sass):
    """{mangled name: [instruction text, ...]} from cuobjdump -sass output."""
    out, name = {}, None
    for line in sass.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            name = m.group(1)
            out[name] = []
        elif name:
            m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
            if m:
                out[name].append(m.group(1).strip())
    return out


def overlap_problems(instructions, block_n):
    """Why a kernel's turns do not run the softmax between the wait for S and the wait for P V
    (empty when they all do)."""
    problems, turns = [], 0
    for i, ins in enumerate(instructions):
        if ins != "WARPGROUP.DEPBAR.LE gsb0, 0x1":
            continue
        turns += 1
        exps = 0
        for later in instructions[i + 1:]:
            if later == "WARPGROUP.DEPBAR.LE gsb0, 0x0":
                break
            exps += "MUFU.EX2" in later
        else:
            problems.append(f"turn {turns}: no wait for P V after the wait for S")
        if exps < block_n // 2:
            problems.append(f"turn {turns}: {exps} MUFU.EX2 between the two waits, want {block_n // 2}")
    if turns < 2:
        problems.append(f"{turns} waits for S alone (gsb0, 0x1); want one per loop, 2 loops (masked, unmasked)")
    return problems


def r2ur_between_wgmma(instructions):
    """How many R2UR sit between two HGMMA of one issue sequence (no wait, branch, barrier or
    mbarrier operation between them): descriptors moved into uniform registers per wgmma."""
    count, pending, inside = 0, 0, False
    for ins in instructions:
        if ins.startswith("HGMMA"):
            count += pending if inside else 0
            inside, pending = True, 0
        elif any(op in ins for op in ("DEPBAR", "BRA", "SYNCS", "BAR.")):
            inside, pending = False, 0
        elif inside and ins.startswith("R2UR"):
            pending += 1
    return count


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    nvcc, root = sys.argv[1], sys.argv[2]
    python = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else sys.executable
    cuobjdump, looked = find_cuobjdump(nvcc, python)
    if not cuobjdump:
        print("SKIP: no cuobjdump (looked at " + ", ".join(looked) + ")")
        return SKIP
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "attention_launch.cubin")
        compile_cmd = [nvcc, "-I" + root, "-O2", "-DNDEBUG", "-std=c++17", "-gencode", "arch=compute_90a,code=sm_90a",
                       "-cubin", "-Xptxas", "-v", "-o", cubin, os.path.join(root, "kernels", "cuda", "attention_launch.cu")]
        built = subprocess.run(compile_cmd, capture_output=True, text=True, timeout=900)
        if built.returncode != 0:
            print(built.stderr[-4000:])
            print("FAIL: nvcc exit", built.returncode)
            return 1
        # ptxas -v: "Compiling entry function 'NAME'" ... "N bytes spill stores, M bytes spill loads"
        current = None
        for line in built.stderr.splitlines():
            if "Potential Performance Loss" in line:
                failures.append("ptxas: " + line.strip())
            m = re.search(r"Compiling entry function '(\S+)'", line)
            if m:
                current = m.group(1)
            m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
            if m and current and any(k in current for k in SPILL_CHECKED) and (m.group(1) != "0" or m.group(2) != "0"):
                failures.append(f"{current}: spills ({line.strip()})")
        sass = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True, timeout=300)
        if sass.returncode != 0:
            print(sass.stderr[-2000:])
            print("FAIL: cuobjdump exit", sass.returncode)
            return 1
    kernels = functions(sass.stdout)
    fwd = {n: ins for n, ins in kernels.items() if "attention_fwd_wgmma_kernel" in n}
    sequential = {n: ins for n, ins in fwd.items() if re.search(r"FwdWgmmaConfigILi\d+ELi128ELi2ELi\d+ELi1ELb0E", n)}
    print(f"{len(kernels)} kernels disassembled, {len(fwd)} wgmma forwards")
    for label, (pattern, block_n) in OVERLAPPED.items():
        overlapped = {n: ins for n, ins in fwd.items() if re.search(pattern, n)}
        if len(overlapped) != 2:
            failures.append(f"want the {label} forward at head dims 64 and 128, found {sorted(overlapped)}")
        for name, instructions in sorted(overlapped.items()):
            problems = overlap_problems(instructions, block_n)
            turns = sum(i == "WARPGROUP.DEPBAR.LE gsb0, 0x1" for i in instructions)
            print(f"  {label} {name}: {turns} loop turns checked, {len(instructions)} instructions"
                  + ("" if not problems else ": " + "; ".join(problems)))
            failures += [f"{name}: {p}" for p in problems]
    # The check must be able to fail: the sequential kernel waits for each product before its softmax.
    if not sequential:
        failures.append("the sequential wgmma_m128_n128 forward was not found (the self-check needs it)")
    for name, instructions in sorted(sequential.items()):
        if not overlap_problems(instructions, 128):
            failures.append(f"the overlap check accepted the sequential kernel {name}")
    atomic = {n: ins for n, ins in kernels.items() if "attention_bwd_atomic_kernel" in n}
    if len(atomic) != 2:
        failures.append(f"want the atomic-dQ backward at head dims 64 and 128, found {sorted(atomic)}")
    for name, instructions in sorted(atomic.items()):
        if "WARPGROUP.DEPBAR.LE gsb0, 0x1" not in instructions:
            failures.append(f"{name}: no wait that leaves one product in flight (S^T is no longer pipelined)")
    for name, instructions in sorted(fwd.items()):
        moved = r2ur_between_wgmma(instructions)
        if moved:
            failures.append(f"{name}: {moved} R2UR between the wgmma of one product (descriptors not in uniform registers)")
    deterministic = {n: ins for n, ins in kernels.items() if "attention_bwd_wgmma_kernel" in n}
    if not deterministic:
        failures.append("the deterministic wgmma backward was not found (the R2UR self-check needs it)")
    for name, instructions in sorted(deterministic.items()):
        if not r2ur_between_wgmma(instructions):
            failures.append(f"the R2UR check found none in {name}, which moves its descriptors per wgmma")
    for failure in failures:
        print("FAIL:", failure)
    if not failures:
        print("OK: no wgmma serialization, no forward or atomic-backward spills, the overlapped softmax overlaps P V, "
              "the atomic backward pipelines S^T, the forwards' descriptors stay in uniform registers")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
