#!/usr/bin/env python3
"""What ptxas made of the Hopper kernels, checked on the machine without a GPU.

ptxas can undo a kernel's schedule without changing its results: it once put the ping-pong
forward's wait for P V above the softmax (the warpgroup then overlapped nothing with itself, 17%
slower on the H200), which no correctness test sees. This test compiles the kernels' .cu files (the
object library harness_attention_cuda_kernels of kernels/cuda/CMakeLists.txt: one per head dims) for
sm_90a as the build does, two at a time, disassembles them and checks, every head dims and element
type alike:
  1. ptxas reports no "Potential Performance Loss" (wgmma serialized) for any kernel, and the
     forward wgmma kernels spill nothing;
  2. in every overlapped forward (the ping-pong wgmma_m128_n128_pingpong and the one-consumer
     wgmma_m64_n64_overlap; at least the bf16 ones of head dims 64, 128 and 128 summing over 96),
     each turn of its loops waits for S alone (`WARPGROUP.DEPBAR.LE gsb0, 0x1`), then runs every
     exp of the softmax (kBlockN / 2 MUFU.EX2 per thread), and only then waits for P V
     (`gsb0, 0x0`); and that there are two such loops (masked and unmasked turns);
  3. the check of 2 rejects the sequential wgmma_m128_n128 forward (it must be able to fail);
  4. the atomic-dQ backward (at least those three in bf16) spills nothing and keeps the next step's
     S^T in flight while it finishes dK and dQ (`WARPGROUP.DEPBAR.LE gsb0, 0x1` in its loop; 5% of
     the causal backward's time);
  5. every wgmma forward issues the wgmma of one product with its descriptors in uniform registers:
     no `R2UR` between two of them (built per wgmma and moved with R2UR, they were a third of the
     dflash forward's inner loop); and the check rejects the deterministic wgmma
     backward, which still builds its descriptors that way.
Usage: kernel_sass_test.py NVCC SOURCE_ROOT [PYTHON] [--cache DIR] [--save DIR | --against DIR].
--cache DIR keeps each file's cubin and ptxas output under a key of nvcc's version, the compile line
and the contents of every source file under kernels/ (what the .cu files can include; not its
Markdown): a rerun over the same sources checks the same SASS without compiling it again (CTest
passes HARNESS_KERNEL_SASS_CACHE, by default ~/.cache/harness/kernel_sass, which every checkout
shares). cuobjdump comes from the CUDA toolkit or, where the toolkit has none (Debian's machine
here), from the triton wheel torch depends on, found through PYTHON. Exit 77 (skipped) with the
reason when neither exists.
--save DIR also writes each kernel's SASS (addresses and encodings dropped) to DIR, one file per
kernel named by its demangled name; --against DIR compares this tree's kernels with
such a folder (saved from another commit) and prints, per saved kernel, whether this tree has a
kernel with the same instructions: a refactoring that must not change the device code shows every
kernel "identical" (exit 1 otherwise). A kernel whose instructions differ only in the offsets of its
parameters in the constant bank (c[0x0][...]: a parameter struct that grew) is reported as such, and
counts as changed.
"""
import difflib
import hashlib
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

SKIP = 77
# The kernels' configurations, by the demangled FwdWgmmaConfig<HeadDims<D, DV, element, sum D, sum DV>,
# kBlockN, kConsumers, kStages, kMinBlocksPerSm, kOverlap> (the sums' columns appear defaulted or not).
# c++filt spells the nested template with its namespace.
DIMS = r"(?:harness::kernels::cuda::)?HeadDims<(\d+), (\d+), \(harness::kernels::cuda::ElementType\)(\d), (\d+), (\d+)>"
# The overlapped forwards, with their keys per tile (kBlockN / 2 scores, so exps, per thread and turn).
OVERLAPPED = {"ping-pong": (r"FwdWgmmaConfig<" + DIMS + r", 128, 2, \d+, 1, true>", 128),
              "m64_n64_overlap": (r"FwdWgmmaConfig<" + DIMS + r", 64, 1, \d+, \d+, true>", 64)}
