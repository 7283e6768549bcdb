#!/usr/bin/env python3
"""Times two builds of harness_attention_selftest against each other in one run (an A/B of the
kernels: e.g. a commit against its parent), on the GPU it runs on.

    python3 bench/selftest_ab.py build OLD_COMMIT OUT_DIR [--nvcc NVCC] [--jobs N]   (anywhere with nvcc and git)
    python3 bench/selftest_ab.py run OLD_BINARY NEW_BINARY [--rounds 2] [--only TEXT ...] [--log-dir DIR]

`build` compiles the self-test of OLD_COMMIT (git archive of its tree) and of the working tree
with the same nvcc options (sm_90a, -O3) into OUT_DIR/selftest_old and OUT_DIR/selftest_new: each
source file to an object, N files at a time (default 1), then one link per binary; OUT_DIR/old_commit
and OUT_DIR/new_commit name what each was built from.
`run` on the GPU:
each round runs the old binary, then the new one, once per `--only TEXT` (the self-test's own
filter, a substring of the case name; default "REAL": the real-dims cases, the only timed ones;
give it several times to time several groups of cases); a binary's time for a (case, kernel) is
its median over the rounds of the self-test's own medians (20 reps, L2 flushed). Prints one markdown table, forward
and backward kernels, with new / old per row and, per direction, the geometric mean of the ratios
over the kernels both binaries time. A kernel that only one binary has is listed with "-" for the
other. Exit status: 0 when every run of both passed its checks, else 1 (the table is printed
either way). No third-party packages.
"""
import argparse
import concurrent.futures
import math
import os
import re
import statistics
import subprocess
import sys

ROW = re.compile(r"^\| (?P<case>[^|]+?) \| (?P<kernel>[a-z0-9_]+) \| (?P<ms>[0-9.]+) \|")


def run(binary, only, log):
    """{(direction, case, kernel): ms} from one self-test run (the cases whose name contains `only`),
    and whether it passed."""
    done = subprocess.run([binary, "--only", only, "--log", log], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          timeout=1800)
    times, direction = {}, None
    with open(log) as text:
        for line in text:
            if line.startswith("| case | forward kernel"):
                direction = "fwd"
            elif line.startswith("| case | backward kernel"):
                direction = "bwd"
            m = ROW.match(line)
            if m and direction:
                times[(direction, m["case"], m["kernel"])] = float(m["ms"])
    return times, done.returncode == 0


def selftest_sources(root):
    """The self-test's sources in a tree: the driver (bench/, or kernels/cuda/ in older trees) and
    the .cu files of the kernels' object library (kernels/cuda/CMakeLists.txt, add_library of
    harness_attention_cuda_kernels)."""
    driver = next(os.path.join(root, d, "attention_selftest.cu") for d in ("bench", "kernels/cuda")
                  if os.path.exists(os.path.join(root, d, "attention_selftest.cu")))
    cuda = os.path.join(root, "kernels", "cuda")
    with open(os.path.join(cuda, "CMakeLists.txt")) as text:
        listed = re.search(r"add_library\(harness_attention_cuda_kernels OBJECT([^)]*)\)", text.read())
    if not listed:
        sys.exit(f"selftest_ab.py: no add_library(harness_attention_cuda_kernels OBJECT ...) in {cuda}/CMakeLists.txt")
    return [driver] + [os.path.join(cuda, f) for f in listed.group(1).split()]


