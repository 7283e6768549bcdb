#!/usr/bin/env bash
# Runs ON the H200 image from the repo root: the founding incident from a crashed job to a written
# triage, with no edit to the job (python/README.md "Capture", docs/RUNNING.md "Triage").
#   dev/gpu/gpu_check_capture.sh [build] [capture] [triage] [fix] [overhead]   (default: all five, in order)
#   build     the harness binary with the CUDA kernels (dev/gpu/h200_build.sh, which needs .deps/ from dev/gpu/prepare_h200.sh)
#   capture   python -m harness.capture -- examples/train_dflash.py at the founding dims (32/8 heads, D 128,
#             512 anchors x 16, context 8192, bf16, eager flex_attention) under --memory-fraction
#             $FRACTION (default 0.55, about an 80 GB GPU): the job must fail with a CUDA OOM, and the
#             capture file, its allocator snapshot and a summary of both land in $OUT
#   triage    harness triage on that file, --device $DEVICE (default cuda:0): explain-oom, bwd_fusion and
#             anchor_scaling at the captured dims, the step replayed dense and fused; writeup in $OUT/triage/
#   fix       the same job with --attention flex-compiled under the same cap: it must run its steps
#   overhead  bench/capture_overhead.py on the compiled job (steps that do not fail, capture off/on)
# Each stage takes minutes (triage the longest: ~20 trials); run them one per call when calls are
# time-limited. Expected: capture exits 1 with torch.OutOfMemoryError raised in the attention's
# backward (or forward), "in_attention": true, requested_bytes the size of one fp32 score matrix
# (32 x 8192 x 16384 x 4 = 16 GiB) or a multiple of it, and a snapshot whose largest live block is
# that size; triage's conclusion says the unfused attention materializes the scores and gives the
# fused backward's bytes (~130 MiB, docs/BENCHMARKS.md) against the request; fix exits 0.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
out=${OUT:-$root/gpu_check_capture.out}
device=${DEVICE:-cuda:0}
fraction=${FRACTION:-0.55}
build_dir=${BUILD_DIR:-$root/build-h200}
harness=$build_dir/harness/harness
export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$out"
stages=("$@")
[[ ${#stages[@]} -eq 0 ]] && stages=(build capture triage fix overhead)
status=0

for stage in "${stages[@]}"; do
  echo "== $stage"
  case $stage in
    build)
      BUILD_TARGETS="harness" BUILD_DIR=$build_dir dev/gpu/h200_build.sh > "$out/build.log" 2>&1 \
        || { echo "build failed (see $out/build.log)"; tail -30 "$out/build.log"; exit 2; }
      "$harness" --version
      ;;
    capture)
      rm -rf "$out/captures"
      timeout 900 python3 -m harness.capture --out "$out/captures" -- examples/train_dflash.py \
        --memory-fraction "$fraction" --steps 2 > "$out/capture.log" 2>&1
      rc=$?
      tail -4 "$out/capture.log"
      echo "job exit code $rc (expected 1: the OOM, re-raised)"
      [[ $rc -eq 1 ]] || status=1
      python3 - "$out/captures" <<'PY' || status=1
import glob, json, sys
from harness.capture_file import read_safetensors_metadata
files = glob.glob(sys.argv[1] + "/capture-*.safetensors")
assert len(files) == 1, files
header = json.loads(read_safetensors_metadata(files[0])["capture"])
print(files[0])
print("exception:", header["exception"]["type"], header["exception"]["message"].splitlines()[0][:200])
print("failure:", json.dumps(header["failure"]))
print("memory:", json.dumps({k: v for k, v in header["memory"].items()}))
print("calls observed:", header["calls_observed"], "step call:", json.dumps(header["calls"][-1])[:400])
assert header["memory"]["snapshot"], "no allocator snapshot"
# The snapshot at the failing request: its largest live blocks (the scores tensor expected first).
import os, pickle
with open(os.path.join(os.path.dirname(files[0]), header["memory"]["snapshot"]), "rb") as f:
    snapshot = pickle.load(f)
# Live as analysis/memory_snapshot.cpp counts them (what harness triage reports): allocated or pending free.
live = sorted((b["size"] for s in snapshot["segments"] for b in s["blocks"]
               if b["state"] in ("active_allocated", "active_pending_free")), reverse=True)
print("snapshot: %d live blocks, %.2f GiB; largest (GiB):" % (len(live), sum(live) / 2**30), [round(b / 2**30, 2) for b in live[:6]])
PY
      ;;
    triage)
      capture=$(ls "$out"/captures/capture-*.safetensors 2>/dev/null | head -1)
      [[ -n $capture ]] || { echo "no capture file: run the capture stage first"; exit 2; }
      rm -rf "$out/triage" && mkdir -p "$out/triage"
      timeout 3000 "$harness" triage "$capture" --device "$device" --db "$out/triage/harness.db" \
        -o "$out/triage/triage.md" --json ${TRIAGE_ARGS:-} > "$out/triage/triage.json" 2> "$out/triage/triage.log"
      rc=$?
      echo "triage exit code $rc"
      [[ $rc -eq 0 ]] || tail -20 "$out/triage/triage.log"
      [[ $rc -eq 0 ]] || status=1
      python3 -c 'import json, sys; a = json.load(open(sys.argv[1])); print(a["conclusion"]); print(json.dumps(a["facts"])); [print(s) for s in a["steps"]]' \
        "$out/triage/triage.json" || status=1
      # The writeup's allocator section (the largest live blocks at the failing request, named).
      grep -i -A12 '^#.*allocator' "$out/triage/triage.md" | head -16
      ;;
    fix)
      timeout 900 python3 examples/train_dflash.py --memory-fraction "$fraction" --attention flex-compiled --steps 3 \
        > "$out/fix.log" 2>&1
      rc=$?
      tail -4 "$out/fix.log"
      echo "compiled job exit code $rc (expected 0)"
      [[ $rc -eq 0 ]] || status=1
      ;;
    overhead)
      timeout 900 python3 bench/capture_overhead.py --pairs 10 -- --attention flex-compiled > "$out/overhead.json" \
        2> "$out/overhead.log" || status=1
      cat "$out/overhead.json"
      ;;
    *)
      echo "unknown stage $stage (build, capture, triage, fix, overhead)"; exit 2 ;;
  esac
done
exit $status