# (D, DV, element, sum D, sum DV) every check must find: bf16 64 and 128, and 128 summing over 96.
CHECKED_BF16 = {("64", "64", "0", "64", "64"), ("128", "128", "0", "128", "128"), ("128", "128", "0", "96", "96")}
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


def kernel_sources(root):
    """The .cu files of the kernels' object library (kernels/cuda/CMakeLists.txt); a tree without
    that list has its kernels in kernels/cuda/attention_launch.cu."""
    cuda = os.path.join(root, "kernels", "cuda")
    with open(os.path.join(cuda, "CMakeLists.txt")) as text:
        listed = re.search(r"add_library\(harness_attention_cuda_kernels OBJECT([^)]*)\)", text.read())
    names = listed.group(1).split() if listed else ["attention_launch.cu"]
    return [os.path.join(cuda, n) for n in names if n != "block_mask_build.cu"]


def sources_key(nvcc, root):
    """A digest of nvcc's version and every source file under kernels/ (the .cu files include nothing
    of the project outside it; its Markdown is left out): what a cached cubin was compiled from."""
    digest = hashlib.sha256()
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
    digest.update((os.path.realpath(nvcc) + version.stdout).encode())
    kernels = os.path.join(root, "kernels")
    for folder, dirs, files in sorted(os.walk(kernels)):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".md"):
                continue
            path = os.path.join(folder, name)
            digest.update(os.path.relpath(path, kernels).encode() + b"\0")
            with open(path, "rb") as text:
                digest.update(hashlib.sha256(text.read()).digest())
    return digest.hexdigest()


def disassemble(nvcc, root, cuobjdump, cache=None):
    """Compiles the kernels for sm_90a as the build does (two files at a time; a cubin of `cache`
    compiled from the same sources is reused); returns ({mangled name: [instruction, ...]}, ptxas -v
    output), or raises RuntimeError with the tool's output."""
    key = sources_key(nvcc, root) if cache else None
    with tempfile.TemporaryDirectory() as tmp:
        def one(source):
            cubin = os.path.join(tmp, os.path.basename(source) + ".cubin")
            compile_cmd = [nvcc, "-I" + root, "-O2", "-DNDEBUG", "-std=c++17", "-gencode", "arch=compute_90a,code=sm_90a",
                           "-cubin", "-Xptxas", "-v", "-o", cubin, source]
            kept = None
            if cache:
                # The compile line with the checkout's path left out: every checkout shares the cache.
                flags = [arg.replace(root, "<root>") for arg in compile_cmd[:-3]]
                line = hashlib.sha256((key + "\0".join(flags + [os.path.relpath(source, root)])).encode())
                kept = os.path.join(cache, line.hexdigest()[:32])
            if kept and os.path.isfile(kept + ".cubin") and os.path.isfile(kept + ".log"):
                cubin = kept + ".cubin"
                with open(kept + ".log") as text:
                    stderr = text.read()
            else:
                built = subprocess.run(compile_cmd, capture_output=True, text=True, timeout=3600)
                if built.returncode != 0:
                    raise RuntimeError(built.stderr[-4000:] + f"\nnvcc exit {built.returncode} ({source})")
                stderr = built.stderr
                if kept:
                    os.makedirs(cache, exist_ok=True)
                    with open(kept + ".log.tmp", "w") as text:
                        text.write(stderr)
                    os.replace(cubin, kept + ".cubin.tmp")
                    os.replace(kept + ".cubin.tmp", kept + ".cubin")
                    os.replace(kept + ".log.tmp", kept + ".log")  # written last: a cubin without it is not used
                    cubin = kept + ".cubin"
            sass = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True, timeout=300)
            if sass.returncode != 0:
                raise RuntimeError(sass.stderr[-2000:] + f"\ncuobjdump exit {sass.returncode} ({source})")
            return functions(sass.stdout), stderr
        with ThreadPoolExecutor(max_workers=2) as pool:
            results = list(pool.map(one, kernel_sources(root)))
    kernels, log = {}, ""
    for functions_of_file, stderr in results:
        kernels.update(functions_of_file)  # a kernel in two files (an inline template) is one kernel
        log += stderr
    return kernels, log