def build(args):
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.makedirs(args.out_dir, exist_ok=True)
    old_root = os.path.join(os.path.abspath(args.out_dir), "old_tree")
    os.makedirs(old_root, exist_ok=True)
    archive = subprocess.run(["git", "-C", here, "archive", args.old_commit, "kernels", "bench"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", old_root], input=archive, check=True)
    options = ["-std=c++17", "-O3", "-DNDEBUG", "-gencode", "arch=compute_90a,code=sm_90a"]
    for which, root in (("old", old_root), ("new", here)):
        out = os.path.join(os.path.abspath(args.out_dir), "selftest_" + which)
        objects_dir = out + "_objects"
        os.makedirs(objects_dir, exist_ok=True)
        sources = selftest_sources(root)
        objects = [os.path.join(objects_dir, f"{i}_{os.path.basename(source)}.o") for i, source in enumerate(sources)]

        def compile_one(source_object):
            command = [args.nvcc, *options, "-I" + root, "-c", source_object[0], "-o", source_object[1]]
            print(" ".join(command), file=sys.stderr)
            subprocess.run(command, check=True)

        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            list(pool.map(compile_one, zip(sources, objects)))
        command = [args.nvcc, "-gencode", "arch=compute_90a,code=sm_90a", *objects, "-o", out]
        print(" ".join(command), file=sys.stderr)
        subprocess.run(command, check=True)
    # What the two binaries are, for whoever runs them where there is no git.
    def describe(revision):
        return subprocess.run(["git", "-C", here, "rev-parse", "--short", revision], check=True, capture_output=True,
                              text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--", "kernels", "bench"], capture_output=True,
                           text=True).stdout.strip()
    with open(os.path.join(args.out_dir, "old_commit"), "w") as text:
        text.write(describe(args.old_commit) + "\n")
    with open(os.path.join(args.out_dir, "new_commit"), "w") as text:
        text.write(describe("HEAD") + (" with uncommitted changes to kernels/ or bench/" if dirty else "") + "\n")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build_parser = commands.add_parser("build")
    build_parser.add_argument("old_commit")
    build_parser.add_argument("out_dir")
    build_parser.add_argument("--nvcc", default="/usr/local/cuda/bin/nvcc")
    build_parser.add_argument("--jobs", type=int, default=1)
    run_parser = commands.add_parser("run")
    run_parser.add_argument("old")
    run_parser.add_argument("new")
    run_parser.add_argument("--rounds", type=int, default=2)
    run_parser.add_argument("--only", action="append")
    run_parser.add_argument("--log-dir", default=".")
    args = parser.parse_args()
    if args.command == "build":
        return build(args)
    os.makedirs(args.log_dir, exist_ok=True)
    onlys = args.only or ["REAL"]
    runs = {"old": [], "new": []}
    passed = True
    for round_index in range(args.rounds):
        for which in ("old", "new"):
            times = {}
            for group, only in enumerate(onlys):
                log = os.path.join(args.log_dir, f"selftest_{which}_{round_index + 1}_{group + 1}.log")
                group_times, ok = run(getattr(args, which), only, log)
                times.update(group_times)
                passed = passed and ok
                print(f"round {round_index + 1} {which} \"{only}\": {'passed' if ok else 'FAILED'} "
                      f"({len(group_times)} timings, {log})", file=sys.stderr)
            runs[which].append(times)
    median = {w: {} for w in runs}
    for which, rounds in runs.items():
        for key in set().union(*rounds):
            median[which][key] = statistics.median(r[key] for r in rounds if key in r)
    keys = sorted(set(median["old"]) | set(median["new"]))
    print("| dir | case | kernel | old ms | new ms | new / old |")
    print("|---|---|---|---|---|---|")
    ratios = {"fwd": [], "bwd": []}
    for key in keys:
        old, new = median["old"].get(key), median["new"].get(key)
        ratio = new / old if old and new else None
        if ratio:
            ratios[key[0]].append(ratio)
        cell = lambda v: f"{v:.3f}" if v is not None else "-"
        print(f"| {key[0]} | {key[1]} | {key[2]} | {cell(old)} | {cell(new)} | {cell(ratio)} |")
    for direction, values in ratios.items():
        if values:
            geo = math.exp(sum(math.log(v) for v in values) / len(values))
            print(f"\n{direction}: geometric mean new / old {geo:.4f} over {len(values)} kernels "
                  f"(min {min(values):.3f}, max {max(values):.3f})")
    print("\nchecks: " + ("every run passed" if passed else "a run FAILED its checks (see the logs)"))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