def demangled(names):
    """{mangled: demangled} through c++filt (the mangled name where it is missing)."""
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, timeout=60).stdout
        lines = out.splitlines()
        if len(lines) == len(names):
            return dict(zip(names, lines))
    except OSError:
        pass
    return {n: n for n in names}


def save(kernels, folder):
    """Each kernel's instructions to folder/<sha1 of its name>.sass, and index.tsv: file, demangled name."""
    os.makedirs(folder, exist_ok=True)
    names = demangled(sorted(kernels))
    with open(os.path.join(folder, "index.tsv"), "w") as index:
        for mangled, name in sorted(names.items(), key=lambda item: item[1]):
            file = hashlib.sha1(mangled.encode()).hexdigest()[:16] + ".sass"
            with open(os.path.join(folder, file), "w") as out:
                out.write("\n".join(kernels[mangled]) + "\n")
            index.write(f"{file}\t{name}\n")
    print(f"saved the SASS of {len(kernels)} kernels to {folder}")


def where_different(before, after):
    """Which of `before`'s instructions `after` changes, branch and call targets aside (code that
    moves shifts them): their index range, and whether all of it lies past the producer
    warpgroup's register release (USETMAXREG.DEALLOC: ptxas puts the producer's code last)."""
    def masked(ins):
        return re.sub(r"0x[0-9a-f]+", "ADDR", ins) if re.match(r"(@!?U?P\d+ )?(BRA|BSSY|CALL\.REL|BRX|JMP)", ins) else ins
    a, b = [masked(i) for i in before], [masked(i) for i in after]
    changed = [(i1, i2) for tag, i1, i2, _, _ in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
               if tag != "equal"]
    if not changed:
        return "only branch and call targets differ"
    first, last = changed[0][0], changed[-1][1]
    release = [i for i, ins in enumerate(before) if ins.startswith("USETMAXREG.DEALLOC")]
    text = f"{sum(i2 - i1 for i1, i2 in changed)} instructions of {len(before)} differ, all within [{first}, {last})"
    if len(release) == 1 and first > release[0]:
        text += f": the producer warpgroup's code (past its register release at {release[0]})"
    return text


def without_param_offsets(instructions):
    """The instructions with every constant bank 0 offset (the kernel's parameters) made one."""
    return tuple(re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "c[0x0][PARAM]", i) for i in instructions)


def compare(kernels, folder):
    """Per kernel saved in `folder`: a kernel of this tree with the same instructions (identical, under
    whatever name), else one with the same instructions but for parameter offsets, else the kernel of
    the same name and how many instructions differ, else gone."""
    saved = []
    with open(os.path.join(folder, "index.tsv")) as index:
        for line in index:
            file, name = line.rstrip("\n").split("\t", 1)
            with open(os.path.join(folder, file)) as text:
                saved.append((name, text.read().splitlines()))
    names = demangled(sorted(kernels))
    by_code, by_shape = {}, {}
    for mangled, instructions in kernels.items():
        by_code.setdefault(tuple(instructions), []).append(names[mangled])
        by_shape.setdefault(without_param_offsets(instructions), []).append(names[mangled])
    changed = gone = offsets = 0
    for name, instructions in saved:
        same = by_code.get(tuple(instructions))
        if same:
            print(f"identical  {name}" + ("" if name in same else f"  (now {same[0]})"))
            continue
        changed += 1
        same = by_shape.get(without_param_offsets(instructions))
        if same:
            offsets += 1
            print(f"PARAMS     {name}: identical but for parameter offsets" + ("" if name in same else f"  (now {same[0]})"))
            continue
        if name not in names.values():
            gone += 1
            print(f"GONE       {name} (no kernel of this name or these instructions)")
            continue
        ours = kernels[next(m for m, n in names.items() if n == name)]
        print(f"DIFFERENT  {name}: {len(instructions)} -> {len(ours)} instructions; {where_different(instructions, ours)}")
    print(f"{len(saved) - changed} of {len(saved)} saved kernels identical, {offsets} identical but for parameter offsets, "
          f"{changed - gone - offsets} changed, {gone} gone; {len(kernels)} kernels in this tree")
    return 1 if changed else 0


def main():
    args, options, argv, cache = [], {}, sys.argv[1:], None
    while argv:
        word = argv.pop(0)
        if word == "--cache" and argv:
            cache = argv.pop(0)
        elif word in ("--save", "--against") and argv:
            options[word] = argv.pop(0)
        else:
            args.append(word)
    if len(args) < 2 or len(options) > 1:
        print(__doc__)
        return 2
    nvcc, root = args[0], args[1]
    python = args[2] if len(args) > 2 and args[2] else sys.executable
    cuobjdump, looked = find_cuobjdump(nvcc, python)
    if not cuobjdump:
        print("SKIP: no cuobjdump (looked at " + ", ".join(looked) + ")")
        return SKIP
    try:
        kernels, ptxas_log = disassemble(nvcc, root, cuobjdump, cache)
    except RuntimeError as error:
        print(error)
        print("FAIL: could not build or disassemble the kernels")
        return 1
    if "--save" in options:
        save(kernels, options["--save"])
    if "--against" in options:
        return compare(kernels, options["--against"])
    failures = []
    # ptxas -v: "Compiling entry function 'NAME'" ... "N bytes spill stores, M bytes spill loads"
    current = None
    for line in ptxas_log.splitlines():
        if "Potential Performance Loss" in line:
            failures.append("ptxas: " + line.strip())
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            current = m.group(1)
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and current and any(k in current for k in SPILL_CHECKED) and (m.group(1) != "0" or m.group(2) != "0"):
            failures.append(f"{current}: spills ({line.strip()})")
    kernels = {demangled_name: kernels[mangled] for mangled, demangled_name in demangled(sorted(kernels)).items()}
    fwd = {n: ins for n, ins in kernels.items() if "attention_fwd_wgmma_kernel" in n}
    sequential = {n: ins for n, ins in fwd.items() if re.search(r"FwdWgmmaConfig<" + DIMS + r", 128, 2, \d+, 1, false>", n)}
    print(f"{len(kernels)} kernels disassembled, {len(fwd)} wgmma forwards")
    for label, (pattern, block_n) in OVERLAPPED.items():
        overlapped = {n: ins for n, ins in fwd.items() if re.search(pattern, n)}
        found = {re.search(pattern, n).groups() for n in overlapped}
        if not CHECKED_BF16 <= found:
            failures.append(f"want the {label} forward at least at {sorted(CHECKED_BF16)}, found {sorted(found)}")
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
    found = {m.groups() for m in (re.search(DIMS, n) for n in atomic) if m}
    if not CHECKED_BF16 <= found:
        failures.append(f"want the atomic-dQ backward at least at {sorted(CHECKED_BF16)}, found {sorted(found)}")
    for name, instructions in sorted(atomic.items()):
        if "WARPGROUP.DEPBAR.LE gsb0, 0x1" not in instructions:
            failures.append(f"{name}: no wait that leaves one product in flight (S^T is no longer pipelined)")
    for name, instructions in sorted(fwd.items()):
        moved = r2ur_between_wgmma(instructions)
        if moved:
            failures.append(f"{name}: {moved} R2UR between the wgmma of one product (descriptors not in uniform registers)")
    # The R2UR check's own check: the deterministic backward at those bf16 head dims moves its
    # descriptors per wgmma (the one that splits columns, above 128, need not).
    def dims_of(name):
        m = re.search(DIMS, name)
        return m.groups() if m else None
    deterministic = {n: ins for n, ins in kernels.items()
                     if "attention_bwd_wgmma_kernel" in n and dims_of(n) in CHECKED_BF16}
    if len(deterministic) != len(CHECKED_BF16):
        failures.append(f"the deterministic wgmma backward at {sorted(CHECKED_BF16)} was not found (the R2UR "
                        f"self-check needs it), found {sorted(deterministic)}")
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
